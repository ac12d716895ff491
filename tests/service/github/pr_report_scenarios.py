"""Pull-request reports of realistic runs for the comment's golden files: mixed findings, clean, all failed,
200 findings (and the same cut).  Rule texts come from the real rules (the conversion detail, the paired
confirmation notes), so a golden shows what a reviewer would read."""

from __future__ import annotations

from typing import Any

from service.github.pr_report import BUCKETS, PullRequestReport, ReportRow, row_order
from service.regressions.paired import paired_verdict
from service.regressions.rules import CellSample, conversion_rule
from service.regressions.thresholds import Thresholds

PUBLIC = "https://ampci.example.com"
HEAD, BASE, OLDER = "3f9c2e1a7b4d" + "0" * 28, "9a1b7c3d5e2f" + "1" * 28, "77e0d41c2b9a" + "2" * 28
SUBJECT = "Keep Resize scales in fp32 when the input comes from a Shape subgraph"
_BASELINE_MS = (1.0, 1.02, 0.99, 1.01, 1.0, 0.98, 1.03, 1.0, 1.01)
SLOWER_NOTE = paired_verdict("latency", _BASELINE_MS, (1.31, 1.35, 1.3, 1.33, 1.29, 1.32, 1.36, 1.3, 1.34),
                             Thresholds(), "ms").detail
SAME_NOTE = paired_verdict("latency", _BASELINE_MS, (1.01, 1.0, 1.0, 1.02, 0.99, 0.99, 1.02, 1.01, 1.0),
                           Thresholds(), "ms").detail


def conversion_detail(now: str) -> str:
    """What the conversion rule says of a cell that converted at baseline and fails with ``now``."""
    [finding] = conversion_rule(CellSample("pass"), CellSample(now), Thresholds(), "m", "fp16")
    return finding.detail


def row(i: int, model: str, dtype: str, kind: str, metric: str, before: float | None, after: float | None, *,
        category: str = "regression", severity: str = "major", state: str = "open", **kw: Any) -> ReportRow:
    """One finding of cell (model, dtype, default, cpu) with its change computed from the two values."""
    delta = None if before is None or after is None else after - before
    ratio = None if before in (None, 0) or after is None else after / before  # type: ignore[operator]
    return ReportRow(id=i, cell=(model, dtype, "default", "cpu"), kind=kind, metric=metric, category=category,
                     severity=severity, state=state, baseline_value=before, value=after, delta=delta, ratio=ratio,
                     finding_url=f"{PUBLIC}/regressions/{i}", **kw)


def report(rows: list[ReportRow], counts: dict[str, int], **kw: Any) -> PullRequestReport:
    """A report of PR #42's run 118 with these rows (in the table's order) and bucket counts."""
    full = {b: 0 for b in BUCKETS}
    full.update(counts)
    base: dict[str, Any] = dict(repo="acme/amp-pass", pr=42, run_id=118, run_url=f"{PUBLIC}/runs/118",
                                run_status="complete", head_sha=HEAD, head_subject=SUBJECT, baseline_sha=BASE,
                                baseline_revisions=(BASE,), cells=sum(full.values()), counts=full,
                                rows=tuple(sorted(rows, key=row_order)), state="success")
    base.update(kw)
    return PullRequestReport(**base)


def mixed() -> PullRequestReport:
    """48 cells: a conversion, an accuracy, a confirmed latency and an acknowledged coverage regression, an
    improvement, flaky cells, a dismissed and a false-positive finding, a cell not measured, new cells, a
    known failure and a baseline fallback."""
    rows = [
        row(901, "resnet18", "fp16", "conversion", "status", None, None, severity="critical",
            detail=conversion_detail("convert_error")),
        row(902, "bert_tiny", "bf16", "accuracy", "max_abs", 0.0069, 0.0194),
        row(903, "mobilenet_v2", "fp16", "latency", "latency_p50_ms", 1234.5, 1618.9, note=SLOWER_NOTE),
        row(904, "whisper_enc", "fp16", "coverage", "compute_low", 212.0, 187.0, severity="minor",
            state="acknowledged", note="expected: LayerNorm kept in fp32 on purpose (#41)"),
        row(905, "conv_small", "bf16", "accuracy", "max_abs", 0.0123, 0.0041, category="improvement", severity="info"),
        row(906, "mlp_small", "fp16", "accuracy", "max_abs", 0.00012, 0.00031, category="flaky", severity="minor",
            detail="flaky (allowlisted): max_abs 0.00012 -> 0.00031"),
        row(907, "gpt2_block", "fp16", "conversion_time", "convert_s", 2.41, 3.05, category="flaky", severity="minor"),
        row(908, "resnet18", "bf16", "latency", "latency_p50_ms", 2.10, 2.77, state="dismissed", note=SAME_NOTE),
        row(909, "unet_tiny", "fp16", "accuracy", "max_abs", 0.0021, 0.0098, severity="minor", state="false_positive",
            note="runner ran out of memory mid-run; re-run passes"),
    ]
    return report(rows, {"regression": 4, "improvement": 1, "flaky": 2, "not_measured": 1, "known_failure": 1,
                         "new": 2, "unchanged": 37}, baseline_revisions=(BASE, OLDER), state="failure",
                  not_measured=((("vit_tiny", "bf16", "default", "cpu"), "bad_spec"),))


