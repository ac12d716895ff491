"""What the pages show, as pure functions of store records (no database, no HTML).

The central decision is :func:`cell_state`: one displayed state per cell of a run's matrix, in
this priority — a regression finding (conversion, accuracy/convergence, coverage, latency) beats
a flaky finding, which beats the result's own failure (error, accuracy failure), which beats an
improvement, which beats a plain pass.  A finding marked ``false_positive`` is ignored.  Every
state has a text label and an icon besides its colour, so nothing is told by colour alone.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from service.db.dashboard import ERROR_STATUSES
from service.db.records import Cell, JobInfo, RegressionInfo, ResultRow, RunInfo
from service.regressions.findings import CONFIRMATION_STATES, EXPLAINED
from service.regressions.kinds.registry import all_kinds
from service.regressions.kinds.registry import kind as finding_kind
from service.regressions.listing import LIST_WORDS, list_verdict

if TYPE_CHECKING:
    from workers.result import JobResult


class Baseline(Protocol):
    """What the run page reads of a cell's baseline result: a :class:`~service.regressions.stored.StoredResult`
    (:func:`service.db.dashboard.baseline_results`), or a :class:`~service.db.records.ResultRow`."""

    @property
    def revision_sha(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def cosine(self) -> float | None: ...
    @property
    def max_abs(self) -> float | None: ...
    @property
    def latency_p50_ms(self) -> float | None: ...
    @property
    def casts_inserted(self) -> int | None: ...
    @property
    def low_precision_fraction(self) -> float | None: ...


@dataclass(frozen=True)
class State:
    """A displayed cell state: CSS class, icon, short label, long label."""

    css: str
    icon: str
    short: str
    label: str


#: The regression state of each kind comes from the kind (:attr:`FindingKind.display
#: <service.regressions.kinds.base.FindingKind>`), in registry order; kinds sharing a display share its state.
STATES: dict[str, State] = {s.css: s for s in (
    *(State(d.css, d.icon, d.short, d.label) for d in dict.fromkeys(k.display for k in all_kinds())),
    State("suspected", "?", "suspect", "suspected timing regression (confirming)"),
    State("suspected_improvement", "?", "gain?", "suspected timing improvement (not confirmed: no gain yet)"),
    State("explained", "≡", "explained", "accuracy change explained by a coverage loss (no gain)"),
    State("dismissed", "○", "dismissed", "timing change dismissed by confirmation"),
    State("suspected_resolved", "•", "resolving?", "timing regression whose recovery is being confirmed"),
    State("flaky", "≈", "flaky", "flaky"),
    State("error", "×", "error", "conversion/job error"),
    State("fail", "!", "fail", "accuracy failure (not new)"),
    State("improved", "▲", "better", "improved"),
    State("pass", "√", "pass", "pass"),
    State("pending", "…", "pending", "queued or running"),
    State("missing", "–", "none", "no result"),
)}
#: The displayed state of a regression of each finding kind (a copy of the registry's: :func:`kind_state` reads
#: the registry and raises for a kind that is not registered).
KIND_STATES = {k.name: k.css for k in all_kinds()}
#: The displayed state of a finding of each category other than ``regression`` (whose state is its kind's);
#: every category of :data:`service.regressions.rules.CATEGORIES` must be here or be ``regression``.
CATEGORY_STATES = {"improvement": "improved", "flaky": "flaky"}
#: The run page's heading of each list of findings other than regressions (default: the category, capitalised).
CATEGORY_TITLES = {"improvement": "Improvements", "flaky": "Flaky",
                   "improvement_not_counted": "Improvements not counted (suspected, dismissed or explained)"}
#: Finding states in which an improvement is shown as a gain (confirmed, or needing no confirmation).
GAIN_STATES = frozenset({"open", "acknowledged"})


#: Where the stylesheet (``static/dashboard.css``) takes the kinds' rules (:func:`kind_styles`).
KIND_STYLES_MARKER = "/* finding kinds: each kind's colours live with it (service.regressions.kinds), inserted here */"


def kind_styles() -> str:
    """The stylesheet rules of every kind's regression state, one per CSS class, in registry order."""
    return "\n".join(d.style() for d in dict.fromkeys(k.display for k in all_kinds()))


def stylesheet(css: str) -> str:
    """``css`` (the dashboard's stylesheet) with the kinds' rules where :data:`KIND_STYLES_MARKER` stands
    (ValueError when it is missing: a kind would have no style)."""
    if KIND_STYLES_MARKER not in css:
        raise ValueError("the dashboard stylesheet has no place for the finding kinds' styles")
    return css.replace(KIND_STYLES_MARKER, kind_styles())


