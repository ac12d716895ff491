"""Sweep specs are validated before a run exists: unknown policies, targets, dtypes, models and bad
policy files are one-line errors (exit 2) with nothing stored; node regexes that match nothing warn."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from service.cli.main import main
from service.db import Store
from service.orchestration.sweeps import SweepConfig, SweepConfigError, zoo_node_names
from tests.service.factories import migrated_store


def _model(path: Path) -> str:
    """A two-node model (``mm_0`` MatMul, ``act_0`` Sigmoid) written to ``path``; its sha256."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.1] * 16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm_0"),
         helper.make_node("Sigmoid", ["h"], ["y"], name="act_0")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def zoo(tmp_path: Path) -> Path:
    """A manifest with one local model, ``tiny``."""
    sha = _model(tmp_path / "tiny.onnx")
    manifest = tmp_path / "zoo.toml"
    manifest.write_text(f'[models.tiny]\nsource = {{ path = "tiny.onnx" }}\nsha256 = "{sha}"\ntags = ["t"]\n'
                        'inputs.x = { shape = [1, 4], dtype = "float32" }\n')
    return manifest


def _sweep_text(zoo: Path, **kw: str) -> str:
    fields = {"models": '["tiny"]', "dtypes": '["fp16"]', "policies": '["default"]', "targets": '["cpu"]'}
    fields.update(kw)
    return f'name = "v"\nzoo = "{zoo}"\nrepeats = 10\n' + "".join(f"{k} = {v}\n" for k, v in fields.items())


def _cfg(**kw: object) -> SweepConfig:
    data: dict[str, object] = {"name": "t", "models": ["a"], "dtypes": ["fp16"], "policies": ["default"],
                               "targets": ["cpu"]}
    data.update(kw)
    return SweepConfig.from_dict(data, "t.toml")


@pytest.mark.parametrize(("change", "needle"), [
    ({"policies": ["defualt"]}, "unknown policy 'defualt' (did you mean 'default'?)"),
    ({"policies": ["default", "agressive"]}, "unknown policy 'agressive' (did you mean 'aggressive'?)"),
    ({"policies": ["no/such/file.toml"]}, "does not exist"),
    ({"targets": ["cdua"]}, "unknown target 'cdua' (did you mean 'cuda'?)"),
    ({"targets": ["tpu"]}, "unknown target 'tpu'"),
    ({"dtypes": ["fp61"]}, "unknown dtype"),
])
def test_unknown_names_are_one_line_errors(change: dict[str, object], needle: str) -> None:
    with pytest.raises(SweepConfigError) as info:
        _cfg(**change)
    assert needle in str(info.value) and "\n" not in str(info.value) and info.value.exit_code == 2


def test_named_policies_auto_and_gpu_type_queues_are_accepted() -> None:
    cfg = _cfg(policies=["default", "conservative", "aggressive", "auto"], targets=["cpu", "cuda", "cuda-a100"])
    assert cfg.policies == ("default", "conservative", "aggressive", "auto") and cfg.policy_files == {}


