"""The service's vocabulary: the names of run and job states, triggers, dtypes, policies and targets,
each defined here once, and the validators that refuse a value outside them.

Every layer reads its names from here (the store checks ``runs.status`` against :data:`RUN_STATES`,
the API's ``status`` filter is a ``Literal`` of it, the CLI's ``--status`` choices are it), so a
new state or dtype is added in one place.  The validators raise :class:`UnknownNameError` (a
``UserError``: exit 2, HTTP 400) whose one-line message lists what *is* accepted and suggests the
closest name; :mod:`service.cli.argtypes` turns them into argparse types.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from service.errors import UserError

# -- runs ----------------------------------------------------------------------------------------
#: How a run was started (``runs.trigger``).
TRIGGERS = ("push", "pull_request", "nightly", "manual", "bisect", "confirm")
#: A pull request run whose code may not run until a maintainer approves it (service.github.approval): no jobs.
AWAITING_APPROVAL = "awaiting_approval"
#: Every run status (``runs.status``), in the order a run passes through them.
RUN_STATES = (AWAITING_APPROVAL, "queued", "running", "complete", "partial", "failed", "cancelled")
#: The statuses a run may be created with.
NEW_RUN_STATES = ("queued", AWAITING_APPROVAL)
#: The statuses a run never leaves: its jobs are over and it was judged (or cancelled).
FINAL_RUN_STATES = frozenset({"complete", "partial", "failed", "cancelled"})

# -- jobs ----------------------------------------------------------------------------------------
#: Every job status (``jobs.status``).  ``error``: the job ended outside its code without a result (the worker
#: lost, the broker or database failing) -- ampci's failure, as a *result* status ``error`` is
#: (:data:`workers.result.NOT_OF_THE_PASS`): neither is ever the pass's.
JOB_STATES = ("queued", "running", "done", "error", "crashed", "cancelled")
#: The statuses a job never leaves (they stamp ``finished_at``).
FINAL_JOB_STATES = frozenset({"done", "error", "crashed", "cancelled"})

# -- cells ---------------------------------------------------------------------------------------
#: The low-precision dtypes the service sweeps (a cell's ``dtype``).
DTYPES = ("fp16", "bf16")
#: The pass's named policies (``amp_pass.policy.NAMED_POLICIES``) and its targets (``amp_pass.policy.TARGETS``),
#: spelled here rather than imported, so a query command (``ampci runs``) loads no part of ``amp_pass``;
#: tests/service/test_vocabulary.py holds them equal to the pass's own lists.
PASS_POLICY_NAMES = ("default", "conservative", "aggressive")
#: The named policies a cell may use (besides a policy file, stored by its path).
POLICY_NAMES = (*PASS_POLICY_NAMES, "auto")
#: The pass targets; a result's ``target`` is one of them or the queue of one (``cuda-a100``).
TARGETS = ("cuda", "cpu")
_POLICY_FILE_SUFFIXES = (".toml", ".yaml", ".yml", ".json")

# -- time ----------------------------------------------------------------------------------------
#: Timestamps the service reads or stores lie in ``[EARLIEST, LATEST)``; others are refused.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2100, 1, 1, tzinfo=UTC)


class CellColumns(Protocol):
    """The four columns that name a cell (model, dtype, policy, target), as every stored row of one carries them:
    a finding, a job, a result."""

    @property
    def model(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def policy(self) -> str: ...
    @property
    def target(self) -> str: ...


class UnknownNameError(UserError):
    """A value that is not one of the names a field accepts; the message is one line listing them."""


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_of(what: str, choices: Sequence[str] | Callable[[], Sequence[str]]) -> Callable[[str], str]:
    """A validator accepting exactly one of ``choices`` (returned unchanged); anything else raises
    UnknownNameError naming ``what`` and listing every choice.  ``choices`` may be a function
    returning them, called only when a value is checked."""

    def check(raw: str) -> str:
        known = tuple(choices() if callable(choices) else choices)
        if raw in known:
            return raw
        raise UnknownNameError(f"unknown {what} {raw!r}{did_you_mean(raw, known)}; expected one of {', '.join(known)}")

    return check


def dtype_name(raw: str) -> str:
    """``raw`` if it is a low-precision dtype the service sweeps (``fp16``, ``bf16``), else UnknownNameError."""
    return one_of("dtype", DTYPES)(raw)


def target_name(raw: str) -> str:
    """``raw`` if it is a pass target (``cpu``, ``cuda``) or the queue of one (``cuda-a100``), as results
    store them; else UnknownNameError."""
    if raw in TARGETS or (raw.partition("-")[0] in TARGETS and raw.partition("-")[2]):
        return raw
    raise UnknownNameError(f"unknown target {raw!r}{did_you_mean(raw, TARGETS)}; expected one of "
                           f"{', '.join(TARGETS)} (or a queue of one, e.g. cuda-a100)")


def policy_name(raw: str) -> str:
    """``raw`` if it is a named policy, ``auto``, or a policy file path (results store a file policy by its
    path), so a misspelt name (``agressive``) is refused rather than matching nothing; else UnknownNameError."""
    if raw in POLICY_NAMES or "/" in raw or raw.endswith(_POLICY_FILE_SUFFIXES):
        return raw
    raise UnknownNameError(f"unknown policy {raw!r}{did_you_mean(raw, POLICY_NAMES)}; expected one "
                           f"of {', '.join(POLICY_NAMES)} or a policy file path")


# -- metrics -------------------------------------------------------------------------------------
#: Metrics a history or comparison can show (``results`` column names; aliases accepted by :func:`metric_column`).
METRICS = ("cosine", "max_abs", "error_ratio", "latency_p50_ms", "speedup", "low_precision_fraction",
           "casts_inserted", "final_error", "convert_s", "convert_cpu_s", "pass_iterations")
_ALIASES = {"latency_p50": "latency_p50_ms", "latency": "latency_p50_ms", "low_precision": "low_precision_fraction",
            "casts": "casts_inserted", "convergence": "final_error", "conversion_time": "convert_s",
            "conversion_cpu": "convert_cpu_s", "iterations": "pass_iterations"}


def metric_column(name: str) -> str:
    """The results column for a metric name or alias, or UserError listing the valid names."""
    col = _ALIASES.get(name, name)
    if col not in METRICS:
        raise UserError(f"unknown metric {name!r}; expected one of {', '.join(METRICS)}")
    return col