def kind_state(kind: str) -> State:
    """The displayed state of a regression of ``kind`` (its registry entry's CSS class);
    :class:`~service.regressions.kinds.registry.UnknownKind` for a kind that is not registered."""
    return STATES[finding_kind(kind).css]


def _kind_rank(kind: str) -> int:
    """Where ``kind`` stands in the registry (the order in which one cell's regressions of several kinds pick
    its state); UnknownKind for a kind that is not registered."""
    return all_kinds().index(finding_kind(kind))


def finding_state(finding: RegressionInfo) -> State:
    """The displayed state of one finding: a timing finding under or after confirmation shows that state
    (suspected, dismissed); otherwise its category's (improvement, flaky, …), or for a regression its kind's.
    A suspected improvement and one a coverage loss explains show as such, never as a gain.  A kind, category
    or confirmation state without a state raises KeyError (UnknownKind for a kind; a test enumerates them all)."""
    state = getattr(finding, "state", None)
    if state == "suspected" and finding.category == "improvement":
        return STATES["suspected_improvement"]
    if state in CONFIRMATION_STATES or state == EXPLAINED:
        return STATES[state]
    if finding.category == "regression":
        return kind_state(finding.kind)
    return STATES[CATEGORY_STATES[finding.category]]


def finding_lists(findings: Iterable[RegressionInfo], categories: Sequence[str]) -> dict[str, list[RegressionInfo]]:
    """The run page's lists of findings: one per category, except that an improvement that is no gain (a
    timing improvement not confirmed or dismissed by confirmation, an accuracy change a coverage loss
    explains) goes to ``improvement_not_counted``, listed after the categories with its state."""
    out: dict[str, list[RegressionInfo]] = {c: [] for c in categories}
    out["improvement_not_counted"] = []
    for f in findings:
        unconfirmed = f.category == "improvement" and (f.state in CONFIRMATION_STATES or f.state == EXPLAINED)
        out.setdefault("improvement_not_counted" if unconfirmed else f.category, []).append(f)
    return out


#: The badge of each state of a list verdict (:func:`service.regressions.listing.list_verdict`).
VERDICT_BADGES = {"success": ("pass", "√"), "failure": ("error", "×"), "error": ("error", "×"),
                  "pending": ("pending", "…"), "unjudged": ("missing", "–")}


@dataclass(frozen=True)
class VerdictBadge:
    """What the runs page shows of a run's verdict, before anything else: state (CSS class, icon, word), the
    counts behind it and the full headline as a tooltip."""

    css: str
    icon: str
    word: str
    counts: str
    title: str


def run_verdict_badge(run: RunInfo, resolved: tuple[int, tuple[int, ...]] | None = None) -> VerdictBadge:
    """The verdict badge of ``run`` (a RunInfo) from its recorded verdict, with what later runs ``resolved``
    beside it (:func:`service.regressions.listing.list_verdict`); decides nothing."""
    state, counts = list_verdict(run, resolved)
    css, icon = VERDICT_BADGES[state]
    title = str((run.verdict or {}).get("headline") or "") if state not in ("pending", "unjudged") else ""
    return VerdictBadge(css, icon, LIST_WORDS[state], counts, title)


