"""What the worker layer needs to know to run one job: :class:`WorkerConfig`.

The service builds one from its ``Settings`` (:meth:`service.settings.Settings.worker_config`) and
passes it down; ``workers`` never reads the environment or imports the service to get it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.sandbox.policy import SandboxPolicy


def _default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("ampci"))


def _default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("ampci"))


@dataclass(frozen=True)
class WorkerConfig:
    """Limits, sample counts and places of one job.  Immutable; every field has a safe default.

    ``cache_dir``: model zoo, fp32 references and pass worktrees; ``data_dir``: where the user zoo
    (``user_zoo.toml``, merged with the built-in one) lives, as for the service; ``pass_repo``: the git repository
    whose revisions are tested (empty: the run's ``pass_repo_url``, else this checkout); ``pass_repo_url``: the
    clone URL of the repository whose webhook made the run (used when ``pass_repo`` is empty), cloned with
    ``pass_repo_token`` (never in ``repr``; dropped by :meth:`without_credentials` before the job's code runs);
    ``pass_repo_allow_file``: also admit ``file://`` clone URLs (tests, a local mirror); ``convert_timeout``/``convert_memory``: limits of
    the conversion subprocess; ``job_timeout``: the whole job's hard limit; ``latency_runs``/
    ``latency_warmup``: timed and untimed runs per latency measurement; ``convergence_steps``: steps a
    stateful model is rolled forward; ``accuracy_k``: the k of the accuracy rule;
    ``worktree_cache_size``: pass worktrees kept; ``convert_repeats``: conversions per job timed for
    the conversion-time rule (the first one's model is the job's; repeats stop once the conversions
    took more than ~5 s in all, see :func:`workers.revision.convert.convert_in_subprocess`); ``latency_threads``:
    onnxruntime intra-op threads of the timed sessions (0: its default, one per core); ``sandbox*``: the
    pass sandbox's mode and limits (:mod:`workers.sandbox.policy`).  One thread by
    default: with the default pool on two cores a converted/fp32 latency ratio swung 2.4x from session to
    session of one model (0.7-1.7), with one thread 1.02x, so results of one revision are comparable.
    """

    cache_dir: Path = dataclasses.field(default_factory=_default_cache_dir)
    data_dir: Path = dataclasses.field(default_factory=_default_data_dir)
    pass_repo: str = ""
    pass_repo_url: str = ""
    pass_repo_token: str = dataclasses.field(default="", repr=False, compare=False)
    pass_repo_allow_file: bool = False
    convert_timeout: float = 600.0
    convert_memory: int = 8 * 1024**3
    job_timeout: float = 1800.0
    latency_runs: int = 20
    latency_warmup: int = 3
    convergence_steps: int = 64
    accuracy_k: float = 3.0
    worktree_cache_size: int = 8
    convert_repeats: int = 5
    latency_threads: int = 1
    sandbox: str = "auto"             # require | best-effort | auto (workers.sandbox.policy)
    sandbox_max_procs: int = 64
    sandbox_max_file: int = 4 * 1024**3
    sandbox_scratch: int = 8 * 1024**3

    def sandbox_policy(self) -> SandboxPolicy:
        """The pass sandbox of this worker: its mode and limits, hiding the data and cache directories."""
        from workers.sandbox.policy import SandboxPolicy

        return SandboxPolicy(mode=self.sandbox, hide=(str(self.data_dir), str(self.cache_dir)),
                             bytecode_dir=str(Path(self.cache_dir) / "bytecode"),
                             max_procs=self.sandbox_max_procs, max_file_bytes=self.sandbox_max_file,
                             scratch_bytes=self.sandbox_scratch)

    def without_credentials(self) -> WorkerConfig:
        """This config without the pass repository's token (what the rest of a job gets once the pass is
        checked out).  Returns ``self`` when it holds none."""
        return dataclasses.replace(self, pass_repo_token="") if self.pass_repo_token else self

    def for_cell(self, options: dict[str, Any] | None) -> WorkerConfig:
        """This config with a cell's sweep options applied: ``repeats`` -> latency runs, ``timeout`` ->
        conversion time limit (never above the job's hard limit).  Returns ``self`` when nothing changes."""
        options = options or {}
        changes: dict[str, Any] = {}
        if options.get("repeats"):
            changes["latency_runs"] = int(options["repeats"])
        if options.get("timeout"):
            changes["convert_timeout"] = min(float(options["timeout"]), self.job_timeout)
        return dataclasses.replace(self, **changes) if changes else self
