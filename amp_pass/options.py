"""What to convert to and how: :class:`ConversionOptions`, shared by the converter and calibration.

Guarantees: :meth:`ConversionOptions.validate` rejects a bad dtype, target or opset with an
OptionsError before any graph work; the options are immutable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx_ir as ir

from amp_pass.errors import OpsetError, OptionsError
from amp_pass.opset import AUTO, KEEP, model_opset, required_opset
from amp_pass.policy import ALLOW, TARGETS, load_policy
from amp_pass.schema import TYPE_STR

DTYPES: dict[str, ir.DataType] = {"fp16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}


@dataclass(frozen=True)
class ConversionOptions:
    """What to convert to and how.

    ``dtype``: "fp16" or "bf16"; ``policy``: a named policy or a TOML/YAML file; ``target``: "cuda" or
    "cpu" overlay; ``keep_io_types``: keep the model's fp32 inputs/outputs (casts at the boundary);
    ``check_input``: run the ONNX checker's full check on the input first (checker rules, and type
    inference with type checks in strict mode; a failure is an InvalidModelError);
    ``target_opset``: the default-domain opset to convert at -- an int, ``None`` / "keep" (the model's),
    or "auto" (default): the lowest opset, at most 22, at which the model's ALLOW ops accept the low
    dtype (bf16 Conv/LSTM need 22, MatMul/Gemm 13; fp16 is accepted at every opset, so "auto" keeps
    fp16 models at their opset); a failed "auto" upgrade keeps the model's opset with a note in the
    report, while an explicit opset the model cannot be converted to, or one above the highest opset the
    installed onnx defines (``onnx.defs.onnx_opset_version()``, the pass's ceiling: it never imports
    onnxruntime), is an OpsetError (exit_code 2); with bf16 and ``keep_io_types=False`` "auto" also
    reaches the opset at which Cast carries bf16 (13), and a model that stays below it keeps fp32
    inputs/outputs (with a note);
    ``keep_initializer_inputs``: keep main-graph inputs that have an initializer of the same name (IR 3
    models list every weight as one; older exporters did so at later IR versions too) as inputs a caller
    may feed; by default (False) they are constants, removed from the graph inputs (a report note; the
    IR version is raised to 4 where it was 3, since IR 3 requires every initializer to be an input);
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
    target_opset: int | str | None = AUTO
    keep_initializer_inputs: bool = False

    def validate(self) -> ir.DataType:
        """The low dtype; raises OptionsError for a bad dtype, target or target_opset."""
        if self.dtype not in DTYPES:
            raise OptionsError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.target not in TARGETS:
            raise OptionsError(f"unknown target {self.target!r}; choose one of {', '.join(TARGETS)}")
        t = self.target_opset
        ceiling = onnx.defs.onnx_opset_version()
        if type(t) is int and t < 1:
            raise OpsetError(f"cannot convert at opset {t}: opsets start at 1")
        if type(t) is int and t > ceiling:
            raise OpsetError(f"cannot convert at opset {t}: the highest opset this onnx ({onnx.__version__}) "
                             f"supports is {ceiling}")
        if not (t is None or t in (AUTO, KEEP) or type(t) is int):
            raise OptionsError(f"bad target_opset {t!r}: an opset between 1 and {ceiling}, 'auto' or 'keep'")
        return DTYPES[self.dtype]

    def opset_planner(self) -> Callable[[onnx.ModelProto], int | None] | int | None:
        """What ``prepare_model`` takes as its ``target_opset``: an explicit opset (an int, which must be
        reached), a function of the (weight-less) model picking one ("auto"), or None (keep)."""
        t = self.target_opset
        if t is None or t == KEEP:
            return None
        if isinstance(t, int):
            return t
        if self.dtype == "fp16":
            return None  # every ONNX compute op accepts float16 at every opset: "auto" keeps the model's
        low_str = TYPE_STR[self.validate()]

        def auto(model: onnx.ModelProto) -> int | None:
            opset = model_opset(model)
            if opset is None:
                return None
            policy = load_policy(self.policy, self.target, opset)
            need = required_opset(model, low_str, lambda op, name: policy.classify(op, "", name)[0] == ALLOW,
                                  low_io=not self.keep_io_types)
            return need if need > opset else None

        return auto
