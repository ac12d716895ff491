"""Detection reads each result's sample summary (``results.sample_doc``, migration 0012) instead of its whole
document (issue 42): the findings must be exactly those judged from the documents.  Checked end to end on real
stores (SQLite and PostgreSQL) over a history with every kind of finding (accuracy and latency against the
parent, drifts against the window and a pinned baseline, pooled baselines), by detecting the same run with the
summaries and with every summary removed (``sample_doc`` NULL: the whole document is read, as for a result
stored before 0012); after a result is rewritten and another one is added at the baseline's revision (each
carries its own summary, written in the statement that writes its document, so neither can leave one stale);
and a summary that does not match its document changes the findings, so the comparison can fail.  The pure
guarantee of :func:`service.regressions.stored.sample_doc` (every document, however odd, samples the same
through its summary) is checked on generated documents."""

from __future__ import annotations

import json
import random

import pytest
import sqlalchemy as sa

from service.db import Store, pins
from service.db.series import t_res
from service.orchestration.judge import detect_run
from service.regressions.stored import (
    _SUMMARY_FIELDS,
    SUMMARY_FORMAT,
    StoredResult,
    _doc_fields,
    sample,
    sample_doc,
)
from tests.service.factories import CELL, chain, make_result, run_with

STILL = ("tiny_mlp", "bf16", "default", "cpu")
SLOWER = ("tiny_mlp", "fp16", "aggressive", "cpu")


def findings(store: Store, run_id: int) -> list[tuple[object, ...]]:
    """The run's findings as detection decided them (ids and times left out)."""
    return sorted((r.model, r.dtype, r.policy, r.target, r.kind, r.metric, r.category, r.state, r.baseline_sha,
                   r.baseline_value, r.value, r.ratio, r.p_value, r.detail) for r in store.regressions(run_id=run_id))


def summaries(store: Store) -> dict[int, str | None]:
    with store.transaction() as conn:
        return dict(conn.execute(sa.select(t_res.c.id, t_res.c.sample_doc)).all())


def set_summaries(store: Store, values: dict[int, str | None]) -> None:
    with store.transaction() as conn:
        for rid, value in values.items():
            conn.execute(t_res.update().where(t_res.c.id == rid).values(sample_doc=value))


def judged_both_ways(store: Store, run_id: int) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The run's findings detected with the stored summaries, then with none (every document read whole)."""
    with_summaries = findings(store, run_id) if detect_run(store, run_id) is not None else []
    kept = summaries(store)
    set_summaries(store, dict.fromkeys(kept))
    try:
        detect_run(store, run_id)
        whole = findings(store, run_id)
    finally:
        set_summaries(store, kept)
    return with_summaries, whole


@pytest.mark.parametrize("pin_at", [None, 4])
def test_summaries_give_the_findings_of_the_whole_documents(store: Store, pin_at: int | None) -> None:
    shas = chain(store, 24)
    for k, rev in enumerate(shas[:-1]):
        results = [make_result(CELL, latency_ms=2.0 * 1.05 ** k, max_abs=1e-3 * 1.08 ** k, seed=k),
                   make_result(SLOWER, latency_ms=3.0, seed=k)]
        run_with(store, rev, results, detect=False)
        if k % 3 == 0:  # a second run at the revision: pooled with the first as a baseline and a drift point
            run_with(store, rev, [make_result(STILL, seed=100 + k), make_result(SLOWER, latency_ms=3.0, seed=50 + k)],
                     detect=False)
    if pin_at is not None:
        with store.transaction() as conn:
            pins.pin(conn, branch="main", sha=shas[pin_at], now=store.clock())
    k = len(shas) - 1
    run_id = run_with(store, shas[-1], [
        make_result(CELL, latency_ms=2.0 * 1.05 ** k, max_abs=1e-3 * 1.08 ** k, seed=k),
        make_result(SLOWER, latency_ms=4.5, max_abs=0.5, seed=k),  # slower and less accurate than its parent
        make_result(STILL, seed=k)], detect=False)
    stored = summaries(store)
    assert stored and all(v is not None for v in stored.values()), "every result is written with its summary"

    got, whole = judged_both_ways(store, run_id)
    assert got == whole
    kinds = {(f[0], f[2], f[4]) for f in got}
    assert {(CELL[0], CELL[2], "drift"), (SLOWER[0], SLOWER[2], "accuracy"),
            (SLOWER[0], SLOWER[2], "latency")} <= kinds, kinds

    # a result rewritten (a redelivered job with other figures) and one added at the baseline's revision after
    # the first detection: each carries the summary of its own document
    store.write_result(run_id, make_result(SLOWER, latency_ms=3.0, max_abs=1e-3, seed=7))
    run_with(store, shas[-2], [make_result(SLOWER, latency_ms=6.0, seed=8)], detect=False)
    with store.transaction() as conn:
        rows = conn.execute(sa.select(t_res.c.data, t_res.c.sample_doc)).all()
    for data, summary in rows:
        assert summary == sample_doc(data if isinstance(data, dict) else json.loads(data))
    got_after, whole_after = judged_both_ways(store, run_id)
    assert got_after == whole_after and got_after != got

    # a summary that does not say what its document says (here: the parent's samples of another cell) changes
    # the findings, so the comparison above can fail
    with store.transaction() as conn:
        parent_of_cell = conn.execute(sa.select(t_res.c.id).where(
            t_res.c.revision_sha == shas[-2], t_res.c.model == CELL[0], t_res.c.dtype == CELL[1],
            t_res.c.policy == CELL[2])).scalar_one()
        other = conn.execute(sa.select(t_res.c.sample_doc).where(
            t_res.c.revision_sha == shas[-2], t_res.c.policy == SLOWER[2]).limit(1)).scalar_one()
    set_summaries(store, {parent_of_cell: other})
    wrong, whole_again = judged_both_ways(store, run_id)
    assert whole_again == whole_after and wrong != whole_again


