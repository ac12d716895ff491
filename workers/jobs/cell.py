"""Run one cell at one revision in this process: :func:`run_cell`.

The plain function both execution paths call: the embedded local pool in its worker subprocesses,
and the service's Celery task.  Job code (``workers.jobs.job``, onnxruntime) is imported inside
:func:`run_cell`, never at module import, so a Celery prefork parent that imports this module
initialises no CUDA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.infra import infra_message
from workers.result import INFRA_ERROR, JobResult
from workers.revision.config import WorkerConfig
from workers.revision.git_commands import RevisionError
from workers.revision.revisions import RevisionCache

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_cell(cell: tuple[str, str, str, str], revision: str, config: WorkerConfig,
             options: dict[str, Any] | None = None) -> JobResult:
    """Run one cell with the pass at ``revision`` (a 40-hex sha or a worktree key) in this process.

    Guarantees: returns a JobResult for every job failure (a revision that cannot be checked out is a
    ``bad_spec`` result); the pass is imported from the revision's worktree (``pass_root``), never
    from this process's own copy; the cell's sweep ``options`` (``repeats``, ``timeout``, ``zoo``)
    apply to this job only; the pass repository's token (``config.pass_repo_token``) serves the checkouts
    alone and is dropped before any measurement (:meth:`WorkerConfig.without_credentials`).
    """
    model, dtype, policy, target = cell
    try:
        pass_root = RevisionCache.from_config(config).checkout(revision)
    except RevisionError as exc:
        return JobResult(model=model, dtype=dtype, policy=policy, target=target, status="bad_spec",
                         revision=revision, message=f"revision: {exc}")
    from workers.jobs.job import run_job  # lazy: onnxruntime only in the process that runs jobs
    from workers.jobs.spec import JobSpec
    if not (options or {}).get("confirm"):  # (a confirmation still checks out its baseline: confirm_job)
        config = config.without_credentials()  # the pass is checked out: nothing after this needs the token

    zoo = (options or {}).get("zoo")
    zoo_path = None if not zoo else (Path(zoo) if Path(zoo).is_absolute() else REPO_ROOT / zoo)
    if (options or {}).get("confirm"):
        return confirm_job(cell, revision, pass_root, dict(options["confirm"]), config.for_cell(options), zoo_path)
    spec = JobSpec(model=model, dtype=dtype, policy=policy, target=target, revision=revision,
                   pass_root=pass_root, zoo_path=zoo_path)
    return run_job(spec, config.for_cell(options))


def confirm_job(cell: tuple[str, str, str, str], revision: str, pass_root: Path, confirm: dict[str, Any],
                config: WorkerConfig, zoo_path: Path | None) -> JobResult:
    """A confirmation job (``options["confirm"]`` = ``{"baseline": SHA, "kinds": [...], "pairs": N}``): the
    cell timed at ``confirm["baseline"]`` and at ``revision`` interleaved (:mod:`workers.jobs.confirm`).  Returns a
    ``pass`` result carrying ``confirmation``, or the failure's status and message (never raises)."""
    from workers.jobs.confirm import ConfirmError, confirm_cell

    model, dtype, policy, target = cell
    result = JobResult(model=model, dtype=dtype, policy=policy, target=target, status="pass", revision=revision)
    try:
        base_root = RevisionCache.from_config(config).checkout(str(confirm.get("baseline")))
        config = config.without_credentials()  # both sides are checked out: the timing needs no token
        result.confirmation = confirm_cell(cell, {"baseline": base_root, "candidate": pass_root},
                                           list(confirm.get("kinds") or []), int(confirm.get("pairs") or 1),
                                           config, zoo_path)
        result.confirmation["baseline"] = str(confirm.get("baseline"))
        result.timings["total_s"] = float(result.confirmation.get("seconds", 0.0))
        result.message = f"confirmation against {str(confirm.get('baseline'))[:12]}"
    except RevisionError as exc:
        result.status, result.message = "bad_spec", f"baseline revision: {exc}"
    except ConfirmError as exc:
        result.status, result.message = exc.status, f"confirmation: {exc}"
    except Exception as exc:  # noqa: BLE001 - a worker bug must still end as a result
        result.status = INFRA_ERROR  # the worker's failure, not the pass's (workers.infra)
        result.message = infra_message(f"confirmation: internal worker error: {type(exc).__name__}: {exc}")
    return result
