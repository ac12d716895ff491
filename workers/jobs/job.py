"""One regression job end to end: fetch, fp32 reference, convert, accuracy, convergence, latency.

``run_job(spec, config: WorkerConfig) -> JobResult`` never raises for job failures: a bad spec, a bad model,
a failing reference, a crashing/hanging/failing pass, an inaccurate or diverging conversion each
end as a result with its status and a precise message.  An unexpected error in the worker itself
also ends as a result, so a job never takes a worker down: it is ampci's failure, not the pass's (status
``error``, message ``infrastructure: internal worker error: ...``; :mod:`workers.infra`), as is a sandbox that
could not be made or could not import a dependency of the pass.  A ``cuda`` job on a worker without a usable CUDA
device runs nothing: status ``unmeasured`` ("no CUDA device"), never ``pass``.

What a job is asked is a :class:`workers.jobs.spec.JobSpec`; the stateful entries' rollout cache and unjudged
state outputs are :mod:`workers.jobs.stateful`, the tolerance a ``policy auto`` conversion searches against
:mod:`workers.jobs.tolerance_search`.
"""

from __future__ import annotations

import hashlib
import secrets
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from workers.infra import infra_message
from workers.jobs.spec import DTYPES, TARGETS, JobSpec, target_kind
from workers.jobs.stateful import flatten_steps, rollout_step_feeds, state_outputs_not_judged, unflatten_steps
from workers.jobs.tolerance_search import search_tolerance
from workers.measure import reference as refcache
from workers.measure.convergence import loop_convergence, loop_feeds, rollout, stateful_convergence
from workers.measure.emulation_rewrite import EmulationError
from workers.measure.environment import fingerprint
from workers.measure.graph_facts import attach_report, measure_graph
from workers.measure.latency import TIMING_LOCK, latency_error, measure_latency
from workers.measure.metrics import compare_outputs, judge, limits
from workers.measure.runners import EmulatedRunner, Runner, SessionRunner
from workers.measure.sessions import CPU, SessionError, cuda_usable
from workers.result import (
    INFRA_ERROR,
    LATENCY_UNSUPPORTED,
    UNMEASURED,
    AccuracyReport,
    JobResult,
    LatencyStats,
)
from workers.revision.config import WorkerConfig
from workers.revision.convert import DEFAULT_PASS_ROOT, convert_in_subprocess
from workers.revision.external_data import external_locations
from workers.timing import JobClock
from workers.zoo.fetch import fetch_entry
from workers.zoo.inputs import SpecError, check_spec, describe_inputs, feeds_digest, make_feeds, model_inputs
from workers.zoo.manifest import ZooEntry, ZooError, load_zoo
from workers.zoo.registry import FetchError

#: The message of a ``cuda`` job on a worker without a usable CUDA device (status ``unmeasured``).
NO_CUDA = "no CUDA device: this worker has no usable CUDA device, so nothing of the cell was measured"


