"""Run the pass under test in its sandbox, with a time and a memory limit.

The pass at a revision is untrusted code: each conversion runs as ``python -m amp_pass convert SRC -o DST ...``
would, but in the sandbox of :mod:`workers.sandbox._sandbox` (allow-listed environment, no inherited descriptors, no
network, a read-only view of everything but its own scratch, its own PID namespace, limits), made by a
supervisor process pre-forked from a zygote (warm: :mod:`workers.sandbox.zygotes`) or from a one-shot fresh
interpreter (cold).  A crash, hang, memory blow-up or hostile act of the pass never reaches the worker:
:func:`convert_in_subprocess` always returns a :class:`ConvertOutcome` whose ``status`` is ``ok`` /
``convert_error`` / ``timeout`` / ``crash`` (the pass's failures), or ``error`` when the sandbox could not be made
or could not import a dependency the worker's interpreter has (ampci's: :mod:`workers.infra`), with what the
pass returned checked as data first (the report
against its schema and size, the output's size) and its error text cut to a bounded tail with credentials
redacted (:func:`workers.redact.redact`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.infra import import_failure_cause, infra_message
from workers.redact import redact
from workers.result import INFRA_ERROR
from workers.revision.timing_reference import ReferencePlan, reference_plan, reference_workload
from workers.sandbox.policy import SandboxPolicy, SandboxUnavailable, resolve_mode, spec_for

#: The repository that holds this checkout's ``amp_pass`` (the default pass root).
DEFAULT_PASS_ROOT = Path(__file__).resolve().parents[2]

_TAIL = 2000
#: Largest report the pass may write (bytes); a larger one is refused.
MAX_REPORT_BYTES = 16 * 2**20
#: Repeats of a conversion stop once the conversions so far took more than this many seconds.
REPEAT_BUDGET_S = 5.0


@dataclass
class ConvertOutcome:
    """What the conversion subprocess did.  ``report`` is the pass report dict when ``status == ok``."""

    status: str                      # ok | convert_error | timeout | crash | error (ampci's: workers.infra)
    message: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    returncode: int | None = None
    samples_s: list[float] = field(default_factory=list)  # wall time of each successful conversion
    # wall time of the reference workload timed right after each sample (:func:`reference_workload`)
    reference_s: list[float] = field(default_factory=list)
    # user + system CPU seconds of the sandbox's processes during the conversion, from the kernel's accounting
    # (all threads and processes of the pass; None: not known, e.g. killed)
    cpu_s: float | None = None
    # the CPU seconds of each sample of ``samples_s`` (empty unless known for every one: kept paired)
    cpu_samples_s: list[float] = field(default_factory=list)
    sandbox: str = ""  # "full" or "best-effort": how the pass was isolated
    stderr_tail: str = ""  # a failed pass's last stderr lines (:func:`stderr_tail`); empty when it succeeded


#: The most lines and characters of a failed pass's stderr a result keeps.
TAIL_LINES, TAIL_CHARS = 20, 2000


def stderr_tail(err: str) -> str:
    """The last :data:`TAIL_LINES` non-empty lines of ``err`` (already redacted), at most :data:`TAIL_CHARS`
    characters, each line's trailing blanks dropped."""
    lines = [ln.rstrip() for ln in err.splitlines() if ln.strip()][-TAIL_LINES:]
    return "\n".join(lines)[-TAIL_CHARS:]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def convert_in_subprocess(src: Path, dst: Path, report: Path, dtype: str, policy: str, target: str,
                          pass_root: Path | None, timeout_s: float, memory_bytes: int,
                          warm: bool = True, inputs: Path | None = None,
                          tolerance: str | None = None, repeats: int = 1,
                          repeat_budget_s: float = REPEAT_BUDGET_S,
                          sandbox: SandboxPolicy | None = None) -> ConvertOutcome:
    """Convert ``src`` to ``dst`` with the pass under ``pass_root``; never raises for pass failures.

    ``warm``: fork the conversion from a zygote that has the pass imported already (see
    :mod:`workers.sandbox.zygotes`), falling back to a fresh ``python -m amp_pass`` when none can start.
    Policy ``auto`` runs ``python -m workers.revision.autoconvert`` instead (the search measures models, on
    ``inputs``, an .npz, to ``tolerance``, a ``workers.measure.autosearch.Tolerance`` string; None: the
    search's default), always cold, with this checkout's workers and ``pass_root``'s amp_pass.

    ``repeats``: after a successful conversion, convert the same way again (into scratch files next
    to ``dst``, removed after; ``dst`` and ``report`` stay the first conversion's) until ``repeats``
    conversions ran or their wall times add up to more than ``repeat_budget_s``; a repeat that fails
    ends the repeating.  ``ConvertOutcome.samples_s`` holds the wall time of every successful one, as
    the sandbox's supervisor timed it (from the request until the conversion process exited; nothing the pass
    writes, its own ``seconds`` included, is used), and ``cpu_samples_s`` the user + system CPU seconds the
    kernel accounted to the sandbox's processes in each (empty unless known for every sample).  ``sandbox``: the worker's sandbox policy (default: ``auto``)."""
    policy_ = sandbox or SandboxPolicy()
    try:
        mode = resolve_mode(policy_)
    except SandboxUnavailable as exc:
        return ConvertOutcome(INFRA_ERROR, infra_message(str(exc)))
    session = _Session(warm and policy != "auto")
    try:
        return _convert_repeats(src, dst, report, dtype, policy, target, pass_root, timeout_s, memory_bytes,
                                inputs, tolerance, repeats, repeat_budget_s, policy_, mode, session)
    finally:
        session.close()


