"""Fixtures for the data-driven precision tests: a validity check shared by every test."""

from __future__ import annotations

import onnx


def assert_valid(model: onnx.ModelProto) -> None:
    """The converted model passes the full ONNX checker and loads in onnxruntime."""
    from workers.measure.sessions import make_session

    onnx.checker.check_model(model, full_check=True)
    make_session(model, "cpu")
