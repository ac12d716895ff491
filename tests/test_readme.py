"""The README stays true: every setting is documented, and the quick start names real commands."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from service.cli.main import build_parser
from service.settings import Settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_setting_is_in_the_configuration_table() -> None:
    missing = [f"AMPCI_{f.name.upper()}" for f in fields(Settings) if f"AMPCI_{f.name.upper()}" not in README]
    assert not missing, f"README configuration table lacks {missing}"


def test_commands_listed_in_readme_exist() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    listed = re.search(r"lists every other command \(([^)]*)\)", README)
    assert listed, "README quick start no longer lists the commands"
    names = re.findall(r"`([a-z]+)`", listed.group(1))
    assert names and set(names) <= set(sub.choices), set(names) - set(sub.choices)
