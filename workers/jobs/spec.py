"""What one job is asked to measure: :class:`JobSpec`, the dtypes and targets a job knows, a target's device kind.

Guarantees: imports neither numpy, onnx nor onnxruntime (the service and :mod:`workers.jobs.confirm` name a job
and its device kind without loading job code); :func:`target_kind` maps a queue of one (``cuda-a100``) to its
device kind and leaves ``cpu``/``cuda`` as they are.  The job (:mod:`workers.jobs.job`) checks a spec's dtype,
target and policy before it runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workers.zoo.manifest import ZooEntry

DTYPES = ("fp16", "bf16")
TARGETS = ("cpu", "cuda")


@dataclass(frozen=True)
class JobSpec:
    """One cell at one revision.  ``pass_root``: a directory whose ``amp_pass`` package the
    conversion subprocess imports first (default: this repository).  ``seed``/``steps`` override
    the zoo entry's input seed and the settings' convergence steps; ``zoo_path`` another manifest
    (default: the built-in zoo merged with the user zoo under ``WorkerConfig.data_dir``); ``entry`` an
    entry to run instead of looking ``model`` up (a model file checked by path)."""

    model: str
    dtype: str
    policy: str = "default"
    target: str = "cpu"
    revision: str | None = None
    pass_root: Path | None = None
    seed: int | None = None
    steps: int | None = None
    zoo_path: Path | None = None
    entry: ZooEntry | None = None


def target_kind(target: str) -> str:
    """The device kind of a job target: ``cpu``/``cuda``, also for a queue of one (``cuda-a100`` -> ``cuda``),
    as ``AMPCI_EXTRA_QUEUES`` and sweeps name them; the cell keeps the queue name."""
    return target.partition("-")[0]
