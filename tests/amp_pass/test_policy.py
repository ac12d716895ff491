"""Policy data and loading: real op names per opset, named policies, overlays, user overrides."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from amp_pass import ConversionOptions, PolicyError, convert_model
from amp_pass.policy import CLASSES, NAMED_POLICIES, load_policy, policy_data
from tests.amp_pass import graphs as G


def _tables():
    data = policy_data()
    yield "base", 1, data["base"]
    for v, table in data["opset"].items():
        yield f"opset.{v}", int(v), table
    for name, table in data["policies"].items():
        yield f"policies.{name}", None, table
    for name, table in data["targets"].items():
        yield f"targets.{name}", None, table


def test_every_listed_op_is_a_real_schema() -> None:
    latest = onnx.defs.onnx_opset_version()
    for where, since, table in _tables():
        for cls in CLASSES:
            for op in table.get(cls, []):
                assert onnx.defs.has(op), f"{where}.{cls}: {op} is not an ONNX op"
                if since is not None and since > 1:
                    onnx.defs.get_schema(op, max(since, 1) if since <= latest else latest)


def test_each_op_has_one_class_in_base() -> None:
    base = policy_data()["base"]
    seen: dict[str, str] = {}
    for cls in CLASSES:
        for op in base.get(cls, []):
            assert op not in seen, f"{op} in both {seen[op]} and {cls}"
            seen[op] = cls


@pytest.mark.parametrize("name", NAMED_POLICIES)
@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_named_policies_and_overlays(name: str, target: str) -> None:
    p = load_policy(name, target, 17)
    assert p.classify("MatMul", "", "mm")[0] == "allow"
    assert p.classify("LayerNormalization", "", "")[0] == "infer"
    assert p.classify("SomeCustomOp", "com.example", "")[0] is None
    if target == "cpu":
        assert p.classify("LSTM", "", "")[0] == "deny"
    if name == "aggressive":
        assert p.classify("Softmax", "", "")[0] == "infer"
    if name == "conservative":
        assert p.rule == "all_low" and p.classify("Div", "", "")[0] == "deny"


def test_opset_versioned_entries_apply_from_their_opset() -> None:
    assert load_policy("default", "cuda", 16).classify("LayerNormalization", "", "")[0] is None
    assert load_policy("default", "cuda", 17).classify("LayerNormalization", "", "")[0] == "infer"


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_user_overrides_by_op_type_and_node_name(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"policy{suffix}"
    if suffix == ".toml":
        path.write_text('base = "default"\n[ops]\ndeny = ["MatMul"]\n\n[[nodes]]\nmatch = "^mm_b$"\nclass = "allow"\n')
    else:
        path.write_text("base: default\nops:\n  deny: [MatMul]\nnodes:\n  - match: '^mm_b$'\n    class: allow\n")
    result = convert_model(G.shared_input(), ConversionOptions(policy=str(path)))
    kept = {k["node"]: k["reason"] for k in result.report.to_dict()["kept_fp32"]}
    assert "user override" in kept["mm_a"] and "user override" in kept["mm_c"]
    assert "mm_b" not in kept
    onnx.checker.check_model(result.model, full_check=True)


@pytest.mark.parametrize(("content", "needle"), [
    ("[ops]\nallow = [", "malformed"),
    ("[ops]\nfast = ['Conv']\n", "'ops' must map"),
    ("base = 'turbo'\n", "unknown base"),
    ("[[nodes]]\nmatch = '('\nclass = 'deny'\n", "bad regex"),
    ("[[nodes]]\nmatch = 'x'\nclass = 'fast'\n", "unknown class"),
    ("rule = 'random'\n", "unknown rule"),
    ("colour = 'blue'\n", "unknown keys"),
    ("[ops]\nallow = 'MatMul'\n", "'ops' must map"),  # a string, not a list (once a TypeError)
    ("[ops]\nallow = ['Exp']\ndeny = ['Exp']\n", "listed in both 'allow' and 'deny'"),
    ("[nodes]\nconv = 'deny'\n", "'nodes' must be a list"),
    ("nodes = 'conv'\n", "'nodes' must be a list"),
])
def test_bad_policy_files_are_user_errors(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(content)
    with pytest.raises(PolicyError, match=needle) as info:
        load_policy(str(path), "cuda", 17)
    assert info.value.exit_code == 2


def test_unknown_policy_name_and_target() -> None:
    with pytest.raises(PolicyError, match="unknown policy"):
        load_policy("fastest", "cuda", 17)
    with pytest.raises(PolicyError, match="unknown target"):
        load_policy("default", "tpu", 17)


def test_auto_policy_points_to_the_measuring_entry_points() -> None:
    with pytest.raises(PolicyError, match="ampci convert --policy auto"):
        load_policy("auto", "cuda", 17)
