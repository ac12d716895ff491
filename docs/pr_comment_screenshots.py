#!/usr/bin/env python3
"""Regenerate the pictures of the pull-request report (README, docs/github.md) from its golden files.

    .venv/bin/python docs/pr_comment_screenshots.py     # writes docs/screenshots/pr-comment.png, check-run.png

The Markdown is the golden file the tests check (``tests/golden/pr_comment_mixed.md`` and
``pr_check_mixed.md``), rendered to HTML by markdown-it-py as the tests render it (CommonMark, GFM tables and
strikethrough, raw HTML), styled like GitHub's Markdown and photographed by the headless Chromium the browser
tests use (``AMPCI_CHROMIUM``, else Debian's ``/usr/bin/chromium``; driven through Playwright, never a
downloaded browser).  Colour emoji need a colour emoji font (Debian: ``fonts-noto-color-emoji``).
"""

from __future__ import annotations

import html
import os
import sys
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from service.github.comment import CHECK_NAME  # noqa: E402  (the script runs from a checkout)

GOLDEN = ROOT / "tests" / "golden"
OUT = ROOT / "docs" / "screenshots"
CHROMIUM = os.environ.get("AMPCI_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

#: GitHub's Markdown look (light theme), enough for tables, code, headings, links and footnotes.
CSS = """
body { margin: 0; padding: 24px; background: #f6f8fa; font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", "DejaVu Sans",
       sans-serif, "Noto Color Emoji"; font-size: 14px; line-height: 1.5;
       color: #1f2328; }
.box { width: 1220px; background: #fff; border: 1px solid #d0d7de; border-radius: 6px; }
.box > header { padding: 8px 16px; background: #f6f8fa; border-bottom: 1px solid #d0d7de; color: #59636e;
                border-radius: 6px 6px 0 0; }
.box > header b { color: #1f2328; }
.markdown { padding: 16px; }
.markdown > :first-child { margin-top: 0; }
h2, h3 { margin: 24px 0 16px; font-weight: 600; line-height: 1.25; }
h2 { font-size: 1.5em; } h3 { font-size: 1.25em; }
p, table, ol { margin: 0 0 16px; }
a { color: #0969da; text-decoration: none; }
code { padding: .2em .4em; font-size: 85%; background: rgba(175, 184, 193, .2); border-radius: 6px;
       font-family: ui-monospace, SFMono-Regular, "DejaVu Sans Mono", monospace; }
table { border-spacing: 0; border-collapse: collapse; display: block; width: max-content; max-width: 100%;
        overflow: auto; }
th, td { padding: 6px 13px; border: 1px solid #d0d7de; }
th { font-weight: 600; }
tr { background: #fff; border-top: 1px solid #d1d9e0; }
tr:nth-child(2n) { background: #f6f8fa; }
sub { font-size: 75%; }
.checks { display: flex; }
.box.checks { width: 1400px; }
.checks nav { width: 150px; padding: 16px; border-right: 1px solid #d0d7de; color: #59636e; }
.checks nav b { color: #1f2328; }
.checks .markdown { flex: 1; min-width: 0; }
"""


def gfm(markdown: str) -> str:
    """``markdown`` as HTML the way the golden tests render it."""
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(markdown)


def comment_page(markdown: str) -> str:
    """A PR conversation's comment box around the rendered comment."""
    return (f"<!doctype html><meta charset='utf-8'><style>{CSS}</style><div class='box'><header><b>ampci</b> "
            f"<span>bot</span> commented</header><div class='markdown'>{gfm(markdown)}</div></div>")


def check_page(markdown: str, conclusion: str = "failure") -> str:
    """The checks tab of a pull request: the check's name and conclusion beside its title, summary and text."""
    nav = f"<nav><b>{html.escape(CHECK_NAME)}</b><br>✖ {html.escape(conclusion)}</nav>"
    return (f"<!doctype html><meta charset='utf-8'><style>{CSS}</style><div class='box checks'>{nav}"
            f"<div class='markdown'>{gfm(markdown)}</div></div>")


def main() -> int:
    """Write the two PNGs; 1 with a message when Chromium or Playwright is missing."""
    if not Path(CHROMIUM).exists():
        print(f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set AMPCI_CHROMIUM)", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    pages = {"pr-comment.png": comment_page((GOLDEN / "pr_comment_mixed.md").read_text()),
             "check-run.png": check_page((GOLDEN / "pr_check_mixed.md").read_text())}
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1480, "height": 800}, device_scale_factor=1)
            for name, content in pages.items():
                page.set_content(content, wait_until="load")
                page.locator(".box").screenshot(path=str(OUT / name))
                print(OUT / name)
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
