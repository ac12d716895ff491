"""One job's fork bomb does not break other jobs (issue 40): ``RLIMIT_NPROC`` counts a uid host-wide, so each
session's pass runs as a uid of its own (root worker); a pass holding every process it may have leaves the
other jobs converting."""

from __future__ import annotations

import os
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from tests.waiting import wait_until
from tests.workers.fakes import fake_pass
from tests.workers.hostile import processes_with
from workers.revision.convert import ConvertOutcome, convert_in_subprocess
from workers.sandbox import policy as sb
from workers.zoo.synthetic import synthetic_model_path

needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="distinct uids per session need a root worker")

#: Forks until refused (each child a marked ``sleep``), then waits for its children: the test kills them.
_BOMB = '''
import os, sys
n = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", {mark!r}])
    n += 1
print("amp_pass: error: forked", n, "uid", os.getuid(), file=sys.stderr)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
sys.exit(2)
'''

MAX_PROCS = 16


@as_root
@pytest.mark.parametrize("mode", [pytest.param("require", marks=needs_full), "best-effort"])
def test_a_fork_bomb_in_one_job_leaves_two_other_jobs_converting(tmp_path: Path, mode: str) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    mark = f"{500 + uuid.uuid4().int % 100}.{uuid.uuid4().int % 10**6}"  # sleeps at most ~10 minutes
    bomb = tmp_path / "bomb"
    (bomb / "amp_pass").mkdir(parents=True)
    (bomb / "amp_pass" / "__init__.py").write_text('"""A fork bomb."""\n')
    (bomb / "amp_pass" / "__main__.py").write_text(textwrap.dedent(_BOMB.format(mark=mark)))
    honest = fake_pass(tmp_path / "honest", "perturb")
    policy = sb.SandboxPolicy(mode=mode, max_procs=MAX_PROCS)
    outcomes: dict[str, ConvertOutcome] = {}

    def convert(name: str, root: Path) -> None:
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        outcomes[name] = convert_in_subprocess(src, d / "out.onnx", d / "report.json", "fp16", "default", "cpu",
                                               root, timeout_s=90, memory_bytes=2 * 2**30, warm=False,
                                               sandbox=policy)

    bomber = threading.Thread(target=convert, args=("bomb", bomb))
    bomber.start()
    try:
        wait_until(lambda: len(processes_with(mark)) >= MAX_PROCS - 2, "the bomb holds its process limit")
        others = [threading.Thread(target=convert, args=(f"job{i}", honest)) for i in range(2)]
        for t in others:
            t.start()
        for t in others:
            t.join()
        assert len(processes_with(mark)) >= MAX_PROCS - 2  # still held while the others converted
    finally:
        for pid in processes_with(mark):
            os.kill(pid, 9)
        bomber.join()
    for i in range(2):
        assert outcomes[f"job{i}"].status == "ok", outcomes[f"job{i}"]
    assert outcomes["bomb"].status == "convert_error" and "forked" in outcomes["bomb"].message, outcomes["bomb"]
    uid = int(outcomes["bomb"].message.split(" uid ")[1].split()[0])
    assert uid != sb.SANDBOX_UID and uid >= sb.loader().SESSION_UID_BASE, uid
