"""Zoo entries for a user's own ONNX file (``ampci check PATH.onnx``, ``ampci zoo add PATH``).

:func:`entry_table` reads the model's graph inputs (no weights) and writes the ``[models.NAME]`` table a
``zoo.toml`` would hold for it, so a model checked by path and one added to the user zoo are validated
and run by the same code as a built-in entry.  Input rules: arrays of ``--inputs FILE.npz`` are used as
they are (shape from the array); otherwise an input is generated from its declared type and shape:
static dims as they are, every symbolic dim from ``--input-shape NAME=AxBxC`` (never guessed), float
values normal(0, 1) or uniform over ``--input-range NAME=LOW:HIGH``, integer values only over a given
range, bool values 0/1.  Whatever is missing is one :class:`~workers.zoo.inputs.SpecError` naming every
input and dim that needs a value (exit 2).  Each input's ``note`` says where its spec came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from workers.zoo.inputs import SpecError, model_inputs
from workers.zoo.manifest import DTYPES, ZooEntry, entry_from_table
from workers.zoo.registry import verified_sha256


@dataclass(frozen=True)
class InputOptions:
    """What the user said about a model's inputs: shapes (``--input-shape``), value ranges
    (``--input-range``, LOW inclusive, HIGH exclusive; LOW == HIGH: the constant of ``--input-value``)
    and an npz of arrays by input name."""

    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    npz: Path | None = None


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` -> (name, dims); ``NAME=`` is a scalar.  SpecError on anything else."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
    except ValueError:
        shape = (-1,)
    if not sep or not name or any(d < 0 for d in shape):
        raise SpecError(f"--input-shape {text!r}: expected NAME=DIMS with non-negative dims joined by x, "
                        "e.g. images=1x3x640x640")
    return name, shape


def parse_range(text: str, option: str = "--input-range") -> tuple[str, tuple[float, float]]:
    """``NAME=LOW:HIGH`` -> (name, (low, high)) with low < high, or ``NAME=VALUE`` -> (name, (value,
    value)): a constant input.  SpecError on anything else."""
    name, sep, rng = text.rpartition("=")
    low_s, colon, high_s = rng.partition(":")
    try:
        low, high = float(low_s), float(high_s if colon else low_s)
    except ValueError:
        low = high = float("nan")
    if not sep or not name or not (low < high or not colon) or not np.isfinite([low, high]).all():
        raise SpecError(f"{option} {text!r}: expected NAME=LOW:HIGH with finite LOW < HIGH, "
                        "e.g. input_ids=0:30522 (integers: HIGH excluded), or NAME=VALUE for a constant, "
                        "e.g. sr=16000")
    return name, (low, high)


def parse_value(text: str) -> tuple[str, tuple[float, float]]:
    """``--input-value NAME=VALUE`` -> (name, (value, value)): the input is that constant."""
    if ":" in text.rpartition("=")[2]:
        raise SpecError(f"--input-value {text!r}: expected NAME=VALUE, e.g. sr=16000 (a range is --input-range)")
    return parse_range(text, "--input-value")


def parse_state(text: str) -> tuple[str, str]:
    """``INPUT=OUTPUT`` (``--stateful state=stateN``: the output fed back as the input each step)."""
    inp, sep, out = text.partition("=")
    if not sep or not inp or not out:
        raise SpecError(f"--stateful {text!r}: expected INPUT=OUTPUT, e.g. state=stateN")
    return inp, out


def _fmt_dims(dims: list[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _npz_arrays(path: Path, label: str) -> dict[str, np.ndarray]:
    import zipfile

    if not path.exists():
        raise SpecError(f"{label}: --inputs {path} does not exist")
    if path.is_dir():
        raise SpecError(f"{label}: --inputs {path} is a directory, not an .npz file")
    if not zipfile.is_zipfile(path):  # np.load would try a pickle and advise allow_pickle
        raise SpecError(f"{label}: --inputs {path} is not an .npz file (write one with numpy.savez(PATH, "
                        "NAME=array, ...), one array per model input)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError) as exc:
        raise SpecError(f"{label}: cannot read --inputs {path}: {' '.join(str(exc).split())[:200]}") from None


def input_tables(model: onnx.ModelProto, options: InputOptions, label: str, npz_ref: str | None = None,
                 ) -> dict[str, dict[str, Any]]:
    """The ``inputs`` table of an entry for ``model`` (see module doc); ``npz_ref`` is how the tables
    name the npz file (default: its absolute path).  SpecError naming everything that is missing."""
    inputs = model_inputs(model)
    arrays = _npz_arrays(options.npz, label) if options.npz is not None else {}
    known = ", ".join(inputs) or "none"
    for what, names in (("--input-shape", options.shapes), ("--input-range", options.ranges),
                        (f"--inputs {options.npz}", arrays)):
        stray = [n for n in names if n not in inputs]
        if stray:
            raise SpecError(f"{label}: {what} names no model input: {', '.join(stray)} (model inputs: {known})")
    both = [n for n in options.shapes if n in arrays]
    if both:
        raise SpecError(f"{label}: {', '.join(both)} given by both --input-shape and --inputs; give one")
    unranked = {vi.name for vi in model.graph.input if not vi.type.tensor_type.HasField("shape")}
    need_dims: list[str] = []
    need_range: list[str] = []
    tables: dict[str, dict[str, Any]] = {}
    for name, (dtype, dims) in inputs.items():
        if dtype.name not in DTYPES:
            raise SpecError(f"{label}: input {name!r} is {dtype.name}; inputs can be {', '.join(DTYPES)}")
        declared = "of unknown rank" if name in unranked else _fmt_dims(dims)
        table: dict[str, Any] = {"dtype": dtype.name}
        shape: tuple[int, ...]
        if name in arrays:
            shape, notes = tuple(arrays[name].shape), [f"array of --inputs {options.npz}"]
        elif name in options.shapes:
            shape, notes = options.shapes[name], [f"shape from --input-shape (model declares {declared})"]
        elif name not in unranked and all(isinstance(d, int) for d in dims):
            shape, notes = tuple(int(d) for d in dims), ["shape: static in the model"]  # type: ignore[arg-type]
        else:
            free = [str(d) if d else f"dim {i}" for i, d in enumerate(dims) if not isinstance(d, int)]
            need_dims.append(f"{name}{'' if name in unranked else declared}"
                             + (f" ({', '.join(free)})" if free else " (unknown rank)"))
            shape, notes = (), []
        if notes and name not in unranked:
            if len(dims) != len(shape):
                raise SpecError(f"{label}: input {name!r} has rank {len(dims)} {declared} in the model, "
                                f"got shape {list(shape)}")
            fixed = [f"dim {i} is {d}" for i, (d, s) in enumerate(zip(dims, shape, strict=True))
                     if isinstance(d, int) and d != s]
            if fixed:
                raise SpecError(f"{label}: input {name!r} {declared}: {', '.join(fixed)} in the model, "
                                f"got shape {list(shape)}")
        table["shape"] = list(shape)
        if name in arrays:
            table.update(dist="npz", npz=npz_ref or str(Path(options.npz or "").resolve()))
        elif name in options.ranges and options.ranges[name][0] == options.ranges[name][1]:
            table.update(dist="constant", value=options.ranges[name][0])
            notes.append("a constant (--input-value)")
        elif name in options.ranges:
            low, high = options.ranges[name]
            table.update(dist="uniform" if dtype.kind == "f" else "randint", low=low, high=high)
            notes.append("values over --input-range")
        elif dtype.kind == "f":
            table.update(dist="normal")
            notes.append("values: default for float inputs")
        elif dtype.kind == "b":
            table.update(dist="randint", low=0.0, high=2.0)
            notes.append("values: 0/1 for bool inputs")
        else:
            need_range.append(f"{name} ({dtype.name})")
        table["note"] = "; ".join(notes)
        tables[name] = table
    problems = []
    if need_dims:
        problems.append("symbolic dims need --input-shape NAME=AxBxC (or --inputs FILE.npz): "
                        + ", ".join(need_dims))
    if need_range:
        problems.append("integer inputs need --input-range NAME=LOW:HIGH (or --inputs FILE.npz): "
                        + ", ".join(need_range))
    if problems:
        raise SpecError(f"{label}: " + "; ".join(problems))
    return tables


def missing_file(path: Path) -> SpecError | None:
    """The error for a model path that is not a readable file (a directory, nothing), else None."""
    if path.is_dir():
        return SpecError(f"model file {path} is a directory; give the .onnx file in it")
    if not path.is_file():
        return SpecError(f"model file {path} does not exist")
    return None


def load_graph(path: Path) -> onnx.ModelProto:
    """The model at ``path`` without its weights (enough for its inputs); SpecError if unreadable."""
    if (err := missing_file(path)) is not None:
        raise err
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types
        raise SpecError(f"{path.name} is not an ONNX model: {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:200]}") from None


def entry_table(path: Path, sha256: str, options: InputOptions, *, ref: str | None = None,
                npz_ref: str | None = None, tags: tuple[str, ...] = (), state: Mapping[str, str] | None = None,
                description: str = "") -> dict[str, Any]:
    """The ``[models.NAME]`` table for the model file at ``path`` (a ``path`` source naming ``ref``,
    default the absolute path, with ``sha256``); ``state`` maps state inputs to the outputs fed back
    (checked against the graph).  SpecError for every input problem (see module doc)."""
    model = load_graph(path)
    tables = input_tables(model, options, path.name, npz_ref)
    table: dict[str, Any] = {"source": {"path": ref or str(path.resolve())}, "sha256": sha256, "inputs": tables}
    if state:
        outputs = [o.name for o in model.graph.output]
        bad = [f"{i}={o}" for i, o in state.items() if i not in tables or o not in outputs]
        if bad:
            raise SpecError(f"{path.name}: --stateful {', '.join(bad)}: not INPUT=OUTPUT of the model "
                            f"(inputs {', '.join(tables) or 'none'}; outputs {', '.join(outputs) or 'none'})")
        table["stateful"] = {"state": dict(state)}
    if tags:
        table["tags"] = list(tags)
    if description:
        table["description"] = description
    return table


def file_entry(path: Path, options: InputOptions, state: Mapping[str, str] | None = None) -> ZooEntry:
    """A zoo entry (origin ``file``, named by the file name) for checking the model file at ``path`` as
    it is, its sha256 computed from the file; SpecError/ZooError (exit 2) for what cannot be run."""
    path = Path(path).expanduser().resolve()
    if (err := missing_file(path)) is not None:
        raise err
    table = entry_table(path, verified_sha256(path), options, state=state, description=f"model file {path}")
    return entry_from_table(path.name, table, path.parent, "file")
