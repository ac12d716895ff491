"""Bounded confirmation work: at most AMPCI_CONFIRM_MAX_CELLS cells per run, AMPCI_CONFIRM_MAX_PER_PR per pull request.

The choice (:func:`service.regressions.confirm_caps.select`) is pure; the lifecycle runs on the real database
(SQLite and PostgreSQL) through :func:`service.orchestration.jobs.finish_if_complete` with the settings, a
stand-in worker answering the confirmation jobs.
"""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace

import pytest

from service.db import Store, budgets
from service.errors import ConfigError
from service.orchestration.confirm_run import confirmation_cost
from service.orchestration.jobs import finish_if_complete
from service.orchestration.judge import run_verdict
from service.regressions.confirm_caps import ConfirmCaps, pull_request, select
from service.regressions.rules import CAPPED_BY
from service.settings import Settings
from tests.service.factories import chain, make_result

BASE_S = 0.3
#: six cells, each slowed by its own factor (the largest effect is m3's, then m0's, ...)
SLOWDOWN = {f"m{i}": f for i, f in enumerate([2.4, 1.6, 1.9, 2.8, 1.5, 2.1])}
BY_EFFECT = sorted(SLOWDOWN, key=lambda m: -SLOWDOWN[m])  # m3, m0, m5, m2, m1, m4


def cell(model: str) -> tuple[str, str, str, str]:
    return (model, "fp16", "default", "cpu")


def conversion(model: str, seconds: float, seed: int) -> object:
    r = make_result(cell(model), seed=seed)
    rng = random.Random(seed)
    r.graph.convert_samples_s = [seconds * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)]
    return r


def settings(max_cells: int = 8, max_per_pr: int = 16) -> Settings:
    return Settings.from_env({"AMPCI_CONFIRM_MAX_CELLS": str(max_cells), "AMPCI_CONFIRM_MAX_PER_PR": str(max_per_pr)})


def make_run(store: Store, revision: str, models: list[str], slow: bool, seed: int, trigger: str = "push",
             baseline: str | None = None, pr: int | None = None) -> int:
    meta: dict = {"confirm_pairs": 8}
    if pr is not None:
        meta["github"] = {"repo": "Acme/Amp-Pass", "branch": "topic", "event": trigger, "pr": pr}
    results = sorted((conversion(m, BASE_S * (SLOWDOWN[m] if slow else 1.0), seed + i) for i, m in enumerate(models)),
                     key=lambda r: r.cell)
    run_id = store.create_run(revision, trigger, baseline_sha=baseline, cells=[r.cell for r in results], meta=meta)
    for job, r in zip(store.jobs(run_id), results, strict=True):
        store.write_result(run_id, r, job_id=job.id)
        store.mark_job(job.id, "done")
    return run_id


class StandInWorker:
    """Dispatch of confirmation runs: records them; ``work`` answers their jobs with pairs that confirm a
    slowdown (``slower``) or show none, as :mod:`workers.jobs.confirm` would have timed them."""

    def __init__(self, store: Store, cfg: Settings, slower: float = 0.6) -> None:
        self.store, self.cfg, self.slower, self.sent = store, cfg, slower, []

    def __call__(self, run_id: int) -> None:
        self.sent.append(run_id)

    def work(self) -> None:
        base = [BASE_S + 0.001 * i for i in range(8)]
        for run_id in self.sent:
            run = self.store.get_run(run_id)
            for job in self.store.jobs(run_id):
                if job.status != "queued":
                    continue
                confirm = run.meta["options"]["|".join(job.cell)]["confirm"]
                r = make_result(job.cell)
                r.latency = r.graph = r.accuracy = None
                r.confirmation = {"pairs": confirm["pairs"], "kinds": {
                    k: {"baseline": base, "candidate": [x + self.slower for x in base], "unit": "s"}
                    for k in confirm["kinds"]}}
                r.timings = {"total_s": 3.5}
                self.store.write_result(run_id, r, job_id=job.id)
                self.store.mark_job(job.id, "done")
            finish_if_complete(self.store, run_id, self.cfg, dispatch=self)