class _Session:
    """The sandbox session of one job's conversions: one zygote supervisor (so one sandbox, one import of the
    pass) serves them all; closing it ends the sandbox and every process of the pass with it.  Warm: the
    pass root's long-lived zygote; cold: a one-shot zygote, a fresh interpreter, closed with the session."""

    def __init__(self, warm: bool) -> None:
        import uuid

        self.warm, self.id = warm, uuid.uuid4().hex
        self.zygote: Any = None
        self.one_shot = False

    def zygote_for(self, root: Path, spec: dict[str, Any]) -> Any:
        """The zygote that serves this session (started on first use); ZygoteUnavailable when none can start."""
        from workers.sandbox.zygotes import Zygote, ZygoteUnavailable, zygote_for

        if self.zygote is not None and self.zygote.alive():
            return self.zygote
        self.close()
        if self.warm:
            try:
                self.zygote = zygote_for(root, spec)
                return self.zygote
            except ZygoteUnavailable:
                pass
        self.zygote, self.one_shot = Zygote(root, spec, forked=False), True
        return self.zygote

    def close(self) -> None:
        """End the session: its sandbox and every process of the pass in it are gone when this returns."""
        z, self.zygote = self.zygote, None
        if z is None:
            return
        z.end(self.id)
        if self.one_shot:
            z.close()


def _convert_repeats(src: Path, dst: Path, report: Path, dtype: str, policy: str, target: str,
                     pass_root: Path | None, timeout_s: float, memory_bytes: int, inputs: Path | None,
                     tolerance: str | None, repeats: int, repeat_budget_s: float, policy_: SandboxPolicy,
                     mode: str, session: _Session) -> ConvertOutcome:
    """The body of :func:`convert_in_subprocess`: the first conversion, then the timed repeats."""
    first = _convert_once(src, dst, report, dtype, policy, target, pass_root, timeout_s, memory_bytes,
                          inputs, tolerance, policy_, mode, session)
    if first.status != "ok":
        return first
    first.samples_s = [first.wall_s]
    cpu = [first.cpu_s]
    timed = repeats > 1  # the conversion-time rule compares these samples: pair each with a reference
    scratch = dst.with_name(f".reference-{dst.name}")
    plan = reference_plan(src, dst.with_name(f".reference-src-{dst.name}")) if timed else ReferencePlan(src, 1)
    if timed:
        first.reference_s = [reference_workload(plan.source, scratch, plan.passes)]
    for i in range(1, max(1, repeats)):
        if sum(first.samples_s) > repeat_budget_s:
            break
        r_dst, r_report = dst.with_name(f".repeat{i}-{dst.name}"), report.with_name(f".repeat{i}-{report.name}")
        try:
            again = _convert_once(src, r_dst, r_report, dtype, policy, target, pass_root, timeout_s,
                                  memory_bytes, inputs, tolerance, policy_, mode, session)
        finally:
            for p in (r_dst, r_report, r_dst.with_name(r_dst.name + ".data")):
                p.unlink(missing_ok=True)
        if again.status != "ok":
            break
        first.samples_s.append(again.wall_s)
        cpu.append(again.cpu_s)
        first.reference_s.append(reference_workload(plan.source, scratch, plan.passes))
    scratch.unlink(missing_ok=True)
    if plan.source != src:
        plan.source.unlink(missing_ok=True)
    first.cpu_samples_s = [round(c, 6) for c in cpu if c is not None] if None not in cpu else []
    return first


