"""The text of the README and of the guide (``docs/``), for tests that hold the documentation to the code.

The configuration page's table is rendered when the site is built (``docs/hooks.py``); :func:`page` and
:func:`guide_text` return that page rendered, as a reader sees it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def hooks() -> ModuleType:
    """``docs/hooks.py``, the MkDocs hook that renders the configuration table (loaded from its file)."""
    spec = importlib.util.spec_from_file_location("ampci_docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def page(name: str) -> str:
    """The Markdown of ``docs/NAME`` as the site renders it (the configuration table filled in)."""
    text = (DOCS / name).read_text(encoding="utf-8")
    return hooks().render_settings(text) if name == "configuration.md" else text


def pages() -> list[str]:
    """The guide's pages: every ``docs/*.md``."""
    return sorted(p.name for p in DOCS.glob("*.md"))


def guide_text() -> str:
    """The README and every page of the guide, joined."""
    return "\n".join([readme(), *(page(name) for name in pages())])


def prose(text: str) -> str:
    """``text`` with every run of blanks (line breaks included) made one space."""
    return " ".join(text.split())
