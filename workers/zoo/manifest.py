"""The model zoo manifest (``zoo.toml``): typed entries, validated when loaded.

Every problem in the manifest is a :class:`ZooError` naming the entry and the key, raised when the
manifest is loaded, so a bad entry never gets as far as a job.  The format is documented at the
top of ``zoo.toml``.  Relative paths in a manifest (``path`` sources, ``npz`` inputs) are relative to
the manifest's own folder, whatever the current directory.  The default catalogue
(``load_zoo(None, data_dir)``) is the built-in ``zoo.toml`` merged with the user zoo
(``DATA_DIR/user_zoo.toml``, written by ``ampci zoo add``); a name in both is a ZooError.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.tolerance import TASK_METRIC_NAMES, Tolerance  # numpy-free: `ampci zoo list` loads no numpy

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MANIFEST = REPO_ROOT / "zoo.toml"
DTYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
DISTS = ("normal", "uniform", "zeros", "ones", "constant", "randint", "npz")
SOURCE_KINDS = ("package", "path", "url", "onnx_light", "synthetic")
LOW_DTYPES = ("fp16", "bf16")
_TOL_KEYS = {"atol", "rtol", "min_cosine", "task_min"}
USER_ZOO_FILE = "user_zoo.toml"
ORIGIN_BUILTIN, ORIGIN_USER = "builtin", "user"


class ZooError(Exception):
    """The manifest or an entry is malformed, or a model name is unknown (a user error)."""

    exit_code = 2


@dataclass(frozen=True)
class InputSpec:
    """How to make one input: concrete shape, dtype, and a value distribution or a .npz array."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    dist: str = "normal"
    mean: float = 0.0
    std: float = 1.0
    low: float = 0.0
    high: float = 1.0
    value: float = 0.0
    npz: str | None = None  # path relative to the manifest's directory; array key = input name
    per_step: bool = True   # stateful models: draw fresh values at every step (else keep step 0's)
    note: str = ""          # where the spec came from (e.g. "shape from --input-shape"), for the result


@dataclass(frozen=True)
class Source:
    """Where a model comes from.  ``kind`` is one of SOURCE_KINDS; ``ref`` its locator."""

    kind: str
    ref: str
    member: str | None = None  # path inside the wheel (kind == "package")
    seed: int = 0              # materialise / synthetic generation seed
    endpoint_url: str | None = None  # s3:// urls: the S3 endpoint (else boto3's own configuration)


@dataclass(frozen=True)
class Stateful:
    """A model whose state outputs feed back as inputs (``state`` maps input -> output)."""

    state: dict[str, str]
    steps: int | None = None  # None: settings.convergence_steps
    cap: float = 1.0          # a step error above this (or non-finite) means diverged
    # False (default): the state outputs are judged by the convergence check (bounded error over the
    # rollout, relative to their own scale), and the accuracy verdict by the other (task) outputs;
    # True: the state outputs are also held to the accuracy tolerance after one step.
    judge_state: bool = False


@dataclass(frozen=True)
class LoopTrace:
    """A Loop model whose scan output ``output`` has one row per iteration; ``trip_input`` sets T."""

    trip_input: str
    output: str
    steps: int | None = None
    cap: float = 1.0