def clean() -> PullRequestReport:
    """46 cells, every one compared and unchanged."""
    return report([], {"unchanged": 46})


def all_failed() -> PullRequestReport:
    """A failed run: every cell either failed to convert (conversion regressions) or could not be measured."""
    rows = [row(950 + i, model, "fp16", "conversion", "status", None, None, severity="critical",
                detail=conversion_detail(status))
            for i, (model, status) in enumerate([("resnet18", "convert_error"), ("bert_tiny", "crash"),
                                                 ("mobilenet_v2", "timeout"), ("whisper_enc", "convert_error")])]
    return report(rows, {"regression": 4, "not_measured": 2}, run_status="failed", state="failure",
                  not_measured=((("vit_tiny", "fp16", "default", "cpu"), "bad_spec"),
                                (("unet_tiny", "fp16", "default", "cpu"), "job failed, no result")))


def two_hundred() -> PullRequestReport:
    """200 findings over 105 cells: one conversion regression in every tenth cell, two findings of different
    kinds in the others (a finding is unique per cell, kind and category, as the store keeps them)."""
    kinds = [("accuracy", "max_abs", 0.0069, 0.0194), ("latency", "latency_p50_ms", 1234.5, 1618.9),
             ("coverage", "low_precision_fraction", 0.93, 0.71), ("convergence", "final_error", 0.0012, 0.0087),
             ("conversion_time", "convert_s", 2.41, 3.05)]
    rows: list[ReportRow] = []
    cell = 0
    while len(rows) < 200:
        model, dtype = f"zoo_model_{cell // 2:02d}", ("fp16", "bf16")[cell % 2]
        if cell % 10 == 0:
            rows.append(row(1000 + len(rows), model, dtype, "conversion", "status", None, None, severity="critical",
                            detail=conversion_detail("convert_error")))
        for kind, metric, before, after in (kinds[cell % 5], kinds[(cell + 2) % 5]) if cell % 10 else ():
            if len(rows) == 200:
                break
            improvement = (cell + len(rows)) % 7 == 0
            rows.append(row(1000 + len(rows), model, dtype, kind, metric, after if improvement else before,
                            before if improvement else after,
                            category="improvement" if improvement else "regression",
                            severity="info" if improvement else ("major", "minor")[cell % 2],
                            note=SLOWER_NOTE if kind == "latency" and not improvement else ""))
        cell += 1
    regressed = {r.cell for r in rows if r.category == "regression"}
    improved = {r.cell for r in rows} - regressed
    return report(rows, {"regression": len(regressed), "improvement": len(improved)}, state="failure")


def multibyte() -> PullRequestReport:
    """The byte-size worst case: 2,000 findings of models named in CJK with an emoji (3- and 4-byte UTF-8
    characters), each with a non-ASCII note, so a table cut by characters would be far over GitHub's bytes."""
    kinds = [("accuracy", "max_abs", 0.0069, 0.0194), ("latency", "latency_p50_ms", 1234.5, 1618.9),
             ("coverage", "low_precision_fraction", 0.93, 0.71)]
    rows = [row(5000 + i, f"模型🧪_{i // 3:03d}_变换器", ("fp16", "bf16")[i % 2], *kinds[i % 3],
                severity=("major", "minor")[i % 2], note="精度下降：保持 fp32 ✓" if i % 3 == 0 else "")
            for i in range(2000)]
    return report(rows, {"regression": 1334, "unchanged": 10}, state="failure",
                  head_subject="在 Shape 子图后保持 Resize 的 scales 为 fp32 🧪")
