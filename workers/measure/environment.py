"""The environment stored with every result (what ran it, on what, with which pass) and its fingerprint.

The **fingerprint** (``environment["fingerprint"]``) identifies where latency and conversion-time samples are
comparable: the machine and the runtime (device, provider, onnxruntime/onnx/python versions, CPU model and
count, thread settings, the timing method), and **nothing about the pass revision** under test, so a cell's latency compares
across revisions measured in one environment.  The pass revision and its worktree stay in the environment
dict as information only (:data:`FINGERPRINT_KEYS` lists what the fingerprint covers).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import onnxruntime as ort

from workers.measure.sessions import cuda_usable


@functools.cache
def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo where available)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def gpu_name() -> str | None:
    """The first GPU's name when CUDA is usable (via nvidia-smi), else None."""
    if not cuda_usable() or not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def pass_revision(pass_root: Path) -> str:
    """``git rev-parse HEAD`` of the pass root (``+dirty`` if amp_pass has local changes), or ``unknown``."""
    if not _may_be_in_git(pass_root):
        return "unknown"
    try:
        head = subprocess.run(["git", "-C", str(pass_root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(pass_root), "status", "--porcelain", "--", "amp_pass"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _may_be_in_git(path: Path) -> bool:
    """False only when git cannot find a repository for ``path`` (no ``.git`` in it or any parent and
    no GIT_DIR / GIT_WORK_TREE override), so no subprocess is started for a plain directory."""
    if "GIT_DIR" in os.environ or "GIT_WORK_TREE" in os.environ:
        return True
    here = Path(path).resolve()
    return any((d / ".git").exists() for d in (here, *here.parents))


#: The environment keys whose values the fingerprint hashes (machine and runtime, never the pass revision).
FINGERPRINT_KEYS: tuple[str, ...] = ("onnxruntime", "provider", "device", "cuda_usable", "python", "onnx", "platform",
                                     "cpu_count", "threads", "measurement", "sandbox")
#: How the job takes its timing samples (latency blocks, the conversion-time reference workload of
#: :func:`workers.revision.timing_reference.reference_workload`).  Part of the fingerprint: bumped whenever that method changes,
#: so that samples taken one way are never compared with samples taken another (2: the reference workload
#: reads a model cut down to ``REFERENCE_BYTES``; 3: a conversion sample is timed by the sandbox's supervisor,
#: from the request reaching the pre-started pass process to its exit).
MEASUREMENT_METHOD = "3"
#: Environment variables that change how many threads the runtime uses.
THREAD_VARS: tuple[str, ...] = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "ORT_NUM_THREADS")


def thread_settings(intra_op_threads: int = 0) -> str:
    """The thread settings latency depends on: the timed sessions' intra-op threads (``default``: one per
    core) and the thread environment variables that are set (``intra=1;OMP_NUM_THREADS=1`` ...)."""
    set_vars = [f"{k}={os.environ[k]}" for k in THREAD_VARS if os.environ.get(k)]
    return ";".join([f"intra={intra_op_threads or 'default'}", *set_vars])


def fingerprint_of(environment: dict[str, str]) -> str:
    """16 hex digits of the SHA-256 of the :data:`FINGERPRINT_KEYS` entries of ``environment``."""
    keyed = {k: environment.get(k, "") for k in FINGERPRINT_KEYS}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(provider: str, pass_root: Path, revision: str | None, intra_op_threads: int = 0,
                sandbox: str = "") -> dict[str, str]:
    """The environment of a job: onnxruntime version and provider, device (GPU name or CPU model), CPU count,
    thread settings, python, onnx, platform, the timing method (:data:`MEASUREMENT_METHOD`), plus (information
    only) the pass revision and root; its ``fingerprint`` entry hashes the machine and runtime keys only (see
    the module doc)."""
    gpu = gpu_name() if provider.startswith("CUDA") else None
    env = {
        "onnxruntime": ort.__version__,
        "provider": provider,
        "device": gpu or cpu_model(),
        "cuda_usable": str(cuda_usable()).lower(),
        "python": platform.python_version(),
        "onnx": onnx.__version__,
        "platform": f"{sys.platform}-{platform.machine()}",
        "cpu_count": str(os.cpu_count() or 0),
        "threads": thread_settings(intra_op_threads),
        "measurement": MEASUREMENT_METHOD,
        "sandbox": sandbox,  # full | best-effort: how the pass was isolated (timings differ between the two)
        "pass_revision": revision or pass_revision(pass_root),
        "pass_root": str(pass_root),
    }
    env["fingerprint"] = fingerprint_of(env)
    return env
