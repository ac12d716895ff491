#!/usr/bin/env python3
"""What the pass sandbox costs a job (issue 31): the same conversions with the full sandbox and with best-effort
isolation (no namespaces, no mounts; a root worker still drops privileges), alternated in one run, warm (zygote
from the fork server, as a pool or Celery worker converts) and cold (a one-shot fresh interpreter).

Per model and mode it prints the median of: the whole conversion call as the job sees it (``call``: what the
sandbox adds to a job), and the conversion samples the conversion-time rule compares (``sample``: timed by the
sandbox's supervisor from the request to the pass's exit, so the set-up is outside it).  Target: the full
sandbox adds under 50 ms per job (warm call, median).  ``--quick``: one small model, few rounds; exits non-zero
when the full sandbox cannot be made here or a conversion fails.

    python bench/bench_sandbox.py [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers.revision.convert import convert_in_subprocess  # noqa: E402
from workers.sandbox import zygotes  # noqa: E402
from workers.sandbox.policy import SandboxPolicy, full_sandbox_error  # noqa: E402
from workers.zoo.synthetic import synthetic_model_path  # noqa: E402

MODELS = ("conv_net", "transformer_block", "loop_if")
TARGET_MS = 50.0


def _convert(src: Path, tmp: Path, policy: SandboxPolicy, warm: bool, repeats: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    out = convert_in_subprocess(src, tmp / "out.onnx", tmp / "report.json", "fp16", "default", "cpu", None,
                                timeout_s=300, memory_bytes=8 * 2**30, warm=warm, repeats=repeats, sandbox=policy)
    call = time.perf_counter() - start
    if out.status != "ok":
        raise SystemExit(f"bench_sandbox: conversion failed ({policy.mode}, {'warm' if warm else 'cold'}): "
                         f"{out.message}")
    return call, out.samples_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="one small model, 2 rounds: seconds")
    args = parser.parse_args()
    why = full_sandbox_error(SandboxPolicy())
    if why is not None:
        print(f"bench_sandbox: no full sandbox on this machine: {why}", file=sys.stderr)
        return 1
    models = MODELS[:1] if args.quick else MODELS
    rounds = 2 if args.quick else args.rounds
    zygotes.start_forkserver()
    rows = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as d:
        tmp = Path(d)
        cache = tmp / "cache"
        for name in models:
            try:
                src, _ = synthetic_model_path(name, 0, cache)
            except Exception as exc:  # noqa: BLE001 - a model this zoo lacks is skipped with the reason
                print(f"skip {name}: {exc}", file=sys.stderr)
                continue
            for warm in (True, False):
                calls: dict[str, list[float]] = {"full": [], "best-effort": []}
                samples: dict[str, list[float]] = {"full": [], "best-effort": []}
                for mode in calls:  # warm-up: zygotes and the first import
                    _convert(src, tmp, SandboxPolicy(mode=mode, hide=(str(cache),)), warm, 1)
                for i in range(rounds if warm else max(2, rounds // 3)):
                    order = ("full", "best-effort") if i % 2 == 0 else ("best-effort", "full")
                    for mode in order:
                        call, s = _convert(src, tmp, SandboxPolicy(mode=mode, hide=(str(cache),)), warm, 3)
                        calls[mode].append(call / len(s))
                        samples[mode].extend(s)
                row = {"model": name, "path": "warm" if warm else "cold"}
                for mode in calls:
                    row[f"{mode} call"] = statistics.median(calls[mode]) * 1e3
                    row[f"{mode} sample"] = statistics.median(samples[mode]) * 1e3
                row["added"] = row["full call"] - row["best-effort call"]
                rows.append(row)
                if warm and row["added"] > TARGET_MS:
                    ok = False
    zygotes.shutdown()
    zygotes.stop_forkserver()
    print(f"{'model':<20} {'path':<5} {'call full':>10} {'call b-e':>10} {'added':>8} {'sample full':>12} "
          f"{'sample b-e':>11}   (ms, medians per conversion)")
    for r in rows:
        print(f"{r['model']:<20} {r['path']:<5} {r['full call']:>10.1f} {r['best-effort call']:>10.1f} "
              f"{r['added']:>8.1f} {r['full sample']:>12.1f} {r['best-effort sample']:>11.1f}")
    print(f"target: the full sandbox adds < {TARGET_MS:.0f} ms per warm conversion: {'met' if ok else 'MISSED'}")
    return 0 if (ok or args.quick) and rows else 1


if __name__ == "__main__":
    sys.exit(main())
