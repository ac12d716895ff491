"""The mixed-precision pass: options, the pass class, and ``convert_model``.

``convert_model`` prepares the model (check, function inlining, opset upgrade per ``target_opset``,
shape inference; ``amp_pass.prepare``), then ``AmpPass.call(model)`` composes private steps:
paint (policy + schema + range safety, to a fixpoint across subgraphs) -> insert casts -> clean up
casts -> report.  The IR is read from, and the result written back into copies of, the prepared
protobuf by ``amp_pass.protoio`` (parts the pass did not change are the original protos); models it
does not mirror go through ``onnx_ir.serde``.  Guarantees: the input proto is never mutated; graph
I/O dtypes are unchanged when ``keep_io_types`` -- and also without it at an opset whose Cast cannot
carry the low dtype (bf16 below 13: the casts between low inputs and fp32 consumers would be invalid;
the report says so in a note); every low-precision position is schema-valid at the model's opset; the
pass is idempotent (converting its own output changes nothing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from amp_pass.casts import CastInserter
from amp_pass.cleanup import cleanup_casts
from amp_pass.errors import OpsetError
from amp_pass.opset import casts_accept
from amp_pass.options import ConversionOptions
from amp_pass.paint import Painter
from amp_pass.policy import compute_op_types, load_policy, unmatched_notes
from amp_pass.prepare import prepare_model
from amp_pass.protowrite import write_model
from amp_pass.report import ConversionReport, build_report
from amp_pass.schema import TYPE_STR
from amp_pass.walk import graph_list


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

    def call(self, model: ir.Model, reserved: frozenset[str] | set[str] = frozenset()) -> ConversionReport:
        """Convert ``model`` in place; return the report (``seconds`` left for the caller).

        ``reserved``: names used outside the IR (by the nodes ``protoio.read_model``'s ``skip_opaque``
        leaves out), never given to new casts or constants.  With an explicit ``target_opset`` the model
        must already be at it (``prepare_model`` converts it there): else OpsetError, nothing changed."""
        o = self.options
        report = ConversionReport(dtype=o.dtype, policy=o.policy, target=o.target, keep_io_types=o.keep_io_types)
        opset = default_opset(model)
        if isinstance(o.target_opset, int) and o.target_opset != opset:
            raise OpsetError(f"cannot convert at opset {o.target_opset}: the model reaching the pass is at opset "
                             f"{opset} (models too large for one protobuf are converted at their own opset)")
        if model.functions:  # normally inlined on the proto by _prepare (before type inference)
            from onnx_ir.passes.common import InlinePass, RemoveUnusedFunctionsPass

            report.functions_inlined += len(model.functions)
            InlinePass()(model)
            RemoveUnusedFunctionsPass()(model)
        report.opset_in = report.opset_out = opset
        if not o.keep_io_types and not casts_accept(opset, TYPE_STR[self.low]):
            o = dataclasses.replace(o, keep_io_types=True)
            report.keep_io_types = True
            report.notes.append(f"inputs and outputs kept fp32: Cast cannot carry {o.dtype} at opset {opset} "
                                "(keep_io_types=False needs a later opset; --opset auto reaches it)")
        policy = load_policy(o.policy, o.target, opset)
        graph = model.graph
        graphs = graph_list(graph)
        if o.calibration is not None or o.force_fp32:
            from amp_pass.calibration import make_painter  # data-driven decisions on top of the policy

            painter = make_painter(graph, policy, opset, self.low, o)
        else:
            painter = Painter(graph, policy, opset, self.low, o.keep_io_types)
        original_casts = {n for g in graphs for n in g if n.op_type == "Cast"}
        painting = painter.run()
        build_report(report, graph, painting, compute_op_types(), graphs)
        report.notes.extend(unmatched_notes(policy, (n.name for g in graphs for n in g)))
        inserter = CastInserter(graph, painting, opset, o.keep_io_types, graphs, reserved)
        inserter.run()
        cleanup_casts(graph, graphs)
        after = {n for g in graphs for n in g if n.op_type == "Cast"}
        report.casts_inserted = len(after - original_casts)
        report.casts_removed = len(original_casts - after)
        report.constants_folded = inserter.constants_folded
        return report


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (restored after, even on error).

    The IR is a web of reference cycles (node <-> value <-> graph): a conversion allocates tens of
    thousands of tracked objects, which triggers some twenty generational collections, several of
    them full scans of a heap the conversion itself keeps growing -- 15-25% of the pass's time on the
    real models, measured with ``gc.callbacks``.  Almost nothing the conversion allocates becomes
    garbage before it ends, so those collections find little; the collector runs normally (and frees
    the IR) once the block is left.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def convert_model(model: onnx.ModelProto, options: ConversionOptions | None = None) -> ConversionResult:
    """Convert an fp32 ONNX model to mixed precision; the input proto is left untouched.

    Raises InvalidModelError / PolicyError / OptionsError (OpsetError: an explicit opset that cannot be
    honoured) for bad input, all with exit_code 2.
    """
    options = options or ConversionOptions()
    start = time.perf_counter()
    amp = AmpPass(options)
    with gc_paused():
        keyed = options.calibration is not None or bool(options.force_fp32)  # node keys number every node
        prepared = prepare_model(model, options.check_input, options.opset_planner(), lean=True,
                                 shapes=options.calibration is not None, skip_opaque=not keyed,
                                 keep_initializer_inputs=options.keep_initializer_inputs)
        origins = prepared.origins
        report = amp.call(prepared.model, origins.reserved if origins is not None else frozenset())
        if origins is not None:
            report.nodes_total += origins.opaque_count
        report.functions_inlined += prepared.inlined
        if prepared.opset_in is not None:
            report.opset_in = prepared.opset_in
        report.notes.extend(prepared.notes)
        if prepared.origins is not None:
            out = write_model(prepared.model, prepared.origins)
        else:
            out = ir.serde.serialize_model(prepared.model)
    report.seconds = time.perf_counter() - start
    return ConversionResult(model=out, report=report)
