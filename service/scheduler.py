"""The scheduler: sweep configs, their expansion into cells, runs, and dispatch of their jobs.

A **sweep** (TOML under ``sweeps/``) names models (zoo names or ``tag:NAME``), dtypes, policies,
targets, ``repeats`` and per-cell overrides.  :func:`start_sweep` expands it for one pass revision,
creates the run and its job rows in the store, and dispatches the jobs:

* **embedded** (no ``AMPCI_BROKER_URL``): on a local pool of worker subprocesses in this process
  (:class:`LocalPool`), bounded by the CPU count; results go to SQLite unless
  ``AMPCI_DATABASE_URL`` says otherwise;
* **distributed**: one Celery message per job to the queue of its target.

This module never imports onnxruntime: job code runs only in worker (sub)processes.
"""

from __future__ import annotations

import fnmatch
import json
import multiprocessing
import os
import queue
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from service.errors import UserError
from service.settings import Settings, parse_duration

SWEEPS_DIR = Path(__file__).resolve().parents[1] / "sweeps"
DTYPES = ("fp16", "bf16")
_KEYS = {"name", "description", "models", "dtypes", "policies", "targets", "repeats", "zoo", "override"}
_MATCH_KEYS = ("model", "dtype", "policy", "target")


class SweepConfigError(UserError):
    """A sweep config file is missing, malformed or names something that does not exist."""


@dataclass(frozen=True)
class Override:
    """Per-cell settings: applies to cells whose fields equal every given ``match`` value (globs ok)."""

    match: Mapping[str, str]
    skip: bool = False
    repeats: int | None = None
    timeout: float | None = None

    def applies(self, cell: tuple[str, str, str, str]) -> bool:
        """True when every given match key equals (or glob-matches) the cell's value."""
        values = dict(zip(_MATCH_KEYS, cell, strict=True))
        return all(fnmatch.fnmatchcase(values[k], v) for k, v in self.match.items())


