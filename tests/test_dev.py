"""dev.py installs chromium (as root, with apt-get) only when the browser tests may run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ampci_dev_script", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("args", "env", "expected"), [
    ([], {}, True),
    (["tests/service/dashboard"], {}, True),
    (["-m", "not browser"], {}, False),
    (["-q", "-m", "not browser and not slow"], {}, False),
    (["-m", "not  browser"], {}, False),
    (["-mnot browser"], {}, False),
    (["-m", "browser"], {}, True),
    (["-m", "slow"], {}, True),
    ([], {"AMPCI_NO_BROWSER": "1"}, False),
    ([], {"AMPCI_NO_BROWSER": "0"}, True),
])
def test_chromium_is_installed_only_when_browser_tests_may_run(args: list[str], env: dict[str, str],
                                                               expected: bool) -> None:
    assert _dev().wants_browser(args, env) is expected


def test_readme_says_dev_test_installs_chromium_and_how_to_skip_it() -> None:
    text = (ROOT / "README.md").read_text()
    assert "chromium" in text.lower() and 'python3 dev.py test -m "not browser"' in text
    assert "AMPCI_NO_BROWSER=1" in text


@pytest.mark.parametrize(("args", "env", "expected"), [
    ([], {}, True),
    (["-m", "not deploy"], {}, False),
    (["-m", "not browser and not deploy"], {}, False),
    (["-m", "not browser"], {}, True),
    ([], {"AMPCI_NO_DOCKER": "1"}, False),
    ([], {"AMPCI_NO_DOCKER": "no"}, True),
])
def test_docker_is_installed_only_when_the_deploy_test_may_run(args: list[str], env: dict[str, str],
                                                               expected: bool) -> None:
    assert _dev().wants_docker(args, env) is expected


def test_ci_type_checks_before_the_tests() -> None:
    """`.ci/run` stops (``set -e``) on a type error: the type check runs first, the tests after it."""
    lines = [ln.split("#")[0].strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "set -euo pipefail" in lines
    commands = [ln for ln in lines if ln.startswith("python3 dev.py")]
    assert [c.split()[2] for c in commands] == ["typecheck", "test"], commands
