"""Runners: one callable interface over fp32, emulated and real-provider sessions.

A runner maps feeds to a dict of outputs.  Feeds are adapted to the session's input dtypes (so an
fp32 feed reaches an fp16 input of a model converted without ``keep_io_types``) and outputs are
returned as numpy arrays (fp16/bf16 outputs widened to fp32).  Every runner counts its session
creation and runs as model execution on the job's clock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import onnx

from workers.measure.emulation import EmulatedSession, emulated_bytes
from workers.measure.emulation_rewrite import emulate_model, low_precision_inputs
from workers.measure.sessions import make_session, numpy_dtype, output_names, run_session
from workers.timing import JobClock


class Runner:
    """Base runner; subclasses set ``self._run`` and ``self.provider``."""

    provider: str = ""
    mode: str = ""

    def __init__(self, clock: JobClock | None) -> None:
        self.clock = clock or JobClock()

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        try:
            out = self._run(feeds)
        finally:
            self.clock.add_exec(time.perf_counter() - t0)
        return {k: _widen(v) for k, v in out.items()}

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError


def _widen(v: np.ndarray) -> np.ndarray:
    arr = np.asarray(v)
    if arr.dtype == np.float16 or arr.dtype.name == "bfloat16":
        return arr.astype(np.float32)
    return arr


class SessionRunner(Runner):
    """An onnxruntime session on ``target`` (``cpu``/``cuda``), optimizations on unless told otherwise;
    ``intra_op_threads`` 0 keeps onnxruntime's default thread pool."""

    def __init__(self, model: onnx.ModelProto | bytes, target: str, clock: JobClock | None = None,
                 optimize: bool = True, intra_op_threads: int = 0) -> None:
        super().__init__(clock)
        with self.clock.executing():
            self.session = make_session(model, target, optimize=optimize, intra_op_threads=intra_op_threads)
        self.provider = self.session.get_providers()[0]
        self.mode = target
        self._types = {i.name: i.type for i in self.session.get_inputs()}
        self._outputs = output_names(self.session)

    def adapt(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Feeds cast to the session's input dtypes (only the names the session has)."""
        out = {}
        for name, t in self._types.items():
            if name in feeds:
                want = np.dtype(numpy_dtype(t))
                arr = np.asarray(feeds[name])
                out[name] = arr if arr.dtype == want else arr.astype(want)
        return out

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_session(self.session, self.adapt(feeds), self._outputs)


class EmulatedRunner(Runner):
    """The converted model under faithful emulation (see :mod:`workers.measure.emulation`).

    The emulation rewrite is bookkeeping (cached per process by the converted model's sha256 when
    the model is given as bytes); only the session creation and runs count as model execution.
    """

    mode = "emulation"
    provider = "CPUExecutionProvider"

    def __init__(self, model: onnx.ModelProto | bytes, clock: JobClock | None = None,
                 digest: str | None = None) -> None:
        super().__init__(clock)
        if isinstance(model, bytes):
            low, data = emulated_bytes(model, digest)
        else:
            low, data = low_precision_inputs(model), emulate_model(model).SerializeToString()
        with self.clock.executing():
            self.session = EmulatedSession.from_emulated(data, low)
        self._names = {i.name for i in self.session.session.get_inputs()}

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.session.run({k: v for k, v in feeds.items() if k in self._names})
