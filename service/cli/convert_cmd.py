"""``ampci convert MODEL -o OUT``: run the mixed-precision pass on one model (calls into amp_pass).

The options are those of ``python -m amp_pass convert`` and ``workers.revision.autoconvert``'s ``--policy auto``
options, added from their standard-library-only declarations (:mod:`amp_pass.cli_args`,
:mod:`workers.revision.auto_args`): ``ampci convert --help`` and a usage error answer without loading the model
stack, which is imported only when the command runs (issue 25).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.cli.main import Subcommands


def _run(args: argparse.Namespace) -> int:
    if args.policy == "auto" or args.calibration_data is not None:
        from workers.revision.autoconvert import run_auto_convert  # runs onnxruntime: imported only here

        return run_auto_convert(args)
    from amp_pass.cli import run_convert

    return run_convert(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add :func:`amp_pass.cli_args.add_convert_arguments`'s and :func:`workers.revision.auto_args.add_auto_arguments`'s
    options, in that order (both modules use the standard library only)."""
    from amp_pass.cli_args import add_convert_arguments
    from workers.revision.auto_args import add_auto_arguments

    add_convert_arguments(parser)
    add_auto_arguments(parser)


def register(subparsers: Subcommands) -> None:
    """Add the ``convert`` command (as ``python -m amp_pass convert``, plus ``--policy auto`` and
    ``--calibration-data``, which run models and are handled by ``workers.revision.autoconvert``); registering it
    imports neither amp_pass's converter nor workers.revision.autoconvert."""
    parser = subparsers.add_parser("convert", help="convert an fp32 ONNX model to fp16/bf16 mixed precision")
    add_arguments(parser)
    strict_types(parser)
    parser.set_defaults(func=_run)


def strict_types(parser: argparse.ArgumentParser) -> None:
    """Give the options amp_pass and workers define (plain ``Path``/``int``/``float``, which take NUL
    bytes, 5,000-character names, ``١٠`` and ``inf``) the service's strict types (issue 24): a value
    the command cannot use is argparse's one-line usage error, exit 2."""
    from service.cli.argtypes import bounded_float, bounded_int, path_arg, text_arg

    for action in parser._actions:
        if action.type is None and action.nargs != 0 and not action.choices and action.option_strings \
                and action.dest != "help":
            action.type = text_arg(action.dest, 4096)  # --policy NAME|FILE, --tolerance SPEC: printable, bounded
        elif action.type is Path:
            action.type = path_arg
        elif action.type is int:
            action.type = bounded_int(1, 2**31 - 1)
        elif action.type is float:
            action.type = bounded_float(0.0, 1e6)
