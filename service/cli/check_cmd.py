"""``ampci check MODEL|PATH.onnx --dtype fp16 --policy default [--target cpu|cuda] [--revision REV] [--json]``.

Runs one job in this process (no queue, no database) and prints its result.  MODEL is a zoo name (the
built-in zoo merged with the user zoo, or ``--zoo``); an argument ending in ``.onnx`` or naming an
existing file is a model file, checked as it is: its inputs come from ``--inputs FILE.npz`` or are
generated from the graph's declared types and shapes (``--input-shape NAME=AxB`` for every symbolic dim,
``--input-range NAME=LOW:HIGH`` for integer inputs, ``--input-value NAME=VALUE`` for a constant one; whatever is missing is one line, exit 2, before
any job; see :mod:`workers.zoo.model_file`).  The result says which inputs were used and how they were
made.  Exit code: 0 when the job passed, 2 for bad input (``bad_spec``/``bad_model``), 1 for every
other failure.  Workers (and so onnxruntime) are imported inside the command function only.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from service.errors import UserError

if TYPE_CHECKING:
    from service.cli.main import Subcommands
    from service.json_types import JsonObject
    from workers.result import GraphFacts, JobResult
    from workers.zoo.manifest import ZooEntry

BAD_INPUT = frozenset({"bad_spec", "bad_model"})


def exit_code(status: str) -> int:
    """0 for ``pass``, 2 for bad input, 1 otherwise."""
    if status == "pass":
        return 0
    return 2 if status in BAD_INPUT else 1


def _fmt(x: float | None, spec: str = ".3g") -> str:
    if x is None:
        return "-"
    return format(x, spec) if math.isfinite(x) else str(x)


def format_result(r: JobResult) -> str:
    """A human-readable summary of a JobResult (status line first)."""
    lines = [f"{r.model} {r.dtype} policy={r.policy} target={r.target}: {r.status.upper()}"
             + (f" - {r.message}" if r.message else "")]
    for acc in (r.accuracy, r.accuracy_cuda):
        if acc is None:
            continue
        w = acc.worst
        task = f", {w.task_metric_name} {_fmt(w.task_metric)}" if w.task_metric_name else ""
        lines.append(f"  accuracy ({acc.mode}, {acc.provider}): {'ok' if acc.passed else 'FAIL'}; worst max_abs "
                     f"{_fmt(w.max_abs)} (fp32 rerun {_fmt(w.baseline_max_abs)}), max_rel {_fmt(w.max_rel)}, "
                     f"cosine {_fmt(w.cosine, '.6f')}, SNR {_fmt(w.snr_db, '.1f')} dB, nan {w.nan_count}, "
                     f"inf {w.inf_count}{task}")
        not_judged = getattr(acc, "not_judged", {}) or {}
        held = getattr(acc, "limits", {}) or {}
        for name, m in acc.per_output.items():
            why = f" (not judged: {not_judged[name]})" if name in not_judged else ""
            lim = held.get(name, {})
            max_abs = f" (limit {_fmt(lim['max_abs'])})" if "max_abs" in lim else ""
            cosine = f" (min {lim['min_cosine']:g})" if "min_cosine" in lim else ""
            task = f", {m.task_metric_name} {_fmt(m.task_metric)} (min {lim['task_min']:g})" \
                if "task_min" in lim and m.task_metric_name else ""
            lines.append(f"    {name}: max_abs {_fmt(m.max_abs)}{max_abs}, mean_abs {_fmt(m.mean_abs)}, "
                         f"cosine {_fmt(m.cosine, '.6f')}{cosine}{task}{why}")
    if r.convergence is not None:
        c = r.convergence
        lines.append(f"  convergence: {c.steps} steps, relative step error final {_fmt(c.final_error)}, "
                     f"max {_fmt(c.max_error)}, "
                     f"{'DIVERGED: ' + c.reason if c.diverged else 'bounded'}")
    if r.latency is not None:
        from workers.result import LATENCY_UNSUPPORTED

        lat = r.latency
        if lat.error.startswith(LATENCY_UNSUPPORTED):
            lines.append(f"  info: latency not measured: {lat.error[len(LATENCY_UNSUPPORTED):]}")
        elif lat.error:
            lines.append(f"  latency ({lat.provider}): not measured - {lat.error}")
        else:
            rss = f", peak RSS {lat.peak_rss_mb:.0f} MiB" if lat.peak_rss_mb else ""
            lines.append(f"  latency ({lat.provider}): p50 {lat.p50_ms:.3f} ms, p90 {lat.p90_ms:.3f} ms, "
                         f"min {lat.min_ms:.3f} ms; fp32 p50 {lat.fp32_p50_ms:.3f} ms; speedup "
                         f"{lat.speedup:.2f}x ({len(lat.samples_ms)} runs){rss}")
    if r.graph is not None:
        lines.extend(graph_lines(r.graph))
    lines.extend(input_lines(getattr(r, "inputs", None) or {}))
    env = r.environment
    if env:
        lines.append(f"  environment: onnxruntime {env.get('onnxruntime')} {env.get('provider')} on "
                     f"{env.get('device')}, python {env.get('python')}, pass {env.get('pass_revision')}")
    t = r.timings
    if t:
        lines.append(f"  time: {t.get('total_s', 0):.2f} s total, {t.get('overhead_s', 0):.2f} s outside model "
                     f"execution ({t.get('overhead_fraction', 0):.0%})")
    return "\n".join(lines)


def graph_lines(g: GraphFacts) -> list[str]:
    """The graph facts of a result as ``check`` prints them: the measured counts first (compute "n/a"
    when the model has no compute node), then what the pass reported about itself, labelled as such."""
    frac = "n/a" if g.low_precision_compute_fraction is None else f"{g.low_precision_compute_fraction:.0%}"
    what = "measured" if g.measured else "from the pass report"
    per_op = ", ".join(f"{op} {c.get('low', 0)}/{c.get('total', 0)}" for op, c in sorted(g.compute_by_op.items()))
    lines = [f"  graph ({what}): compute {g.compute_low}/{g.compute_nodes} low ({frac})"
             + (f" [{per_op}]" if per_op else "")
             + f", {g.nodes_low}/{g.nodes_total} nodes low, {g.nodes_kept_fp32} kept fp32, casts +{g.casts_inserted}"
             f"/-{g.casts_removed}"]
    if g.convert_samples_s:
        xs = sorted(g.convert_samples_s)
        lines.append(f"  conversion: median {xs[len(xs) // 2]:.3f} s over {len(xs)} conversion(s) "
                     f"(min {xs[0]:.3f} s)")
    rep = g.pass_report
    if rep or g.pass_iterations is not None:
        claimed = rep.get("low_precision_compute_fraction")
        said = [f"compute {rep['compute_low']}/{rep['compute_nodes']}"] if {"compute_low", "compute_nodes"} <= set(rep) \
            else []
        if isinstance(claimed, int | float):
            said.append(f"{claimed:.0%}")
        if g.pass_iterations is not None:
            state = {True: "converged", False: "did NOT converge", None: "convergence unknown"}[g.pass_converged]
            said.append(f"painting {state} in {g.pass_iterations} iteration(s)")
        said.append(f"{len(g.kept_fp32)} fp32 reason(s)")
        lines.append(f"  pass report (information): {', '.join(said)}")
    return lines


def input_lines(inputs: Mapping[str, Mapping[str, object]]) -> list[str]:
    """One line per input of a result: ``input NAME: DTYPE[SHAPE] VALUES (where the spec came from)``."""
    lines = []
    for name, d in inputs.items():
        note = f" ({d['note']})" if d.get("note") else ""
        lines.append(f"  input {name}: {d.get('dtype')}{d.get('shape')} {d.get('values')}{note}")
    return lines


def is_model_file(model: str) -> bool:
    """True when ``check``'s MODEL argument names a model file (ends with .onnx, or is a file)."""
    return model.lower().endswith(".onnx") or Path(model).expanduser().is_file()


