"""Regression detection: pure rules over (baseline, new) samples and series, and their application to runs.

- :mod:`service.regressions.rules` — one pure function per kind (conversion, accuracy, convergence,
  coverage, latency) returning findings;
- :mod:`service.regressions.stats` — Mann-Whitney U, the windowed change-point test, flip counting;
- :mod:`service.regressions.thresholds` — configured limits;
- :mod:`service.regressions.detect` — baselines, flaky cells, storing and auto-resolving;
- :mod:`service.regressions.render` — the text people read (tables, status lines, plots).
"""

from __future__ import annotations
