"""``python -m amp_pass convert SRC -o DST ...`` (see amp_pass.cli)."""

from __future__ import annotations

import sys

from amp_pass.cli import main

if __name__ == "__main__":
    sys.exit(main())