def prewarm(pass_root: Path | None, sandbox: SandboxPolicy | None = None) -> bool:
    """Start the conversion zygote of ``pass_root`` (default: this checkout) now, as the first warm conversion
    would (same sandbox spec: it is the one that conversion then uses), so that its first supervisor makes the
    sandbox and imports the pass while the caller does something else.  True when a zygote is up; False
    (nothing raised) when none could start -- the conversion then reports why, as it would have."""
    root = Path(pass_root) if pass_root else DEFAULT_PASS_ROOT
    if not (root / "amp_pass").is_dir():
        return False
    from workers.sandbox.zygotes import ZygoteUnavailable, zygote_for

    policy = sandbox or SandboxPolicy()
    try:
        zygote_for(root, spec_for(policy, [root], resolve_mode(policy) == "full"))
    except (ZygoteUnavailable, SandboxUnavailable):
        return False
    return True


def _convert_once(src: Path, dst: Path, report: Path, dtype: str, policy: str, target: str,
                  pass_root: Path | None, timeout_s: float, memory_bytes: int,
                  inputs: Path | None, tolerance: str | None, sandbox: SandboxPolicy,
                  mode: str, session: _Session) -> ConvertOutcome:
    """One conversion in the sandbox of ``session`` (see :func:`convert_in_subprocess`)."""
    from workers.sandbox.zygotes import ZygoteUnavailable

    root = Path(pass_root) if pass_root else DEFAULT_PASS_ROOT
    if not (root / "amp_pass").is_dir():
        return ConvertOutcome("convert_error", f"pass root {root} has no amp_pass package")
    argv = ["convert", str(src), "-o", str(dst), "--dtype", dtype, "--policy", policy, "--target", target,
            "--report", str(report)]
    module, lib, preimport = "amp_pass", [root], ("amp_pass", "amp_pass.cli")
    if policy == "auto":
        from workers.revision.autoconvert import command

        # this checkout's workers drive the search; the revision's amp_pass converts (``--pass-root``)
        argv = command(src, dst, report, dtype, target, root.resolve(), inputs, tolerance)[3:]
        module, lib, preimport = "workers.revision.autoconvert", [DEFAULT_PASS_ROOT, root], ("workers.revision.autoconvert",)
    spec = spec_for(sandbox, lib, mode == "full", preimport)
    for p in (dst, report, dst.with_name(dst.name + ".data")):
        p.unlink(missing_ok=True)
    out_p, err_p = report.with_name(f".{report.name}.stdout"), report.with_name(f".{report.name}.stderr")
    request = {"module": module, "argv": argv, "inputs": [str(src), *([str(inputs)] if inputs else [])],
               "outputs": {str(dst): dst.name, str(dst) + ".data": dst.name + ".data", str(report): report.name},
               "stdout": str(out_p), "stderr": str(err_p), "memory": int(memory_bytes), "session": session.id}
    try:
        try:
            zygote = session.zygote_for(root, spec)
        except ZygoteUnavailable as exc:
            return ConvertOutcome(INFRA_ERROR, infra_message(f"cannot start the pass sandbox: {exc}"), sandbox=mode)
        start = time.perf_counter()
        try:
            ended = zygote.run(request, timeout_s)
        except ZygoteUnavailable as exc:
            return ConvertOutcome(INFRA_ERROR, infra_message(f"the pass sandbox failed: {exc}"), sandbox=mode)
        wall = ended.wall_s if ended.wall_s is not None else time.perf_counter() - start
        err = _tail(err_p)
        if ended.sandbox_error:
            return ConvertOutcome(INFRA_ERROR, infra_message(f"the pass sandbox could not be made: {ended.sandbox_error}"),
                                  sandbox=mode)
        rc = -ended.signal if ended.signal is not None else int(ended.code or 0)
        got = _outcome(rc, err, ended.timed_out, wall, dst, report, timeout_s, memory_bytes, ended.oversized or [])
        if got.status != "ok":
            got.stderr_tail = stderr_tail(redact(err))
        got.cpu_s = ended.cpu_s
        got.sandbox = mode
        return got
    finally:
        for p in (out_p, err_p):
            p.unlink(missing_ok=True)


