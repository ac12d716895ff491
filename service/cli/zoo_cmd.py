"""``ampci zoo list|fetch|add|export``: the model zoo (built-in ``zoo.toml`` + the user zoo) and its cache.

The catalogue is the built-in ``zoo.toml`` merged with the user zoo (``AMPCI_DATA_DIR/user_zoo.toml``), or
the manifest given with ``--zoo``; ``list`` says where each entry comes from (``builtin``/``user``/the
manifest).  Fetching verifies sha256, never fetches a cached file twice, and on a checksum mismatch deletes
the downloaded file and fails with a one-line message (exit 2).  ``add`` records a model file of the
user's in the user zoo (sha256 computed, the file copied into ``AMPCI_CACHE_DIR``; inputs as for ``ampci
check PATH``; a name the zoo already has is a one-line error, exit 2).  ``export`` copies an entry's model
file out of the cache.  Workers are imported lazily.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.cli.main import Subcommands
    from service.settings import Settings
    from workers.zoo.manifest import Zoo
    from workers.zoo.model_file import InputOptions


def _zoo(args: argparse.Namespace, settings: Settings) -> Zoo:
    from workers.zoo.manifest import load_zoo

    return load_zoo(args.zoo, settings.data_dir)


def add_input_arguments(p: argparse.ArgumentParser, what: str = "") -> None:
    """``--inputs``, ``--input-shape``, ``--input-range``, ``--stateful`` (a model file's inputs), as
    ``check PATH`` and ``zoo add`` take them; ``what`` prefixes their help."""
    from service.cli.argtypes import path_arg, text_arg

    p.add_argument("--inputs", type=path_arg, default=None, metavar="NPZ",
                   help=f"{what}input arrays by name (the other inputs are generated)")
    p.add_argument("--input-shape", action="append", type=text_arg("input shape", 1000), default=[],
                   metavar="NAME=AxBxC",
                   help=f"{what}the shape of an input with symbolic dims (repeatable)")
    p.add_argument("--input-range", action="append", type=text_arg("input range", 1000), default=[],
                   metavar="NAME=LOW:HIGH",
                   help=f"{what}generate the input uniformly in [LOW, HIGH) (needed for integer inputs; "
                        "repeatable)")
    p.add_argument("--input-value", action="append", type=text_arg("input value", 1000), default=[],
                   metavar="NAME=VALUE",
                   help=f"{what}the input is this constant, e.g. sr=16000 (repeatable)")
    p.add_argument("--stateful", action="append", type=text_arg("stateful", 1000), default=[],
                   metavar="INPUT=OUTPUT",
                   help=f"{what}OUTPUT is fed back as INPUT each step (convergence check; repeatable)")


def input_options(args: argparse.Namespace) -> tuple[InputOptions, dict[str, str]]:
    """The parsed :func:`add_input_arguments` (a one-line SpecError, exit 2, for a malformed value):
    the input options and the state map."""
    from workers.zoo import model_file

    ranges = dict(model_file.parse_range(t) for t in args.input_range)
    ranges.update(model_file.parse_value(t) for t in getattr(args, "input_value", []))
    options = model_file.InputOptions(shapes=dict(model_file.parse_shape(t) for t in args.input_shape),
                                      ranges=ranges,
                                      npz=args.inputs)
    return options, dict(model_file.parse_state(t) for t in args.stateful)


def _list(args: argparse.Namespace) -> int:
    from service.settings import Settings

    entries = _zoo(args, Settings.from_env()).select(None, args.tag)
    if args.json:
        print(json.dumps([{"name": e.name, "origin": e.origin, "source": e.source.kind, "ref": e.source.ref,
                           "member": e.source.member, "sha256": e.sha256, "tags": list(e.tags), "task": e.task,
                           "stateful": bool(e.stateful), "loop": bool(e.loop),
                           "inputs": {i.name: {"shape": list(i.shape), "dtype": i.dtype} for i in e.inputs},
                           "description": e.description} for e in entries], indent=2))
        return 0
    import shutil

    from service.cli.fit import wrap_words

    columns = shutil.get_terminal_size((200, 24)).columns  # $COLUMNS first, as the tables
    width = max((len(e.name) for e in entries), default=4)
    tags = max((len(",".join(e.tags)) for e in entries), default=4)
    left = width + 2 + 8 + 2 + 10 + 2 + tags + 2
    # the inputs wrap between inputs (a shape is one word) under their column, or, when that column would
    # be narrower than 16, on indented lines of their own
    indent = left if columns - left >= 16 else 4
    header = f"{'NAME':<{width}}  {'ORIGIN':<8}  {'SOURCE':<10}  {'TAGS':<{tags}}  "
    narrow = indent != left  # each model as a heading line (wrapped between its fields), its inputs below
    print("NAME · ORIGIN · SOURCE · TAGS\n    INPUTS" if narrow else header + "INPUTS")
    for e in entries:
        shapes = ", ".join(f"{i.name}{list(i.shape)}".replace(" ", "") for i in e.inputs)
        origin = e.origin if e.origin in ("builtin", "user") else "manifest"
        lines = wrap_words(shapes, columns - indent)[0]
        if narrow:
            print("\n".join(wrap_words(f"{e.name} · {origin} · {e.source.kind} · {', '.join(e.tags)}", columns)[0]))
        else:
            print((f"{e.name:<{width}}  {origin:<8}  {e.source.kind:<10}  {','.join(e.tags):<{tags}}  "
                   + lines.pop(0)).rstrip())
        for line in lines:
            print(" " * indent + line)
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from service.settings import Settings
    from workers.zoo.fetch import fetch_entry

    settings = Settings.from_env()
    zoo = _zoo(args, settings)
    rows = []
    for entry in zoo.select(args.names or None, args.tag):
        fetched = fetch_entry(entry, Path(settings.cache_dir))  # FetchError: one line, exit 2
        rows.append({"name": entry.name, "path": str(fetched.path), "sha256": fetched.sha256})
        if not args.json:
            print(f"{entry.name}: {fetched.path} (sha256 {fetched.sha256[:12]}…)")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


def _add(args: argparse.Namespace) -> int:
    from service.settings import Settings
    from workers.zoo.manifest import user_zoo_path
    from workers.zoo.user_zoo import add_model

    settings = Settings.from_env()
    options, state = input_options(args)
    tags = tuple(dict.fromkeys(t.strip() for group in args.tags for t in group.split(",") if t.strip()))
    entry = add_model(args.name, args.path, options, settings.data_dir, settings.cache_dir, tags=tags,
                      state=state)

    if args.json:
        print(json.dumps({"name": entry.name, "path": entry.source.ref, "sha256": entry.sha256,
                          "tags": list(entry.tags), "zoo": str(user_zoo_path(settings.data_dir)),
                          "inputs": {i.name: {"shape": list(i.shape), "dtype": i.dtype, "note": i.note}
                                     for i in entry.inputs}}, indent=2))
        return 0
    print(f"added {entry.name} to {user_zoo_path(settings.data_dir)} (sha256 {str(entry.sha256)[:12]}…, "
          f"model copied to {entry.source.ref})")
    for i in entry.inputs:
        print(f"  input {i.name}: {i.dtype}{list(i.shape)} ({i.note})")
    return 0


def _export(args: argparse.Namespace) -> int:
    from service.errors import UserError
    from service.settings import Settings
    from workers.zoo.fetch import fetch_entry
    from workers.zoo.registry import sha256_file

    settings = Settings.from_env()
    entry = _zoo(args, settings).get(args.name)
    fetched = fetch_entry(entry, Path(settings.cache_dir))
    out = Path(args.output).expanduser()
    if out.is_file() and sha256_file(out) == fetched.sha256:
        print(f"{entry.name}: {out} is already this model (sha256 {fetched.sha256[:12]}…)")
        return 0
    if out.exists() and not args.force:
        raise UserError(f"zoo export: {out} exists and is another file; pass --force to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fetched.path, out)
    print(f"{entry.name}: wrote {out} (sha256 {fetched.sha256[:12]}…)")
    return 0


def register(subparsers: Subcommands) -> None:
    """Add ``ampci zoo list``, ``fetch``, ``add`` and ``export``."""
    zoo = subparsers.add_parser("zoo", help="the model zoo (list, fetch into the cache, add your own models)")
    verbs = zoo.add_subparsers(dest="zoo_command", metavar="VERB")
    verbs.required = True
    manifest_help = "zoo manifest (default: zoo.toml of this checkout merged with the user zoo)"
    lst = verbs.add_parser("list", help="list the zoo's models and where each comes from")
    from service.cli.argtypes import path_arg, text_arg

    lst.add_argument("--tag", type=text_arg("tag"), default=None, help="only models with this tag (e.g. smoke)")
    lst.add_argument("--zoo", type=path_arg, default=None, help=manifest_help)
    lst.add_argument("--json", action="store_true", help="print JSON instead of text")
    lst.set_defaults(func=_list)
    fetch = verbs.add_parser("fetch", help="fetch models into the cache (AMPCI_CACHE_DIR), verifying sha256")
    fetch.add_argument("names", nargs="*", metavar="NAME", type=text_arg("model"), help="models to fetch (default: all)")
    fetch.add_argument("--tag", type=text_arg("tag"), default=None, help="only models with this tag")
    fetch.add_argument("--zoo", type=path_arg, default=None, help=manifest_help)
    fetch.add_argument("--json", action="store_true", help="print JSON instead of text")
    fetch.set_defaults(func=_fetch)
    add = verbs.add_parser("add", help="add an ONNX file of yours to the user zoo (AMPCI_DATA_DIR/user_zoo.toml)")
    add.add_argument("path", type=path_arg, help="the ONNX model file (copied into AMPCI_CACHE_DIR)")
    add.add_argument("--name", type=text_arg("name"), required=True, help="the zoo name sweeps and `ampci check` will use")
    add.add_argument("--tags", action="append", type=text_arg("tags", 1000), default=[], metavar="TAG[,TAG...]",
                     help="tags for sweeps (`models = [\"tag:NAME\"]`)")
    add_input_arguments(add)
    add.add_argument("--json", action="store_true", help="print JSON instead of text")
    add.set_defaults(func=_add)
    export = verbs.add_parser("export", help="copy a zoo model's ONNX file out of the cache")
    export.add_argument("name", metavar="NAME", type=text_arg("model"), help="the zoo model to export (ampci zoo list)")
    export.add_argument("-o", "--output", type=path_arg, required=True, help="where to write the .onnx file")
    export.add_argument("--force", action="store_true", help="overwrite an existing file")
    export.add_argument("--zoo", type=path_arg, default=None, help=manifest_help)
    export.set_defaults(func=_export)