def _odd(rng: random.Random) -> object:
    """A JSON value of any kind (numbers of every JSON type, strings, nulls, nested lists and objects)."""
    return rng.choice([1, 2.5, -0.0, 1e300, True, False, None, "3", "relative", [], [1.0, 2],
                       [0.5, True, "x", None, 7], {"a": 1}, rng.random(), rng.randint(-5, 5)])


def _document(rng: random.Random) -> object:
    """A result document: a real one with some of the paths the rules read replaced, removed or odd."""
    doc: dict[str, object] = make_result(CELL, seed=rng.randint(0, 10**6), diverged=rng.choice([None, False])).to_dict()
    for key, leaves in (("latency", ("samples_ms", "fp32_samples_ms", "cpu_samples_ms", "fp32_cpu_samples_ms")),
                        ("graph", ("source", "compute_low", "compute_nodes", "compute_ops_version", "convert_samples_s",
                                   "convert_reference_s", "convert_cpu_s", "pass_iterations", "pass_converged")),
                        ("convergence", ("error_unit",))):
        roll = rng.random()
        if roll < 0.1:
            doc.pop(key, None)
        elif roll < 0.2:
            doc[key] = _odd(rng)
        else:
            obj = doc.get(key) if isinstance(doc.get(key), dict) else {}
            assert isinstance(obj, dict)
            for leaf in leaves:
                if rng.random() < 0.4:
                    obj[leaf] = _odd(rng) if rng.random() < 0.7 else [rng.uniform(0, 9) for _ in range(rng.randint(0, 12))]
                elif rng.random() < 0.2:
                    obj.pop(leaf, None)
            if key == "graph" and rng.random() < 0.5:
                obj["source"] = "measured"
            doc[key] = obj
    return doc if rng.random() > 0.02 else _odd(rng)


def test_every_document_samples_the_same_through_its_summary() -> None:
    rng = random.Random(42)
    for i in range(600):
        doc = _document(rng)
        base = StoredResult(CELL, i, 1, "a" * 40, rng.choice(["pass", "fail_accuracy", "convert_error"]), 1e-3, 0.99,
                            None, None, 0.9, 4, "env-a", 2.0, json.dumps(doc))
        via_summary = StoredResult(*(getattr(base, f) for f in StoredResult.__dataclass_fields__ if f not in
                                     ("doc", "summary")), None, sample_doc(doc))  # type: ignore[arg-type]
        assert sample(via_summary) == sample(base), doc


def test_a_summary_of_another_format_is_refused() -> None:
    r = StoredResult(CELL, 1, 1, "a" * 40, "pass", None, None, None, None, None, None, None, None, None,
                     json.dumps([99, [], [], [], [], "absolute", None, None, None, [], [], [], None, None]))
    with pytest.raises(ValueError):
        sample(r)


def _format_1(doc: dict[str, object]) -> str:
    """The summary of ``doc`` as it was written before format 2 (its samples as JSON lists of decimal floats)."""
    fields = _doc_fields(doc)
    return json.dumps([1, *(fields[k] for k in _SUMMARY_FIELDS)], separators=(",", ":"))  # type: ignore[literal-required]


def test_summaries_are_written_in_format_2_and_those_of_format_1_still_read_as_their_documents() -> None:
    """Format 2 packs the samples as doubles; a summary stored in format 1 (before it) samples as its document
    too, so nothing stored needs rewriting."""
    rng = random.Random(7)
    for i in range(300):
        doc = _document(rng)
        assert json.loads(sample_doc(doc))[0] == SUMMARY_FORMAT == 2
        base = StoredResult(CELL, i, 1, "a" * 40, "pass", 1e-3, 0.99, None, None, 0.9, 4, "env-a", 2.0,
                            json.dumps(doc))
        old = StoredResult(*(getattr(base, f) for f in StoredResult.__dataclass_fields__ if f not in
                             ("doc", "summary")), None, _format_1(doc))  # type: ignore[arg-type]
        assert sample(old) == sample(base), doc


def test_a_summary_whose_packed_samples_do_not_match_their_lengths_is_refused() -> None:
    doc = {"latency": {"samples_ms": [1.0, 2.0, 3.0]}}
    good = json.loads(sample_doc(doc))
    short = [*good[:1], [4, *good[1][1:]], *good[2:]]  # one sample more than the block holds
    for summary in (short, [*good[:2], good[2] + "!", *good[3:]]):
        r = StoredResult(CELL, 1, 1, "a" * 40, "pass", None, None, None, None, None, None, None, None, None,
                         json.dumps(summary))
        with pytest.raises(ValueError):
            sample(r)
