"""Driving one bisection to its end in this process (embedded mode: no broker).

:func:`bisect_to_end` repeats :func:`service.orchestration.bisection.bisect_step` and runs each midpoint ``bisect``
run on a :class:`service.orchestration.localpool.LocalPool` of this process, waiting for it, until the first bad
commit is found.

Guarantees: this loop is the only driver (the pool does not advance the bisection by itself, so no
midpoint runs twice); with ``parallel`` 1 the number of midpoint runs is at most
``ceil(log2(n))`` for ``n`` commits after the baseline up to the regressed revision, plus one per
commit that could not be judged (it did not build or convert: skipped, as ``git bisect skip``);
a bisect run left queued by an earlier call (``ampci bisect --step``) is run, not waited on forever;
a run still pending after ``timeout`` raises :class:`BisectStuck`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.errors import ServiceError
from service.orchestration.bisection import bisect_step
from service.orchestration.localpool import LocalPool
from service.orchestration.scheduler import wait_for_run
from service.regressions.bisect import BisectState, dedup_key
from service.settings import Settings

if TYPE_CHECKING:
    from service.db.store import Store

Progress = Callable[[str], None]


class BisectStuck(ServiceError):
    """A bisection that cannot go on here (a midpoint run never finishes); exit 1."""

    exit_code = 1


@dataclass(frozen=True)
class BisectOutcome:
    """The final state of a bisection, its midpoint runs (all of them, and those this call ran), and why
    skipped commits were skipped (sha -> the status of their result)."""

    state: BisectState
    midpoints: int
    ran: int
    skip_reasons: dict[str, str]


def bisect_to_end(store: Store, settings: Settings, regression_id: int, parallel: int = 1,
                  workers: int | None = None, progress: Progress | None = None,
                  timeout: float | None = None) -> BisectOutcome:
    """Run the bisection of ``regression_id`` to its first bad commit (see the module docstring)."""
    say = progress or (lambda _line: None)
    timeout = timeout if timeout is not None else 2 * settings.job_timeout + 60
    pool = LocalPool(settings, store, workers=workers or parallel, continue_bisections=False)
    submitted: set[int] = set()
    tested: list[str] = []
    midpoints = 0
    try:
        for _ in range(64):  # far more than log2 of any first-parent path plus skips
            state = bisect_step(store, regression_id, parallel=parallel)
            for sha in tested:
                say(f"  {sha[:12]}: {state.verdicts.get(sha, '?')}{_status_note(store, state, sha)}")
            tested = []
            if state.status == "found":
                ends = _ends(state)
                inner = [sha for sha in state.verdicts if sha not in ends]
                total = sum(1 for sha in inner if store.find_run(dedup_key(sha, state.cell)) is not None)
                return BisectOutcome(state, total, midpoints, {s: _status(store, state, s) for s in state.skipped})
            runs = list(state.queued_runs) if state.status == "queued" else \
                [r.id for r in (store.find_run(dedup_key(s, state.cell)) for s in state.pending) if r is not None]
            say(f"regression {regression_id}: {state.remaining} commit(s) left between {state.good[:12]} (good) "
                f"and {state.bad[:12]} (bad); testing "
                f"{', '.join(store.get_run(r).revision_sha[:12] for r in runs)}")
            for run_id in runs:
                if run_id in submitted:
                    continue
                pool.submit([j for j in store.jobs(run_id) if j.status == "queued"])
                submitted.add(run_id)
                midpoints += 1
            for run_id in runs:
                try:
                    wait_for_run(store, run_id, poll=0.2, timeout=timeout)
                except TimeoutError as exc:
                    raise BisectStuck(f"regression {regression_id}: {exc}") from None
                tested.append(store.get_run(run_id).revision_sha)
        raise BisectStuck(f"regression {regression_id}: bisection did not converge")  # pragma: no cover
    except BaseException:
        pool.cancel()
        raise
    finally:
        pool.close()


def _ends(state: BisectState) -> tuple[str, str]:
    """The baseline and regressed revisions: the first and last commits of the bisected path."""
    shas = list(state.verdicts)
    return shas[0], shas[-1]


def _status(store: Store, state: BisectState, sha: str) -> str:
    run = store.find_run(dedup_key(sha, state.cell))
    results = store.results(run_id=run.id) if run is not None else []
    return results[0].status if results else "no result"


def _status_note(store: Store, state: BisectState, sha: str) -> str:
    status = _status(store, state, sha)
    if state.verdicts.get(sha) == "skip":
        return f" (could not be judged: {status}; skipped)"
    return f" ({status})"