def file_entry(args: argparse.Namespace) -> ZooEntry:
    """The ad-hoc zoo entry of ``check PATH``: the file with the inputs its options describe (a one-line
    SpecError/UserError, exit 2, for a symbolic dim or an integer range without a value, a bad option)."""
    from service.cli.zoo_cmd import input_options
    from workers.zoo.model_file import file_entry as entry_for_file

    if args.zoo is not None:
        raise UserError("--zoo names a zoo manifest; a model file is checked without one")
    options, state = input_options(args)
    return entry_for_file(Path(args.model), options, state)


def validated_policy(dtype: str, policy: str, target: str) -> str:
    """The policy a job of ``check`` runs with (a policy file as its absolute path, since the conversion
    runs in the pass revision's folder); a SweepConfigError (exit 2, one line, nothing run) for an
    unknown dtype, target or policy name, or a policy file the pass would refuse."""
    from service.orchestration.sweeps import SweepConfigError, check_target, resolve_policy
    from service.vocabulary import DTYPES

    if dtype not in DTYPES:
        raise SweepConfigError(f"--dtype: unknown dtype {dtype!r}; expected {' or '.join(DTYPES)}")
    check_target(target, "--target")
    return resolve_policy(policy, Path.cwd(), "--policy")


def error_json(message: str, status: str = "bad_spec", exit_code: int = 2,
               result: JsonObject | None = None) -> JsonObject:
    """The one shape of an error of ``check --json`` on stdout (the same line also goes to stderr):
    ``{"error", "status", "message", "exit_code"}``, plus ``result`` when a job ran and found the input bad."""
    out: JsonObject = {"error": "bad_input" if exit_code == 2 else "error", "status": status,
                       "message": " ".join(message.split()), "exit_code": exit_code}
    if result is not None:
        out["result"] = result
    return out