def test_policy_file_is_resolved_against_the_sweep_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "sweeps"
    folder.mkdir()
    (folder / "mine.toml").write_text('[ops]\ndeny = ["MatMul"]\n')
    (folder / "s.toml").write_text('models = ["a"]\ndtypes = ["fp16"]\npolicies = ["mine.toml"]\ntargets = ["cpu"]\n'
                                   '[[override]]\nmatch = { policy = "mine.toml" }\nrepeats = 2\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not where the policy file is
    cfg = SweepConfig.from_file(folder / "s.toml")
    resolved = str((folder / "mine.toml").resolve())
    assert cfg.policies == (resolved,) and cfg.policy_files == {resolved: "mine.toml"}
    (cell,) = cfg.expand({"a": set()})
    assert cell.policy == resolved and cell.repeats == 2  # the override still matches what the sweep wrote


@pytest.mark.parametrize(("content", "needle"), [
    ('[ops]\ndeny = ["Sigmiod"]\n', "'Sigmiod' is not an op type of any ONNX domain; did you mean 'Sigmoid'?"),
    ('[ops]\nallow = ["matmul"]\n', "did you mean 'MatMul'?"),
    ('[ops]\ninfer = ["Frobnicate"]\n', "'Frobnicate' is not an op type of any ONNX domain"),
    ('[[nodes]]\nmatch = "("\nclass = "deny"\n', "bad regex"),
])
def test_bad_policy_file_is_a_sweep_error(tmp_path: Path, content: str, needle: str) -> None:
    (tmp_path / "p.toml").write_text(content)
    with pytest.raises(SweepConfigError) as info:
        SweepConfig.from_dict({"models": ["a"], "dtypes": ["fp16"], "policies": ["p.toml"], "targets": ["cpu"]},
                              "s.toml", base_dir=tmp_path)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("change", "needle"), [
    ({"policies": '["defualt"]'}, "did you mean 'default'?"),
    ({"policies": '["bad.toml"]'}, "did you mean 'Sigmoid'?"),
    ({"targets": '["gpu"]'}, "unknown target 'gpu'"),
    ({"dtypes": '["int8"]'}, "unknown dtype"),
    ({"models": '["tinny"]'}, "unknown zoo model 'tinny'"),
    ({"models": '["tag:nope"]'}, "no zoo model has tag 'nope'"),
])
def test_ampci_sweep_refuses_bad_specs_and_stores_nothing(
        sqlite_url: str, tmp_path: Path, zoo: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], change: dict[str, str], needle: str) -> None:
    (tmp_path / "bad.toml").write_text('[ops]\ndeny = ["Sigmiod"]\n')
    sweep = tmp_path / "s.toml"
    sweep.write_text(_sweep_text(zoo, **change))
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    assert main(["sweep", "--config", str(sweep), "--revision", "HEAD"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampci: error: ") and needle in err and err.count("\n") == 1
    store = migrated_store(sqlite_url)
    assert store.list_runs(limit=10) == []
    store.dispose()


@pytest.mark.parametrize(("command", "needle"), [
    (["check", "tiny", "--policy", "agressive"], "did you mean 'aggressive'?"),
    (["check", "tiny", "--policy", "bad.toml"], "did you mean 'Sigmoid'?"),
    (["check", "tiny", "--target", "gpu"], "unknown target 'gpu'"),
    (["convert", "IN", "-o", "OUT", "--policy", "agressive"], "did you mean 'aggressive'?"),
    (["convert", "IN", "-o", "OUT", "--policy", "bad.toml"], "did you mean 'Sigmoid'?"),
])
def test_check_and_convert_refuse_unknown_policies(tmp_path: Path, zoo: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], command: list[str],
                                                  needle: str) -> None:
    (tmp_path / "bad.toml").write_text('[ops]\ndeny = ["Sigmiod"]\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    argv = [{"IN": str(tmp_path / "tiny.onnx"), "OUT": str(tmp_path / "out.onnx")}.get(a, a) for a in command]
    if argv[0] == "check":
        argv += ["--zoo", str(zoo)]
    try:
        code = main(argv)
    except SystemExit as exc:  # check's options are typed: argparse's one-line usage error (issue 24)
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "out.onnx").exists()


# -- [[nodes]] regexes that match nothing -----------------------------------------------------------


def test_node_rule_warnings_name_the_pattern_and_models(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[[nodes]]\nmatch = "^mm_"\nclass = "deny"\n\n'
                                     '[[nodes]]\nmatch = "^attention_"\nclass = "deny"\n')
    cfg = SweepConfig.from_dict({"models": ["a", "b"], "dtypes": ["fp16"], "policies": ["default", "p.toml"],
                                 "targets": ["cpu"]}, "s.toml", base_dir=tmp_path)
    cells = cfg.expand({"a": set(), "b": set()})
    nodes = {"a": ["mm_0", "relu"], "b": ["conv"]}
    assert cfg.node_rule_warnings(cells, nodes.__getitem__) == [
        "policy p.toml: [[nodes]] match '^attention_' matches no node of a, b"]
    assert cfg.node_rule_warnings(cells, {"a": ["x"], "b": ["mm_1", "attention_q"]}.__getitem__) == []

    def broken(model: str) -> list[str]:
        if model == "b":
            raise OSError("gone")
        return nodes[model]
    assert cfg.node_rule_warnings(cells, broken) == [
        "policy p.toml: [[nodes]] match '^attention_' matches no node of a (not listed: b (OSError))"]
    plain = _cfg(policies=["default"])
    assert plain.node_rule_warnings(plain.expand({"a": set()}), broken) == []


def test_zoo_node_names_reads_the_fetched_model(tmp_path: Path, zoo: Path) -> None:
    assert zoo_node_names(zoo, tmp_path / "cache")("tiny") == ["mm_0", "act_0"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_ampci_sweep_records_and_prints_regex_warnings(
        sqlite_url: str, tmp_path: Path, zoo: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "passrepo"  # a pass revision that cannot convert: the job fails fast, the run exists
    (repo / "amp_pass").mkdir(parents=True)
    (repo / "amp_pass" / "__init__.py").write_text("VALUE = 1\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    (tmp_path / "p.toml").write_text('[[nodes]]\nmatch = "^nothing_here$"\nclass = "deny"\n\n'
                                     '[[nodes]]\nmatch = "^mm_"\nclass = "deny"\n')
    sweep = tmp_path / "s.toml"
    sweep.write_text(_sweep_text(zoo, policies='["p.toml"]'))
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AMPCI_PASS_REPO", str(repo))
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    main(["sweep", "--config", str(sweep), "--revision", "main", "--workers", "1"])
    err = capsys.readouterr().err
    line = "policy p.toml: [[nodes]] match '^nothing_here$' matches no node of tiny"
    assert f"warning: {line}\n" in err and "'^mm_'" not in err
    store = Store.from_url(sqlite_url)
    (run,) = store.list_runs(limit=10)
    assert store.get_run(run.id).meta["warnings"] == [line]
    store.dispose()
