"""The user zoo: models a user added with ``ampci zoo add``, kept in ``DATA_DIR/user_zoo.toml``.

:func:`add_model` copies the model file (and its npz, if any) into the cache under its sha256, writes
a ``[models.NAME]`` entry naming those copies, and appends it to the user zoo, which
:func:`workers.zoo.manifest.load_zoo` merges with the built-in ``zoo.toml`` (``load_zoo(None,
data_dir)``), so sweeps, ``ampci check NAME`` and worker subprocesses (given the same data dir) see it.
Guarantees: nothing is written unless the entry is valid for the model (inputs as in
:mod:`workers.zoo.model_file`) and its name is new to both zoos; the user zoo file is replaced
atomically and always parses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.zoo.manifest import ORIGIN_USER, ZooEntry, ZooError, entry_from_table, load_zoo, user_zoo_path
from workers.zoo.model_file import InputOptions, entry_table
from workers.zoo.registry import sha256_file

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def _toml(value: Any) -> str:
    """A TOML value (strings, numbers, booleans, lists and inline tables of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def entry_text(name: str, table: Mapping[str, Any]) -> str:
    """``[models."NAME"]`` followed by one ``key = value`` line per key of ``table``."""
    lines = [f"[models.{json.dumps(name)}]"]
    for key, value in table.items():
        if key == "inputs":
            lines.extend(f"inputs.{json.dumps(k)} = {_toml(v)}" for k, v in value.items())
        else:
            lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def _cache_copy(src: Path, cache_dir: Path, sha256: str) -> Path:
    """``src`` copied (atomically, once) to ``CACHE/user/SHA[:2]/SHA/NAME``."""
    dest = Path(cache_dir) / "user" / sha256[:2] / sha256 / src.name
    if dest.is_file() and sha256_file(dest) == sha256:
        return dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest.resolve()


def add_model(name: str, model: Path, options: InputOptions, data_dir: Path, cache_dir: Path, *,
              tags: tuple[str, ...] = (), state: Mapping[str, str] | None = None) -> ZooEntry:
    """Add the model file ``model`` to the user zoo as ``name`` and return its entry (see module doc).
    ZooError for a bad or taken name; SpecError for inputs that cannot be made (nothing written)."""
    if not NAME_RE.match(name):
        raise ZooError(f"zoo add: name {name!r} must be letters, digits, '_', '.', '-' (starting with a "
                       "letter or digit)")
    bad_tags = [t for t in tags if not NAME_RE.match(t)]
    if bad_tags:
        raise ZooError(f"zoo add: tag(s) {', '.join(map(repr, bad_tags))} must be letters, digits, '_', '.', '-'")
    zoo = load_zoo(None, data_dir)
    if name in zoo.entries:
        where = zoo.entries[name].origin
        raise ZooError(f"zoo add: model {name!r} is already in the {where} zoo "
                       f"({user_zoo_path(data_dir) if where == ORIGIN_USER else zoo.path}); choose another --name")
    model = Path(model).expanduser().resolve()
    if model.is_dir():
        raise ZooError(f"zoo add: model file {model} is a directory; give the .onnx file in it")
    if not model.is_file():
        raise ZooError(f"zoo add: model file {model} does not exist")
    sha = sha256_file(model)
    table = entry_table(model, sha, options, tags=tags, state=state,
                        description=f"added with ampci zoo add from {model}")  # validates before copying
    if options.npz is not None:
        npz_ref = str(_cache_copy(Path(options.npz).resolve(), cache_dir, sha256_file(Path(options.npz))))
        for spec in table["inputs"].values():
            if spec.get("dist") == "npz":
                spec["npz"] = npz_ref
    table["source"] = {"path": str(_cache_copy(model, cache_dir, sha))}
    entry = entry_from_table(name, table, data_dir, ORIGIN_USER)
    path = user_zoo_path(data_dir)
    old = path.read_text() if path.is_file() else "# ampci user zoo: written by `ampci zoo add`, merged with zoo.toml\n"
    _write_atomic(path, old.rstrip("\n") + "\n\n" + entry_text(name, table))
    try:
        load_zoo(None, data_dir).get(name)
    except ZooError:
        _write_atomic(path, old)
        raise
    return entry


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)
