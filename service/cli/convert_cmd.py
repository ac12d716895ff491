"""``ampci convert MODEL -o OUT``: run the mixed-precision pass on one model (calls into amp_pass)."""

from __future__ import annotations

import argparse


def _run(args: argparse.Namespace) -> int:
    from amp_pass.cli import run_convert

    return run_convert(args)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``convert`` command (same options and behaviour as ``python -m amp_pass convert``)."""
    from amp_pass.cli import add_convert_arguments

    parser = subparsers.add_parser("convert", help="convert an fp32 ONNX model to fp16/bf16 mixed precision")
    add_convert_arguments(parser)
    parser.set_defaults(func=_run)
