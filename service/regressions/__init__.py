"""Regression detection: pure rules over (baseline, new) samples and series, and their application to runs.

- :mod:`service.regressions.kinds` — one module per finding kind (its rule, comparability, bisection,
  confirmation limits, drift metrics, how it is shown) and the registry listing them;
- :mod:`service.regressions.rules` — applying the kinds' rules to a cell (and the tables derived from the
  registry);
- :mod:`service.regressions.stats` — Mann-Whitney U, the windowed change-point test, flip counting;
- :mod:`service.regressions.thresholds` — configured limits;
- :mod:`service.regressions.detect` — baselines, flaky cells, storing and auto-resolving;
- :mod:`service.regressions.verdict` — the one decider of a run's verdict (state, exit code, headline);
- :mod:`service.regressions.render` — the text people read (tables, status lines, plots).
"""

from __future__ import annotations
