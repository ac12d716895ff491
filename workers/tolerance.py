"""The per-model accuracy tolerance and the names of the task metrics, without numpy.

The zoo manifest (:mod:`workers.zoo.manifest`) validates entries against these, and ``ampci zoo list``
reads the manifest, so this module imports the standard library only: listing the zoo loads no numpy.
:mod:`workers.measure.metrics` computes the metrics and re-exports :class:`Tolerance`; its ``TASK_METRICS`` has
exactly the names in :data:`TASK_METRIC_NAMES` (tests/service/cli/test_cli_imports.py holds them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Task metrics a zoo entry may declare (``task = "top1"``); :data:`workers.measure.metrics.TASK_METRICS` computes them.
TASK_METRIC_NAMES: tuple[str, ...] = ("top1",)


@dataclass(frozen=True)
class Tolerance:
    """Per-model tolerance.  An output passes when (all of)

    - ``max_abs <= k * baseline_max_abs + atol + rtol * max|ref|`` (the k-rule plus a small tolerance),
    - ``cosine >= min_cosine`` (when the output has more than one element),
    - no NaN/Inf appears that the fp32 reference does not have,
    - the task metric (when declared) is ``>= task_min``.
    """

    atol: float = 1e-3
    rtol: float = 1e-2
    min_cosine: float = 0.999
    task_min: float | None = None
