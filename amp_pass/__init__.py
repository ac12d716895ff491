"""amp_pass: automatic mixed-precision (fp16/bf16) conversion of fp32 ONNX models.

Pure graph code: imports no celery, sqlalchemy or onnxruntime.

Public API::

    from amp_pass import ConversionOptions, convert_model, convert_file, ConversionReport, ConversionResult
"""

from __future__ import annotations

from amp_pass.converter import AmpPass, ConversionOptions, ConversionResult, convert_model
from amp_pass.errors import AmpPassError, InvalidModelError, OptionsError, PolicyError
from amp_pass.io import convert_file
from amp_pass.report import ConversionReport

__all__ = [
    "AmpPass", "AmpPassError", "ConversionOptions", "ConversionReport", "ConversionResult", "InvalidModelError",
    "OptionsError", "PolicyError", "convert_file", "convert_model",
]