def usage_error_json(line: str) -> JsonObject:
    """An argparse usage error of ``check --json`` (a bad option value, a missing model) in the shape of
    :func:`error_json`: ``status`` ``usage``, exit code 2 (service.cli.main.OneLineParser prints it)."""
    return error_json(line, status="usage", exit_code=2)


def _run(args: argparse.Namespace) -> int:
    try:
        return _check(args)
    except Exception as exc:  # the JSON twin of the one line main() prints for an expected error
        code = getattr(exc, "exit_code", None)
        if getattr(args, "json", False) and isinstance(code, int):
            print(json.dumps(error_json(str(exc), exit_code=code), sort_keys=True))
        raise


def _check(args: argparse.Namespace) -> int:
    import sys

    from service.settings import Settings
    from workers.jobs.job import run_job  # lazy: onnxruntime only when a job runs
    from workers.jobs.spec import JobSpec

    settings = Settings.from_env()
    policy = validated_policy(args.dtype, args.policy, args.target)
    from service.cli.sandbox_check import start_canary

    canary = start_canary(settings)  # beside the model's checks below
    entry = None
    if Path(args.model).expanduser().is_dir():
        raise UserError(f"{args.model} is a directory; give an ONNX model file (PATH.onnx) or a zoo name "
                        "(see `ampci zoo list`)")
    if is_model_file(args.model):
        entry = file_entry(args)
    elif args.inputs is not None or args.input_shape or args.input_range or args.input_value or args.stateful:
        raise UserError(f"--inputs/--input-shape/--input-range/--input-value/--stateful describe a model file; "
                        f"{args.model!r} "
                        "is a zoo name (its inputs are in the zoo entry)")
    else:
        from workers.zoo.manifest import load_zoo

        load_zoo(args.zoo, settings.data_dir).get(args.model)  # unknown: ZooError with a "did you mean"
    spec = JobSpec(model=entry.name if entry else args.model, dtype=args.dtype, policy=policy, target=args.target,
                   revision=args.revision, pass_root=args.pass_root, seed=args.seed, steps=args.steps,
                   zoo_path=args.zoo, entry=entry)
    canary()  # a sandbox that cannot convert stops here, in one line (exit 3), before the job
    result = run_job(spec, settings.worker_config())
    memory = AutoMemory(settings.data_dir)
    if policy == "auto":
        memory.remember(result)
    code = exit_code(result.status)
    if args.json:
        if code == 2:
            print(json.dumps(error_json(result.message, result.status, 2, result.to_dict()), sort_keys=True,
                             indent=2, allow_nan=False))
            print(f"ampci: error: {' '.join(result.message.split())}", file=sys.stderr)
        else:
            print(json.dumps(result.to_dict(), sort_keys=True, indent=2, allow_nan=False))
    else:
        print(format_result(result))
        for line in next_steps(result, args, memory.recall(result)):
            print(line)
    return code


