"""The pass cannot time itself (issue 39): a conversion's wall and CPU seconds come from the supervisor's clock and
the kernel's accounting, never from a line the pass's code writes.

Each forging pass writes timing-shaped lines (``0 0.000100``, ``E 0``, ``S 9``, garbage) into every descriptor it
holds -- in the conversion process (``__main__``) and, from a thread its import starts, in the sandbox's pass
process that reports the conversion's end -- and then sleeps or burns CPU like its honest control (the fakes'
``sleepy`` and ``burn``).  Its samples must be as long as the control's work, through the real sandbox, in both
modes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.fakes import BEHAVIOURS, fake_pass
from workers.revision.convert import convert_in_subprocess
from workers.sandbox import policy as sb
from workers.zoo.synthetic import synthetic_model_path

#: What the pass writes into every descriptor it holds.
FORGED = b"0 0.000100\nE 0\nS 9\n0 0.0001\n\x00garbage" + b"x" * 5000 + b"\nE 0\n"

_FORGE = '''
import os as _os, threading as _threading

def _forge_all(fds=None):
    for _fd in fds or _os.listdir("/proc/self/fd"):
        try:
            _os.write(int(_fd), {forged!r})
        except OSError:
            pass
'''

#: ``amp_pass/__init__.py``: runs in the pass process (at its import), forging from a thread every 5 ms into the
#: descriptors it held then (its report pipe among them; not the conversions' request pipes, made later).
_INIT = _FORGE + '''
_AT_IMPORT = _os.listdir("/proc/self/fd")

def _loop():
    import time
    while True:
        _forge_all(_AT_IMPORT)
        time.sleep(0.005)

_threading.Thread(target=_loop, daemon=True).start()
'''

needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")
MODES = [pytest.param("require", marks=needs_full), "best-effort"]


def forging_pass(root: Path, behaviour: str) -> Path:
    """``behaviour`` of the fakes, preceded by forged lines into every inherited descriptor, with an import that
    keeps forging from the pass process."""
    fake_pass(root, behaviour)
    main = root / "amp_pass" / "__main__.py"
    body = main.read_text()
    main.write_text(_FORGE.format(forged=FORGED) + "_forge_all()\n" + body)
    (root / "amp_pass" / "__init__.py").write_text(_INIT.format(forged=FORGED))
    return root


def _samples(tmp_path: Path, root: Path, mode: str) -> tuple[list[float], list[float]]:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=120, memory_bytes=2 * 2**30, warm=False, repeats=3,
                                repeat_budget_s=60, sandbox=sb.SandboxPolicy(mode=mode))
    assert out.status == "ok", out.message
    assert len(out.samples_s) == 3 and len(out.cpu_samples_s) == 3, out
    return out.samples_s, out.cpu_samples_s


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("forged", [False, True], ids=["honest", "forging"])
def test_a_sleeping_pass_is_timed_at_its_sleep_whatever_it_writes(tmp_path: Path, mode: str, forged: bool) -> None:
    make = forging_pass if forged else fake_pass
    wall, cpu = _samples(tmp_path, make(tmp_path / "pass", "sleepy"), mode)
    assert min(wall) >= 0.5, wall  # the fake sleeps 0.5 s per conversion
    assert max(cpu) < 0.5, cpu  # sleeping is no CPU time


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("forged", [False, True], ids=["honest", "forging"])
def test_a_busy_pass_is_charged_its_cpu_whatever_it_writes(tmp_path: Path, mode: str, forged: bool) -> None:
    make = forging_pass if forged else fake_pass
    wall, cpu = _samples(tmp_path, make(tmp_path / "pass", "burn"), mode)
    assert min(wall) >= 0.5, wall  # the fake burns 0.5 s of its own CPU time per conversion
    assert min(cpu) >= 0.45, cpu  # the kernel's ticks (10 ms) round it, never by half a second


BEHAVIOURS["burn_in_init"] = '''
import shutil
_pid1_burn()
shutil.copyfile(a.src, a.dst)
report()
'''


@pytest.mark.parametrize("mode", MODES)
def test_cpu_the_pass_moves_into_the_pass_process_is_counted(tmp_path: Path, mode: str) -> None:
    """The conversion asks a thread of the sandbox's pass process (its parent, which imported the pass) to burn
    0.5 s of CPU and waits for it: that CPU time is the conversion's, though no conversion process spent it."""
    root = fake_pass(tmp_path / "pass", "burn_in_init")
    (root / "amp_pass" / "__init__.py").write_text('''
import os, threading, time
_r, _w = os.pipe()
_done_r, _done_w = os.pipe()

def _serve():
    while os.read(_r, 1):
        end = time.thread_time() + 0.5
        while time.thread_time() < end:
            pass
        os.write(_done_w, b"d")

threading.Thread(target=_serve, daemon=True).start()
''')
    main = root / "amp_pass" / "__main__.py"
    main.write_text('''
import os
import amp_pass as _p

def _pid1_burn():
    os.write(_p._w, b"x")
    os.read(_p._done_r, 1)
''' + main.read_text())
    wall, cpu = _samples(tmp_path, root, mode)
    assert min(wall) >= 0.5, wall
    assert min(cpu) >= 0.45, cpu