def confirmed_cells(store: Store, worker: StandInWorker, k: int) -> list[str]:
    return [j.cell[0] for j in store.jobs(worker.sent[k])]


def states(store: Store, run_id: int) -> dict[str, tuple[str, str | None, str | None]]:
    return {g.model: (g.state, g.state_by, g.state_note) for g in store.regressions(run_id=run_id)}


# -- the choice ---------------------------------------------------------------------------------------------

def finding(model: str, ratio: float | None, state: str = "suspected", kind: str = "latency") -> SimpleNamespace:
    return SimpleNamespace(model=model, dtype="fp16", policy="default", target="cpu", state=state, ratio=ratio,
                           kind=kind)


def test_select_takes_the_largest_effects_first_slowdowns_before_recoveries_and_is_deterministic() -> None:
    found = [finding("a", 1.3), finding("b", 2.0), finding("c", 1.3), finding("d", None), finding("e", 1.5),
             finding("e", 3.0, kind="conversion_time"), finding("r", 9.0, state="suspected_resolved")]
    sel = select(found, ConfirmCaps(max_cells=3))
    assert [c[0] for c in sel.chosen] == ["e", "b", "a"]  # e's largest finding counts; a before c (tie: by cell)
    assert {c[0]: why for c, why in sel.capped.items()} == {
        m: "confirmation cap of 3 cells per run reached" for m in ("c", "d", "r")}
    assert select(list(reversed(found)), ConfirmCaps(max_cells=3)) == sel
    every = select(found, ConfirmCaps(max_cells=8))
    assert [c[0] for c in every.chosen] == ["e", "b", "a", "c", "d", "r"] and every.capped == {}
    # a pull request's budget takes from the front of what the run cap left
    sel = select(found, ConfirmCaps(max_cells=3, max_per_pr=16), budget_left=1, pr_label="acme/amp#7")
    assert [c[0] for c in sel.chosen] == ["e"]
    assert sel.capped[cell("b")] == "confirmation budget of 16 cells for pull request acme/amp#7 spent"
    assert sel.capped[cell("c")] == "confirmation cap of 3 cells per run reached"
    assert select(found, ConfirmCaps(), budget_left=-2).chosen == ()


def test_only_pull_request_runs_that_name_their_pull_request_have_a_budget() -> None:
    meta = {"github": {"repo": "Acme/Amp", "pr": 7}}
    assert pull_request(SimpleNamespace(trigger="pull_request", meta=meta)) == ("acme/amp", 7)
    for trigger in ("push", "nightly", "manual", "bisect", "confirm"):
        assert pull_request(SimpleNamespace(trigger=trigger, meta=meta)) is None
    for github in ({}, {"repo": "acme/amp"}, {"pr": 7}, {"repo": "", "pr": 7}, {"repo": "a/b", "pr": "7"},
                   {"repo": "a/b", "pr": True}):
        assert pull_request(SimpleNamespace(trigger="pull_request", meta={"github": github})) is None


# -- settings -----------------------------------------------------------------------------------------------

def test_settings_defaults_and_one_line_errors() -> None:
    s = Settings.from_env({})
    assert (s.confirm_max_cells, s.confirm_max_per_pr) == (8, 16)
    assert ConfirmCaps.from_settings(s) == ConfirmCaps()
    assert ConfirmCaps.from_settings(settings(3, 0)) == ConfirmCaps(3, 0)  # 0: pull requests confirm nothing
    for env, message in (({"AMPCI_CONFIRM_MAX_CELLS": "0"}, "AMPCI_CONFIRM_MAX_CELLS: must be >= 1, got 0"),
                         ({"AMPCI_CONFIRM_MAX_CELLS": "many"}, "AMPCI_CONFIRM_MAX_CELLS: expected an integer, got 'many'"),
                         ({"AMPCI_CONFIRM_MAX_PER_PR": "-1"}, "AMPCI_CONFIRM_MAX_PER_PR: must be >= 0, got -1"),
                         ({"AMPCI_CONFIRM_MAX_PER_PR": "1.5"}, "AMPCI_CONFIRM_MAX_PER_PR: expected an integer, got '1.5'")):
        with pytest.raises(ConfigError) as err:
            Settings.from_env(env)
        assert str(err.value) == message and "\n" not in str(err.value)
    with pytest.raises(ValueError):
        ConfirmCaps(max_cells=0)