class JobFailed(Exception):
    """Ends a job early with ``status`` and ``message`` (only raised and caught inside this module), and for
    a failed conversion the pass's stderr tail."""

    def __init__(self, status: str, message: str, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.stderr_tail = status, message, stderr_tail


def run_job(spec: JobSpec, settings: WorkerConfig) -> JobResult:
    """Run one job and return its result (see module doc); never raises for job failures."""
    clock = JobClock()
    result = JobResult(model=spec.model, dtype=spec.dtype, policy=spec.policy, target=spec.target, status="pass",
                       revision=spec.revision)
    pass_root = Path(spec.pass_root) if spec.pass_root else DEFAULT_PASS_ROOT
    job = _Job(spec, settings, result, clock)
    try:
        job.run()
    except JobFailed as failed:
        result.status, result.message, result.stderr_tail = failed.status, failed.message, failed.stderr_tail
    except Exception as exc:  # noqa: BLE001 - a worker bug must still end as a result
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result.status = INFRA_ERROR
        result.message = infra_message(f"internal worker error: {type(exc).__name__}: {exc} "
                                       f"(at {Path(where.filename).name}:{where.lineno})")
    job.close()
    with clock.phase("fingerprint"):
        provider = result.latency.provider if result.latency and result.latency.provider else CPU
        result.environment = fingerprint(provider, pass_root, spec.revision, settings.latency_threads,
                                         job.sandbox)
    result.timings = clock.finish()
    return result


class _Job:
    """The steps of one job, sharing the loaded model, feeds and sessions."""

    def __init__(self, spec: JobSpec, settings: WorkerConfig, result: JobResult, clock: JobClock) -> None:
        self.spec, self.settings, self.result, self.clock = spec, settings, result, clock
        self.cache = refcache.ReferenceCache(Path(settings.cache_dir) / "reference")
        self._fp32: SessionRunner | None = None
        self.emulated: EmulatedRunner | None = None
        self._held: list[Runner] = []  # other sessions of this job, released by close()
        self.sandbox = ""  # how the pass was isolated (set by the conversion)

    def close(self) -> None:
        """Release the job's onnxruntime sessions now (their teardown counts as model execution)."""
        with self.clock.executing():
            self._fp32 = self.emulated = None
            self._held.clear()

    def run(self) -> None:
        self._validate_spec()
        if target_kind(self.spec.target) == "cuda" and not cuda_usable():
            raise JobFailed(UNMEASURED, NO_CUDA)  # nothing of the cell can be measured here: not run at all
        with self.clock.phase("fetch"):
            entry, path, sha = self._fetch()
        with self.clock.phase("load"):
            model, feeds = self._load(entry, path)
        seed = self.spec.seed if self.spec.seed is not None else entry.seed
        self.entry, self.model, self.feeds, self.seed, self.sha = entry, model, feeds, seed, sha
        with self.clock.phase("reference"):
            ref, baseline = self._reference()
        with tempfile.TemporaryDirectory(prefix="ampci-job-") as tmp:
            with self.clock.phase("convert"):
                converted = self._convert(path, Path(tmp), ref, baseline)
            with self.clock.phase("accuracy"):
                self._accuracy(converted, ref, baseline)
            with self.clock.phase("convergence"):
                self._convergence(converted)
            with self.clock.phase("latency"):
                self._latency(converted)
        self._verdict()

    # ------------------------------------------------------------------ steps

    def _validate_spec(self) -> None:
        s = self.spec
        if s.dtype not in DTYPES:
            raise JobFailed("bad_spec", f"unknown dtype {s.dtype!r}; expected one of {', '.join(DTYPES)}")
        if target_kind(s.target) not in TARGETS:
            raise JobFailed("bad_spec", f"unknown target {s.target!r}; expected one of {', '.join(TARGETS)} "
                            "(or a queue of one, e.g. cuda-a100)")
        if not s.policy or not s.policy.strip():
            raise JobFailed("bad_spec", "empty policy name")

    def _fetch(self) -> tuple[ZooEntry, Path, str]:
        try:
            entry = self.spec.entry or load_zoo(self.spec.zoo_path, self.settings.data_dir).get(self.spec.model)
        except ZooError as exc:
            raise JobFailed("bad_spec", str(exc)) from None
        try:  # verified against its sha256 on every use; a changed cache file is fetched or made again
            fetched = fetch_entry(entry, Path(self.settings.cache_dir))
        except FetchError as exc:
            raise JobFailed("bad_model", str(exc)) from None
        self.result.model_sha256 = fetched.sha256
        self.model_path = fetched.path
        return entry, fetched.path, fetched.sha256

    def _load(self, entry: ZooEntry, path: Path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        try:
            self.model_bytes = path.read_bytes()
            model = onnx.load_from_string(self.model_bytes)
            self._check_once(model, str(self.result.model_sha256), full=False)
        except Exception as exc:  # noqa: BLE001 - protobuf/checker raise several types
            raise JobFailed("bad_model", f"{path.name} is not a valid ONNX model: {_line(exc)}") from None
        seed = self.spec.seed if self.spec.seed is not None else entry.seed
        self.result.inputs = describe_inputs(entry, seed)
        try:
            check_spec(entry, model)
            feeds = make_feeds(entry, seed)
        except SpecError as exc:
            raise JobFailed("bad_spec", str(exc)) from None
        outputs = {o.name for o in model.graph.output}
        inputs = model_inputs(model)
        if entry.stateful:
            bad = [f"{i}->{o}" for i, o in entry.stateful.state.items() if i not in inputs or o not in outputs]
            if bad:
                raise JobFailed("bad_spec", f"{entry.name}: stateful map names unknown inputs/outputs: {', '.join(bad)} "
                                f"(inputs {sorted(inputs)}, outputs {sorted(outputs)})")
        if entry.loop and (entry.loop.trip_input not in inputs or entry.loop.output not in outputs):
            raise JobFailed("bad_spec", f"{entry.name}: loop trip input {entry.loop.trip_input!r} or output "
                            f"{entry.loop.output!r} is not in the model")
        return model, feeds

    def fp32(self) -> SessionRunner:
        """The fp32 model on the CPU provider, optimized (created once; failures are reference_error)."""
        if self._fp32 is None:
            try:
                self._fp32 = SessionRunner(self.model_bytes, "cpu", self.clock)
            except SessionError as exc:
                raise JobFailed("reference_error", f"fp32 model does not load in onnxruntime: {exc}") from None
        return self._fp32

    def _run_ref(self, runner: Runner, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return runner(feeds)
        except SessionError as exc:
            raise JobFailed("reference_error", f"fp32 model fails to run: {exc}") from None

    def _reference(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The fp32 reference and baseline outputs, from the cache when there (see :mod:`workers.measure.reference`).

        The model bytes every session of the job runs are checked against the verified sha256 first (the
        file may have changed since it was fetched).  A cached entry is used only if the optimized fp32
        model, run once more on the same feeds, reproduces its ``ref`` outputs, and, when its ``baseline``
        is not within that same bound of ``ref`` (only then could it widen the accuracy bound), the
        unoptimized model run once more reproduces the baseline (:func:`workers.measure.reference.rerun_mismatch`);
        otherwise the job is a ``reference_error`` naming the entry, never a wider tolerance.
        """
        got = hashlib.sha256(self.model_bytes).hexdigest()
        if got != self.sha:
            raise JobFailed("bad_model", f"model file {self.model_path} changed after it was verified: "
                            f"sha256 {got}, expected {self.sha}")
        key = self.cache.key(self.sha, self.seed, feeds_digest(self.feeds), "outputs", refcache.runtime_tag())

        def plain() -> dict[str, np.ndarray]:
            try:
                runner = SessionRunner(self.model_bytes, "cpu", self.clock, optimize=False)
            except SessionError as exc:
                raise JobFailed("reference_error", f"fp32 model does not load unoptimized: {exc}") from None
            return self._run_ref(runner, self.feeds)

        arrays, hit = self.cache.get_or_compute(key, lambda: refcache.join(
            ref=self._run_ref(self.fp32(), self.feeds), baseline=plain()))
        ref, baseline = refcache.split(arrays, "ref"), refcache.split(arrays, "baseline")
        if hit:
            self._check_rerun("fp32 rerun", "reference", key, ref, self._run_ref(self.fp32(), self.feeds))
            if refcache.rerun_mismatch(ref, baseline) is not None:
                self._check_rerun("unoptimized fp32 rerun", "baseline", key, baseline, plain())
        self.clock.timings["reference_cached"] = float(hit)
        return ref, baseline

    def _check_rerun(self, what: str, noun: str, key: str, cached: Mapping[str, np.ndarray],
                     rerun: Mapping[str, np.ndarray]) -> None:
        """``reference_error`` naming the cache entry when a fresh run does not reproduce cached outputs."""
        why = refcache.rerun_mismatch(cached, rerun)
        if why is not None:
            raise JobFailed("reference_error", f"{what} does not reproduce the cached {noun} at "
                            f"{self.cache.path(key)}: {why}")

    def _convert(self, src: Path, tmp: Path, ref: dict[str, np.ndarray],
                 baseline: dict[str, np.ndarray]) -> onnx.ModelProto:
        s = self.spec
        dst, report = tmp / "converted.onnx", tmp / "report.json"
        inputs = tolerance = None
        if s.policy == "auto":  # the accuracy search measures on this job's own inputs, by this job's rule
            inputs = tmp / "inputs.npz"
            np.savez(inputs, **self.feeds)
            tolerance = search_tolerance(self.entry, s.dtype, self.settings.accuracy_k, ref, baseline)
        outcome = convert_in_subprocess(src, dst, report, s.dtype, s.policy, target_kind(s.target), s.pass_root,
                                        self.settings.convert_timeout, self.settings.convert_memory,
                                        inputs=inputs, tolerance=tolerance,
                                        repeats=self.settings.convert_repeats,
                                        sandbox=self.settings.sandbox_policy())
        self.sandbox = outcome.sandbox
        self.clock.timings["convert_subprocess_s"] = outcome.wall_s
        self.clock.timings["convert_repeats_s"] = sum(outcome.samples_s[1:])
        if outcome.status != "ok":
            raise JobFailed(outcome.status, outcome.message, outcome.stderr_tail)
        self.clock.add_exec(float(outcome.report.get("seconds", 0.0) or 0.0))
        try:
            self.converted_bytes = dst.read_bytes()
            converted = onnx.load_from_string(self.converted_bytes)
        except Exception as exc:  # noqa: BLE001
            raise JobFailed("convert_error", f"the pass wrote an unreadable model: {_line(exc)}") from None
        named = external_locations(converted)  # before anything could resolve them against our directory
        if named:
            raise JobFailed("convert_error", "the pass's model names external data outside its output (only the "
                            f"model file is taken): {'; '.join(named[:5])[:500]}")
        self.converted_sha = hashlib.sha256(self.converted_bytes).hexdigest()
        try:  # emulation widens every type to fp32, so it must not be what finds type errors
            self._check_once(converted, self.converted_sha, full=True)
        except Exception as exc:  # noqa: BLE001
            raise JobFailed("convert_error", f"the pass wrote an invalid model: {_line(exc)}") from None
        self.result.graph = attach_report(measure_graph(converted, self.model, s.dtype), outcome.report,
                                          outcome.samples_s or [outcome.wall_s], outcome.reference_s,
                                          outcome.cpu_samples_s)
        have = {o.name for o in converted.graph.output}
        missing = [o.name for o in self.model.graph.output if o.name not in have]
        if missing:
            raise JobFailed("convert_error", f"converted model lost outputs: {', '.join(missing)}")
        return converted

    def _check_once(self, model: onnx.ModelProto, sha256: str, full: bool) -> None:
        """``onnx.checker.check_model``, skipped when a file with this sha256 passed it before (same onnx)."""
        marker = (Path(self.settings.cache_dir) / "checked"
                  / f"{sha256}-onnx{onnx.__version__}{'-full' if full else ''}")
        if marker.exists():
            return
        onnx.checker.check_model(model, full_check=full)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    def _accuracy(self, converted: onnx.ModelProto, ref: dict[str, np.ndarray],
                  baseline: dict[str, np.ndarray]) -> None:
        try:
            self.emulated = EmulatedRunner(self.converted_bytes, self.clock, digest=self.converted_sha)
            got = self.emulated(self.feeds)
        except (EmulationError, SessionError) as exc:
            raise JobFailed("convert_error", f"converted model does not run under emulation: {exc}") from None
        self.result.accuracy = self._report("emulation", self.emulated.provider, ref, got, baseline)
        if cuda_usable():
            self.result.accuracy_cuda = self._cuda_accuracy(ref)

    def _cuda_accuracy(self, ref: dict[str, np.ndarray]) -> AccuracyReport:
        try:
            conv = SessionRunner(self.converted_bytes, "cuda", self.clock)
            self._held.append(conv)
            fp32 = SessionRunner(self.model_bytes, "cuda", self.clock)
            self._held.append(fp32)
            got, base = conv(self.feeds), fp32(self.feeds)
        except SessionError as exc:
            return AccuracyReport(mode="cuda", provider="CUDAExecutionProvider", passed=False,
                                  reason=f"converted model fails on CUDA: {exc}")
        return self._report("cuda", conv.provider, ref, got, base)

    def _report(self, mode: str, provider: str, ref: dict[str, np.ndarray], got: dict[str, np.ndarray],
                baseline: dict[str, np.ndarray]) -> AccuracyReport:
        e = self.entry
        per, worst = compare_outputs(ref, got, baseline, e.task, e.task_outputs)
        not_judged = state_outputs_not_judged(e, per)
        judged = {k: v for k, v in per.items() if k not in not_judged}
        tol = e.tolerance_for(self.spec.dtype)
        passed, reason = judge(judged, ref, tol, self.settings.accuracy_k)
        return AccuracyReport(mode=mode, provider=provider, per_output=per, worst=worst, passed=passed,
                              reason=reason, not_judged=not_judged,
                              limits=limits(judged, ref, tol, self.settings.accuracy_k))

    def _convergence(self, converted: onnx.ModelProto) -> None:
        e = self.entry
        if not (e.stateful or e.loop):
            return
        steps = self.spec.steps or e.steps_configured or self.settings.convergence_steps
        digest = feeds_digest(self.feeds)
        extra = f"{steps}|{refcache.runtime_tag()}"
        try:
            if e.stateful:
                key = self.cache.key(self.sha, self.seed, digest, "rollout", extra)
                arrays, hit = self.cache.get_or_compute(key, lambda: flatten_steps(
                    rollout(lambda f: self._run_ref(self.fp32(), f), e, self.seed, steps)))
                ref_steps = unflatten_steps(arrays, steps)
                if hit:  # rerun the first step and one other, each from the cached state before it
                    for t in sorted({0, 1 + secrets.randbelow(steps - 1) if steps > 1 else 0}):
                        feeds = rollout_step_feeds(e, self.seed, ref_steps, t)
                        self._check_rerun("fp32 rerun", f"reference (step {t})", key, ref_steps[t],
                                          self._run_ref(self.fp32(), feeds))
                self.result.convergence = stateful_convergence(ref_steps, self.emulated, e, self.seed)
            else:
                feeds = loop_feeds(e, self.seed, steps)
                key = self.cache.key(self.sha, self.seed, digest, "loop", extra)
                ref, hit = self.cache.get_or_compute(key, lambda: self._run_ref(self.fp32(), feeds))
                if hit:
                    self._check_rerun("fp32 rerun", "reference", key, ref, self._run_ref(self.fp32(), feeds))
                self.result.convergence = loop_convergence(ref, self.emulated(feeds), e)
        except SessionError as exc:
            raise JobFailed("convert_error", f"converted model fails during the convergence rollout: {exc}") from None

    def _latency(self, converted: onnx.ModelProto) -> None:
        target = target_kind(self.spec.target)
        provider = "CUDAExecutionProvider" if target == "cuda" else CPU
        threads = self.settings.latency_threads
        try:
            conv = SessionRunner(self.converted_bytes, target, self.clock, intra_op_threads=threads)
            self._held.append(conv)
            fp32 = self.fp32() if target == "cpu" and not threads else \
                SessionRunner(self.model_bytes, target, self.clock, intra_op_threads=threads)
            self._held.append(fp32)
            self.result.latency = measure_latency(conv, fp32, self.feeds, self.settings.latency_runs,
                                                  self.settings.latency_warmup,
                                                  lock_file=Path(self.settings.cache_dir) / TIMING_LOCK)
        except SessionError as exc:
            self.result.latency = LatencyStats(provider=provider, error=latency_error(exc, target, self.spec.dtype))

    def _verdict(self) -> None:
        r = self.result
        failed = [a for a in (r.accuracy, r.accuracy_cuda) if a is not None and not a.passed]
        if failed:
            r.status = "fail_accuracy"
            r.message = "; ".join(f"{a.mode}: {a.reason}" for a in failed)
        elif r.convergence is not None and r.convergence.diverged:
            r.status, r.message = "diverged", r.convergence.reason
        else:
            r.status = "pass"
        if r.latency is not None and r.latency.error and not r.latency.error.startswith(LATENCY_UNSUPPORTED):
            r.message = f"{r.message}; latency: {r.latency.error}" if r.message else f"latency: {r.latency.error}"


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"
