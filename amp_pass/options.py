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

from amp_pass.errors import OptionsError
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
    fp16 models at their opset); a failed upgrade keeps the model's opset with a note in the report;
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

    def validate(self) -> ir.DataType:
        """The low dtype; raises OptionsError for a bad dtype, target or target_opset."""
        if self.dtype not in DTYPES:
            raise OptionsError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.target not in TARGETS:
            raise OptionsError(f"unknown target {self.target!r}; choose one of {', '.join(TARGETS)}")
        t = self.target_opset
        if not (t is None or t in (AUTO, KEEP) or type(t) is int and 1 <= t <= onnx.defs.onnx_opset_version()):
            raise OptionsError(f"bad target_opset {t!r}: an opset between 1 and {onnx.defs.onnx_opset_version()}, "
                               "'auto' or 'keep'")
        return DTYPES[self.dtype]

    def opset_planner(self) -> Callable[[onnx.ModelProto], int | None] | None:
        """What ``prepare_model`` calls on the (weight-less) model to pick its opset; None keeps it."""
        t = self.target_opset
        if t is None or t == KEEP:
            return None
        if isinstance(t, int):
            return lambda _model: t
        if self.dtype == "fp16":
            return None  # every ONNX compute op accepts float16 at every opset: "auto" keeps the model's
        low_str = TYPE_STR[self.validate()]

        def auto(model: onnx.ModelProto) -> int | None:
            opset = model_opset(model)
            if opset is None:
                return None
            policy = load_policy(self.policy, self.target, opset)
            need = required_opset(model, low_str, lambda op, name: policy.classify(op, "", name)[0] == ALLOW)
            return need if need > opset else None

        return auto
