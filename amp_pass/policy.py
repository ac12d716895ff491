"""Op-class policy: which ops run low precision, loaded from data files.

The default lists live in ``amp_pass/policies/ops.toml`` (versioned by opset).  A policy is a named
policy (``default``, ``conservative``, ``aggressive``) or a user file (TOML or YAML) that starts from a
named ``base`` and overrides classes by op type and by node-name regex; a target overlay (``cuda``,
``cpu``) is applied between the named policy and the user overrides.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amp_pass.errors import PolicyError

ALLOW, INFER, CLEAR, DENY = "allow", "infer", "clear", "deny"
CLASSES: tuple[str, ...] = (ALLOW, INFER, CLEAR, DENY)
RULES: tuple[str, ...] = ("any_low", "all_low", "eager")
NAMED_POLICIES: tuple[str, ...] = ("default", "conservative", "aggressive")
TARGETS: tuple[str, ...] = ("cuda", "cpu")
DATA_FILE = Path(__file__).with_name("policies") / "ops.toml"

_DATA_CACHE: dict[str, Any] = {}


def policy_data() -> dict[str, Any]:
    """The parsed default op lists (read once per process)."""
    if "data" not in _DATA_CACHE:
        with open(DATA_FILE, "rb") as f:
            _DATA_CACHE["data"] = tomllib.load(f)
    return _DATA_CACHE["data"]


@dataclass(frozen=True)
class NodeRule:
    """A node-name regex override: every node whose name matches (``re.search``) gets ``op_class``."""

    pattern: re.Pattern[str]
    op_class: str


@dataclass
class Policy:
    """Resolved op classes for one model opset.

    Guarantees: ``classify`` returns one of CLASSES or ``None`` (unknown op) with a human reason.
    """

    name: str
    target: str
    opset: int
    rule: str
    classes: dict[str, tuple[str, str]] = field(default_factory=dict)  # op -> (class, reason)
    node_rules: list[NodeRule] = field(default_factory=list)

    def classify(self, op_type: str, domain: str, node_name: str) -> tuple[str | None, str]:
        """Class and reason for one node (node-name rules win over op-type lists)."""
        for rule in self.node_rules:
            if node_name and rule.pattern.search(node_name):
                return rule.op_class, f"user override: node name matches {rule.pattern.pattern!r}"
        if domain not in ("", "ai.onnx"):
            return None, f"unknown op {domain}::{op_type}"
        if op_type in self.classes:
            return self.classes[op_type]
        return None, f"unknown op {op_type} (not in any policy list)"


def known_op_types() -> frozenset[str]:
    """Every op type that has a schema in some ONNX domain (default, ``ai.onnx.ml``, previews; any opset)."""
    if "ops" not in _DATA_CACHE:
        import onnx.defs

        _DATA_CACHE["ops"] = frozenset(s.name for s in onnx.defs.get_all_schemas_with_history())
    return _DATA_CACHE["ops"]


def check_op_type(op: str, where: str) -> None:
    """PolicyError naming ``where`` unless ``op`` is an op type of some ONNX domain; a near miss is
    suggested (``deny = ["Sigmiod"]`` -> did you mean 'Sigmoid'?)."""
    known = known_op_types()
    if op in known:
        return
    close = difflib.get_close_matches(op, known, n=1, cutoff=0.6)
    if not close:  # case slips ("matmul") are not near by ratio alone
        close = [k for k in sorted(known) if k.lower() == op.lower()][:1]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise PolicyError(f"{where}: {op!r} is not an op type of any ONNX domain{hint}")


def unmatched_node_rules(policy: Policy, node_names: Iterable[str]) -> list[str]:
    """The ``[[nodes]]`` patterns of ``policy`` that match none of ``node_names`` (in file order)."""
    names = [n for n in node_names if n]
    return [r.pattern.pattern for r in policy.node_rules if not any(r.pattern.search(n) for n in names)]


def unmatched_notes(policy: Policy, node_names: Iterable[str]) -> list[str]:
    """One report note per ``[[nodes]]`` pattern of ``policy`` that matches no node name given."""
    return [f"policy {Path(policy.name).name}: [[nodes]] match {p!r} matches no node of this model that the pass classifies"
            for p in unmatched_node_rules(policy, node_names)]


def _apply_lists(classes: dict[str, tuple[str, str]], table: dict[str, Any], why: str) -> None:
    for cls in CLASSES:
        for op in table.get(cls, ()) or ():
            if not isinstance(op, str):
                raise PolicyError(f"policy {why}: entries of '{cls}' must be op names, got {op!r}")
            classes[op] = (cls, f"{cls.upper()} list ({why}): {op}")


def _read_user_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc}") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = tomllib.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parser error is a user error
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PolicyError(f"malformed policy file {path}: {first}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"policy file {path} must contain a table/mapping at top level")
    known = {"base", "rule", "ops", "nodes"}
    extra = sorted(set(data) - known)
    if extra:
        raise PolicyError(f"policy file {path}: unknown keys {extra}; allowed: {sorted(known)}")
    return data


def load_policy(policy: str, target: str, opset: int) -> Policy:
    """Resolve ``policy`` (a name in NAMED_POLICIES or a TOML/YAML path) for ``target`` and ``opset``.

    Raises PolicyError (exit code 2) for an unknown name, unreadable or malformed file, bad class,
    bad rule, bad regex, or a listed op type that exists in no ONNX domain (with a "did you mean").
    """
    if target not in TARGETS:
        raise PolicyError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    user: dict[str, Any] = {}
    base = policy
    if policy == "auto":
        raise PolicyError("policy 'auto' measures the model (onnxruntime), which the pure pass does not do: "
                          "run it with `ampci convert --policy auto` or `python -m workers.revision.autoconvert`")
    if policy not in NAMED_POLICIES:
        path = Path(policy)
        if not (path.suffix.lower() in (".toml", ".yaml", ".yml") or path.exists()):
            close = difflib.get_close_matches(policy, (*NAMED_POLICIES, "auto"), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PolicyError(f"unknown policy {policy!r}; {hint}choose one of {', '.join(NAMED_POLICIES)}, "
                              "auto, or a .toml/.yaml file")
        if not path.is_file():
            raise PolicyError(f"policy file {policy} does not exist")
        user = _read_user_file(path)
        base = user.get("base", "default")
        if base not in NAMED_POLICIES:
            raise PolicyError(f"policy file {policy}: unknown base {base!r}; choose one of {NAMED_POLICIES}")
    data = policy_data()
    classes: dict[str, tuple[str, str]] = {}
    _apply_lists(classes, data["base"], "default")
    for version in sorted(int(v) for v in data.get("opset", {})):
        if opset >= version:
            _apply_lists(classes, data["opset"][str(version)], f"opset {version}")
    named = data["policies"][base]
    _apply_lists(classes, named, f"policy {base}")
    _apply_lists(classes, data.get("targets", {}).get(target, {}), f"target {target}")
    rule = user.get("rule", named.get("rule", "any_low"))
    if rule not in RULES:
        raise PolicyError(f"policy {policy}: unknown rule {rule!r}; choose one of {', '.join(RULES)}")
    ops = user.get("ops", {}) or {}
    if not isinstance(ops, dict) or set(ops) - set(CLASSES) or \
            not all(isinstance(v, list) for v in ops.values() if v is not None):
        raise PolicyError(f"policy {policy}: 'ops' must map classes {CLASSES} to lists of op types")
    ops = {cls: v for cls, v in ops.items() if v is not None}
    listed: dict[str, str] = {}
    for cls, names in ops.items():
        for op in names:
            if isinstance(op, str):
                check_op_type(op, f"policy file {policy}: ops.{cls}")
            if isinstance(op, str) and listed.setdefault(op, cls) != cls:
                raise PolicyError(f"policy {policy}: {op} is listed in both '{listed[op]}' and '{cls}'")
    _apply_lists(classes, ops, f"user override {Path(policy).name}")
    for op in ops.get(ALLOW, []) + ops.get(INFER, []) + ops.get(CLEAR, []) + ops.get(DENY, []):
        cls = classes[op][0]
        classes[op] = (cls, f"user override: {op} in {cls.upper()} list")
    node_rules: list[NodeRule] = []
    entries = user.get("nodes", []) or []
    if not isinstance(entries, list):
        raise PolicyError(f"policy {policy}: 'nodes' must be a list of {{match, class}} entries ([[nodes]] in TOML)")
    for entry in entries:
        if not isinstance(entry, dict) or "match" not in entry or "class" not in entry:
            raise PolicyError(f"policy {policy}: each [[nodes]] entry needs 'match' (regex) and 'class'")
        if entry["class"] not in CLASSES:
            raise PolicyError(f"policy {policy}: unknown class {entry['class']!r}; choose one of {CLASSES}")
        try:
            pattern = re.compile(str(entry["match"]))
        except re.error as exc:
            raise PolicyError(f"policy {policy}: bad regex {entry['match']!r}: {exc}") from None
        node_rules.append(NodeRule(pattern, entry["class"]))
    return Policy(name=policy, target=target, opset=opset, rule=rule, classes=classes, node_rules=node_rules)


def compute_op_types() -> frozenset[str]:
    """Op types counted as compute for the coverage fraction (the ALLOW list of every opset)."""
    data = policy_data()
    ops = set(data["base"].get(ALLOW, []))
    for table in data.get("opset", {}).values():
        ops.update(table.get(ALLOW, []))
    return frozenset(ops)
