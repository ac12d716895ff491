"""Run one cell at one revision in this process: :func:`run_cell`.

The plain function both execution paths call: the embedded local pool in its worker subprocesses,
and the service's Celery task.  Job code (``workers.job``, onnxruntime) is imported inside
:func:`run_cell`, never at module import, so a Celery prefork parent that imports this module
initialises no CUDA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.config import WorkerConfig
from workers.result import JobResult
from workers.revisions import RevisionCache, RevisionError

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_cell(cell: tuple[str, str, str, str], revision: str, config: WorkerConfig,
             options: dict[str, Any] | None = None) -> JobResult:
    """Run one cell with the pass at ``revision`` (a 40-hex sha or a worktree key) in this process.

    Guarantees: returns a JobResult for every job failure (a revision that cannot be checked out is a
    ``bad_spec`` result); the pass is imported from the revision's worktree (``pass_root``), never
    from this process's own copy; the cell's sweep ``options`` (``repeats``, ``timeout``, ``zoo``)
    apply to this job only.
    """
    model, dtype, policy, target = cell
    try:
        pass_root = RevisionCache.from_config(config).checkout(revision)
    except RevisionError as exc:
        return JobResult(model=model, dtype=dtype, policy=policy, target=target, status="bad_spec",
                         revision=revision, message=f"revision: {exc}")
    from workers.job import JobSpec, run_job  # lazy: onnxruntime only in the process that runs jobs

    zoo = (options or {}).get("zoo")
    zoo_path = None if not zoo else (Path(zoo) if Path(zoo).is_absolute() else REPO_ROOT / zoo)
    spec = JobSpec(model=model, dtype=dtype, policy=policy, target=target, revision=revision,
                   pass_root=pass_root, zoo_path=zoo_path)
    return run_job(spec, config.for_cell(options))
