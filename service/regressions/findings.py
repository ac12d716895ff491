"""What every finding kind shares: the sample of one result a rule reads (:class:`CellSample`), the finding a
rule returns (:class:`Finding`), and the vocabulary of categories and confirmation states.  Pure data, no rule:
the rules live with their kinds (:mod:`service.regressions.kinds`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from workers.result import CONVERGENCE_ERROR_UNIT, CONVERSION_OK_STATUSES

#: Statuses that blame the pass under test (conversion failed, hung or died).
PASS_FAULT_STATUSES = frozenset({"convert_error", "timeout", "crash"})
#: The categories a stored finding can have, the one source of truth every rendering (dashboard, CLI, commit
#: status, API) is tested against: ``regression`` fails the gate; ``improvement`` and ``flaky`` never do.
CATEGORIES = ("regression", "improvement", "flaky")
#: Finding states of confirmation (``regressions.state``, beside open/acknowledged/resolved/false_positive):
#: ``suspected`` awaits its confirmation run, ``dismissed`` was not confirmed by it (kept, never a gate failure);
#: ``suspected_resolved``: an open or acknowledged timing regression that a later run no longer shows, until a
#: confirmation run times its regressed revision against that run's interleaved (then ``resolved``, or back
#: to the state it had: :mod:`service.regressions.confirm`).
CONFIRMATION_STATES = ("suspected", "dismissed", "suspected_resolved")
#: ``state_by`` of a ``suspected`` finding that its run's confirmation left out because a cap was reached (the
#: cells per run, or the pull request's budget: :mod:`service.regressions.confirm_caps`): it stays suspected
#: for good, never fails the gate, and the verdict counts it as :data:`CAPPED_LABEL`, never as a pass.
CAPPED_BY = "ampci-confirm-cap"
CAPPED_LABEL = "not confirmed (cap)"
#: What the verdict calls a suspected timing *improvement* a cap left out: never a gain, and (unlike
#: :data:`CAPPED_LABEL`) no reason to withhold "no regressions".
CAPPED_GAIN_LABEL = "improvement not confirmed (cap)"
#: ``regressions.state`` of an accuracy or convergence improvement on a cell whose coverage regressed in the same
#: comparison (a kind whose ``explained_by_coverage`` is set): less computed in low precision is less rounding, not a better pass, so it
#: is recorded with the coverage loss in its note and counted nowhere as an improvement.
EXPLAINED = "explained"


@dataclass(frozen=True)
class CellSample:
    """What the rules need of one result of a cell (built from a stored row or a JobResult)."""

    status: str
    max_abs: float | None = None
    cosine: float | None = None
    final_error: float | None = None
    diverged: bool | None = None
    low_precision_fraction: float | None = None
    casts_inserted: int | None = None
    latency_samples: tuple[float, ...] = ()
    fp32_latency_samples: tuple[float, ...] = ()  # the fp32 model timed interleaved with latency_samples
    # the same blocks' CPU time of the timing thread (ms; workers.measure.latency), paired like the wall-time samples;
    # empty where CPU time is not the model's work (CUDA, thread pools) and in results stored before
    cpu_latency_samples: tuple[float, ...] = ()
    fp32_cpu_latency_samples: tuple[float, ...] = ()
    # a pooled baseline (:func:`pooled`): the median of each pooled result's own samples, relative to fp32
    # (when every result carried paired fp32 samples), in ms, and in CPU time relative to fp32 (when every
    # result carried paired CPU samples); empty for a single result
    run_medians: tuple[float, ...] = ()
    run_medians_ms: tuple[float, ...] = ()
    run_medians_cpu: tuple[float, ...] = ()
    env_fingerprint: str | None = None
    error_unit: str = CONVERGENCE_ERROR_UNIT  # unit of final_error (workers.result.ConvergenceStats)
    # measured by the worker from the converted model (workers.measure.graph_facts); None for results whose graph
    # facts are the pass's own report (stored before measurement) or counted by another compute-op version
    compute_low: int | None = None
    compute_nodes: int | None = None
    compute_ops_version: str | None = None
    convert_samples: tuple[float, ...] = ()   # conversion wall times in seconds, timed by the worker
    convert_reference: tuple[float, ...] = ()  # a fixed reference workload timed right after each of them
    convert_cpu: tuple[float, ...] = ()       # CPU seconds of the conversion process in each of them (user + sys)
    pass_iterations: int | None = None        # the pass's painting fixpoint iterations (its report)
    pass_converged: bool | None = None        # whether that painting reached its fixpoint (its report)

    @property
    def converted(self) -> bool:
        """The pass produced a valid model (accuracy, convergence and coverage are meaningful)."""
        return self.status in CONVERSION_OK_STATUSES


def same_error_unit(base: CellSample, new: CellSample) -> bool:
    """True when the two samples' convergence errors are in the same unit (so their values compare)."""
    return base.error_unit == new.error_unit


@dataclass(frozen=True)
class Finding:
    """One change of one kind: ``category`` is ``regression`` or ``improvement`` (``flaky`` later)."""

    kind: str
    category: str
    severity: str
    metric: str
    baseline_value: float | None
    value: float | None
    detail: str
    p_value: float | None = None
    #: set by a kind's ``dismissed`` rule (:attr:`FindingKind.dismissed
    #: <service.regressions.kinds.base.FindingKind.dismissed>`): why a change seen beyond the rule's limits is
    #: not the pass's; stored ``dismissed`` with this note, shown, never failing the gate
    dismissed: str | None = None

    @property
    def delta(self) -> float | None:
        """``value - baseline_value`` (None when either is unknown)."""
        if self.value is None or self.baseline_value is None:
            return None
        if math.isinf(self.value) and math.isinf(self.baseline_value):
            return 0.0
        return self.value - self.baseline_value

    @property
    def ratio(self) -> float | None:
        """``value / baseline_value`` (inf for a rise from zero; None when unknown)."""
        if self.value is None or self.baseline_value is None:
            return None
        if self.baseline_value == 0:
            return 1.0 if self.value == 0 else math.inf
        return self.value / self.baseline_value


def fmt_g(x: float | None) -> str:
    """A number for a finding's detail (``n/a`` when unknown)."""
    return "n/a" if x is None else f"{x:.4g}"
