"""A local worker starts its first job's conversion zygote while it imports the job code (issue 25):
``workers.revision.convert.prewarm`` starts the very zygote -- same pass root, same environment -- that the first warm
conversion then uses, instead of that conversion starting it on the job's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.workers.fakes import fake_pass
from workers.revision import convert
from workers.sandbox import zygotes
from workers.zoo.synthetic import synthetic_model_path


def test_prewarm_starts_the_zygote_the_first_conversion_then_uses(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root = fake_pass(tmp_path / "pass", "perturb")
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    calls: list[tuple[Path, dict[str, str], Any]] = []
    real = zygotes.zygote_for

    def spy(root: Path, env: dict[str, str]) -> zygotes.Zygote:
        z = real(root, env)
        calls.append((root, env, z))
        return z

    monkeypatch.setattr(zygotes, "zygote_for", spy)
    try:
        assert convert.prewarm(root)
        out = convert.convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16",
                                            "default", "cpu", root, timeout_s=120.0, memory_bytes=4 * 1024**3)
        assert out.status == "ok", out.message
        (r1, env1, z1), (r2, env2, z2) = calls
        assert r1 == r2 and env1 == env2  # the environment the conversion would have started it with
        assert z1 is z2 and z1.alive()  # started once, by the prewarm: the conversion found it up
    finally:
        zygotes.shutdown()
    assert not convert.prewarm(tmp_path / "no-pass-here")  # no amp_pass: nothing started, nothing raised
