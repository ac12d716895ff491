"""The job's accuracy rule as the tolerance a ``policy auto`` conversion searches against.

Guarantees: :func:`search_tolerance` bounds each judged float output exactly as
:func:`workers.measure.metrics.judge` does on the same inputs (k x fp32 rerun noise + atol + rtol x max|ref|),
skips the state outputs :func:`workers.jobs.stateful.state_outputs_not_judged` leaves to convergence, and
always names the entry's minimum cosine; a pure function of its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from workers.jobs.stateful import state_outputs_not_judged
from workers.zoo.manifest import ZooEntry


def search_tolerance(entry: ZooEntry, dtype: str, k: float, ref: Mapping[str, np.ndarray],
                     baseline: Mapping[str, np.ndarray]) -> str:
    """The job's acceptance rule as a ``policy auto`` tolerance string (``workers.measure.autosearch.Tolerance``).

    Per judged float output (see :func:`state_outputs_not_judged`): ``max_abs[NAME]`` = k x fp32 rerun
    noise + atol + rtol x max|ref|, exactly the bound :func:`workers.measure.metrics.judge` applies on the same
    inputs, and the entry's minimum cosine.  (A task metric such as top-1 is not part of the search; the
    job still judges it afterwards.)
    """
    tol = entry.tolerance_for(dtype)
    skip = state_outputs_not_judged(entry, ref)
    parts = [f"cosine={tol.min_cosine!r}"]
    for name, r in ref.items():
        if name in skip or np.asarray(r).dtype.kind != "f" or any(c in name for c in ",=]"):
            continue
        r64 = np.asarray(r, np.float64)
        both = np.isfinite(r64)
        scale = float(np.abs(r64[both]).max()) if both.any() else 0.0
        b64 = np.asarray(baseline.get(name, r), np.float64)
        fin = both & np.isfinite(b64)
        noise = float(np.abs(r64 - b64)[fin].max()) if fin.any() else 0.0
        parts.append(f"max_abs[{name}]={k * noise + tol.atol + tol.rtol * scale!r}")
    return ",".join(parts)
