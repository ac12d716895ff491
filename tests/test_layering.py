"""Layers import downward: amp_pass imports no celery/sqlalchemy/onnxruntime; service no onnxruntime."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: str) -> list[str]:
    pkg_dir = ROOT / package
    names = [package]
    for info in pkgutil.walk_packages([str(pkg_dir)], prefix=f"{package}."):
        names.append(info.name)
    return names


@pytest.mark.parametrize(
    ("package", "banned"),
    [
        ("amp_pass", ["celery", "sqlalchemy", "onnxruntime", "fastapi", "redis"]),
        ("service", ["onnxruntime"]),
    ],
)
def test_package_does_not_import_banned_layers(package: str, banned: list[str]) -> None:
    mods = _modules(package)
    assert len(mods) > 1, f"{package} has no modules"
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        f"bad = sorted(b for b in {banned!r} if b in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"{package} imports {proc.stdout.strip()}"
