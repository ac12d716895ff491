"""``ampci zoo list`` and ``ampci zoo fetch [NAME...]``: the model zoo manifest and its cache.

Fetching verifies sha256, never fetches a cached file twice, and on a checksum mismatch deletes the
downloaded file and fails with a one-line message (exit 2).  Workers are imported lazily.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _list(args: argparse.Namespace) -> int:
    from workers.zoo.manifest import load_zoo

    zoo = load_zoo(args.zoo)
    entries = zoo.select(None, args.tag)
    if args.json:
        print(json.dumps([{"name": e.name, "source": e.source.kind, "ref": e.source.ref, "member": e.source.member,
                           "sha256": e.sha256, "tags": list(e.tags), "task": e.task,
                           "stateful": bool(e.stateful), "loop": bool(e.loop),
                           "inputs": {i.name: {"shape": list(i.shape), "dtype": i.dtype} for i in e.inputs},
                           "description": e.description} for e in entries], indent=2))
        return 0
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        shapes = ", ".join(f"{i.name}{list(i.shape)}" for i in e.inputs)
        print(f"{e.name:<{width}}  {e.source.kind:<10}  {','.join(e.tags):<28}  {shapes}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from service.settings import Settings
    from workers.zoo.fetch import fetch_entry
    from workers.zoo.manifest import load_zoo

    settings = Settings.from_env()
    zoo = load_zoo(args.zoo)
    rows = []
    for entry in zoo.select(args.names or None, args.tag):
        fetched = fetch_entry(entry, Path(settings.cache_dir))  # FetchError: one line, exit 2
        rows.append({"name": entry.name, "path": str(fetched.path), "sha256": fetched.sha256})
        if not args.json:
            print(f"{entry.name}: {fetched.path} (sha256 {fetched.sha256[:12]}…)")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``ampci zoo list`` and ``ampci zoo fetch``."""
    zoo = subparsers.add_parser("zoo", help="the model zoo (list entries, fetch models into the cache)")
    verbs = zoo.add_subparsers(dest="zoo_command", metavar="VERB")
    verbs.required = True
    lst = verbs.add_parser("list", help="list the zoo's models")
    lst.add_argument("--tag", default=None, help="only models with this tag (e.g. smoke)")
    lst.add_argument("--zoo", type=Path, default=None, help="zoo manifest (default: zoo.toml of this checkout)")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=_list)
    fetch = verbs.add_parser("fetch", help="fetch models into the cache (AMPCI_CACHE_DIR), verifying sha256")
    fetch.add_argument("names", nargs="*", metavar="NAME", help="models to fetch (default: all)")
    fetch.add_argument("--tag", default=None, help="only models with this tag")
    fetch.add_argument("--zoo", type=Path, default=None, help="zoo manifest (default: zoo.toml of this checkout)")
    fetch.add_argument("--json", action="store_true")
    fetch.set_defaults(func=_fetch)
