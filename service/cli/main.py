"""``ampci`` entry point.  ``main(argv)`` returns an exit code; ``entry()`` is the console script.

Each command module in COMMAND_MODULES exposes ``register(subparsers)`` which adds its
sub-commands and sets ``func(args) -> int`` on each parser.  Expected errors from any layer
(``UserError``-like: they carry ``exit_code``) are printed as one line without a traceback.
Command modules import heavy layers (workers, onnxruntime) lazily inside ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: tuple[str, ...] = (
    "service.cli.convert_cmd",
    "service.cli.sweep_cmd",
    "service.cli.worker_cmd",
    "service.cli.serve_cmd",
    "service.cli.db_cmd",
    "service.cli.query_cmd",
    "service.cli.bisect_cmd",
    "service.cli.zoo_cmd",
    "service.cli.check_cmd",
    "service.cli.reconcile_cmd",
    "service.cli.deliveries_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered command."""
    parser = argparse.ArgumentParser(prog="ampci", description="Mixed-precision regression CI for ONNX models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _is_expected_error(exc: BaseException) -> bool:
    """Errors raised on purpose by our layers carry an ``exit_code``; so do config errors."""
    return hasattr(exc, "exit_code") and isinstance(exc.exit_code, int)


def main(argv: list[str] | None = None) -> int:
    """Run one ampci command; return its exit code (0 ok, 1 gate failed, 2 bad input, 3 unavailable)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("ampci: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # translated at the boundary: one line, no traceback
        if _is_expected_error(exc):
            print(f"ampci: error: {exc}", file=sys.stderr)
            return int(exc.exit_code)  # type: ignore[attr-defined]
        raise


def entry() -> None:
    """Console-script wrapper around :func:`main`."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