#: Statuses after which ``policy auto`` is the next thing to try (it keeps nodes fp32 until accurate).
AUTO_HELPS = frozenset({"fail_accuracy", "diverged"})
#: How the pass's fp32 reasons name a node the auto search forced (``auto: search: …``, or
#: amp_pass.calibration.FORCED_REASON; not imported: the CLI stays light).
FORCED = ("auto:", "forced fp32")


def kept_nodes(result: JobResult) -> list[dict[str, str]]:
    """The nodes a result kept in fp32 (the pass's reasons), with ``forced``: "1" for those the auto
    search forced (the others follow from them or from the policy)."""
    graph = getattr(result, "graph", None)
    return [{**k, "forced": "1" if any(f in k.get("reason", "") for f in FORCED) else ""}
            for k in (graph.kept_fp32 if graph is not None else [])]


def _nodes_text(kept: list[dict[str, str]], limit: int = 12) -> str:
    """``mm (MatMul, forced by the search), add (Add)``, at most ``limit`` of them."""
    shown = ", ".join(f"{k.get('node')} ({k.get('op_type')}{', forced by the search' if k.get('forced') else ''})"
                      for k in kept[:limit])
    return shown + (f" and {len(kept) - limit} more" if len(kept) > limit else "")


class AutoMemory:
    """What ``ampci check --policy auto`` kept in fp32, per (model sha256, dtype, target), under
    ``AMPCI_DATA_DIR/check_auto.json``, so that a later FAIL of another policy can say it.  Best effort:
    an unreadable or unwritable file is the same as an empty one."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "check_auto.json"

    @staticmethod
    def key(result: JobResult) -> str:
        return f"{result.model_sha256 or result.model}|{result.dtype}|{result.target}"

    def _load(self) -> JsonObject:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def remember(self, result: JobResult) -> None:
        """Record a finished ``policy auto`` result (nothing when it did not convert)."""
        if getattr(result, "graph", None) is None:
            return
        import datetime as dt
        import os

        data = self._load()
        data[self.key(result)] = {"status": result.status, "kept": kept_nodes(result),
                                  "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError:
            pass

    def recall(self, result: JobResult) -> JsonObject | None:
        """The recorded ``policy auto`` outcome for ``result``'s model, dtype and target, if any."""
        got = self._load().get(self.key(result))
        return got if isinstance(got, dict) else None


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def next_steps(result: JobResult, args: argparse.Namespace, auto: JsonObject | None) -> list[str]:
    """What to try after ``result``: for an accuracy failure with a policy other than ``auto``, the
    ``ampci check --policy auto`` and ``ampci convert --policy auto`` commands, with what ``auto`` kept in
    fp32 when it ran on this model here before; for a ``policy auto`` result, the nodes it kept in fp32."""
    if args.policy == "auto":
        if getattr(result, "graph", None) is None:
            return []
        kept = kept_nodes(result)
        return [f"  auto kept {len(kept)} node(s) in fp32: {_nodes_text(kept)}" if kept
                else "  auto kept no node in fp32"]
    if result.status not in AUTO_HELPS:
        return []
    model, dtype = args.model, args.dtype
    is_file = is_model_file(model)
    src = model if is_file else f"{model}.onnx"
    target = ["--target", args.target] if args.target in ("cpu", "cuda") else []
    file_inputs = [["--inputs", str(args.inputs)]] if is_file and args.inputs is not None else []
    check = [model, "--dtype", dtype, *target, *(x for pair in file_inputs for x in pair)]
    if is_file:
        check += [x for flag in ("input_shape", "input_range", "input_value") for v in getattr(args, flag, None) or []
                  for x in (f"--{flag.replace('_', '-')}", v)]
    convert = [src, "-o", f"{Path(model).stem if is_file else model}_{dtype}.onnx", "--dtype", dtype, *target,
               *(x for pair in file_inputs for x in pair)]
    lines = [f"next step: policy auto keeps the fewest nodes in fp32 that make {model} {dtype} accurate:",
             f"  ampci check {' '.join(map(_quote, check))} --policy auto",
             "  and to write the passing model:"]
    if not is_file:
        lines.append(f"  ampci zoo export {_quote(model)} -o {_quote(src)}")
    lines.append(f"  ampci convert {' '.join(map(_quote, convert))} --policy auto")
    if is_file and args.inputs is None and (args.input_shape or args.input_range or getattr(args, "input_value", None)):
        lines.append("  (auto measures on real inputs: give it --inputs FILE.npz for a model with symbolic dims "
                     "or integer inputs)")
    if auto:
        kept = [k for k in auto.get("kept") or [] if isinstance(k, dict)]
        lines.append(f"  when auto ran here ({auto.get('at')}: {str(auto.get('status', '')).upper()}) it kept "
                     + (f"{len(kept)} node(s) in fp32: {_nodes_text(kept)}" if kept else "no node in fp32"))
    else:
        lines.append("  (auto has not run on this model here yet; the first command shows what it keeps in fp32)")
    return lines