# -- the lifecycle ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("real", [True, False])
def test_a_run_over_the_cap_confirms_the_largest_effects_and_reports_the_rest_as_not_confirmed(
        store: Store, real: bool) -> None:
    a, b = chain(store, 2)
    models = sorted(SLOWDOWN)
    finish_if_complete(store, make_run(store, a, models, slow=False, seed=0), settings(3))
    run_id = make_run(store, b, models, slow=True, seed=100)
    cfg = settings(max_cells=3)
    worker = StandInWorker(store, cfg, slower=0.6 if real else 0.0)

    assert finish_if_complete(store, run_id, cfg, dispatch=worker) is False
    assert len(worker.sent) == 1 and confirmed_cells(store, worker, 0) == sorted(BY_EFFECT[:3])
    assert store.get_run(worker.sent[0]).meta["caps"] == {"max_cells": 3, "capped": 3}
    got = states(store, run_id)
    for m in BY_EFFECT[3:]:  # left out at once, saying why; they wait for nothing
        assert got[m] == ("suspected", CAPPED_BY, "not confirmed: confirmation cap of 3 cells per run reached")
    assert finish_if_complete(store, run_id, cfg, dispatch=worker) is False and len(worker.sent) == 1
    worker.work()

    assert store.get_run(run_id).status == "complete"
    got = states(store, run_id)
    assert {m: got[m][0] for m in BY_EFFECT[:3]} == {m: "open" if real else "dismissed" for m in BY_EFFECT[:3]}
    assert all(got[m][:2] == ("suspected", CAPPED_BY) for m in BY_EFFECT[3:])
    assert confirmation_cost(store, run_id) == {"runs": 1, "cells": 3, "job_seconds": 10.5}
    v = run_verdict(store, run_id)
    assert v.others["not confirmed (cap)"] == {"conversion_time": 3}
    assert "3 not confirmed (cap) (conversion_time)" in v.headline()
    # the capped ones never fail the gate, and never pass it silently: no "no regressions" is said
    assert v.exit_code == (1 if real else 0) and "no regressions" not in v.headline()
    assert finish_if_complete(store, run_id, cfg, dispatch=worker) is True  # re-finishing keeps every verdict
    assert states(store, run_id) == got


def test_a_pull_request_spends_its_budget_across_runs_and_then_confirms_nothing(store: Store) -> None:
    a, b, c, d = chain(store, 4)
    models = sorted(SLOWDOWN)
    cfg = settings(max_cells=4, max_per_pr=6)
    finish_if_complete(store, make_run(store, a, models, slow=False, seed=0), cfg)
    worker = StandInWorker(store, cfg)

    first = make_run(store, b, models, slow=True, seed=100, trigger="pull_request", baseline=a, pr=7)
    assert finish_if_complete(store, first, cfg, dispatch=worker) is False
    assert confirmed_cells(store, worker, 0) == sorted(BY_EFFECT[:4])  # the run cap: 4 of 6
    worker.work()
    with store.transaction() as conn:
        assert budgets.spent(conn, repository="acme/amp-pass", pr_number=7) == 4

    second = make_run(store, c, models, slow=True, seed=200, trigger="pull_request", baseline=a, pr=7)
    assert finish_if_complete(store, second, cfg, dispatch=worker) is False
    assert confirmed_cells(store, worker, 1) == sorted(BY_EFFECT[:2])  # what the budget left: 2
    got = states(store, second)
    budget_note = "not confirmed: confirmation budget of 6 cells for pull request acme/amp-pass#7 spent"
    assert [got[m] for m in BY_EFFECT[2:4]] == [("suspected", CAPPED_BY, budget_note)] * 2
    assert [got[m][2] for m in BY_EFFECT[4:]] == ["not confirmed: confirmation cap of 4 cells per run reached"] * 2
    worker.work()

    # the budget is spent: a third synchronize confirms nothing, finishes at once and says so
    third = make_run(store, d, models, slow=True, seed=300, trigger="pull_request", baseline=a, pr=7)
    assert finish_if_complete(store, third, cfg, dispatch=worker) is True and len(worker.sent) == 2
    assert confirmation_cost(store, third)["runs"] == 0
    got = states(store, third)
    assert [got[m] for m in BY_EFFECT[:4]] == [("suspected", CAPPED_BY, budget_note)] * 4
    v = run_verdict(store, third)
    assert v.exit_code == 0 and "6 not confirmed (cap) (conversion_time)" in v.headline()
    with store.transaction() as conn:
        assert budgets.spent(conn, repository="acme/amp-pass", pr_number=7) == 6

    # another pull request has its own budget; a push run has none, whatever its meta says
    other = make_run(store, d, models, slow=True, seed=400, trigger="pull_request", baseline=a, pr=8)
    assert finish_if_complete(store, other, cfg, dispatch=worker) is False and len(worker.sent) == 3
    assert len(confirmed_cells(store, worker, 2)) == 4
    push = make_run(store, d, models, slow=True, seed=500, trigger="push", baseline=a, pr=7)
    assert finish_if_complete(store, push, cfg, dispatch=worker) is False and len(worker.sent) == 4
    assert confirmed_cells(store, worker, 3) == sorted(BY_EFFECT[:4])