def fmt(x: float | int | None, digits: int = 4) -> str:
    """Compact number ('–' unknown, 'inf' for infinities)."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def fmt_cosine(x: float | None) -> str:
    """A cosine similarity with enough digits to see a drop from 0.99999 (e.g. '0.99987')."""
    if x is None:
        return "–"
    if x > 0.99999:
        return f"{x:.6f}"
    return f"{x:.5f}" if x > 0.999 else f"{x:.4g}"


def pct(base: float | None, new: float | None) -> str:
    """Relative change ``new`` vs ``base`` as '+12.3%' ('–' when not computable)."""
    if base is None or new is None or base == 0 or not math.isfinite(base) or not math.isfinite(new):
        return "–"
    return f"{(new - base) / base * 100:+.1f}%"


def magnitude(finding: RegressionInfo) -> str:
    """How far a finding moved its metric: ``baseline → value (×ratio)``, or the delta alone; ``–`` when
    it stored no numbers (a status change: its detail says what changed)."""
    if finding.baseline_value is None and finding.value is None:
        return "–"
    moved = f"{finding.metric} {fmt(finding.baseline_value)} → {fmt(finding.value)}"
    if finding.ratio is not None:
        return f"{moved} (×{fmt(finding.ratio, 3)})"
    if finding.delta is not None:
        return f"{moved} ({'+' if finding.delta >= 0 else ''}{fmt(finding.delta, 3)})"
    return moved


def duration(seconds: float | None) -> str:
    """'1h 02m', '3m 04s', '12s' ('–' when unknown)."""
    if seconds is None:
        return "–"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def cell_state(result: ResultRow | None, job: JobInfo | None, findings: Iterable[RegressionInfo]) -> State:
    """The displayed state of one cell (see the module docstring for the priority)."""
    live = [f for f in findings if f.state not in ("false_positive", "dismissed")]
    regs = [f for f in live if f.category == "regression" and f.state != "suspected"]
    if not regs and any(f.category == "regression" for f in live):
        return STATES["suspected"]  # only a timing finding still being confirmed
    if regs:
        return kind_state(min((f.kind for f in regs), key=_kind_rank))
    if any(f.category == "flaky" for f in live):
        return STATES["flaky"]
    if result is None:
        if job is not None and job.status in ("queued", "running"):
            return STATES["pending"]
        if job is not None and job.status in ("crashed", "error"):
            return STATES["error"]
        return STATES["missing"]
    if result.status == "unmeasured":
        return STATES["missing"]  # nothing was measured (no device for its target): never a pass
    if result.status in ERROR_STATUSES:
        return STATES["error"]
    if result.status != "pass":
        return STATES["fail"]
    if any(f.category == "improvement" and f.state in GAIN_STATES for f in live):
        return STATES["improved"]  # a confirmed gain only: never a suspected, dismissed or explained one
    return STATES["pass"]


def key_numbers(result: ResultRow | None, state: State) -> tuple[str, str]:
    """Two short numbers shown in a cell: accuracy (cosine, or error ratio) and speed-up."""
    if result is None:
        return "", ""
    if result.status in ERROR_STATUSES:
        return result.status.replace("_", " "), ""
    acc = f"cos {fmt_cosine(result.cosine)}" if result.cosine is not None else (
        f"err ×{fmt(result.error_ratio, 3)}" if result.error_ratio is not None else "")
    speed = f"×{result.speedup:.2f}" if result.speedup is not None and math.isfinite(result.speedup) else ""
    return acc, speed


def _line(name: str, new: float | int | None, base: float | int | None, digits: int = 4,
          relative: bool = False) -> str:
    text = f"{name} {fmt(new, digits)}"
    if base is not None:
        change = pct(base, new) if relative else (fmt(new - base, 3) if new is not None else "–")
        text += f" (baseline {fmt(base, digits)}, {'Δ ' if not relative else ''}{change})"
    return text


def tooltip(cell: Cell, state: State, result: ResultRow | None, base: Baseline | None, findings: Sequence[RegressionInfo],
            job: JobInfo | None = None) -> str:
    """The ``title`` text of a matrix cell: state, numbers against the baseline, findings."""
    lines = [f"{cell[0]} · {cell[1]}/{cell[2]}/{cell[3]}", f"{state.icon} {state.label}"]
    if result is None:
        lines.append(f"job {job.status}" if job is not None else "no job")
        if job is not None and job.error:
            lines.append(job.error[:200])
        return "\n".join(lines)
    lines.append(f"status {result.status}" + (f" (baseline {base.status} at {base.revision_sha[:10]})"
                                              if base is not None else " (no baseline)"))
    lines.append(_line("cosine", result.cosine, None if base is None else base.cosine, 6))
    lines.append(_line("max_abs", result.max_abs, None if base is None else base.max_abs, 3))
    lines.append(_line("p50 ms", result.latency_p50_ms, None if base is None else base.latency_p50_ms, 4,
                       relative=True))
    if result.speedup is not None:
        lines.append(f"speedup ×{fmt(result.speedup, 3)}")
    lines.append(_line("casts", result.casts_inserted, None if base is None else base.casts_inserted))
    lines.append(_line("low-precision", result.low_precision_fraction,
                       None if base is None else base.low_precision_fraction, 3))
    if result.message:
        lines.append(result.message[:200])
    for f in findings:
        lines.append(f"{f.category} [{f.kind}, {f.severity}, {f.state}]: {f.detail}")
    return "\n".join(lines)


@dataclass(frozen=True)
class MatrixCell:
    """One rendered cell of the run matrix."""

    cell: Cell
    state: State
    acc: str
    speed: str
    title: str
    regression_id: int | None


@dataclass
class Matrix:
    """Rows = models, columns = (dtype, policy, target); ``cells[model][column]``."""

    models: list[str]
    columns: list[tuple[str, str, str]]
    cells: dict[str, dict[tuple[str, str, str], MatrixCell]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)


def build_matrix(jobs: Sequence[JobInfo], results: Sequence[ResultRow], findings: Sequence[RegressionInfo],
                 baselines: Mapping[Cell, Baseline]) -> Matrix:
    """The run matrix from its jobs, results, findings and per-cell baselines."""
    by_result = {r.cell: r for r in results}
    by_job = {j.cell: j for j in jobs}
    by_finding: dict[Cell, list[RegressionInfo]] = {}
    for f in findings:
        by_finding.setdefault(f.cell, []).append(f)
    cells = sorted(set(by_result) | set(by_job))
    matrix = Matrix(models=sorted({c[0] for c in cells}), columns=sorted({c[1:] for c in cells}))
    for cell in cells:
        res, job, fs = by_result.get(cell), by_job.get(cell), by_finding.get(cell, [])
        state = cell_state(res, job, fs)
        acc, speed = key_numbers(res, state)
        reg = next((f.id for f in fs if f.category == "regression" and f.state != "false_positive"), None)
        matrix.cells.setdefault(cell[0], {})[cell[1:]] = MatrixCell(
            cell, state, acc, speed, tooltip(cell, state, res, baselines.get(cell), fs, job), reg)
        matrix.counts[state.css] += 1
    return matrix


@dataclass(frozen=True)
class DiffRow:
    """One cell compared with its baseline result."""

    cell: Cell
    base_sha: str | None
    base_status: str | None
    status: str | None
    cosine: tuple[str, str]
    p50: tuple[str, str]
    casts: tuple[str, str]
    low_prec: tuple[str, str]
    changed: bool


def diff_rows(results: Sequence[ResultRow], baselines: Mapping[Cell, Baseline],
              latency_ratio: float = 1.10) -> list[DiffRow]:
    """Every result against its baseline; ``changed`` marks a status change, a cast or coverage change,
    a cosine move beyond 1e-4, or a p50 beyond ``latency_ratio`` either way."""
    out = []
    for r in results:
        b = baselines.get(r.cell)
        bc, bp, bk, bl = (None, None, None, None) if b is None else (b.cosine, b.latency_p50_ms, b.casts_inserted,
                                                                      b.low_precision_fraction)
        changed = b is not None and (
            b.status != r.status or (bk is not None and r.casts_inserted is not None and bk != r.casts_inserted)
            or (bl is not None and r.low_precision_fraction is not None and abs(bl - r.low_precision_fraction) > 0.005)
            or (bc is not None and r.cosine is not None and abs(bc - r.cosine) > 1e-4)
            or (bp and r.latency_p50_ms and not (1 / latency_ratio <= r.latency_p50_ms / bp <= latency_ratio)))
        out.append(DiffRow(
            cell=r.cell, base_sha=b.revision_sha if b is not None else None, base_status=getattr(b, "status", None),
            status=r.status, cosine=(fmt_cosine(r.cosine), fmt(r.cosine - bc, 2) if bc is not None and r.cosine is not None else "–"),
            p50=(fmt(r.latency_p50_ms, 4), pct(bp, r.latency_p50_ms)),
            casts=(fmt(r.casts_inserted), fmt(r.casts_inserted - bk) if bk is not None and r.casts_inserted is not None else "–"),
            low_prec=(fmt(r.low_precision_fraction, 3),
                      fmt(r.low_precision_fraction - bl, 2) if bl is not None and r.low_precision_fraction is not None else "–"),
            changed=bool(changed)))
    return out


def main_baseline(baselines: Mapping[Cell, Baseline]) -> tuple[str | None, int]:
    """The most common baseline revision among cells and how many cells use it."""
    counts = Counter(b.revision_sha for b in baselines.values())
    if not counts:
        return None, 0
    sha, n = counts.most_common(1)[0]
    return sha, n


#: Latency fields that mean nothing (stored as 0.0) unless the named sample list is non-empty.
_UNMEASURED_UNLESS = {"latency.p50_ms": "samples_ms", "latency.p90_ms": "samples_ms", "latency.min_ms": "samples_ms",
                      "latency.speedup": "samples_ms", "latency.fp32_p50_ms": "fp32_samples_ms"}
#: Sample lists shown by their median (conversion wall and CPU seconds: what the conversion-time rule compares).
_MEDIAN_OF = frozenset({"graph.convert_samples_s", "graph.convert_cpu_s"})


def result_numbers(base: JobResult | None, new: JobResult | None) -> list[tuple[str, str, str, str]]:
    """(name, baseline, offending, change) rows comparing two full JobResults (either may be None).

    Final step errors in different units (``convergence.error_unit``) get no change, only a note."""
    from service.db.extract import env_fingerprint

    def get(r: JobResult | None, path: str) -> object:
        samples = _UNMEASURED_UNLESS.get(path)  # an unmeasured latency is stored as 0.0: show "–", not "0"
        if samples is not None and r is not None and not getattr(getattr(r, "latency", None), samples, None):
            return None
        v: object = r
        for part in path.split("."):
            v = getattr(v, part, None) if v is not None else None
        if path in _MEDIAN_OF:
            return statistics.median(v) if isinstance(v, list) and v else None
        return v

    units = (get(base, "convergence.error_unit"), get(new, "convergence.error_unit"))
    rows: list[tuple[str, str, str, str]] = []
    for name, path, digits, rel in (
            ("status", "status", 0, False), ("worst cosine", "accuracy.worst.cosine", 6, False),
            ("worst max abs error", "accuracy.worst.max_abs", 4, False),
            ("worst max rel error", "accuracy.worst.max_rel", 4, False), ("SNR dB", "accuracy.worst.snr_db", 4, False),
            ("fp32 rerun noise (max abs)", "accuracy.worst.baseline_max_abs", 3, False),
            ("latency p50 ms", "latency.p50_ms", 4, True), ("latency p90 ms", "latency.p90_ms", 4, True),
            ("latency min ms", "latency.min_ms", 4, True), ("fp32 p50 ms", "latency.fp32_p50_ms", 4, True),
            ("speed-up", "latency.speedup", 3, True), ("casts inserted", "graph.casts_inserted", 0, False),
            ("low-precision fraction", "graph.low_precision_compute_fraction", 3, False),
            ("low-precision compute nodes", "graph.compute_low", 0, False),
            ("compute nodes", "graph.compute_nodes", 0, False),
            ("conversion s (first run)", "graph.convert_seconds", 4, True),
            ("conversion wall s (median)", "graph.convert_samples_s", 4, True),
            ("conversion CPU s (median)", "graph.convert_cpu_s", 4, True),
            ("pass fixpoint iterations", "graph.pass_iterations", 0, False),
            ("pass converged", "graph.pass_converged", 0, False),
            ("nodes kept fp32", "graph.kept_fp32", 0, False), ("final step error", "convergence.final_error", 4, False),
            ("convergence error unit", "convergence.error_unit", 0, False),
            ("diverged", "convergence.diverged", 0, False)):
        b, n = get(base, path), get(new, path)
        if path == "convergence.final_error" and b is not None and n is not None and units[0] != units[1]:
            rows.append((name, fmt(_number(b), digits), fmt(_number(n), digits),
                         f"not comparable ({units[0]} vs {units[1]})"))
            continue
        if isinstance(b, list) or isinstance(n, list):
            b, n = (len(b) if isinstance(b, list) else None), (len(n) if isinstance(n, list) else None)
        if b is None and n is None:
            continue
        if isinstance(b, str) or isinstance(n, str) or isinstance(b, bool) or isinstance(n, bool):
            rows.append((name, str(fmt(b) if isinstance(b, bool) else (b or "–")),
                         str(fmt(n) if isinstance(n, bool) else (n or "–")), "" if b == n else "changed"))
            continue
        bn, nn = _number(b), _number(n)
        change = pct(bn, nn) if rel else (fmt(nn - bn, 3) if bn is not None and nn is not None else "–")
        rows.append((name, fmt(bn, digits or 4), fmt(nn, digits or 4), change))
    envs = [env_fingerprint(r.environment) if r is not None else None for r in (base, new)]
    rows.append(("environment fingerprint", envs[0] or "–", envs[1] or "–",
                 "same" if envs[0] == envs[1] else "differs (latency not compared pairwise)"))
    return rows


def _number(v: object) -> float | int | None:
    """``v``, a number or None, as one (a TypeError for anything else: its row names a field that is no number)."""
    if v is None or isinstance(v, int | float):
        return v
    raise TypeError(f"not a number: {type(v).__name__}")


def sandbox_line(modes: list[str]) -> tuple[str, bool] | None:
    """How the pass ran in a run's results, given each result's ``environment.sandbox`` (issue 31): (the line,
    whether it warns), None without results.  A cell whose pass ran ``best-effort`` (no network, mount or PID
    isolation: its worker could not make the namespaces) warns."""
    if not modes:
        return None
    weak = sum(m == "best-effort" for m in modes)
    if weak:
        return (f"best-effort in {weak} of {len(modes)} cells: the pass ran without network, mount and PID "
                "isolation (environment, descriptors, system-call filter and limits only)", True)
    full = sum(m == "full" for m in modes)
    return (f"full in {full} of {len(modes)} cells" if full else "not recorded (results from before the sandbox)",
            False)
