"""The README and the guide stay true: every setting has its row with its real default, the quick start names
real commands, and the README is a front door whose links all lead somewhere."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from markdown.extensions.toc import slugify

from service.cli.main import build_parser
from service.settings import Settings
from service.settings_doc import SETTING_DOCS, render_table, variable
from tests.docs_text import DOCS, ROOT, page, readme

README = readme()
#: the first `literal` of a default column: what the setting is set to, as written in the environment
LITERAL = re.compile(r"^`([^`]*)`")


def test_every_setting_has_a_row_and_every_row_a_setting() -> None:
    names = [f.name for f in fields(Settings)]
    assert sorted(set(names) - set(SETTING_DOCS)) == [], "settings without a row in service/settings_doc.py"
    assert sorted(set(SETTING_DOCS) - set(names)) == [], "rows of service/settings_doc.py naming no setting"
    assert all(doc.default.strip() and doc.meaning.strip() for doc in SETTING_DOCS.values())


def test_each_documented_default_is_the_real_one() -> None:
    """A default written as a literal is what ``Settings.from_env`` makes of it: the field's default.  A default
    described in words (no leading literal) is only allowed for a computed or empty one."""
    defaults = Settings()
    wrong = []
    for name, doc in SETTING_DOCS.items():
        real = getattr(defaults, name)
        literal = LITERAL.match(doc.default)
        if literal is None:
            if not (real == "" or isinstance(real, Path)):
                wrong.append(f"{variable(name)}: default {real!r} is described in words: {doc.default!r}")
            continue
        if real == "":  # computed at run time (AMPCI_SANDBOX): the words after the literal say how
            continue
        parsed = getattr(Settings.from_env({variable(name): literal.group(1)}), name)
        if parsed != real:
            wrong.append(f"{variable(name)}: documented {literal.group(1)!r} reads {parsed!r}, the default is {real!r}")
    assert not wrong, "\n".join(wrong)


def test_configuration_page_lists_every_variable_with_its_default() -> None:
    text = page("configuration.md")
    assert "<!-- settings-table -->" not in text and render_table() in text
    missing = [variable(name) for name, doc in SETTING_DOCS.items()
               if f"| `{variable(name)}` | {doc.default.replace('|', chr(92) + '|')} |" not in text]
    assert not missing, f"the configuration page lacks rows {missing}"


def test_commands_listed_in_readme_exist() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    listed = re.search(r"lists every other command \(([^)]*)\)", README)
    assert listed, "README quick start no longer lists the commands"
    names = re.findall(r"`([a-z]+)`", listed.group(1))
    assert names and set(names) <= set(sub.choices), set(names) - set(sub.choices)


def anchors(markdown: str) -> set[str]:
    """The ids of a page's headings as MkDocs makes them (``toc``'s slugify, or an explicit ``{ #id }``)."""
    ids = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.MULTILINE):
        explicit = re.search(r"\{ *#([\w-]+) *\}\s*$", heading)
        ids.add(explicit.group(1) if explicit else slugify(heading.strip(), "-"))
    return ids


def test_readme_is_a_front_door_whose_links_resolve() -> None:
    assert len(README.splitlines()) <= 300
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    broken = []
    for target in links:
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        if not file.is_file():
            broken.append(target)
        elif anchor and anchor not in anchors(file.read_text(encoding="utf-8")):
            broken.append(target)
    assert not broken, f"README links that lead nowhere: {broken}"


def test_readme_links_every_page_of_the_guide() -> None:
    unlinked = [p.name for p in DOCS.glob("*.md") if f"](docs/{p.name})" not in README]
    assert not unlinked, unlinked
