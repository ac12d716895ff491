"""``ampci convert MODEL -o OUT``: run the mixed-precision pass on one model (calls into amp_pass)."""

from __future__ import annotations

import argparse


def _run(args: argparse.Namespace) -> int:
    if args.policy == "auto" or args.calibration_data is not None:
        from workers.autoconvert import run_auto_convert  # runs onnxruntime: imported only here

        return run_auto_convert(args)
    from amp_pass.cli import run_convert

    return run_convert(args)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``convert`` command (as ``python -m amp_pass convert``, plus ``--policy auto`` and
    ``--calibration-data``, which run models and are handled by ``workers.autoconvert``)."""
    from amp_pass.cli import add_convert_arguments
    from workers.autoconvert import add_auto_arguments  # argparse only; no onnxruntime at import

    parser = subparsers.add_parser("convert", help="convert an fp32 ONNX model to fp16/bf16 mixed precision")
    add_convert_arguments(parser)
    add_auto_arguments(parser)
    parser.set_defaults(func=_run)
