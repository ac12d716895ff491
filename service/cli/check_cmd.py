"""``ampci check MODEL|PATH.onnx --dtype fp16 --policy default [--target cpu|cuda] [--revision REV] [--json]``.

Runs one job in this process (no queue, no database) and prints its result.  MODEL is a zoo name (the
built-in zoo merged with the user zoo, or ``--zoo``); an argument ending in ``.onnx`` or naming an
existing file is a model file, checked as it is: its inputs come from ``--inputs FILE.npz`` or are
generated from the graph's declared types and shapes (``--input-shape NAME=AxB`` for every symbolic dim,
``--input-range NAME=LOW:HIGH`` for integer inputs; whatever is missing is one line, exit 2, before
any job; see :mod:`workers.zoo.model_file`).  The result says which inputs were used and how they were
made.  Exit code: 0 when the job passed, 2 for bad input (``bad_spec``/``bad_model``), 1 for every
other failure.  Workers (and so onnxruntime) are imported inside the command function only.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import UserError

if TYPE_CHECKING:
    from workers.result import GraphFacts
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


def format_result(r: Any) -> str:
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
        for name, m in acc.per_output.items():
            why = f" (not judged: {not_judged[name]})" if name in not_judged else ""
            lines.append(f"    {name}: max_abs {_fmt(m.max_abs)}, mean_abs {_fmt(m.mean_abs)}, "
                         f"cosine {_fmt(m.cosine, '.6f')}{why}")
    if r.convergence is not None:
        c = r.convergence
        lines.append(f"  convergence: {c.steps} steps, relative step error final {_fmt(c.final_error)}, "
                     f"max {_fmt(c.max_error)}, "
                     f"{'DIVERGED: ' + c.reason if c.diverged else 'bounded'}")
    if r.latency is not None:
        lat = r.latency
        if lat.error:
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


def input_lines(inputs: dict[str, dict[str, Any]]) -> list[str]:
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
    from service.orchestration.sweeps import DTYPES, SweepConfigError, check_target, resolve_policy

    if dtype not in DTYPES:
        raise SweepConfigError(f"--dtype: unknown dtype {dtype!r}; expected {' or '.join(DTYPES)}")
    check_target(target, "--target")
    return resolve_policy(policy, Path.cwd(), "--policy")


def _run(args: argparse.Namespace) -> int:
    from service.settings import Settings
    from workers.job import JobSpec, run_job  # lazy: onnxruntime only when a job runs

    settings = Settings.from_env()
    policy = validated_policy(args.dtype, args.policy, args.target)
    entry = None
    if is_model_file(args.model):
        entry = file_entry(args)
    elif args.inputs is not None or args.input_shape or args.input_range or args.stateful:
        raise UserError(f"--inputs/--input-shape/--input-range/--stateful describe a model file; {args.model!r} "
                        "is a zoo name (its inputs are in the zoo entry)")
    spec = JobSpec(model=entry.name if entry else args.model, dtype=args.dtype, policy=policy, target=args.target,
                   revision=args.revision, pass_root=args.pass_root, seed=args.seed, steps=args.steps,
                   zoo_path=args.zoo, entry=entry)
    result = run_job(spec, settings.worker_config())
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True, indent=2, allow_nan=False))
    else:
        print(format_result(result))
    return exit_code(result.status)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``ampci check``."""
    from service.cli.zoo_cmd import add_input_arguments

    p = subparsers.add_parser("check", help="run one regression job (model x dtype x policy x target) locally")
    p.add_argument("model", help="zoo model name (see `ampci zoo list`) or an ONNX model file (PATH.onnx)")
    p.add_argument("--dtype", default="fp16", help="fp16 or bf16 (default fp16)")
    p.add_argument("--policy", default="default", help="pass policy name or file (default: default)")
    p.add_argument("--target", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--revision", default=None,
                   help="pass revision to record (the pass itself comes from --pass-root or this checkout)")
    p.add_argument("--pass-root", type=Path, default=None,
                   help="directory whose amp_pass package is converted with (default: this checkout)")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: the zoo entry's)")
    p.add_argument("--steps", type=int, default=None, help="convergence steps (default: entry or settings)")
    p.add_argument("--zoo", type=Path, default=None,
                   help="zoo manifest (default: zoo.toml of this checkout merged with the user zoo)")
    add_input_arguments(p, "model file: ")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_run)
