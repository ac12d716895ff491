"""Sweep configs: TOML files under ``sweeps/`` naming models, dtypes, policies, targets and overrides,
and their expansion into the cells of one run.  Pure data; imports no job code."""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from amp_pass.errors import PolicyError
from amp_pass.policy import load_policy, unmatched_node_rules
from service.errors import UserError
from service.json_types import JsonObject
from service.settings import parse_duration
from service.vocabulary import DTYPES as DTYPES  # re-exported: a sweep's dtypes
from service.vocabulary import POLICY_NAMES as POLICY_NAMES
from service.vocabulary import TARGETS
from service.vocabulary import did_you_mean as _did_you_mean

SWEEPS_DIR = Path(__file__).resolve().parents[2] / "sweeps"
_KEYS = {"name", "description", "models", "dtypes", "policies", "targets", "repeats", "zoo", "override"}
_MATCH_KEYS = ("model", "dtype", "policy", "target")
NodeNames = Callable[[str], Iterable[str]]  # zoo model name -> its node names (subgraphs too)


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

    def options(self) -> JsonObject:
        """The per-job options stored in the run's meta (JSON-ready)."""
        return {"repeats": self.repeats, "timeout": self.timeout, "zoo": self.zoo}


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep.  Guarantees: non-empty axes, known dtypes, targets of a known kind (``cpu``,
    ``cuda``, or a queue of one, ``cuda-a100``), and policies that are named policies, ``auto`` or
    readable, valid policy files (relative paths resolved against the sweep file's folder; the cells
    carry the absolute path, ``policy_files`` maps it back to what the sweep wrote, for overrides), and a
    ``zoo`` manifest that exists, held as its absolute path (a relative one is relative to the sweep
    file's folder, like policy files)."""

    name: str
    models: tuple[str, ...]
    dtypes: tuple[str, ...]
    policies: tuple[str, ...]
    targets: tuple[str, ...]
    repeats: int = 20
    description: str = ""
    overrides: tuple[Override, ...] = field(default_factory=tuple)
    zoo: str | None = None  # another zoo manifest (absolute path; None: built-in zoo + user zoo)
    policy_files: Mapping[str, str] = field(default_factory=dict)  # resolved path -> as written

    def zoo_path(self) -> Path | None:
        """The manifest this sweep's models come from (None: the default ``zoo.toml``)."""
        return None if self.zoo is None else Path(self.zoo)

    @classmethod
    def from_dict(cls, data: Mapping[str, object], source: str = "<sweep>", base_dir: Path | None = None
                  ) -> SweepConfig:
        """Validate a parsed TOML table; every problem is a one-line SweepConfigError naming ``source``.
        Policy file and zoo manifest paths are relative to ``base_dir`` (default: the current directory)."""
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
            check_target(t, source, queues=True)
        policy_files: dict[str, str] = {}
        policies = tuple(resolve_policy(p, base_dir or Path.cwd(), source, policy_files)
                         for p in names("policies"))
        repeats = _positive_int(data.get("repeats", 20), f"{source}: 'repeats'")
        raw_overrides = data.get("override", [])
        if not isinstance(raw_overrides, list):
            raise SweepConfigError(f"{source}: 'override' must be an array of tables ([[override]])")
        overrides = tuple(_override(o, f"{source}: override #{i + 1}") for i, o in enumerate(raw_overrides))
        raw_zoo = data.get("zoo")
        zoo = _resolve_zoo(raw_zoo, base_dir or Path.cwd(), source) if raw_zoo is not None else None
        return cls(name=name, models=names("models"), dtypes=dtypes, policies=tuple(dict.fromkeys(policies)),
                   targets=targets, repeats=repeats, description=str(data.get("description", "")),
                   overrides=overrides, zoo=zoo, policy_files=policy_files)

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
        return cls.from_dict(data, str(path), base_dir=path.resolve().parent)

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
                        written = (model, dtype, self.policy_files.get(policy, policy), target)
                        repeats, timeout, skip = self.repeats, None, False
                        for o in self.overrides:
                            if o.applies(cell) or o.applies(written):
                                skip = o.skip or skip
                                repeats = o.repeats if o.repeats is not None else repeats
                                timeout = o.timeout if o.timeout is not None else timeout
                        if not skip:
                            cells.append(PlannedCell(*cell, repeats=repeats, timeout=timeout, zoo=self.zoo))
        if not cells:
            raise SweepConfigError(f"sweep {self.name}: every cell is skipped; nothing to run")
        return sorted(cells, key=lambda c: c.cell)

    def node_rule_warnings(self, cells: Iterable[PlannedCell], node_names: NodeNames) -> list[str]:
        """One line per ``[[nodes]]`` regex of a policy file of this sweep that matches no node of any
        model the sweep runs with that policy (``node_names(model)``; a model whose nodes cannot be
        listed is left out, and said so).  Empty when no policy file has node rules."""
        models: dict[str, list[str]] = {}
        for c in cells:
            if c.policy in self.policy_files:
                models.setdefault(c.policy, [])
                if c.model not in models[c.policy]:
                    models[c.policy].append(c.model)
        warnings: list[str] = []
        for path, chosen in models.items():
            rules = load_policy(path, TARGETS[0], 1)
            if not rules.node_rules:
                continue
            names: list[str] = []
            unlisted: list[str] = []
            for model in chosen:
                try:
                    names.extend(node_names(model))
                except Exception as exc:  # noqa: BLE001 - a warning must never stop the sweep
                    unlisted.append(f"{model} ({type(exc).__name__})")
            checked = [m for m in chosen if not any(u.startswith(f"{m} (") for u in unlisted)]
            if not checked:
                continue
            for pattern in unmatched_node_rules(rules, names):
                warnings.append(f"policy {self.policy_files[path]}: [[nodes]] match {pattern!r} matches no node "
                                f"of {', '.join(checked)}" + (f" (not listed: {', '.join(unlisted)})" if unlisted
                                                               else ""))
        return warnings

    def warnings_meta(self, cells: Iterable[PlannedCell], cache_dir: Path, data_dir: Path | None = None
                      ) -> dict[str, list[str]]:
        """``{"warnings": [...]}`` for the run's meta (:meth:`node_rule_warnings` over this sweep's zoo,
        with the user zoo under ``data_dir``, models fetched into ``cache_dir`` as jobs would), or ``{}``
        when there is nothing to say."""
        warnings = self.node_rule_warnings(cells, zoo_node_names(self.zoo_path(), cache_dir, data_dir))
        return {"warnings": warnings} if warnings else {}


def zoo_node_names(zoo: Path | None, cache_dir: Path, data_dir: Path | None = None) -> NodeNames:
    """Node names (every graph, subgraphs included) of a zoo model (``zoo`` None: the built-in zoo and
    the user zoo under ``data_dir``), fetched into ``cache_dir`` as a job fetches it; reads the graph
    only (no weights, no onnxruntime)."""

    def names(model: str) -> list[str]:
        import onnx

        from workers.zoo.fetch import fetch_entry
        from workers.zoo.manifest import load_zoo

        fetched = fetch_entry(load_zoo(zoo, data_dir).get(model), Path(cache_dir))
        proto = onnx.load(str(fetched.path), load_external_data=False)
        found: list[str] = []
        graphs = [proto.graph]
        while graphs:
            graph = graphs.pop()
            for node in graph.node:
                found.append(node.name)
                for attr in node.attribute:
                    graphs.extend([attr.g] if attr.HasField("g") else attr.graphs)
        return found

    return names


def check_target(target: str, source: str, queues: bool = False) -> None:
    """SweepConfigError unless ``target`` is a pass target (``cpu``, ``cuda``) or, with ``queues``, the
    queue of one (``cuda-a100``)."""
    if target in TARGETS or (queues and target.partition("-")[0] in TARGETS):
        return
    also = " (or a queue of one, e.g. cuda-a100)" if queues else ""
    raise SweepConfigError(f"{source}: unknown target {target!r}{_did_you_mean(target, TARGETS)}; expected "
                           f"{' or '.join(TARGETS)}{also}")


def resolve_policy(policy: str, base_dir: Path, source: str, files: dict[str, str] | None = None) -> str:
    """A named policy or ``auto`` as it is; a policy file as its absolute path (relative to ``base_dir``),
    after loading it in full, so a bad op type or regex is a SweepConfigError naming ``source``, not a
    ``convert_error`` cell.  ``files`` collects resolved path -> as written."""
    if policy in POLICY_NAMES:
        return policy
    path = Path(policy).expanduser()
    path = (path if path.is_absolute() else base_dir / path).resolve()
    if not path.is_file():
        raise SweepConfigError(f"{source}: unknown policy {policy!r}{_did_you_mean(policy, POLICY_NAMES)}; "
                               f"expected one of {', '.join(POLICY_NAMES)} or a policy file "
                               f"({path} does not exist)")
    try:
        load_policy(str(path), TARGETS[0], 1)
    except PolicyError as exc:
        raise SweepConfigError(f"{source}: {exc}") from None
    if files is not None:
        files[str(path)] = policy
    return str(path)


def _resolve_zoo(zoo: object, base_dir: Path, source: str) -> str:
    """A sweep's ``zoo`` manifest as an absolute path (relative to ``base_dir``); it must exist."""
    if not isinstance(zoo, str) or not zoo:
        raise SweepConfigError(f"{source}: 'zoo' must be a manifest path")
    path = Path(zoo).expanduser()
    path = (path if path.is_absolute() else base_dir / path).resolve()
    if not path.is_file():
        raise SweepConfigError(f"{source}: zoo manifest {zoo!r} does not exist ({path})")
    return str(path)


def _positive_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SweepConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


def _override(raw: object, what: str) -> Override:
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
