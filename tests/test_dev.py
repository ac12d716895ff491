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


def test_getting_started_says_dev_test_installs_chromium_and_how_to_skip_it() -> None:
    text = (ROOT / "docs" / "getting-started.md").read_text()
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
    """`.ci/run` stops (``set -e``) on a type error or a broken guide: the type check runs first, then the guide's
    strict build (tests/test_docs_site.py: a broken link fails it), the tests after them."""
    lines = [ln.split("#")[0].strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "set -euo pipefail" in lines
    commands = [ln for ln in lines if ln.startswith("python3 dev.py")]
    assert [c.split()[2] for c in commands] == ["typecheck", "docs", "test"], commands



def test_dev_ampci_replaces_itself_so_its_pid_is_the_commands(tmp_path: Path) -> None:
    """``python3 dev.py ampci ...`` execs ampci: the PID a user starts (and later kills) is ampci's own, so
    stopping it leaves no orphaned ``ampci serve``.  A stand-in ``ampci`` in a stand-in venv prints its PID,
    its arguments and its working directory; with exec the PID is the one this test started."""
    import subprocess
    import sys

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "ampci"
    fake.write_text('#!/bin/sh\necho "$$ $* $(pwd)"\n')
    fake.chmod(0o755)
    code = (f"import importlib.util, sys, pathlib\n"
            f"spec = importlib.util.spec_from_file_location('d', {str(ROOT / 'dev.py')!r})\n"
            f"d = importlib.util.module_from_spec(spec); spec.loader.exec_module(d)\n"
            f"d.VENV = pathlib.Path({str(venv)!r})\n"
            f"d.exec_ampci(['serve', '--port', '1'], {{'PATH': '/usr/bin:/bin'}})\n"
            f"print('exec_ampci returned')\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.split() == [str(proc.pid), "serve", "--port", "1", str(ROOT)]