def _tail(path: Path) -> str:
    """The last :data:`_TAIL` characters of a file the pass wrote (its stderr), read without loading it whole."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4 * _TAIL))
            return fh.read().decode(errors="replace")[-_TAIL:]
    except OSError:
        return ""


def _outcome(rc: int, err: str, timed_out: bool, wall: float, dst: Path, report: Path, timeout_s: float,
             memory_bytes: int, oversized: list[str] | None = None) -> ConvertOutcome:
    """Classify how the pass process ended (``rc < 0``: killed by signal ``-rc``).  What the pass returned is
    data: the report must be a JSON object of at most :data:`MAX_REPORT_BYTES` (:func:`check_report`), outputs
    over the sandbox's size cap were not copied out, and the message is a redacted one-line tail."""
    err = redact(err)
    if timed_out:
        return ConvertOutcome("timeout", f"conversion exceeded its time limit of {timeout_s:g}s and was killed",
                              wall_s=wall, returncode=rc)
    if oversized:
        return ConvertOutcome("convert_error", f"the pass wrote outputs ampci does not take: {', '.join(oversized)}",
                              wall_s=wall, returncode=rc)
    if rc == 0:
        try:
            data = check_report(report)
        except (OSError, ValueError) as exc:
            return ConvertOutcome("convert_error", f"the pass exited 0 but wrote no usable report: "
                                  f"{redact(str(exc))[:300]}", wall_s=wall, returncode=rc)
        if not dst.is_file():
            return ConvertOutcome("convert_error", "the pass exited 0 but wrote no model", wall_s=wall, returncode=rc)
        return ConvertOutcome("ok", "", data, wall, rc)
    tail = err[-_TAIL:]
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        hint = " (memory limit?)" if -rc in (signal.SIGKILL, signal.SIGSEGV) else ""
        return ConvertOutcome("crash", f"pass subprocess killed by {name}{hint}: {_last_line(tail) or 'no output'}",
                              wall_s=wall, returncode=rc)
    if "MemoryError" in tail or "std::bad_alloc" in tail:
        return ConvertOutcome("crash", f"pass ran out of memory (limit {memory_bytes / 2**30:.1f} GiB): "
                              f"{_last_line(tail)}", wall_s=wall, returncode=rc)
    hidden = import_failure_cause(_last_line(tail))  # a dependency the sandbox hid: ampci's failure
    if hidden is not None:
        return ConvertOutcome(INFRA_ERROR, hidden, wall_s=wall, returncode=rc)
    what = "rejected the input" if rc == 2 else f"failed (exit {rc})"
    return ConvertOutcome("convert_error", f"pass {what}: {_last_line(tail) or 'no output'}",
                          wall_s=wall, returncode=rc)


def check_report(path: Path) -> dict[str, Any]:
    """The pass's report as a dict, checked as untrusted data: at most :data:`MAX_REPORT_BYTES`, a JSON object
    whose keys are strings, ``seconds`` (when present) a finite non-negative number.  ValueError otherwise."""
    size = path.stat().st_size
    if size > MAX_REPORT_BYTES:
        raise ValueError(f"report of {size} bytes is over the {MAX_REPORT_BYTES} byte limit")
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise ValueError("report is not a JSON object")
    seconds = data.get("seconds", 0.0)
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                                or not 0 <= seconds < 1e7):
        raise ValueError("report's seconds is not a duration")
    return data