def register(subparsers: Subcommands) -> None:
    """Add ``ampci check``."""
    from service.cli.zoo_cmd import add_input_arguments

    p = subparsers.add_parser("check", help="run one regression job (model x dtype x policy x target) locally")
    from service.cli.argtypes import (
        bounded_int,
        dtype_name,
        path_arg,
        policy_name,
        revision_arg,
        target_name,
        text_arg,
    )

    p.add_argument("model", type=text_arg("model", 4096), help="zoo model name (see `ampci zoo list`) or an ONNX model file (PATH.onnx)")
    p.add_argument("--dtype", type=dtype_name, default="fp16", help="fp16 or bf16 (default fp16)")
    p.add_argument("--policy", type=policy_name, default="default", help="pass policy name or file (default: default)")
    p.add_argument("--target", type=target_name, default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--revision", type=revision_arg, default=None,
                   help="pass revision to record (the pass itself comes from --pass-root or this checkout)")
    p.add_argument("--pass-root", type=path_arg, default=None,
                   help="directory whose amp_pass package is converted with (default: this checkout)")
    p.add_argument("--seed", type=bounded_int(0, 2**32 - 1), default=None, help="input seed (default: the zoo entry's)")
    p.add_argument("--steps", type=bounded_int(1, 100_000), default=None,
                   help="convergence steps (default: entry or settings)")
    p.add_argument("--zoo", type=path_arg, default=None,
                   help="zoo manifest (default: zoo.toml of this checkout merged with the user zoo)")
    add_input_arguments(p, "model file: ")
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON; an error (a usage error too) is one JSON line on stdout "
                        "(error, status, message, exit_code) besides the one line on stderr")
    p.json_usage = usage_error_json
    p.set_defaults(func=_run)
