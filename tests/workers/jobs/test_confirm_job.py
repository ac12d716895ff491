"""The confirmation job (:mod:`workers.jobs.confirm`): both revisions timed interleaved in one job, every timing kind.

Two pass roots (copies of this checkout's ``amp_pass``); the candidate's converted models route their first
output through a 400-step Loop of no-ops (slower on every inference) and its conversions sleep 0.3 s.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench._injected_bugs import REDUNDANT_LOOP_FN  # the bench's latency bug, shared
from workers.jobs.cell import confirm_job
from workers.jobs.confirm import ConfirmError, confirm_cell
from workers.revision.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[3]
CELL = ("conv_net", "fp16", "default", "cpu")
HEAD = "def convert_model(model: onnx.ModelProto, options: ConversionOptions | None = None) -> ConversionResult:\n"
SLOWER = REDUNDANT_LOOP_FN + '''

_convert_model_fast = convert_model


def convert_model(model: onnx.ModelProto, options: ConversionOptions | None = None) -> ConversionResult:
    """BUG(test): a slower conversion, and a converted model that does 400 no-op Loop steps more."""
    time.sleep(0.3)
    result = _convert_model_fast(model, options)
    return ConversionResult(model=_redundant_work(result.model), report=result.report)
'''


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("base")
    cand = tmp_path_factory.mktemp("candidate")
    for root in (base, cand):
        root.chmod(0o755)  # mktemp's 0700 would hide it from the sandboxed pass (another uid)
        shutil.copytree(ROOT / "amp_pass", root / "amp_pass", ignore=shutil.ignore_patterns("__pycache__"))
    conv = cand / "amp_pass" / "converter.py"
    conv.write_text(conv.read_text() + SLOWER)
    return {"baseline": base, "candidate": cand}


def config(tmp_path: Path) -> WorkerConfig:
    return WorkerConfig(cache_dir=tmp_path / "cache", data_dir=tmp_path / "data", convert_timeout=120.0,
                        convert_memory=4 * 1024**3, latency_warmup=1)


def test_both_revisions_are_timed_pair_by_pair_for_every_timing_kind(roots: dict[str, Path], tmp_path: Path) -> None:
    got = confirm_cell(CELL, roots, ["latency", "conversion_time"], 3, config(tmp_path))
    assert got["pairs"] == 3 and set(got["kinds"]) == {"latency", "conversion_time"}
    conv, lat = got["kinds"]["conversion_time"], got["kinds"]["latency"]
    # latency_threads 1 on the CPU: the work of each run (CPU time of the timing thread), not its wall time
    assert (conv["unit"], lat["unit"]) == ("s", "ms of CPU")
    for kind in (conv, lat):
        assert len(kind["baseline"]) == len(kind["candidate"]) == 3
        assert all(b > 0 for b in kind["baseline"])
    # CPU time is what other load does not inflate: the candidate's 400 extra Loop steps (about 3x the
    # model's own work) show in every pair, so each side ran its own revision's model
    assert all(c > b for b, c in zip(lat["baseline"], lat["candidate"], strict=True))
    # conversion time is wall time, which load inflates on either side of a pair (comparing the two is
    # for bench/); the candidate's sleep is a floor no load can lower, in each of its conversions
    assert all(c >= 0.3 for c in conv["candidate"]), conv
    assert got["seconds"] > 3 * 0.3


def test_the_job_reports_failures_as_statuses(roots: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfirmError, match="cannot confirm kinds"):
        confirm_cell(CELL, roots, ["accuracy"], 3, config(tmp_path))
    broken = dict(roots, candidate=tmp_path / "nothing-here")
    with pytest.raises(ConfirmError) as err:
        confirm_cell(CELL, broken, ["conversion_time"], 1, config(tmp_path))
    assert err.value.status == "convert_error" and "candidate revision" in str(err.value)
    # through the job entry point: a baseline revision the cache cannot check out is a bad_spec result
    r = confirm_job(CELL, "c" * 40, roots["candidate"], {"baseline": "0" * 40, "kinds": ["latency"], "pairs": 2},
                    config(tmp_path), None)
    assert r.status == "bad_spec" and r.message.startswith("baseline revision:") and r.confirmation is None


def test_latency_pairs_are_wall_time_where_cpu_time_is_not_the_work(roots: dict[str, Path], tmp_path: Path) -> None:
    # a default onnxruntime thread pool (latency_threads 0): other threads work, so wall time decides
    cfg = WorkerConfig(cache_dir=tmp_path / "cache", data_dir=tmp_path / "data", convert_timeout=120.0,
                       convert_memory=4 * 1024**3, latency_warmup=1, latency_threads=0)
    lat = confirm_cell(CELL, roots, ["latency"], 2, cfg)["kinds"]["latency"]
    assert lat["unit"] == "ms" and len(lat["baseline"]) == len(lat["candidate"]) == 2
    assert all(c > b for b, c in zip(lat["baseline"], lat["candidate"], strict=True))

