"""Configured thresholds of the regression rules (defaults here; overridable from a mapping/file).

Accuracy thresholds are per dtype and may be overridden per model (``models: {name: {dtype|"*":
{ratio, floor}}}``): bf16 carries 3 fewer mantissa bits than fp16, so its absolute floor is larger.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Protocol

from service.errors import ConfigError
from service.json_types import JsonValue


@dataclass(frozen=True)
class ErrorThreshold:
    """An error metric regresses when ``new > base * ratio`` **and** ``new - base > floor``."""

    ratio: float
    floor: float

    def worse(self, base: float, new: float) -> bool:
        """True when ``new`` is worse than ``base`` beyond both the ratio and the floor."""
        return new > base * self.ratio and new - base > self.floor

    def better(self, base: float, new: float) -> bool:
        """True when ``new`` is better than ``base`` beyond both the ratio and the floor."""
        return self.worse(new, base)


def _default_accuracy() -> dict[str, ErrorThreshold]:
    return {"fp16": ErrorThreshold(2.0, 1e-3), "bf16": ErrorThreshold(2.0, 1e-2)}


@dataclass(frozen=True)
class Thresholds:
    """All knobs of the rules.  Immutable; build variants with :meth:`from_mapping`."""

    accuracy: dict[str, ErrorThreshold] = field(default_factory=_default_accuracy)
    accuracy_fallback: ErrorThreshold = ErrorThreshold(2.0, 1e-3)
    model_accuracy: dict[str, dict[str, ErrorThreshold]] = field(default_factory=dict)
    convergence: ErrorThreshold = ErrorThreshold(2.0, 1e-3)
    coverage_fraction_drop: float = 0.02     # absolute drop of the low-precision compute fraction
    casts_growth_ratio: float = 1.10
    casts_growth_abs: int = 2
    latency_ratio: float = 1.10              # asv: a change must exceed 10 % ...
    latency_p: float = 0.002                 # ... and be significant (Mann-Whitney U, one-sided) ...
    latency_floor_ms: float = 0.05           # ... and move the p50 by more than this (timer noise below)
    latency_min_samples: int = 6             # fewest samples per side with which p < latency_p is possible
    latency_pool: int = 5                    # baseline results of one revision pooled (newest first)
    nightly_p: float = 0.001                 # change-point over nightly history
    nightly_floor: float = 0.10              # relative magnitude floor of a nightly shift
    nightly_window: int = 10                 # reference points before the candidate shift
    nightly_min_history: int = 5
    nightly_consecutive: int = 2
    flaky_allowlist: tuple[str, ...] = ()    # fnmatch patterns over "model/dtype/policy/target"
    flaky_flips: int = 3                     # pass<->not-pass flips ...
    flaky_window: int = 10                   # ... within the last M results of the cell
    ancestor_depth: int = 500                # how far back a push baseline is searched
    coverage_compute_drop: int = 1           # low-precision compute nodes lost (measured) that regress coverage
    convert_time_ratio: float = 1.20         # conversion time: median ratio beyond this ...
    convert_time_floor_s: float = 0.10       # ... and a median change above this (fork, I/O jitter below) ...
    convert_time_p: float = 0.01             # ... significant (Mann-Whitney U, one-sided)
    convert_time_min_samples: int = 3        # conversion-time samples needed on each side
    confirm_p: float = 0.01                  # confirmation: one-sided Wilcoxon signed-rank p on per-pair ratios
    suspect_p: float = 0.10                  # screening p of a timing regression that a confirmation run will judge
    pass_iterations_ratio: float = 1.5       # painting iterations grew beyond this ratio ...
    pass_iterations_abs: int = 2             # ... and by more than this many iterations
    drift_window: int = 16                   # drift: the measured revisions of a cell's lookback window ...
    drift_min_history: int = 2               # ... at least this many before a drift is judged
    drift_line_depth: int = 200              # first-parent commits searched for them (and for a pinned baseline)

    def accuracy_for(self, model: str, dtype: str) -> ErrorThreshold:
        """The accuracy threshold of a model at a dtype (model override > dtype > fallback)."""
        per_model = self.model_accuracy.get(model, {})
        return per_model.get(dtype) or per_model.get("*") or self.accuracy.get(dtype) or self.accuracy_fallback

    def allowlisted(self, cell: tuple[str, str, str, str]) -> bool:
        """True when the cell matches a flaky allowlist pattern."""
        key = "/".join(cell)
        return any(fnmatch.fnmatchcase(key, pat) for pat in self.flaky_allowlist)

    @classmethod
    def from_mapping(cls, data: Mapping[str, JsonValue]) -> Thresholds:
        """Defaults overridden by ``data``; unknown keys or malformed values raise ConfigError."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown threshold keys: {', '.join(sorted(unknown))}")
        out = cls()
        kwargs: dict[str, object] = {}
        try:
            for key, value in data.items():
                if key == "accuracy":
                    kwargs[key] = {**out.accuracy, **{d: _thr(v) for d, v in value.items()}}
                elif key in ("accuracy_fallback", "convergence"):
                    kwargs[key] = _thr(value)
                elif key == "model_accuracy":
                    kwargs[key] = {mdl: {d: _thr(v) for d, v in per.items()} for mdl, per in value.items()}
                elif key == "flaky_allowlist":
                    kwargs[key] = tuple(str(p) for p in value)
                else:
                    kwargs[key] = type(getattr(out, key))(value)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise ConfigError(f"malformed thresholds: {exc}") from None
        # each key was checked against the fields above and its value converted to the field's type; mypy
        # checks replace() field by field, which changes keyed by a loop variable cannot satisfy
        with_changes: _Replace = replace
        return with_changes(out, **kwargs)

    @classmethod
    def load(cls, path: str | Path) -> Thresholds:
        """Thresholds from a JSON or YAML file (ConfigError naming the file when unreadable)."""
        p = Path(path)
        try:
            text = p.read_text()
            if p.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text) or {}
            else:
                data = json.loads(text)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read thresholds file {p}: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"thresholds file {p} must hold a mapping")
        return cls.from_mapping(data)


class _Replace(Protocol):
    """:func:`dataclasses.replace` of a Thresholds, with changes whose types were checked at run time."""

    def __call__(self, obj: Thresholds, /, **changes: object) -> Thresholds: ...


def _thr(value: JsonValue) -> ErrorThreshold:
    if isinstance(value, ErrorThreshold):
        return value
    return ErrorThreshold(ratio=float(value["ratio"]), floor=float(value["floor"]))