def test_concurrent_runs_of_one_pull_request_never_spend_more_than_its_budget(store: Store) -> None:
    revs = chain(store, 5)
    models = sorted(SLOWDOWN)
    cfg = settings(max_cells=4, max_per_pr=6)
    finish_if_complete(store, make_run(store, revs[0], models, slow=False, seed=0), cfg)
    runs = [make_run(store, rev, models, slow=True, seed=100 * k, trigger="pull_request", baseline=revs[0], pr=9)
            for k, rev in enumerate(revs[1:], start=1)]
    sent: list[int] = []
    lock = threading.Lock()

    def send(run_id: int) -> None:
        with lock:
            sent.append(run_id)

    def finish(run_id: int) -> None:
        for _ in range(2):  # two finishers per run, as two workers finishing its last jobs at once may
            finish_if_complete(store, run_id, cfg, dispatch=send)

    threads = [threading.Thread(target=finish, args=(r,)) for r in runs for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    timed = sum(len(store.jobs(r)) for r in set(sent))
    with store.transaction() as conn:
        assert budgets.spent(conn, repository="acme/amp-pass", pr_number=9) == timed == 6
    for r in runs:  # every suspected cell is either confirmed by a confirmation run or marked as capped
        confirming = {j.cell[0] for s in set(sent) if store.get_run(s).meta["confirms"] == r for j in store.jobs(s)}
        got = states(store, r)
        assert {m for m, st in got.items() if st[1] != CAPPED_BY} == confirming


def test_a_failed_dispatch_opens_the_chosen_cells_and_leaves_the_capped_ones_as_they_were(store: Store) -> None:
    a, b = chain(store, 2)
    models = sorted(SLOWDOWN)
    cfg = settings(max_cells=2)
    finish_if_complete(store, make_run(store, a, models, slow=False, seed=0), cfg)
    run_id = make_run(store, b, models, slow=True, seed=100)

    def broken(_: int) -> None:
        raise ConnectionError("broker down")

    assert finish_if_complete(store, run_id, cfg, dispatch=broken) is True
    got = states(store, run_id)
    assert {m: got[m][:2] for m in BY_EFFECT[:2]} == {m: ("open", "ampci-confirm") for m in BY_EFFECT[:2]}
    assert all(got[m][2] == "not confirmed: confirmation could not be dispatched: broker down" for m in BY_EFFECT[:2])
    assert all(got[m][:2] == ("suspected", CAPPED_BY) for m in BY_EFFECT[2:])
    assert run_verdict(store, run_id).exit_code == 1  # a broken check of a slowdown never passes the gate
