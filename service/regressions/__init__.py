"""Regression detection as pure rules over plain data: (baseline, new) samples, series and stored findings.

- :mod:`service.regressions.kinds` — one module per finding kind (its rule, comparability, bisection,
  confirmation limits, drift metrics, how it is shown) and the registry listing them;
- :mod:`service.regressions.rules` — applying the kinds' rules to a cell (and the tables derived from the
  registry);
- :mod:`service.regressions.stats` — Mann-Whitney U, the windowed change-point test, flip counting;
- :mod:`service.regressions.thresholds` — configured limits;
- :mod:`service.regressions.stored` — stored results and findings as the rules read them;
- :mod:`service.regressions.detect` — baselines pooled, flaky cells, the rows a run's findings are stored as,
  the regressions a run resolves; :mod:`service.regressions.drift` — drift over a first-parent line;
- :mod:`service.regressions.confirm`, :mod:`service.regressions.bisect` — the decisions of confirmation and
  bisection; :mod:`service.regressions.verdict` — a run's verdict;
- :mod:`service.regressions.render` — numbers as people read them (figures, a terminal plot).

Nothing here opens a session: :mod:`service.db` reads and writes (``series``, ``findings``,
``confirmations``), :mod:`service.orchestration` drives a run's judgement (``judge``, ``confirm_run``,
``bisection``, ``bisect_run``).
"""

from __future__ import annotations