@dataclass(frozen=True)
class PlannedCell:
    """One cell of a sweep with its effective options (what a job of it will be run with)."""

    model: str
    dtype: str
    policy: str
    target: str
    repeats: int
    timeout: float | None = None
    zoo: str | None = None

    @property
    def cell(self) -> tuple[str, str, str, str]:
        """(model, dtype, policy, target)."""
        return (self.model, self.dtype, self.policy, self.target)

    def options(self) -> dict[str, Any]:
        """The per-job options stored in the run's meta (JSON-ready)."""
        return {"repeats": self.repeats, "timeout": self.timeout, "zoo": self.zoo}


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep.  Guarantees: non-empty axes, known dtypes, valid queue-name targets."""

    name: str
    models: tuple[str, ...]
    dtypes: tuple[str, ...]
    policies: tuple[str, ...]
    targets: tuple[str, ...]
    repeats: int = 20
    description: str = ""
    overrides: tuple[Override, ...] = field(default_factory=tuple)
    zoo: str | None = None  # another zoo manifest (absolute, or relative to the repository root)

    def zoo_path(self) -> Path | None:
        """The manifest this sweep's models come from (None: the default ``zoo.toml``)."""
        if self.zoo is None:
            return None
        path = Path(self.zoo)
        return path if path.is_absolute() else SWEEPS_DIR.parent / path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<sweep>") -> SweepConfig:
        """Validate a parsed TOML table; every problem is a one-line SweepConfigError naming ``source``."""
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise SweepConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; expected {sorted(_KEYS)}")

        def names(key: str) -> tuple[str, ...]:
            raw = data.get(key)
            if not isinstance(raw, list) or not raw or not all(isinstance(x, str) and x for x in raw):
                raise SweepConfigError(f"{source}: {key!r} must be a non-empty list of strings")
            return tuple(dict.fromkeys(raw))

        name = data.get("name", Path(source).stem)
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise SweepConfigError(f"{source}: 'name' must be a simple identifier, got {name!r}")
        dtypes = names("dtypes")
        bad = [d for d in dtypes if d not in DTYPES]
        if bad:
            raise SweepConfigError(f"{source}: unknown dtype(s) {bad}; expected {list(DTYPES)}")
        targets = names("targets")
        for t in targets:
            if not t.replace("-", "").replace("_", "").isalnum():
                raise SweepConfigError(f"{source}: target {t!r} is not a valid queue name")
        repeats = _positive_int(data.get("repeats", 20), f"{source}: 'repeats'")
        raw_overrides = data.get("override", [])
        if not isinstance(raw_overrides, list):
            raise SweepConfigError(f"{source}: 'override' must be an array of tables ([[override]])")
        overrides = tuple(_override(o, f"{source}: override #{i + 1}") for i, o in enumerate(raw_overrides))
        zoo = data.get("zoo")
        if zoo is not None and (not isinstance(zoo, str) or not zoo):
            raise SweepConfigError(f"{source}: 'zoo' must be a manifest path")
        return cls(name=name, models=names("models"), dtypes=dtypes, policies=names("policies"),
                   targets=targets, repeats=repeats, description=str(data.get("description", "")),
                   overrides=overrides, zoo=zoo)

    @classmethod
    def from_file(cls, path: Path) -> SweepConfig:
        """Load and validate a sweep TOML file."""
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SweepConfigError(f"sweep config {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SweepConfigError(f"cannot read sweep config {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SweepConfigError(f"{path}: invalid TOML: {exc}") from None
        return cls.from_dict(data, str(path))

    def expand(self, catalog: Mapping[str, Iterable[str]]) -> list[PlannedCell]:
        """Cells of this sweep over ``catalog`` (zoo model name -> tags), overrides applied, sorted.

        ``tag:*`` selects every model.  A name or tag that selects nothing is an error, so a typo
        cannot silently shrink a nightly sweep.
        """
        tags = {name: set(t) for name, t in catalog.items()}
        chosen: dict[str, None] = {}
        for sel in self.models:
            if sel.startswith("tag:"):
                tag = sel[4:]
                hits = [n for n in sorted(tags) if tag == "*" or tag in tags[n]]
                if not hits:
                    raise SweepConfigError(f"sweep {self.name}: no zoo model has tag {tag!r}")
            elif sel in tags:
                hits = [sel]
            else:
                raise SweepConfigError(f"sweep {self.name}: unknown zoo model {sel!r}; "
                                       f"known: {', '.join(sorted(tags)) or '(none)'}")
            chosen.update(dict.fromkeys(hits))
        cells: list[PlannedCell] = []
        for model in chosen:
            for dtype in self.dtypes:
                for policy in self.policies:
                    for target in self.targets:
                        cell = (model, dtype, policy, target)
                        repeats, timeout, skip = self.repeats, None, False
                        for o in self.overrides:
                            if o.applies(cell):
                                skip = o.skip or skip
                                repeats = o.repeats if o.repeats is not None else repeats
                                timeout = o.timeout if o.timeout is not None else timeout
                        if not skip:
                            cells.append(PlannedCell(*cell, repeats=repeats, timeout=timeout, zoo=self.zoo))
        if not cells:
            raise SweepConfigError(f"sweep {self.name}: every cell is skipped; nothing to run")
        return sorted(cells, key=lambda c: c.cell)


def _positive_int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SweepConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


def _override(raw: Any, what: str) -> Override:
    if not isinstance(raw, dict):
        raise SweepConfigError(f"{what}: must be a table")
    unknown = sorted(set(raw) - {"match", "skip", "repeats", "timeout"})
    if unknown:
        raise SweepConfigError(f"{what}: unknown key(s) {', '.join(unknown)}")
    match = raw.get("match", {})
    if not isinstance(match, dict) or set(match) - set(_MATCH_KEYS) or \
            not all(isinstance(v, str) for v in match.values()):
        raise SweepConfigError(f"{what}: 'match' must be a table with string values for {_MATCH_KEYS}")
    skip = raw.get("skip", False)
    if not isinstance(skip, bool):
        raise SweepConfigError(f"{what}: 'skip' must be true or false")
    repeats = _positive_int(raw["repeats"], f"{what}: 'repeats'") if "repeats" in raw else None
    timeout = None
    if "timeout" in raw:
        try:
            timeout = parse_duration(f"{what}: 'timeout'", str(raw["timeout"]))
        except UserError as exc:
            raise SweepConfigError(str(exc)) from None
    return Override(match=dict(match), skip=skip, repeats=repeats, timeout=timeout)


def load_sweep(config: str | Path | None = None, sweep: str | None = None) -> SweepConfig:
    """The sweep from ``config`` (a file) or the named built-in sweep (``sweeps/<name>.toml``)."""
    if config is not None:
        return SweepConfig.from_file(Path(config))
    name = sweep or "smoke"
    path = SWEEPS_DIR / f"{name}.toml"
    if not name.replace("-", "").replace("_", "").isalnum() or not path.exists():
        known = sorted(p.stem for p in SWEEPS_DIR.glob("*.toml"))
        raise SweepConfigError(f"unknown sweep {name!r}; known: {', '.join(known)}")
    return SweepConfig.from_file(path)


def nightly_dedup_key(day: date, sweep: str) -> str:
    """The run dedup key that makes a nightly sweep happen at most once per (UTC date, sweep)."""
    return f"nightly:{day.isoformat()}:{sweep}"


ProgressCallback = Callable[[Mapping[str, int]], None]


# -- runs -------------------------------------------------------------------------------------------
FINAL_JOB_STATUSES = frozenset({"done", "error", "crashed", "cancelled"})
PENDING_JOB_STATUSES = frozenset({"queued", "running"})


@dataclass(frozen=True)
class StartedRun:
    """A run that exists in the store with its jobs dispatched (or found by its dedup key)."""

    run_id: int
    revision: str
    baseline: str | None
    cells: int
    created: bool
    pool: Any = None  # the embedded LocalPool running its jobs, if any


_MIGRATE_LOCK = threading.Lock()


def open_store(settings: Settings) -> Any:
    """The Store of ``settings`` with its schema at head (migrated on first use; thread-safe)."""
    from service.db import migrate
    from service.db.store import Store, thresholds_from_settings

    url = settings.effective_database_url
    store = Store.from_url(url, thresholds=thresholds_from_settings(settings))
    with _MIGRATE_LOCK:  # Alembic's command API keeps module-global state
        if migrate.current(url) != migrate.head():
            store.upgrade()
    return store


def zoo_catalog(path: Path | None = None) -> dict[str, frozenset[str]]:
    """Zoo model name -> tags, from a manifest (default ``zoo.toml``); fetches nothing, no onnxruntime."""
    from workers.zoo.manifest import load_zoo

    return {name: frozenset(entry.tags) for name, entry in load_zoo(path).entries.items()}


def run_meta(cells: Iterable[PlannedCell], requested_revision: str) -> dict[str, Any]:
    """Run meta holding the cells' options compactly: the most common options once
    (``cell_defaults``) and, under ``options``, only the cells that differ from them."""
    cells = list(cells)
    counts: dict[str, int] = {}
    for c in cells:
        key = json.dumps(c.options(), sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
    defaults = json.loads(max(counts, key=counts.__getitem__)) if counts else {}
    return {"cell_defaults": defaults, "requested_revision": requested_revision,
            "options": {"|".join(c.cell): c.options() for c in cells if c.options() != defaults}}


def cell_options(run: Any, cell: tuple[str, str, str, str]) -> dict[str, Any]:
    """The sweep options stored in ``run.meta`` for ``cell`` ({} when the run has none)."""
    meta = run.meta or {}
    return dict(meta.get("options", {}).get("|".join(cell), meta.get("cell_defaults", {})))


def record_result(store: Any, run: Any, job: Any, result: Any) -> str:
    """Write ``result`` for ``job`` (idempotent on (run, cell)); return the job's final status."""
    if result.cell != job.cell:  # a job runner returning another cell's result is our bug
        raise RuntimeError(f"job {job.id} is {job.cell} but its result is for {result.cell}")
    store.write_result(run.id, result, job_id=job.id)
    return "crashed" if result.status == "crashed" else "done"


def record_crashed(store: Any, run: Any, job: Any, attempts: int) -> str:
    """Mark a poison job: a ``crashed`` result and job status, saying how often it was delivered."""
    from workers.result import JobResult

    msg = f"worker died on every one of {attempts - 1} attempts; not retried"
    result = JobResult(model=job.model, dtype=job.dtype, policy=job.policy, target=job.target,
                       status="crashed", revision=run.revision_sha, message=msg)
    store.write_result(run.id, result, job_id=job.id)
    store.mark_job(job.id, "crashed", msg)
    return "crashed"


def finish_if_complete(store: Any, run_id: int) -> bool:
    """If no job of the run is pending: finish the run and detect its regressions (both idempotent)."""
    counts = store.run_summary(run_id).job_status
    if any(counts.get(s) for s in PENDING_JOB_STATUSES):
        return False
    store.finish_run(run_id)
    store.detect_regressions(run_id)
    return True


def _describe_revision(settings: Settings, revision: str) -> tuple[str, str | None, dict[str, Any]]:
    """(sha-or-worktree-key, baseline, revision fields) for ``REV`` or ``WORKTREE``."""
    from workers import revisions as rv

    cache = rv.RevisionCache.from_settings(settings)
    if revision == rv.WORKTREE:
        local = Path(settings.pass_repo) if settings.pass_repo and Path(settings.pass_repo).is_dir() \
            else Path(rv.default_pass_repo())
        key = cache.snapshot(local)
        try:
            head = rv.git(["rev-parse", "--verify", "HEAD^{commit}"], cwd=local).strip()
        except rv.RevisionError:
            head = ""
        base = head if rv.SHA_RE.match(head) else None
        return key, base, {"parents": [base] if base else [], "branch": rv.WORKTREE,
                           "message": f"uncommitted working tree of {local}"}
    sha = cache.resolve(revision)
    cache.checkout(sha)  # fetches it; fails early for an unknown commit
    info = rv.describe(cache, sha)
    parents = list(info["parents"])  # type: ignore[arg-type]
    return sha, (parents[0] if parents else None), info


def start_sweep(settings: Settings, config: SweepConfig, revision: str = "WORKTREE", *,
                trigger: str = "manual", baseline: str | None = None, dedup_key: str | None = None,
                store: Any = None, catalog: Mapping[str, Iterable[str]] | None = None,
                local_workers: int | None = None) -> StartedRun:
    """Create the run of ``config`` at ``revision`` and dispatch its jobs; return without waiting.

    Guarantees: the run and all its job rows are committed before the first job is dispatched;
    a ``dedup_key`` that already has a run dispatches nothing (``created`` False); embedded mode
    (no broker) starts a :class:`LocalPool` in this process (call ``pool.close()`` when done),
    distributed mode sends one Celery message per job to the queue named by its target.
    """
    store = store if store is not None else open_store(settings)
    cells = config.expand(catalog if catalog is not None else zoo_catalog(config.zoo_path()))
    sha, parent, info = _describe_revision(settings, revision)
    store.upsert_revision(sha, parents=info.get("parents", []), branch=info.get("branch"),
                          author=info.get("author"), message=info.get("message"))
    base = baseline or parent
    meta = run_meta(cells, revision)
    run_id, created = store.create_run_if_new(sha, trigger, base, config.name, [c.cell for c in cells],
                                              dedup_key, meta)
    if not created:
        return StartedRun(run_id, sha, base, len(cells), created=False)
    jobs = store.jobs(run_id)
    pool = None
    if settings.embedded:
        pool = LocalPool(settings, store, workers=local_workers)
        pool.submit(jobs)
    else:
        enqueue(settings, sha, jobs)
    return StartedRun(run_id, sha, base, len(cells), created=True, pool=pool)


def start_nightly(settings: Settings, sweep: str = "full", day: date | None = None,
                  ref: str = "HEAD") -> int | None:
    """Start the nightly ``sweep`` of the pass repository's ``ref``; at most once per (UTC date, sweep).

    Returns the new run's id, or None when that date's nightly run of this sweep already exists
    (a second beat instance or a restart).  The baseline is the previous nightly run's revision.
    """
    from datetime import UTC, datetime

    day = day or datetime.now(UTC).date()
    store = open_store(settings)
    previous = store.list_runs(limit=1, trigger="nightly")
    baseline = previous[0].revision_sha if previous else None
    started = start_sweep(settings, load_sweep(sweep=sweep), ref, trigger="nightly", baseline=baseline,
                          dedup_key=nightly_dedup_key(day, sweep), store=store)
    if started.pool is not None:  # embedded beat: run it here
        wait_for_run(store, started.run_id)
        started.pool.close()
    return started.run_id if started.created else None


_CELERY_APPS: dict[tuple[int, Settings], Any] = {}
_CELERY_APPS_LOCK = threading.Lock()


def celery_app(settings: Settings) -> Any:
    """The Celery app for ``settings``, built once per process and reused (thread-safe).

    Building one costs tens of milliseconds and its producer pool is what makes repeated sends
    cheap; settings are immutable, so one app per distinct ``Settings`` value is exact.  Keyed by
    process id too: a forked child (prefork worker) builds its own instead of sharing the
    parent's broker connections.
    """
    key = (os.getpid(), settings)
    app = _CELERY_APPS.get(key)
    if app is None:
        from workers.celery_app import make_app

        with _CELERY_APPS_LOCK:
            app = _CELERY_APPS.get(key)
            if app is None:
                app = _CELERY_APPS[key] = make_app(settings)
    return app


def enqueue(settings: Settings, revision: str, jobs: Iterable[Any], app: Any = None) -> int:
    """Send one ``ampci.run_job`` message per job to the queue of its target; return how many.

    ``app`` is the Celery app to send with (default: :func:`celery_app` of ``settings``, cached
    per process); all messages of one call share one producer (one broker connection).
    """
    from workers.celery_app import RUN_JOB_TASK

    app = app if app is not None else celery_app(settings)
    n = 0
    with app.producer_or_acquire() as producer:
        for job in jobs:
            app.send_task(RUN_JOB_TASK, args=[job.id, revision], queue=job.target, producer=producer)
            n += 1
    return n


def wait_for_run(store: Any, run_id: int, on_progress: ProgressCallback | None = None,
                 poll: float = 0.5, timeout: float | None = None) -> Any:
    """Block until no job of the run is pending, then finish it; return its final RunInfo.

    ``on_progress`` gets the job counts by status after every poll.  Raises TimeoutError after
    ``timeout`` seconds (the run is left as it is; workers keep going).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        counts: dict[str, int] = {}
        for job in store.jobs(run_id):
            counts[job.status] = counts.get(job.status, 0) + 1
        if on_progress is not None:
            on_progress(counts)
        if not any(counts.get(s) for s in PENDING_JOB_STATUSES):
            finish_if_complete(store, run_id)
            return store.get_run(run_id)
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still has pending jobs after {timeout:.0f}s")
        time.sleep(poll)


# -- the embedded local pool ------------------------------------------------------------------------
def _slot_main(conn: Any) -> None:
    """Body of one local worker subprocess: run requested cells one at a time until told to stop."""
    from workers.tasks import run_cell  # the only place the service side reaches job code

    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        cell, revision, settings, options = request
        conn.send(run_cell(tuple(cell), revision, settings, options).to_json())


class _SlotDied(Exception):
    pass


class _Slot:
    """One worker subprocess (spawned, so the parent's threads and sockets are not inherited)."""

    def __init__(self) -> None:
        self.proc: Any = None
        self.conn: Any = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        proc = ctx.Process(target=_slot_main, args=(child,), daemon=True, name="ampci-local-worker")
        proc.start()
        self.proc = proc  # only once it has a pid
        child.close()

    def run(self, request: tuple[Any, ...], timeout: float) -> str | None:
        """Result JSON, or None on timeout (the subprocess is killed); _SlotDied if it died."""
        if self.proc is None or not self.proc.is_alive():
            self._start()
        try:
            self.conn.send(request)
            if self.conn.poll(timeout):
                return str(self.conn.recv())
        except (EOFError, OSError, BrokenPipeError):
            self.stop(kill=True)
            raise _SlotDied() from None
        self.stop(kill=True)
        return None

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        try:
            if not kill:
                self.conn.send(None)
                self.proc.join(5)
        except (OSError, BrokenPipeError):
            pass
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()
        self.proc = self.conn = None


class LocalPool:
    """Runs jobs in ``workers`` local subprocesses (default: CPU count), recording like a Celery worker.

    Guarantees: the same attempt counting as distributed mode (a job whose subprocess dies is
    retried; past ``max_attempts`` it ends ``crashed``, without touching other jobs); a job running
    past ``job_timeout`` gets a ``timeout`` result; this process writes every result (one writer,
    so SQLite is fine) and finishes the run after its last job.
    """

    def __init__(self, settings: Settings, store: Any, workers: int | None = None) -> None:
        self.settings = settings
        self.store = store
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._slots: list[_Slot] = []
        self._cancelled = threading.Event()
        self.errors: list[BaseException] = []

    def submit(self, jobs: Iterable[Any]) -> None:
        """Queue jobs and start up to ``workers`` subprocesses for them."""
        jobs = list(jobs)
        for job in jobs:
            self._queue.put(job)
        while len(self._threads) < min(self.workers, max(1, len(jobs))):
            slot = _Slot()
            t = threading.Thread(target=self._loop, args=(slot, len(self._threads)), daemon=True)
            self._slots.append(slot)
            self._threads.append(t)
            t.start()

    def _loop(self, slot: _Slot, index: int) -> None:
        name = f"local-{os.getpid()}-{index}"
        while not self._cancelled.is_set():
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                self._run_one(slot, job, name)
            except BaseException as exc:  # noqa: BLE001 - keep the pool alive, report at the end
                self.errors.append(exc)
                self.store.mark_job(job.id, "error", f"{type(exc).__name__}: {exc}")

    def _run_one(self, slot: _Slot, job: Any, worker: str) -> None:
        from workers.result import JobResult

        run = self.store.get_run(job.run_id)
        while True:
            attempts = self.store.start_attempt(job.id, worker)
            if attempts > self.settings.max_attempts:
                record_crashed(self.store, run, job, attempts)
                break
            request = (job.cell, run.revision_sha, self.settings, cell_options(run, job.cell))
            try:
                text = slot.run(request, timeout=self.settings.job_timeout)
            except _SlotDied:
                if self._cancelled.is_set():
                    self.store.mark_job(job.id, "cancelled", "sweep interrupted")
                    break
                continue
            if text is None:
                result = JobResult(model=job.model, dtype=job.dtype, policy=job.policy, target=job.target,
                                   status="timeout", revision=run.revision_sha,
                                   message=f"job exceeded {self.settings.job_timeout:.0f}s; worker killed")
            else:
                result = JobResult.from_json(text)
            record_result(self.store, run, job, result)
            break
        finish_if_complete(self.store, run.id)

    def close(self) -> None:
        """Wait for the queued jobs' threads and stop every subprocess."""
        for t in self._threads:
            t.join()
        for slot in self._slots:
            slot.stop()

    def cancel(self) -> None:
        """Stop now (e.g. Ctrl-C): kill the subprocesses, mark unfinished jobs ``cancelled``, finish the run."""
        self._cancelled.set()
        run_ids = set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            run_ids.add(job.run_id)
            self.store.mark_job(job.id, "cancelled", "sweep interrupted")
        for slot in list(self._slots):  # the running threads see EOF and mark their jobs cancelled
            proc = slot.proc
            if proc is not None and proc.is_alive():
                proc.kill()
        for t in self._threads:
            t.join(30)
        for slot in self._slots:
            slot.stop(kill=True)
        for run_id in run_ids:
            finish_if_complete(self.store, run_id)
