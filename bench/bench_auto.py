"""Policy ``auto`` on the real zoo models: how long the search takes and what it keeps in fp32.

For each model (default: the zoo's ``real`` tag) and each tolerance, runs ``auto_search`` on the
zoo inputs and prints one row: default coverage/cosine, auto coverage/cosine, nodes forced fp32,
evaluations, seconds (calibration + search + final conversion, all in memory).  The default
tolerance (cosine=0.9995 for fp16) is met by the default painting on every real model, so the
``--strict`` tolerance (default cosine=0.999995) is also run on the largest model to time a real
search.  Target: under 60 s for the largest real model (PP-OCRv4 rec) on a 2-core machine.

    python bench/bench_auto.py [--models a,b] [--dtype fp16] [--strict cosine=0.999995] [--max-steps 16] [--quick]

``--quick`` (seconds, nothing downloaded: the synthetic smoke model conv_net, default tolerance only, 4
steps) checks the invariants: the search meets the default tolerance, within its step budget, and its
result converts some compute to low precision; exit 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

from amp_pass import ConversionOptions  # noqa: E402
from service.settings import Settings  # noqa: E402
from workers.measure.autosearch import DEFAULT_TOLERANCE, Tolerance, auto_search  # noqa: E402
from workers.zoo.fetch import fetch_entry  # noqa: E402
from workers.zoo.inputs import make_feeds  # noqa: E402
from workers.zoo.manifest import load_zoo  # noqa: E402

TARGET_S = 60.0
LARGEST = "ppocr_v4_rec"
QUICK_MODEL = "conv_net"


def _cov(low: int, total: int) -> str:
    return f"{low}/{total}"


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 1 if the search on the largest model exceeds the target."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated zoo names (default: tag 'real')")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--strict", default="cosine=0.999995", help="extra tolerance run on the largest model")
    p.add_argument("--max-steps", type=int, default=16)
    p.add_argument("--quick", action="store_true", help="seconds: synthetic conv_net, default tolerance; invariants")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.strict, args.max_steps = QUICK_MODEL, "", 4
    settings = Settings.from_env()
    zoo = load_zoo()
    names = [n for n in args.models.split(",") if n] or [e.name for e in zoo.select(tag="real")]
    runs = [(n, DEFAULT_TOLERANCE[args.dtype]) for n in names]
    if args.strict and LARGEST in names:
        runs.append((LARGEST, args.strict))
    header = (f"{'model':<18} {'tolerance':<16} {'default cov':>11} {'default cos':>12} {'auto cov':>9} "
              f"{'auto cos':>12} {'met':>4} {'fp32 forced':>11} {'steps':>5} {'seconds':>8}")
    print(f"load average before: {os.getloadavg()[0]:.2f} (cpu count {os.cpu_count()})")
    print(header)
    print("-" * len(header))
    worst = 0.0
    broken: list[str] = []
    for name, tol in runs:
        entry = zoo.get(name)
        model = onnx.load(str(fetch_entry(entry, Path(settings.cache_dir)).path))
        feeds = [make_feeds(entry, entry.seed)]
        start = time.perf_counter()
        found = auto_search(model, feeds, ConversionOptions(dtype=args.dtype, policy="auto"), Tolerance.parse(tol),
                            max_steps=args.max_steps)
        seconds = time.perf_counter() - start
        if name == LARGEST:
            worst = max(worst, seconds)
        d, f = found.default, found.final
        if tol == DEFAULT_TOLERANCE[args.dtype] and not (found.met and len(found.steps) <= args.max_steps
                                                         and 0 < f.compute_low <= f.compute_nodes):
            broken.append(f"{name}: met {found.met}, {len(found.steps)} steps, {f.compute_low}/{f.compute_nodes} low")
        print(f"{name:<18} {tol:<16} {_cov(d.compute_low, d.compute_nodes):>11} {d.cosine:>12.8f} "
              f"{_cov(f.compute_low, f.compute_nodes):>9} {f.cosine:>12.8f} {'yes' if found.met else 'no':>4} "
              f"{len(found.forced):>11} {len(found.steps):>5} {seconds:>8.2f}")
        for key in found.forced:
            print(f"    fp32: {key}: {found.reasons.get(key, '')}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"largest model ({LARGEST}) worst search: {worst:.1f}s (target < {TARGET_S:.0f}s)")
    for b in broken:
        print(f"FAILED: {b}", file=sys.stderr)
    return 0 if worst < TARGET_S and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
