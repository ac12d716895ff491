"""The mixed-precision pass: options, the pass class, and ``convert_model``.

``AmpPass.call(model)`` composes private steps: prepare (shape inference, function inlining) ->
paint (policy + schema + range safety, to a fixpoint across subgraphs) -> insert casts -> clean up
casts -> report.  Guarantees: the input proto is never mutated; graph I/O dtypes are unchanged when
``keep_io_types``; every low-precision position is schema-valid at the model's opset; the pass is
idempotent (converting its own output changes nothing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx_ir as ir

from amp_pass.casts import CastInserter
from amp_pass.cleanup import cleanup_casts
from amp_pass.errors import OptionsError
from amp_pass.paint import Painter
from amp_pass.policy import TARGETS, compute_op_types, load_policy
from amp_pass.prepare import prepare
from amp_pass.report import ConversionReport, build_report
from amp_pass.walk import iter_nodes

DTYPES: dict[str, ir.DataType] = {"fp16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}


@dataclass(frozen=True)
class ConversionOptions:
    """What to convert to and how.

    ``dtype``: "fp16" or "bf16"; ``policy``: a named policy or a TOML/YAML file; ``target``: "cuda" or
    "cpu" overlay; ``keep_io_types``: keep the model's fp32 inputs/outputs (casts at the boundary);
    ``check_input``: run the ONNX checker on the input first (a failure is an InvalidModelError);
    ``calibration``: measured value ranges (``amp_pass.calibration.CalibrationRanges``) whose overflowing
    or underflowing nodes stay fp32; ``force_fp32``: node keys (``amp_pass.calibration.node_key``) kept
    fp32 and propagated like DENY (an unknown key is an OptionsError).
    """

    dtype: str = "fp16"
    policy: str = "default"
    target: str = "cuda"
    keep_io_types: bool = True
    check_input: bool = True
    calibration: Any = None
    force_fp32: frozenset[str] = field(default_factory=frozenset)

    def validate(self) -> ir.DataType:
        """The low dtype; raises OptionsError for a bad dtype or target."""
        if self.dtype not in DTYPES:
            raise OptionsError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.target not in TARGETS:
            raise OptionsError(f"unknown target {self.target!r}; choose one of {', '.join(TARGETS)}")
        return DTYPES[self.dtype]


@dataclass
class ConversionResult:
    """The converted model and its report."""

    model: onnx.ModelProto
    report: ConversionReport


def default_opset(model: ir.Model) -> int:
    """The model's default-domain opset (ONNX's "" or "ai.onnx")."""
    imports = model.opset_imports
    return int(imports.get("", imports.get("ai.onnx", 1)))


class AmpPass:
    """Automatic mixed precision over an onnx-ir model (see the module docstring for guarantees)."""

    def __init__(self, options: ConversionOptions) -> None:
        self.options = options
        self.low = options.validate()

    def call(self, model: ir.Model) -> ConversionReport:
        """Convert ``model`` in place; return the report (``seconds`` left for the caller)."""
        o = self.options
        report = ConversionReport(dtype=o.dtype, policy=o.policy, target=o.target, keep_io_types=o.keep_io_types)
        if model.functions:  # normally inlined on the proto by _prepare (before type inference)
            from onnx_ir.passes.common import InlinePass, RemoveUnusedFunctionsPass

            report.functions_inlined += len(model.functions)
            InlinePass()(model)
            RemoveUnusedFunctionsPass()(model)
        opset = default_opset(model)
        policy = load_policy(o.policy, o.target, opset)
        graph = model.graph
        original_casts = {n for n in iter_nodes(graph) if n.op_type == "Cast"}
        if o.calibration is not None or o.force_fp32:
            from amp_pass.calibration import make_painter  # data-driven decisions on top of the policy

            painter = make_painter(graph, policy, opset, self.low, o)
        else:
            painter = Painter(graph, policy, opset, self.low, o.keep_io_types)
        painting = painter.run()
        build_report(report, graph, painting, compute_op_types())
        inserter = CastInserter(graph, painting, opset, o.keep_io_types)
        inserter.run()
        cleanup_casts(graph)
        after = {n for n in iter_nodes(graph) if n.op_type == "Cast"}
        report.casts_inserted = len(after - original_casts)
        report.casts_removed = len(original_casts - after)
        report.constants_folded = inserter.constants_folded
        return report


def convert_model(model: onnx.ModelProto, options: ConversionOptions | None = None) -> ConversionResult:
    """Convert an fp32 ONNX model to mixed precision; the input proto is left untouched.

    Raises InvalidModelError / PolicyError / OptionsError (exit_code 2) for bad input.
    """
    options = options or ConversionOptions()
    start = time.perf_counter()
    amp = AmpPass(options)
    ir_model, inlined = prepare(model, options.check_input)
    report = amp.call(ir_model)
    report.functions_inlined += inlined
    out = ir.serde.serialize_model(ir_model)
    report.seconds = time.perf_counter() - start
    return ConversionResult(model=out, report=report)
