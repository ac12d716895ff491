"""Sweep configs: TOML files under ``sweeps/`` naming models, dtypes, policies, targets and overrides,
and their expansion into the cells of one run.  Pure data; imports no job code."""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from service.errors import UserError
from service.settings import parse_duration

SWEEPS_DIR = Path(__file__).resolve().parents[1] / "sweeps"
DTYPES = ("fp16", "bf16")
_KEYS = {"name", "description", "models", "dtypes", "policies", "targets", "repeats", "zoo", "override"}
_MATCH_KEYS = ("model", "dtype", "policy", "target")


class SweepConfigError(UserError):
    """A sweep config file is missing, malformed or names something that does not exist."""


@dataclass(frozen=True)
class Override:
    """Per-cell settings: applies to cells whose fields equal every given ``match`` value (globs ok)."""

    match: Mapping[str, str]
    skip: bool = False
    repeats: int | None = None
    timeout: float | None = None

    def applies(self, cell: tuple[str, str, str, str]) -> bool:
        """True when every given match key equals (or glob-matches) the cell's value."""
        values = dict(zip(_MATCH_KEYS, cell, strict=True))
        return all(fnmatch.fnmatchcase(values[k], v) for k, v in self.match.items())


@dataclass(frozen=True)
class PlannedCell:
    """One cell of a sweep with its effective options (what a job of it will be run with)."""

    model: str
    dtype: str
    policy: str
    target: str
    repeats: int
    timeout: float | None = None
    zoo: str | None = None

    @property
    def cell(self) -> tuple[str, str, str, str]:
        """(model, dtype, policy, target)."""
        return (self.model, self.dtype, self.policy, self.target)

    def options(self) -> dict[str, Any]:
        """The per-job options stored in the run's meta (JSON-ready)."""
        return {"repeats": self.repeats, "timeout": self.timeout, "zoo": self.zoo}


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep.  Guarantees: non-empty axes, known dtypes, valid queue-name targets."""

    name: str
    models: tuple[str, ...]
    dtypes: tuple[str, ...]
    policies: tuple[str, ...]
    targets: tuple[str, ...]
    repeats: int = 20
    description: str = ""
    overrides: tuple[Override, ...] = field(default_factory=tuple)
    zoo: str | None = None  # another zoo manifest (absolute, or relative to the repository root)

    def zoo_path(self) -> Path | None:
        """The manifest this sweep's models come from (None: the default ``zoo.toml``)."""
        if self.zoo is None:
            return None
        path = Path(self.zoo)
        return path if path.is_absolute() else SWEEPS_DIR.parent / path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<sweep>") -> SweepConfig:
        """Validate a parsed TOML table; every problem is a one-line SweepConfigError naming ``source``."""
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise SweepConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; expected {sorted(_KEYS)}")

        def names(key: str) -> tuple[str, ...]:
            raw = data.get(key)
            if not isinstance(raw, list) or not raw or not all(isinstance(x, str) and x for x in raw):
                raise SweepConfigError(f"{source}: {key!r} must be a non-empty list of strings")
            return tuple(dict.fromkeys(raw))

        name = data.get("name", Path(source).stem)
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise SweepConfigError(f"{source}: 'name' must be a simple identifier, got {name!r}")
        dtypes = names("dtypes")
        bad = [d for d in dtypes if d not in DTYPES]
        if bad:
            raise SweepConfigError(f"{source}: unknown dtype(s) {bad}; expected {list(DTYPES)}")
        targets = names("targets")
        for t in targets:
            if not t.replace("-", "").replace("_", "").isalnum():
                raise SweepConfigError(f"{source}: target {t!r} is not a valid queue name")
        repeats = _positive_int(data.get("repeats", 20), f"{source}: 'repeats'")
        raw_overrides = data.get("override", [])
        if not isinstance(raw_overrides, list):
            raise SweepConfigError(f"{source}: 'override' must be an array of tables ([[override]])")
        overrides = tuple(_override(o, f"{source}: override #{i + 1}") for i, o in enumerate(raw_overrides))
        zoo = data.get("zoo")
        if zoo is not None and (not isinstance(zoo, str) or not zoo):
            raise SweepConfigError(f"{source}: 'zoo' must be a manifest path")
        return cls(name=name, models=names("models"), dtypes=dtypes, policies=names("policies"),
                   targets=targets, repeats=repeats, description=str(data.get("description", "")),
                   overrides=overrides, zoo=zoo)

    @classmethod
    def from_file(cls, path: Path) -> SweepConfig:
        """Load and validate a sweep TOML file."""
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SweepConfigError(f"sweep config {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SweepConfigError(f"cannot read sweep config {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SweepConfigError(f"{path}: invalid TOML: {exc}") from None
        return cls.from_dict(data, str(path))

    def expand(self, catalog: Mapping[str, Iterable[str]]) -> list[PlannedCell]:
        """Cells of this sweep over ``catalog`` (zoo model name -> tags), overrides applied, sorted.

        ``tag:*`` selects every model.  A name or tag that selects nothing is an error, so a typo
        cannot silently shrink a nightly sweep.
        """
        tags = {name: set(t) for name, t in catalog.items()}
        chosen: dict[str, None] = {}
        for sel in self.models:
            if sel.startswith("tag:"):
                tag = sel[4:]
                hits = [n for n in sorted(tags) if tag == "*" or tag in tags[n]]
                if not hits:
                    raise SweepConfigError(f"sweep {self.name}: no zoo model has tag {tag!r}")
            elif sel in tags:
                hits = [sel]
            else:
                raise SweepConfigError(f"sweep {self.name}: unknown zoo model {sel!r}; "
                                       f"known: {', '.join(sorted(tags)) or '(none)'}")
            chosen.update(dict.fromkeys(hits))
        cells: list[PlannedCell] = []
        for model in chosen:
            for dtype in self.dtypes:
                for policy in self.policies:
                    for target in self.targets:
                        cell = (model, dtype, policy, target)
                        repeats, timeout, skip = self.repeats, None, False
                        for o in self.overrides:
                            if o.applies(cell):
                                skip = o.skip or skip
                                repeats = o.repeats if o.repeats is not None else repeats
                                timeout = o.timeout if o.timeout is not None else timeout
                        if not skip:
                            cells.append(PlannedCell(*cell, repeats=repeats, timeout=timeout, zoo=self.zoo))
        if not cells:
            raise SweepConfigError(f"sweep {self.name}: every cell is skipped; nothing to run")
        return sorted(cells, key=lambda c: c.cell)


def _positive_int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SweepConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


def _override(raw: Any, what: str) -> Override:
    if not isinstance(raw, dict):
        raise SweepConfigError(f"{what}: must be a table")
    unknown = sorted(set(raw) - {"match", "skip", "repeats", "timeout"})
    if unknown:
        raise SweepConfigError(f"{what}: unknown key(s) {', '.join(unknown)}")
    match = raw.get("match", {})
    if not isinstance(match, dict) or set(match) - set(_MATCH_KEYS) or \
            not all(isinstance(v, str) for v in match.values()):
        raise SweepConfigError(f"{what}: 'match' must be a table with string values for {_MATCH_KEYS}")
    skip = raw.get("skip", False)
    if not isinstance(skip, bool):
        raise SweepConfigError(f"{what}: 'skip' must be true or false")
    repeats = _positive_int(raw["repeats"], f"{what}: 'repeats'") if "repeats" in raw else None
    timeout = None
    if "timeout" in raw:
        try:
            timeout = parse_duration(f"{what}: 'timeout'", str(raw["timeout"]))
        except UserError as exc:
            raise SweepConfigError(str(exc)) from None
    return Override(match=dict(match), skip=skip, repeats=repeats, timeout=timeout)


def load_sweep(config: str | Path | None = None, sweep: str | None = None) -> SweepConfig:
    """The sweep from ``config`` (a file) or the named built-in sweep (``sweeps/<name>.toml``)."""
    if config is not None:
        return SweepConfig.from_file(Path(config))
    name = sweep or "smoke"
    path = SWEEPS_DIR / f"{name}.toml"
    if not name.replace("-", "").replace("_", "").isalnum() or not path.exists():
        known = sorted(p.stem for p in SWEEPS_DIR.glob("*.toml"))
        raise SweepConfigError(f"unknown sweep {name!r}; known: {', '.join(known)}")
    return SweepConfig.from_file(path)


def nightly_dedup_key(day: date, sweep: str) -> str:
    """The run dedup key that makes a nightly sweep happen at most once per (UTC date, sweep)."""
    return f"nightly:{day.isoformat()}:{sweep}"
