"""Faithful emulation of fp16/bf16 numerics on an fp32 device: running the emulated model.

:func:`workers.measure.emulation_rewrite.emulate_model` rounds every fp16/bf16 value of a model explicitly
(see that module for what the rewrite guarantees).  :func:`run_emulated` / :class:`EmulatedSession` run the
result on the CPU provider with all graph optimizations disabled, so no round trip is ever folded away;
:func:`emulated_bytes` rewrites the same converted bytes once per process.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import ModelProto

from workers.measure.emulation_rewrite import emulate_model, low_precision_inputs


def _feed_arrays(feeds: Mapping[str, np.ndarray], low_inputs: Iterable[str]) -> dict[str, np.ndarray]:
    low = set(low_inputs)
    out: dict[str, np.ndarray] = {}
    for name, value in feeds.items():
        arr = np.asarray(value)
        if name in low:
            arr = arr.astype(np.float32)
        out[name] = arr
    return out


class EmulatedSession:
    """An onnxruntime CPU session over :func:`emulate_model` of a mixed-precision model.

    Guarantees: graph optimizations are disabled (``ORT_DISABLE_ALL``), so every round trip runs;
    feeds for low-precision inputs may be given as fp16, bf16 or fp32 arrays; outputs are fp32.
    """

    def __init__(self, model: ModelProto, intra_op_threads: int = 0) -> None:
        from workers.measure.sessions import make_session

        self.low_inputs = low_precision_inputs(model)
        self._model: ModelProto | None = emulate_model(model)
        self._emulated: bytes | None = None
        self.session = make_session(self._model, "cpu", optimize=False, intra_op_threads=intra_op_threads)

    @classmethod
    def from_emulated(cls, emulated: bytes, low_inputs: Mapping[str, int],
                      intra_op_threads: int = 0) -> EmulatedSession:
        """A session over an already emulated, serialised model (see :func:`emulated_bytes`)."""
        from workers.measure.sessions import make_session

        self = cls.__new__(cls)
        self.low_inputs = dict(low_inputs)
        self._model, self._emulated = None, emulated
        self.session = make_session(emulated, "cpu", optimize=False, intra_op_threads=intra_op_threads)
        return self

    @property
    def model(self) -> ModelProto:
        """The emulated model (parsed on first use for sessions made :meth:`from_emulated`)."""
        if self._model is None:
            assert self._emulated is not None
            self._model = onnx.load_from_string(self._emulated)
        return self._model

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; return every graph output by name."""
        from workers.measure.sessions import output_names, run_session

        cached = getattr(self, "_outputs", None)
        if cached is None or cached[0] is not self.session:  # ``session`` may be replaced by callers
            cached = self._outputs = (self.session, output_names(self.session))
        return run_session(self.session, _feed_arrays(feeds, self.low_inputs), cached[1])


#: Emulated models by sha256 of the converted model's bytes (the rewrite is a pure function of them).
_EMULATED: OrderedDict[str, tuple[dict[str, int], bytes]] = OrderedDict()
_EMULATED_MAX, _EMULATED_MAX_BYTES = 4, 256 << 20


def emulated_bytes(converted: bytes, digest: str | None = None) -> tuple[dict[str, int], bytes]:
    """``(low_precision_inputs, serialised emulate_model)`` of a serialised mixed-precision model.

    Computed once per process for the same bytes (``digest``: their sha256, when already known);
    a few recent models are kept.  Raises :class:`workers.measure.emulation_rewrite.EmulationError` like
    :func:`emulate_model`.
    """
    key = digest or hashlib.sha256(converted).hexdigest()
    hit = _EMULATED.get(key)
    if hit is not None:
        _EMULATED.move_to_end(key)
        return dict(hit[0]), hit[1]
    model = onnx.load_from_string(converted)
    low, data = low_precision_inputs(model), emulate_model(model).SerializeToString()
    if len(data) <= _EMULATED_MAX_BYTES:
        _EMULATED[key] = (low, data)
        while len(_EMULATED) > _EMULATED_MAX or sum(len(v[1]) for v in _EMULATED.values()) > _EMULATED_MAX_BYTES:
            _EMULATED.popitem(last=False)
    return dict(low), data


def run_emulated(model: ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Emulate ``model`` (see :func:`emulate_model`) and run it once on the CPU provider."""
    return EmulatedSession(model).run(feeds)


def check_emulated(model: ModelProto) -> None:
    """Run the ONNX checker on the emulated model (raises ``onnx.checker.ValidationError``)."""
    onnx.checker.check_model(emulate_model(model), full_check=True)
