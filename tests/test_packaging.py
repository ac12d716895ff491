"""pyproject.toml states its license as an SPDX expression (a TOML table made setuptools warn three times
on every ``pip install -e .``) and requires a setuptools that reads one (77, PEP 639)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_string_and_setuptools_reads_it() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in data["project"].get("classifiers", []))  # PEP 639: not both
    req = next(r for r in data["build-system"]["requires"] if r.startswith("setuptools"))
    m = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", req.replace(" ", ""))
    assert m is not None and int(m.group(1)) >= 77, req
