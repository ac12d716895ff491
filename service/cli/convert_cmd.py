"""``ampci convert MODEL -o OUT``: run the mixed-precision pass on one model (calls into amp_pass).

The options are those of ``python -m amp_pass convert`` (:func:`amp_pass.cli.add_convert_arguments`) and
``workers.autoconvert``'s ``--policy auto`` options (:func:`workers.autoconvert.add_auto_arguments`),
declared here again by :func:`add_arguments` because both of those modules import onnx (and numpy) when
imported: ``ampci convert --help`` and a usage error answer without loading the model stack, which is
imported only when the command runs (issue 25).  tests/service/test_cli_imports.py holds the two
declarations equal (option strings, destinations, defaults, choices, types, help), so an option added to
the pass's CLI fails that test until it is declared here too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: ``amp_pass.options.DTYPES`` (sorted), which imports onnx_ir to map them to ir.DataType.
DTYPES: tuple[str, ...] = ("bf16", "fp16")


def _run(args: argparse.Namespace) -> int:
    if args.policy == "auto" or args.calibration_data is not None:
        from workers.autoconvert import run_auto_convert  # runs onnxruntime: imported only here

        return run_auto_convert(args)
    from amp_pass.cli import run_convert

    return run_convert(args)


def opset_arg(text: str) -> int | str:
    """``--opset``: an integer opset, "auto" or "keep" (as ``amp_pass.cli._opset_arg``)."""
    if text in ("auto", "keep"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an opset number, 'auto' or 'keep', got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add what :func:`amp_pass.cli.add_convert_arguments` and :func:`workers.autoconvert.add_auto_arguments`
    add, in their order, with their plain types (``Path``, ``int``, ``float``), importing neither."""
    from amp_pass.policy import TARGETS  # stdlib only: the source of truth for target names

    parser.add_argument("model", type=Path, help="fp32 ONNX model to convert")
    parser.add_argument("-o", "--output", type=Path, required=True, help="where to write the converted model")
    parser.add_argument("--dtype", default="fp16", choices=list(DTYPES), help="low-precision dtype")
    parser.add_argument("--policy", default="default",
                        help="named policy (default, conservative, aggressive) or a TOML/YAML policy file")
    parser.add_argument("--target", default="cuda", choices=TARGETS, help="target overlay")
    parser.add_argument("--no-keep-io-types", dest="keep_io_types", action="store_false",
                        help="fold low precision into the model's inputs and outputs")
    parser.add_argument("--opset", default="auto", type=opset_arg, metavar="N|auto|keep",
                        help="default-domain opset to convert at: auto (default) upgrades to the lowest opset "
                             "at which the compute ops accept the dtype (bf16: up to 22), keep never upgrades; "
                             "an opset N that cannot be reached is an error")
    parser.add_argument("--keep-initializer-inputs", action="store_true",
                        help="keep graph inputs that have an initializer (IR 3 style weights) as inputs; by default "
                             "they become constants (IR version raised to 4 where needed)")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report to this file")
    parser.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    # workers.autoconvert.add_auto_arguments
    parser.add_argument("--tolerance", default=None,
                        help="policy auto: accuracy to meet, e.g. cosine=0.9995[,max_abs=..,snr_db=..,max_rel=..] "
                             "(default cosine=0.9995 for fp16, 0.995 for bf16)")
    parser.add_argument("--calibration-data", "--inputs", dest="calibration_data", type=Path, default=None,
                        help=".npz of model inputs (one array per input, optionally a leading sample axis): "
                             "what policy auto measures on, and calibration (keep nodes fp32 whose observed "
                             "values overflow/underflow)")
    parser.add_argument("--inputs-source", default=None, help=argparse.SUPPRESS)  # the job: where its npz came from
    parser.add_argument("--max-steps", type=int, default=16, help="policy auto: most candidate evaluations")
    parser.add_argument("--overflow-margin", type=float, default=0.5,
                        help="keep fp32 when observed |x| exceeds this fraction of the dtype's max")
    parser.add_argument("--max-reduction", type=int, default=32768,
                        help="keep fp32 when a node sums more terms than this per output element")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``convert`` command (as ``python -m amp_pass convert``, plus ``--policy auto`` and
    ``--calibration-data``, which run models and are handled by ``workers.autoconvert``); registering it
    imports neither amp_pass's converter nor workers.autoconvert."""
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