@dataclass(frozen=True)
class ZooEntry:
    """One named model of the zoo."""

    name: str
    source: Source
    sha256: str | None
    inputs: tuple[InputSpec, ...]
    tolerances: dict[str, Tolerance] = field(default_factory=lambda: {d: Tolerance() for d in LOW_DTYPES})
    task: str | None = None
    task_outputs: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    stateful: Stateful | None = None
    loop: LoopTrace | None = None
    seed: int = 0
    description: str = ""
    base_dir: Path = REPO_ROOT
    origin: str = ORIGIN_BUILTIN  # "builtin", "user" (the user zoo), "file" (a model checked by path) or a manifest path

    def tolerance_for(self, dtype: str) -> Tolerance:
        """The tolerance that applies to conversions to ``dtype`` (``fp16`` / ``bf16``)."""
        return self.tolerances.get(dtype, Tolerance())

    @property
    def steps_configured(self) -> int | None:
        """Convergence steps declared by the entry (None: use the settings default)."""
        part = self.stateful or self.loop
        return part.steps if part else None


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise ZooError(f"{where}: missing key {key!r}")
        return default
    value = d[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        raise ZooError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _check_keys(d: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ZooError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _parse_input(name: str, d: dict[str, Any], where: str) -> InputSpec:
    w = f"{where}.inputs.{name}"
    _check_keys(d, {"shape", "dtype", "dist", "mean", "std", "low", "high", "value", "npz", "per_step", "note"}, w)
    shape = _get(d, "shape", list, w)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ZooError(f"{w}: shape must be a list of non-negative integers, got {shape!r}")
    dtype = _get(d, "dtype", str, w, "float32")
    if dtype not in DTYPES:
        raise ZooError(f"{w}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    dist = _get(d, "dist", str, w, "npz" if "npz" in d else ("constant" if "value" in d else "normal"))
    if dist not in DISTS:
        raise ZooError(f"{w}: unknown dist {dist!r}; expected one of {', '.join(DISTS)}")
    if dist == "npz" and "npz" not in d:
        raise ZooError(f"{w}: dist 'npz' needs an 'npz' file")
    return InputSpec(name=name, shape=tuple(shape), dtype=dtype, dist=dist,
                     mean=_get(d, "mean", float, w, 0.0), std=_get(d, "std", float, w, 1.0),
                     low=_get(d, "low", float, w, 0.0), high=_get(d, "high", float, w, 1.0),
                     value=_get(d, "value", float, w, 0.0), npz=_get(d, "npz", str, w, None),
                     per_step=_get(d, "per_step", bool, w, True), note=_get(d, "note", str, w, ""))


def _parse_source(d: dict[str, Any], where: str) -> Source:
    w = f"{where}.source"
    _check_keys(d, {*SOURCE_KINDS, "member", "seed", "endpoint_url"}, w)
    kinds = [k for k in SOURCE_KINDS if k in d]
    if len(kinds) != 1:
        raise ZooError(f"{w}: exactly one of {', '.join(SOURCE_KINDS)} is required, got {kinds or 'none'}")
    kind = kinds[0]
    ref = _get(d, kind, str, w)
    member = _get(d, "member", str, w, None)
    if kind == "package" and ("==" not in ref or not member):
        raise ZooError(f"{w}: package sources need 'name==version' and a 'member' path inside the wheel")
    if kind == "url" and not ref.startswith(("https://", "http://", "file://", "s3://")):
        raise ZooError(f"{w}: url must start with https://, http://, file:// or s3://, got {ref!r}")
    endpoint = _get(d, "endpoint_url", str, w, None)
    if endpoint is not None and not (kind == "url" and ref.startswith("s3://")):
        raise ZooError(f"{w}: 'endpoint_url' is only for s3:// url sources")
    if kind == "url" and ref.startswith("s3://") and not ref[5:].partition("/")[2]:
        raise ZooError(f"{w}: s3 url must be s3://BUCKET/KEY, got {ref!r}")
    return Source(kind=kind, ref=ref, member=member, seed=_get(d, "seed", int, w, 0), endpoint_url=endpoint)


def _parse_tolerances(defaults: dict[str, Any], own: dict[str, Any], where: str) -> dict[str, Tolerance]:
    """Per-dtype tolerances: defaults < defaults.<dtype> < entry < entry.<dtype> (later wins)."""
    out = {}
    for dtype in LOW_DTYPES:
        merged: dict[str, Any] = {}
        for layer, w in ((defaults, "[defaults.tolerance]"), (own, f"{where}.tolerance")):
            _check_keys(layer, _TOL_KEYS | set(LOW_DTYPES), w)
            merged.update({k: v for k, v in layer.items() if k in _TOL_KEYS})
            sub = layer.get(dtype, {})
            if not isinstance(sub, dict):
                raise ZooError(f"{w}.{dtype} must be a table")
            _check_keys(sub, _TOL_KEYS, f"{w}.{dtype}")
            merged.update(sub)
        for k, v in merged.items():
            if not isinstance(v, int | float) or isinstance(v, bool):
                raise ZooError(f"{where}.tolerance: {k} must be a number, got {v!r}")
        out[dtype] = Tolerance(**{k: float(v) for k, v in merged.items()})
    return out


def _parse_entry(name: str, d: dict[str, Any], defaults: dict[str, Any], base_dir: Path,
                 origin: str = ORIGIN_BUILTIN) -> ZooEntry:
    w = f"zoo entry {name!r}"
    _check_keys(d, {"source", "sha256", "inputs", "tolerance", "task", "task_outputs", "tags", "stateful",
                    "loop", "seed", "description"}, w)
    source = _parse_source(_get(d, "source", dict, w), w)
    sha = _get(d, "sha256", str, w, None)
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        raise ZooError(f"{w}: sha256 must be 64 lower-case hex digits")
    if sha is None and source.kind in ("package", "path", "url"):
        raise ZooError(f"{w}: sources of kind {source.kind!r} need a sha256")
    inputs = tuple(_parse_input(k, v, w) for k, v in _get(d, "inputs", dict, w).items())
    tolerances = _parse_tolerances(defaults.get("tolerance", {}), _get(d, "tolerance", dict, w, {}), w)
    task = _get(d, "task", str, w, None)
    if task is not None and task not in TASK_METRIC_NAMES:
        raise ZooError(f"{w}: unknown task metric {task!r}; known: {', '.join(TASK_METRIC_NAMES)}")
    stateful = loop = None
    if "stateful" in d:
        sd = _get(d, "stateful", dict, w)
        _check_keys(sd, {"state", "steps", "cap", "judge_state"}, f"{w}.stateful")
        state = _get(sd, "state", dict, f"{w}.stateful")
        if not state or not all(isinstance(v, str) for v in state.values()):
            raise ZooError(f"{w}.stateful: 'state' must map input names to output names")
        stateful = Stateful(state=dict(state), steps=_get(sd, "steps", int, w, None),
                            cap=_get(sd, "cap", float, w, 1.0),
                            judge_state=_get(sd, "judge_state", bool, w, False))
    if "loop" in d:
        ld = _get(d, "loop", dict, w)
        _check_keys(ld, {"trip_input", "output", "steps", "cap"}, f"{w}.loop")
        loop = LoopTrace(trip_input=_get(ld, "trip_input", str, w), output=_get(ld, "output", str, w),
                         steps=_get(ld, "steps", int, w, None), cap=_get(ld, "cap", float, w, 1.0))
    tags = _get(d, "tags", list, w, [])
    return ZooEntry(name=name, source=source, sha256=sha, inputs=inputs, tolerances=tolerances, task=task,
                    task_outputs=tuple(_get(d, "task_outputs", list, w, [])), tags=tuple(str(t) for t in tags),
                    stateful=stateful, loop=loop, seed=_get(d, "seed", int, w, int(defaults.get("seed", 0))),
                    description=_get(d, "description", str, w, ""), base_dir=base_dir, origin=origin)


@dataclass(frozen=True)
class Zoo:
    """All entries of one manifest (or of the built-in and the user zoo merged), by name."""

    entries: dict[str, ZooEntry]
    path: Path
    defaults: dict[str, Any] = field(default_factory=dict)  # the manifest's [defaults] table

    def get(self, name: str) -> ZooEntry:
        """The entry called ``name``; ZooError listing the known names otherwise."""
        if name not in self.entries:
            import difflib

            close = difflib.get_close_matches(name, list(self.entries), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ZooError(f"unknown model {name!r}{hint}; the zoo has: {', '.join(sorted(self.entries))}")
        return self.entries[name]

    def select(self, names: list[str] | None = None, tag: str | None = None) -> list[ZooEntry]:
        """Entries by name (all when empty), optionally only those carrying ``tag``; a tag that no entry of
        the zoo carries is a ZooError listing the tags there are (an empty answer would look like "none")."""
        chosen = [self.get(n) for n in names] if names else list(self.entries.values())
        if tag is not None and not any(tag in e.tags for e in self.entries.values()):
            known = sorted({t for e in self.entries.values() for t in e.tags})
            raise ZooError(f"no zoo model has tag {tag!r}; tags: {', '.join(known)}")
        return [e for e in chosen if tag is None or tag in e.tags]


def user_zoo_path(data_dir: Path) -> Path:
    """The user zoo file under ``data_dir`` (what ``ampci zoo add`` writes)."""
    return Path(data_dir) / USER_ZOO_FILE


#: Parsed manifests by (path, inode, size, mtime, ctime): a worker parses an unchanged manifest once.
_PARSED: dict[tuple[str, int, int, int, int], Zoo] = {}


def load_zoo(path: Path | None = None, data_dir: Path | None = None) -> Zoo:
    """Parse and validate a manifest; with no ``path``, the built-in ``zoo.toml`` merged with the user
    zoo under ``data_dir`` (when given and the file exists; its entries use the built-in defaults).

    Guarantees: entries carry an absolute ``base_dir`` (relative paths resolve against the manifest's
    folder); a user entry named like a built-in one is a ZooError naming both files; an unchanged file
    (same inode, size, mtime and ctime) is parsed once per process, the frozen entries shared.
    """
    if path is not None:
        path = Path(path).expanduser().resolve()
        return _cached(path, "builtin" if path == DEFAULT_MANIFEST else str(path), None)
    builtin = _cached(DEFAULT_MANIFEST, ORIGIN_BUILTIN, None)
    user = user_zoo_path(data_dir) if data_dir is not None else None
    if user is None or not user.is_file():
        return builtin
    extra = _cached(user.resolve(), ORIGIN_USER, builtin.defaults)
    clash = sorted(set(extra.entries) & set(builtin.entries))
    if clash:
        raise ZooError(f"user zoo {user}: model(s) {', '.join(clash)} also in the built-in zoo {DEFAULT_MANIFEST}; "
                       "rename them there")
    return Zoo(entries={**builtin.entries, **extra.entries}, path=DEFAULT_MANIFEST, defaults=builtin.defaults)


def entry_from_table(name: str, table: dict[str, Any], base_dir: Path, origin: str) -> ZooEntry:
    """Validate one ``[models.NAME]`` table (as ``zoo.toml`` would hold it) under the built-in
    ``[defaults]``; a ZooError naming the key otherwise."""
    return _parse_entry(name, table, load_zoo().defaults, Path(base_dir).resolve(), origin)


def _cached(path: Path, origin: str, defaults: dict[str, Any] | None) -> Zoo:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ZooError(f"zoo manifest {path} does not exist") from None
    key = (f"{path}|{origin}", st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _PARSED:
        zoo = _parse_zoo(path, origin, defaults)
        if len(_PARSED) >= 32:
            _PARSED.clear()
        _PARSED[key] = zoo
    return _PARSED[key]


def _parse_zoo(path: Path, origin: str = ORIGIN_BUILTIN, inherited: dict[str, Any] | None = None) -> Zoo:
    """One manifest; ``inherited`` (the user zoo): these defaults, and no entries is not an error."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ZooError(f"zoo manifest {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ZooError(f"cannot read zoo manifest {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ZooError(f"zoo manifest {path} is not valid TOML: {exc}") from None
    _check_keys(data, {"defaults", "models"}, f"zoo manifest {path}")
    defaults = {**(inherited or {}), **data.get("defaults", {})}
    models = data.get("models", {})
    if not isinstance(models, dict) or (not models and inherited is None):
        raise ZooError(f"zoo manifest {path} has no [models.*] entries")
    entries = {name: _parse_entry(name, d, defaults, path.parent, origin) for name, d in models.items()}
    return Zoo(entries=entries, path=path, defaults=defaults)
