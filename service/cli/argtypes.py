"""Argument types shared by the ``ampci`` subcommands."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers in ``[low, high]`` (otherwise argparse's one-line usage error)."""
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {raw!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_of(what: str, choices: Sequence[str] | Callable[[], Sequence[str]]) -> Callable[[str], str]:
    """An argparse ``type`` accepting exactly one of ``choices``; anything else is argparse's one-line
    usage error (exit 2) naming ``what`` and listing every choice, so a query filter with an unknown
    value is refused instead of printing an empty table.  ``choices`` may be a function returning
    them, called only when a value is parsed (the vocabularies live in modules the parser does not
    import)."""

    def parse(raw: str) -> str:
        known = tuple(choices() if callable(choices) else choices)
        if raw in known:
            return raw
        raise argparse.ArgumentTypeError(f"unknown {what} {raw!r}{_did_you_mean(raw, known)}; "
                                         f"expected one of {', '.join(known)}")

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def dtype_name(raw: str) -> str:
    """An argparse ``type``: a low-precision dtype the service sweeps (``fp16``, ``bf16``)."""
    from service.orchestration.sweeps import DTYPES

    return one_of("dtype", DTYPES)(raw)


def target_name(raw: str) -> str:
    """An argparse ``type``: a pass target (``cpu``, ``cuda``) or the queue of one (``cuda-a100``), as
    results store them."""
    from amp_pass.policy import TARGETS

    if raw in TARGETS or (raw.partition("-")[0] in TARGETS and raw.partition("-")[2]):
        return raw
    raise argparse.ArgumentTypeError(f"unknown target {raw!r}{_did_you_mean(raw, TARGETS)}; expected one of "
                                     f"{', '.join(TARGETS)} (or a queue of one, e.g. cuda-a100)")


def policy_name(raw: str) -> str:
    """An argparse ``type``: a named policy, ``auto``, or a policy file path (results store a file policy
    by its path), so a misspelt name (``agressive``) is refused rather than matching nothing."""
    from service.orchestration.sweeps import POLICY_NAMES

    if raw in POLICY_NAMES or "/" in raw or raw.endswith((".toml", ".yaml", ".yml", ".json")):
        return raw
    raise argparse.ArgumentTypeError(f"unknown policy {raw!r}{_did_you_mean(raw, POLICY_NAMES)}; expected one "
                                     f"of {', '.join(POLICY_NAMES)} or a policy file path")
