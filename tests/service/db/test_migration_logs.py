"""A worker or server start says nothing about migrations when the schema is current, and never repeats
Alembic's "setup plugin" INFO lines (seven of them on every start, in every worker log)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
from service.db.migrate import upgrade
print("== first", upgrade(sys.argv[1]))
print("== second", upgrade(sys.argv[1]))
print("== alembic imported by the second:", "alembic" in sys.modules)
"""


def test_upgrade_logs_no_plugin_lines_and_nothing_when_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    out = subprocess.run([sys.executable, "-c", SCRIPT, url], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    first, second = out.split("== second")
    assert "Running upgrade" in first and "setup plugin" not in out, out
    assert "alembic" not in second.split("\n", 1)[1].replace("alembic imported", ""), second


def test_a_current_database_is_not_touched_by_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    script = ("import sys\nfrom service.db.migrate import upgrade\nupgrade(sys.argv[1])\n")
    subprocess.run([sys.executable, "-c", script, url], cwd=ROOT, check=True, timeout=120)
    again = ("import sys\nfrom service.db.migrate import upgrade, head\nassert upgrade(sys.argv[1]) == head()\n"
             "print('alembic' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", again, url], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "False"
