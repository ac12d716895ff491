"""``ampci zoo add``: a user's model in the user zoo (AMPCI_DATA_DIR/user_zoo.toml, merged with zoo.toml),
copied into the cache, listed with its origin, run by an embedded sweep's worker subprocesses; name
clashes are one-line errors (exit 2) that write nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.main import main
from tests.workers.jobs.test_byom import symbolic_model
from workers.zoo.manifest import ZooError, load_zoo, user_zoo_path
from workers.zoo.registry import sha256_file

ROOT = Path(__file__).resolve().parents[3]
SHAPES = ["--input-shape", "x=2x8", "--input-shape", "ids=2", "--input-range", "ids=0:10"]


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))


def test_zoo_add_then_an_embedded_sweep_runs_the_added_model(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src" / "sym.onnx"
    sha = symbolic_model(src)
    assert main(["zoo", "add", str(src), "--name", "my_sym", *SHAPES, "--tags", "mine,byom"]) == 0
    assert capsys.readouterr().out.startswith(f"added my_sym to {tmp_path / 'data' / 'user_zoo.toml'}")
    entry = load_zoo(None, tmp_path / "data").get("my_sym")
    copy = Path(entry.source.ref)
    assert entry.origin == "user" and entry.sha256 == sha and entry.tags == ("mine", "byom")
    assert copy.is_relative_to(tmp_path / "cache") and sha256_file(copy) == sha
    assert [(i.name, i.shape, i.dist) for i in entry.inputs] == [("x", (2, 8), "normal"), ("ids", (2,), "randint")]
    assert main(["zoo", "list"]) == 0
    listed = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert listed["my_sym"] == "user" and listed["conv_net"] == "builtin"
    src.unlink()  # the sweep runs the cached copy
    sweep = tmp_path / "mine.toml"
    sweep.write_text('name = "mine"\nmodels = ["tag:mine"]\ndtypes = ["fp16"]\npolicies = ["default"]\n'
                     'targets = ["cpu"]\nrepeats = 6\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_DATA_DIR=str(tmp_path / "data"), AMPCI_CACHE_DIR=str(tmp_path / "cache"),
               AMPCI_CONVERT_REPEATS="1")
    # the baseline (HEAD) has no result for the cell: ampci sweep runs it first, over the same catalogue
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", "sweep", "--config", str(sweep), "--json",
                           "--workers", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["run"]["status"] == "complete" and out["summary"]["cells"] == 1
    assert out["baseline_run"] is not None
    with sqlite3.connect(tmp_path / "data" / "ampci.sqlite3") as c:
        for run_id in (out["baseline_run"], out["run"]["id"]):
            rows = c.execute("select model, dtype, status from results where run_id = ?", (run_id,)).fetchall()
            assert rows == [("my_sym", "fp16", "pass")]  # the worker subprocess found the user zoo entry
    assert "local pool" in proc.stderr


def test_zoo_add_name_clashes_are_one_line_errors_that_write_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "sym.onnx"
    symbolic_model(src)
    user_zoo = user_zoo_path(tmp_path / "data")
    assert main(["zoo", "add", str(src), "--name", "conv_net", *SHAPES]) == 2
    err = capsys.readouterr().err
    assert err == (f"ampci: error: zoo add: model 'conv_net' is already in the builtin zoo ({ROOT / 'zoo.toml'}); "
                   "choose another --name\n")
    assert not user_zoo.exists()
    assert main(["zoo", "add", str(src), "--name", "mine", *SHAPES]) == 0
    before = user_zoo.read_text()
    capsys.readouterr()
    assert main(["zoo", "add", str(src), "--name", "mine", *SHAPES]) == 2
    assert capsys.readouterr().err == (f"ampci: error: zoo add: model 'mine' is already in the user zoo ({user_zoo}); "
                                       "choose another --name\n")
    assert main(["zoo", "add", str(src), "--name", "other"]) == 2  # inputs that cannot be made: nothing written
    assert "symbolic dims need --input-shape" in capsys.readouterr().err
    assert main(["zoo", "add", str(src), "--name", "bad name", *SHAPES]) == 2
    assert "must be letters, digits" in capsys.readouterr().err
    assert user_zoo.read_text() == before
    # a user zoo edited by hand to hold a built-in name: every load of the catalogue says so
    user_zoo.write_text(before.replace('[models."mine"]', '[models."conv_net"]'))
    with pytest.raises(ZooError, match=r"model\(s\) conv_net also in the built-in zoo"):
        load_zoo(None, tmp_path / "data")
    assert main(["zoo", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ampci: error: user zoo {user_zoo}: model(s) conv_net") and err.count("\n") == 1


def test_zoo_add_with_npz_and_stateful_and_check_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    src = tmp_path / "sym.onnx"
    symbolic_model(src)
    np.savez(tmp_path / "in.npz", x=np.ones((3, 8), np.float32), ids=np.array([1, 2, 3]))
    assert main(["zoo", "add", str(src), "--name", "st", "--inputs", str(tmp_path / "in.npz"),
                 "--stateful", "x=nope"]) == 2
    assert "--stateful x=nope: not INPUT=OUTPUT of the model" in capsys.readouterr().err
    assert main(["zoo", "add", str(src), "--name", "withnpz", "--inputs", str(tmp_path / "in.npz"), "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["inputs"]["x"]["shape"] == [3, 8]
    entry = load_zoo(None, tmp_path / "data").get("withnpz")
    npz = Path(str(entry.inputs[0].npz))
    assert npz.is_relative_to(tmp_path / "cache")  # the npz was copied too
    (tmp_path / "in.npz").unlink()
    monkeypatch.setenv("AMPCI_LATENCY_RUNS", "3")
    assert main(["check", "withnpz", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "withnpz" and result["inputs"]["ids"]["values"] == f"npz {npz}"


def test_zoo_export_writes_the_model_and_never_overwrites_another_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.onnx"
    out.write_text("mine")
    assert main(["zoo", "export", "conv_net", "-o", str(out)]) == 2
    assert capsys.readouterr().err == (f"ampci: error: zoo export: {out} exists and is another file; "
                                       "pass --force to overwrite it\n")
    assert out.read_text() == "mine"
    assert main(["zoo", "export", "conv_net", "-o", str(out), "--force"]) == 0
    capsys.readouterr()
    assert main(["zoo", "fetch", "conv_net", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert sha256_file(out) == row["sha256"]
    assert main(["zoo", "export", "conv_net", "-o", str(out)]) == 0  # the same model again: nothing to do
    assert "is already this model" in capsys.readouterr().out


def test_webhook_sweep_plans_include_user_models_with_the_sweeps_tag(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from service.api.dispatch import RunDispatcher
    from service.settings import Settings

    symbolic_model(tmp_path / "sym.onnx")
    assert main(["zoo", "add", str(tmp_path / "sym.onnx"), "--name", "my_smoke", *SHAPES, "--tags", "smoke"]) == 0
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    planned = {c.model for c in RunDispatcher(settings, store=None).planner("smoke")}
    assert "my_smoke" in planned and "conv_net" in planned
