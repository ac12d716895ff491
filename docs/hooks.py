"""MkDocs hook: the configuration page's table is rendered from :data:`service.settings_doc.SETTING_DOCS` when
the site is built (``mkdocs.yml`` ``hooks:``), so the page cannot drift from ``Settings``.

``docs/configuration.md`` holds the marker line below; a page that keeps the marker after rendering, or a
configuration page without it, fails the build.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARKER = "<!-- settings-table -->"
ROOT = Path(__file__).resolve().parents[1]


def render_settings(markdown: str) -> str:
    """``markdown`` with :data:`MARKER` replaced by the configuration table (a ValueError when it is missing)."""
    if str(ROOT) not in sys.path:  # mkdocs run outside the project's virtual environment
        sys.path.insert(0, str(ROOT))
    from service.settings_doc import render_table

    if MARKER not in markdown:
        raise ValueError(f"docs/configuration.md lost its {MARKER} line")
    return markdown.replace(MARKER, render_table())


def on_page_markdown(markdown: str, page: object, **_: object) -> str:
    """MkDocs calls this for each page's Markdown before it is rendered."""
    src = getattr(getattr(page, "file", None), "src_uri", "")
    return render_settings(markdown) if src == "configuration.md" else markdown
