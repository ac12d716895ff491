"""Fixtures for the pass tests: a converter that also validates and checks idempotence."""

from __future__ import annotations

from collections.abc import Callable

import onnx
import pytest

from amp_pass import ConversionOptions, ConversionResult, convert_model
from tests.amp_pass.models import assert_valid


def _convert(model: onnx.ModelProto, dtype: str = "fp16", **kw: object) -> ConversionResult:
    """Convert, assert the result is valid (full checker + onnxruntime) and idempotent."""
    before = model.SerializeToString()
    options = ConversionOptions(dtype=dtype, **kw)  # type: ignore[arg-type]
    result = convert_model(model, options)
    assert model.SerializeToString() == before, "convert_model mutated its input"
    assert_valid(result.model, dtype)
    again = convert_model(result.model, options)
    assert again.model.SerializeToString() == result.model.SerializeToString(), "pass is not idempotent"
    assert again.report.casts_inserted == 0 and again.report.casts_removed == 0
    return result


@pytest.fixture
def convert() -> Callable[..., ConversionResult]:
    """``convert(model, dtype="fp16", **options)``: convert + validity + idempotence + no input mutation."""
    return _convert
