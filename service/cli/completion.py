"""The answer to a TAB in a shell that ran ``ampci completion`` (argcomplete's protocol: ``_ARGCOMPLETE``,
``COMP_LINE``, ``COMP_POINT`` in the environment).

:func:`complete` registers only the command being typed (as a normal run does), gives every model argument
(:data:`MODEL_ARGS`: ``history MODEL``, ``check MODEL``, ``results --model``, ``zoo fetch/export NAME``) the
zoo's model names and the stored ones as candidates, prints the candidates and exits.  A TAB imports no
onnx, numpy or onnxruntime (tests/service/cli/test_completion.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

#: The arguments that take a model name, as (command words, destination): completed by :func:`model_names`
#: (``check`` also takes a model file: files are completed beside the names there).
MODEL_ARGS = frozenset({(("results",), "model"), (("history",), "model"), (("zoo", "fetch"), "names"),
                        (("zoo", "export"), "name"), (("check",), "model")})


def _zoo_names() -> set[str]:
    from service.settings import Settings
    from workers.zoo.manifest import load_zoo

    return set(load_zoo(None, Settings.from_env().data_dir).entries)


def _stored_names() -> set[str]:
    """Model names of the store at ``AMPCI_DATABASE_URL`` (only when it is set: a TAB creates no database)."""
    if not os.environ.get("AMPCI_DATABASE_URL"):
        return set()
    from service.db.store import Store
    from service.settings import Settings

    store = Store.from_url(Settings.from_env().database_url)
    try:
        return set(store.model_names())
    finally:
        store.dispose()


def model_names(prefix: str, **_: object) -> list[str]:
    """The model names starting with ``prefix``: the zoo's (built-in and user) and the stored ones; a
    source that cannot be read (a bad manifest, a database that is down) adds none."""
    names: set[str] = set()
    for source in (_zoo_names, _stored_names):
        try:
            names |= source()
        except Exception:  # noqa: BLE001, S112 - a TAB never prints a traceback; the other source still counts
            continue
    return sorted(n for n in names if n.startswith(prefix))


def model_or_file(prefix: str, **kwargs: object) -> list[str]:
    """:func:`model_names` and the files and folders starting with ``prefix`` (``check`` takes either)."""
    from argcomplete.completers import FilesCompleter

    return model_names(prefix) + list(FilesCompleter()(prefix, **kwargs))


def _with_model_completer(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> None:
    """Set :func:`model_names` as the completer of each of :data:`MODEL_ARGS` found in ``parser`` (the
    top-level parser: ``words`` empty) and its sub-commands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                _with_model_completer(sub, (*words, name))
        elif (words, action.dest) in MODEL_ARGS:
            completer = model_or_file if words == ("check",) else model_names
            action.completer = completer  # type: ignore[attr-defined]  # argcomplete reads this attribute


def complete(build_parser: Callable[[list[str]], argparse.ArgumentParser]) -> None:
    """Answer one completion request (argcomplete's protocol, see the module docstring) with the parser
    ``build_parser`` makes for the words typed so far (:func:`service.cli.main.main` gives it) and exit."""
    import argcomplete

    try:
        words = shlex.split(os.environ.get("COMP_LINE", ""))[1:]
    except ValueError:  # an open quote
        words = os.environ.get("COMP_LINE", "").split()[1:]
    parser = build_parser(words)
    _with_model_completer(parser)
    argcomplete.autocomplete(parser)
