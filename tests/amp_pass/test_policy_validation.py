"""Policy files name real op types (with a "did you mean" for typos); node regexes that match nothing
are said in the conversion report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from amp_pass import ConversionOptions, PolicyError, convert_model
from amp_pass.policy import known_op_types, load_policy
from tests.amp_pass import graphs as G

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("ops", "needle"), [
    ('deny = ["Sigmiod"]', "ops.deny: 'Sigmiod' is not an op type of any ONNX domain; did you mean 'Sigmoid'?"),
    ('allow = ["Gemm", "Matmul"]', "did you mean 'MatMul'?"),
    ('clear = ["reshape"]', "did you mean 'Reshape'?"),
    ('infer = ["Zorblax"]', "'Zorblax' is not an op type of any ONNX domain"),
])
def test_unknown_op_types_are_policy_errors(tmp_path: Path, ops: str, needle: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f"[ops]\n{ops}\n")
    with pytest.raises(PolicyError) as info:
        load_policy(str(path), "cpu", 17)
    assert needle in str(info.value) and info.value.exit_code == 2 and "\n" not in str(info.value)


def test_ops_of_every_onnx_domain_are_known(tmp_path: Path) -> None:
    assert {"Sigmoid", "TreeEnsembleClassifier", "LayerNormalization"} <= known_op_types()
    path = tmp_path / "p.yaml"
    path.write_text("ops:\n  deny: [Sigmoid, TreeEnsembleClassifier]\n")
    assert load_policy(str(path), "cpu", 17).classify("Sigmoid", "", "s")[0] == "deny"


def test_unknown_policy_name_suggests_the_close_one() -> None:
    with pytest.raises(PolicyError, match="did you mean 'aggressive'"):
        load_policy("agressive", "cpu", 17)
    with pytest.raises(PolicyError, match="did you mean 'default'"):
        load_policy("defualt", "cpu", 17)


def test_python_m_amp_pass_refuses_a_typo_with_exit_2(tmp_path: Path) -> None:
    src = tmp_path / "in.onnx"
    onnx.save(G.shared_input(), src)
    (tmp_path / "p.toml").write_text('[ops]\ndeny = ["Sigmiod"]\n')
    proc = subprocess.run([sys.executable, "-m", "amp_pass", "convert", str(src), "-o", str(tmp_path / "o.onnx"),
                           "--policy", str(tmp_path / "p.toml")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "did you mean 'Sigmoid'?" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and not (tmp_path / "o.onnx").exists()


def test_node_regex_matching_nothing_is_a_report_note(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[[nodes]]\nmatch = "^mm_b$"\nclass = "deny"\n\n[[nodes]]\nmatch = "^no_such_node"\nclass = "deny"\n')
    result = convert_model(G.shared_input(), ConversionOptions(policy=str(path)))
    notes = result.report.to_dict()["notes"]
    assert notes == ["policy p.toml: [[nodes]] match '^no_such_node' matches no node of this model that the "
                     "pass classifies"]
    kept = {k["node"] for k in result.report.to_dict()["kept_fp32"]}
    assert "mm_b" in kept
    onnx.checker.check_model(result.model, full_check=True)


def test_node_regex_inside_a_subgraph_counts_as_a_match(tmp_path: Path) -> None:
    model = G.loop_with_captured_weights()
    body = [n.name for n in model.graph.node for a in n.attribute if a.HasField("g") for n in a.g.node if n.name]
    top = {n.name for n in model.graph.node}
    assert body and body[0] not in top
    path = tmp_path / "p.toml"
    path.write_text(f'[[nodes]]\nmatch = "^{body[0]}$"\nclass = "deny"\n')
    result = convert_model(model, ConversionOptions(policy=str(path)))
    assert result.report.to_dict()["notes"] == []
    onnx.checker.check_model(result.model, full_check=True)
