"""A stateful zoo entry in a job: which outputs the accuracy verdict leaves to convergence, and its cached rollout.

Guarantees: :func:`state_outputs_not_judged` names only state outputs of a stateful entry with ``judge_state``
false, and never all of a model's outputs; :func:`unflatten_steps` inverts :func:`flatten_steps` (a rollout is
cached as one stacked array per output); :func:`rollout_step_feeds` gives exactly the feeds
:func:`workers.measure.convergence.rollout` gives the model at that step, so one cached transition can be rerun
alone.  Pure functions of their arguments: no onnxruntime, no files.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from workers.measure import reference as refcache
from workers.zoo.inputs import make_feeds
from workers.zoo.manifest import ZooEntry


def state_outputs_not_judged(entry: ZooEntry, outputs: Mapping[str, object]) -> dict[str, str]:
    """The state outputs of a stateful entry that the accuracy verdict leaves to the convergence check.

    Empty unless the entry is stateful with ``judge_state`` false and at least one output is not a
    state output (a model whose only outputs are state is judged on them).  A recurrent state is
    internal: bf16 moves single LSTM cell elements by up to ~0.1 at one step while the task output
    stays within 3e-4 (silero VAD), so its health is judged by whether its error stays bounded,
    relative to its own magnitude, over the whole rollout.
    """
    if entry.stateful is None or entry.stateful.judge_state:
        return {}
    state = set(entry.stateful.state.values()) & set(outputs)
    if not state or not set(outputs) - state:
        return {}
    return {name: "state output: judged by the convergence check" for name in sorted(state)}


def flatten_steps(steps: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One array per output, stacked over steps (a rollout is stored as few large arrays)."""
    return {f"rollout/{k}": np.stack([outs[k] for outs in steps]) for k in steps[0]}


def unflatten_steps(arrays: dict[str, np.ndarray], steps: int) -> list[dict[str, np.ndarray]]:
    """The ``steps`` per-step outputs :func:`flatten_steps` stored, step ``t`` being ``arrays[...][t]``."""
    stacked = refcache.split(arrays, "rollout")
    return [{k: v[t] for k, v in stacked.items()} for t in range(steps)]


def rollout_step_feeds(entry: ZooEntry, seed: int, ref_steps: list[dict[str, np.ndarray]],
                        step: int) -> dict[str, np.ndarray]:
    """The feeds :func:`workers.measure.convergence.rollout` gives the model at ``step``, its state taken from
    ``ref_steps[step - 1]`` (so one cached transition can be rerun alone)."""
    assert entry.stateful is not None
    fresh = make_feeds(entry, seed, step=step)
    if not step:
        return fresh
    feeds = {k: v for k, v in fresh.items() if k not in entry.stateful.state}
    for inp, out in entry.stateful.state.items():
        feeds[inp] = ref_steps[step - 1][out].astype(fresh[inp].dtype)
    return feeds
