"""The options of ``python -m amp_pass convert``, declared with the standard library only.

``amp_pass.cli`` (which imports onnx to convert) and ``ampci convert`` (whose ``--help`` and usage errors must
not load the model stack) both add them with :func:`add_convert_arguments`, so the two commands cannot drift.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from amp_pass.policy import TARGETS

#: The names of ``amp_pass.options.DTYPES`` (sorted); that module imports onnx_ir to map them to ir.DataType.
DTYPE_NAMES: tuple[str, ...] = ("bf16", "fp16")


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    """Add MODEL, -o, --dtype, --policy, --target, --no-keep-io-types, --opset, --keep-initializer-inputs,
    --report, --json to ``parser``."""
    parser.add_argument("model", type=Path, help="fp32 ONNX model to convert")
    parser.add_argument("-o", "--output", type=Path, required=True, help="where to write the converted model")
    parser.add_argument("--dtype", default="fp16", choices=list(DTYPE_NAMES), help="low-precision dtype")
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


def opset_arg(text: str) -> int | str:
    """``--opset``: an integer opset, "auto" or "keep"."""
    if text in ("auto", "keep"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an opset number, 'auto' or 'keep', got {text!r}") from None
