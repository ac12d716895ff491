"""amp_pass: automatic mixed-precision (fp16/bf16) conversion of fp32 ONNX models.

Pure graph code: imports no celery, sqlalchemy or onnxruntime.

Public API::

    from amp_pass import ConversionOptions, convert_model, convert_file, ConversionReport, ConversionResult

The names are loaded on first use (PEP 562), so importing a light submodule such as ``amp_pass.policy``
or ``amp_pass.errors`` (the service validates sweeps with them) does not import onnx, onnx-ir and numpy
into a process that never converts (a Celery prefork parent).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amp_pass.converter import AmpPass, ConversionOptions, ConversionResult, convert_model
    from amp_pass.errors import AmpPassError, InvalidModelError, OptionsError, PolicyError
    from amp_pass.io import convert_file
    from amp_pass.report import ConversionReport

#: public name -> the module that defines it
_EXPORTS = {
    "AmpPass": "amp_pass.converter", "ConversionOptions": "amp_pass.converter",
    "ConversionResult": "amp_pass.converter", "convert_model": "amp_pass.converter",
    "AmpPassError": "amp_pass.errors", "InvalidModelError": "amp_pass.errors", "OptionsError": "amp_pass.errors",
    "PolicyError": "amp_pass.errors", "convert_file": "amp_pass.io", "ConversionReport": "amp_pass.report",
}
__all__ = [
    "AmpPass", "AmpPassError", "ConversionOptions", "ConversionReport", "ConversionResult", "InvalidModelError",
    "OptionsError", "PolicyError", "convert_file", "convert_model",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first access (AttributeError for any other name)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'amp_pass' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
