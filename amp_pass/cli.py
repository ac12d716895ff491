"""Argument handling shared by ``python -m amp_pass convert`` and ``ampci convert``.

``add_convert_arguments`` defines the options; ``run_convert`` performs the conversion and writes
the report.  Exit codes: 0 ok, 2 bad input (one line on stderr), 1 internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from amp_pass.cli_args import add_convert_arguments as add_convert_arguments
from amp_pass.cli_args import opset_arg as _opset_arg  # noqa: F401 - the name callers used
from amp_pass.errors import OptionsError, OutputError
from amp_pass.io import chmod_as_created, convert_file
from amp_pass.options import ConversionOptions


def options_from_args(args: argparse.Namespace) -> ConversionOptions:
    """ConversionOptions built from parsed arguments (``--opset`` defaults to auto when absent)."""
    return ConversionOptions(dtype=args.dtype, policy=args.policy, target=args.target,
                             keep_io_types=args.keep_io_types, target_opset=getattr(args, "opset", "auto"),
                             keep_initializer_inputs=getattr(args, "keep_initializer_inputs", False))


def _write_report(path: Path, data: dict[str, object], model: Path) -> None:
    """Write the JSON report atomically; on failure remove ``model`` too (a run writes both or neither)."""
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        chmod_as_created(tmp)  # mkstemp's 0600 -> what the umask gives a new file
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        model.unlink(missing_ok=True)
        raise OutputError.cannot_write(f"report {path}", exc) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def run_convert(args: argparse.Namespace) -> int:
    """Convert ``args.model`` to ``args.output``; raise AmpPassError subclasses for bad input."""
    src, dst = Path(args.model), Path(args.output)
    if src.resolve() == dst.resolve():
        raise OptionsError(f"output {dst} would overwrite the input model")
    if args.report is not None:
        try:
            args.report.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError.cannot_write(f"report {args.report}", exc) from None
    report = convert_file(src, dst, options_from_args(args))
    data = report.to_dict()
    if args.report is not None:
        _write_report(args.report, data, dst)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(f"converted {src} -> {dst}: {data['nodes_low']}/{data['nodes_total']} nodes {args.dtype}, "
              f"compute {data['compute_low']}/{data['compute_nodes']}, casts +{data['casts_inserted']}"
              f"/-{data['casts_removed']}, {len(data['kept_fp32'])} kept fp32, opset {data['opset_in']}"
              + (f"->{data['opset_out']}" if data['opset_out'] != data['opset_in'] else "")
              + f", {data['seconds']:.3f}s")
        for note in data["notes"]:
            print(f"note: {note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m amp_pass convert ...``: 0 ok, 2 bad input (one stderr line), 1 internal error."""
    parser = argparse.ArgumentParser(prog="python -m amp_pass", description="Mixed-precision ONNX conversion.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_convert_arguments(sub.add_parser("convert", help="convert an fp32 ONNX model to fp16/bf16"))
    args = parser.parse_args(argv)
    try:
        return run_convert(args)
    except KeyboardInterrupt:
        print("amp_pass: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # translated at the boundary: one line, no traceback
        code = getattr(exc, "exit_code", None)
        if isinstance(code, int):
            print(f"amp_pass: error: {exc}", file=sys.stderr)
            return code
        print(f"amp_pass: internal error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
