"""The guide builds as a site with ``mkdocs build --strict`` (what ``python3 dev.py docs`` and ``.ci/run`` do), and
a broken link, a missing anchor or a page left out of the nav makes that build fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.settings_doc import SETTING_DOCS, variable
from tests.docs_text import ROOT


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``python3 dev.py docs`` on ``project``'s mkdocs.yml (the last --site-dir wins), as CI runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "dev.py"), "docs", "-f", str(project / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True)


def copy_of_the_guide(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    return project


def test_the_guide_builds_strict_with_every_setting_on_its_configuration_page(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    html = (tmp_path / "site" / "configuration" / "index.html").read_text(encoding="utf-8")
    missing = [variable(name) for name in SETTING_DOCS if f"<code>{variable(name)}</code>" not in html]
    assert not missing, missing
    assert "settings-table" not in html
    assert (tmp_path / "site" / "DEVELOPING" / "index.html").is_file()  # docs/DEVELOPING.md keeps its path


@pytest.mark.parametrize(("page", "append", "says"), [
    ("index.md", "\nSee [the missing page](no-such-page.md).\n", "no-such-page.md"),
    ("getting-started.md", "\nSee [a missing section](security.md#no-such-section).\n", "no-such-section"),
    ("new-page.md", "# A page nobody listed in the nav\n", "new-page.md"),
])
def test_a_broken_link_anchor_or_unlisted_page_fails_the_build(tmp_path: Path, page: str, append: str,
                                                                 says: str) -> None:
    project = copy_of_the_guide(tmp_path)
    with (project / "docs" / page).open("a", encoding="utf-8") as f:
        f.write(append)
    done = build(project, tmp_path / "site")
    assert done.returncode != 0 and says in done.stderr, done.stderr[-3000:]
