"""The conversion-time rule's drift reference (issue 25): a fixed, conversion-shaped workload per model that
costs a few ms -- parse/walk/serialise passes in memory and one write, not one write per pass."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from workers import convert
from workers.convert import REFERENCE_MAX_PASSES, reference_passes, reference_workload
from workers.zoo.synthetic import synthetic_model_path


def test_the_number_of_passes_depends_on_the_model_size_alone() -> None:
    assert reference_passes(convert.REFERENCE_BYTES) == 1
    assert reference_passes(convert.REFERENCE_BYTES // 4) == 4
    assert reference_passes(convert.REFERENCE_BYTES // 4 - 1) == 5  # rounded up: at least REFERENCE_BYTES
    assert reference_passes(6_000) == REFERENCE_MAX_PASSES  # a tiny model is capped
    assert reference_passes(10 * convert.REFERENCE_BYTES) == 1  # a large model: one pass


def test_the_workload_parses_each_pass_in_memory_and_writes_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    parses: list[int] = []
    writes: list[Path] = []
    real_load, real_write = onnx.load_model_from_string, Path.write_bytes

    def load(data: bytes) -> onnx.ModelProto:
        parses.append(len(data))
        return real_load(data)

    def write(self: Path, data: bytes) -> int:
        writes.append(self)
        return real_write(self, data)

    monkeypatch.setattr(onnx, "load_model_from_string", load)
    monkeypatch.setattr(Path, "write_bytes", write)
    scratch = tmp_path / "scratch.onnx"
    seconds = reference_workload(src, scratch)
    assert seconds > 0
    assert len(parses) == reference_passes(src.stat().st_size) > 1 and set(parses) == {src.stat().st_size}
    assert writes == [scratch]  # the file system is timed once per sample, as a conversion writes once
    assert real_load(scratch.read_bytes()) == real_load(src.read_bytes())  # the model, serialised back
