"""Conversion with data: ``--policy auto`` (accuracy-guided search) and ``--calibration-data`` (range rules).

Used by ``ampci convert`` (imported lazily, since it needs onnxruntime) and, as
``python -m workers.revision.autoconvert SRC -o DST ... --report FILE [--pass-root ROOT]``, by the job's
conversion subprocess, with the same exit codes as ``python -m amp_pass convert`` (0 ok; 2 bad
input, one line on stderr; 1 internal error).  ``--pass-root`` imports ``amp_pass`` from another
checkout (the revision under test) while the search itself is this checkout's.

Inputs for calibration and the search (:func:`choose_feeds`): ``--inputs``/``--calibration-data F.npz``
(one array per model input, either the input's shape or with one extra leading axis of samples); else
the zoo entry whose sha256 matches the model (its input spec); else, only for a model whose inputs are
all float with static shapes, seeded N(0, 1) of the declared shapes.  A model with symbolic dims or
non-float inputs and neither is refused (DataError naming the inputs and dims needed): ``auto`` never
judges on invented inputs.  Guarantees: nothing is written unless conversion succeeded; the report is
the pass report (same keys; ``policy`` is ``auto``) plus ``auto`` (the search), ``calibration`` and
``inputs`` (``source``: ``user npz:PATH``, ``zoo spec`` or ``generated from static shapes``, with each
input's shape and dtype) sections.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from workers.revision.auto_args import add_auto_arguments as add_auto_arguments


class DataError(ValueError):
    """Unreadable or mismatching calibration data, or a pass without the hooks (a user error)."""

    exit_code = 2


def load_feeds(path: Path, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """Feed sets from an .npz (see the module docstring); DataError naming the problem."""
    import zipfile

    from workers.zoo.inputs import model_inputs

    if path.is_dir() or (path.is_file() and not zipfile.is_zipfile(path)):
        what = "a directory" if path.is_dir() else "not an .npz file"
        raise DataError(f"calibration data {path} is {what} (write one with numpy.savez(PATH, NAME=array, ...), "
                        "one array per model input)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"cannot read calibration data {path}: {exc}") from None
    inputs = model_inputs(model)
    missing = [n for n in inputs if n not in arrays]
    if missing:
        raise DataError(f"calibration data {path} lacks model inputs: {', '.join(missing)} (has {sorted(arrays)})")
    counts = set()
    for name, (_, dims) in inputs.items():
        extra = arrays[name].ndim - len(dims)
        if extra not in (0, 1):
            raise DataError(f"calibration data {path}: {name!r} has shape {list(arrays[name].shape)}, "
                            f"model rank is {len(dims)}")
        counts.add(arrays[name].shape[0] if extra else None)
    if len(counts) != 1:
        raise DataError(f"calibration data {path}: inputs disagree on the number of samples")
    n = counts.pop()
    cast = {name: dtype for name, (dtype, _) in inputs.items()}
    if n is None:
        return [{k: arrays[k].astype(cast[k]) for k in inputs}]
    return [{k: arrays[k][i].astype(cast[k]) for k in inputs} for i in range(n)]


def describe_inputs(source: str, feeds: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """The report's ``inputs`` section: where the inputs came from, how many feed sets, each input's
    shape and dtype (of the first set)."""
    first = feeds[0] if feeds else {}
    return {"source": source, "samples": len(feeds),
            "shapes": {k: list(v.shape) for k, v in first.items()},
            "dtypes": {k: str(v.dtype) for k, v in first.items()}}


def _needs(dtype: np.dtype, dims: list[int | str | None]) -> str | None:
    """Why an input cannot be invented (symbolic dims, non-float values), or None."""
    symbolic = [str(d) if d else "?" for d in dims if not (isinstance(d, int) and d > 0)]
    why = []
    if symbolic:
        why.append(f"symbolic dims {', '.join(symbolic)}")
    if dtype.kind != "f":
        why.append(f"{dtype} values")
    return "; ".join(why) or None


def choose_feeds(model_path: Path, model: onnx.ModelProto, data: Path | None = None,
                 data_source: str | None = None) -> tuple[list[dict[str, np.ndarray]], str, dict[str, Any]]:
    """(feed sets, calibration source, the report's ``inputs`` section) for ``model``: the npz ``data``
    (``data_source`` says where it came from, e.g. the job's zoo feeds); else the zoo entry whose
    sha256 is the file's; else seeded N(0, 1) of the declared shapes, only when every input is float
    with static dims -- otherwise DataError naming what each input needs (nothing is invented)."""
    from workers.zoo.inputs import make_feeds, model_inputs
    from workers.zoo.manifest import ZooError, load_zoo

    if data is not None:
        feeds = load_feeds(data, model)
        return feeds, str(data), describe_inputs(data_source or f"user npz:{data}", feeds)
    sha = hashlib.sha256(model_path.read_bytes()).hexdigest()
    try:
        for entry in load_zoo().entries.values():
            if entry.sha256 == sha:
                feeds = [make_feeds(entry, entry.seed)]
                return feeds, f"zoo:{entry.name}", {**describe_inputs("zoo spec", feeds), "zoo": entry.name}
    except ZooError:
        pass
    inputs = model_inputs(model)
    needed = {name: why for name, (dtype, dims) in inputs.items() if (why := _needs(dtype, dims))}
    if needed:
        what = ", ".join(f"{name} {inputs[name][0]}[{','.join(str(d) if d else '?' for d in inputs[name][1])}] "
                         f"({why})" for name, why in needed.items())
        raise DataError(f"{model_path.name} is not a zoo model and its inputs cannot be made up: {what}; "
                        "give real inputs with --inputs FILE.npz (one array per input)")
    rng = np.random.default_rng(0)
    feeds = [{name: rng.standard_normal([int(d) for d in dims]).astype(dtype)  # type: ignore[arg-type]
              for name, (dtype, dims) in inputs.items()}]
    return feeds, "synthetic N(0,1) of the static input shapes", describe_inputs("generated from static shapes",
                                                                                  feeds)


def _save(model: onnx.ModelProto, dst: Path, external: bool) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        if external or model.ByteSize() > 1_500_000_000:
            onnx.save(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                      location=f"{dst.name}.data", size_threshold=1024)
        else:
            onnx.save(model, tmp)
        _mode_as_created(tmp)
        os.replace(tmp, dst)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _write_json(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    _mode_as_created(tmp)
    os.replace(tmp, path)


def _mode_as_created(path: str) -> None:
    """Give a ``tempfile.mkstemp`` file (0600) the mode the umask gives a newly created file (0644 under 022).
    Not ``amp_pass.io.chmod_as_created``: this module runs beside the pass of any revision, which may predate it."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def run_auto_convert(args: argparse.Namespace) -> int:
    """Convert ``args.model`` with policy auto and/or calibration data; write model and report."""
    from amp_pass.cli import options_from_args
    from amp_pass.errors import OptionsError
    from amp_pass.io import load_model

    try:  # the pass under test (maybe another revision) must provide the hooks the search drives
        from workers.measure.autosearch import DEFAULT_TOLERANCE, Tolerance, auto_search
        from workers.measure.calibrate import collect_ranges
    except ImportError as exc:
        raise DataError(f"this pass revision has no policy-auto hooks (amp_pass.calibration): {exc}") from None

    start = time.perf_counter()
    src, dst = Path(args.model), Path(args.output)
    if src.resolve() == dst.resolve():
        raise OptionsError(f"output {dst} would overwrite the input model")
    loaded = load_model(src)  # (model, had external data) in current revisions, a bare model in older ones
    model, external = loaded if isinstance(loaded, tuple) else (loaded, False)
    options = options_from_args(args)
    tolerance = Tolerance.parse(args.tolerance or DEFAULT_TOLERANCE.get(options.dtype, "cosine=0.9995"))
    options.validate()
    feeds, source, inputs = choose_feeds(src, model, args.calibration_data, getattr(args, "inputs_source", None))
    thresholds = {"overflow_margin": args.overflow_margin, "max_reduction": args.max_reduction}
    auto = options.policy == "auto"
    given = args.calibration_data is not None or not auto  # measured up front only when data was given
    calibration = collect_ranges(model, feeds, source=source, keep_arrays=auto, **thresholds) if given else None
    extra: dict[str, Any] = {}
    if auto:
        found = auto_search(model, feeds, options, tolerance, max_steps=args.max_steps, calibration=calibration,
                            thresholds=thresholds)
        assert found.result is not None
        result, calibration = found.result, found.calibration
        extra["auto"] = found.to_dict()
    else:
        assert calibration is not None
        import dataclasses

        from amp_pass import convert_model

        result = convert_model(model, dataclasses.replace(options, calibration=calibration.ranges))
    extra["calibration"] = {"source": source, "samples": len(feeds), **thresholds,
                            "values": len(calibration.ranges.values) if calibration else 0,
                            "measured": calibration is not None}
    extra["inputs"] = inputs
    _save(result.model, dst, external)
    report = result.report
    report.seconds = time.perf_counter() - start
    data = {**report.to_dict(), **extra}
    if args.report is not None:
        _write_json(data, args.report)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        line = (f"converted {src} -> {dst}: {data['nodes_low']}/{data['nodes_total']} nodes {args.dtype}, "
                f"compute {data['compute_low']}/{data['compute_nodes']}, casts +{data['casts_inserted']}"
                f"/-{data['casts_removed']}, {len(data['kept_fp32'])} kept fp32, {data['seconds']:.3f}s")
        if auto:
            a = extra["auto"]
            line += (f"; auto {'met' if a['met'] else 'did NOT meet'} {a['tolerance']}: "
                     f"{len(a['forced_fp32'])} forced fp32, cosine {a['default']['cosine']} -> "
                     f"{a['final']['cosine']}, {a['evaluations']} evaluations; inputs: {inputs['source']}")
        print(line)
    return 0


class _PinnedPass(importlib.abc.MetaPathFinder):
    """Resolves ``amp_pass.*`` only inside the pinned root: a module that revision lacks is missing,
    never silently taken from another copy (an editable install's finder would supply this checkout's)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("amp_pass."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {fullname!r} in pass root {self.root}", name=fullname)
        return spec


def use_pass_root(root: Path) -> None:
    """Import ``amp_pass`` from ``root`` (before anything imports it), keeping this checkout's workers."""
    init = Path(root) / "amp_pass" / "__init__.py"
    if "amp_pass" in sys.modules or not init.is_file():
        return
    sys.meta_path.insert(0, _PinnedPass(Path(root)))
    spec = importlib.util.spec_from_file_location("amp_pass", init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["amp_pass"] = module
    spec.loader.exec_module(module)


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.revision.autoconvert``: 0 ok, 2 bad input (one stderr line), 1 internal error."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pass-root", type=Path, default=None)
    known, rest = pre.parse_known_args(argv)
    if known.pass_root is not None:
        try:
            use_pass_root(known.pass_root)
        except ImportError as exc:
            print(f"autoconvert: error: the pass at {known.pass_root} has no policy-auto hooks: {exc}",
                  file=sys.stderr)
            return 2
    from amp_pass.cli import add_convert_arguments

    parser = argparse.ArgumentParser(prog="python -m workers.revision.autoconvert",
                                     description="Conversion with calibration data and/or policy auto.")
    add_convert_arguments(parser)
    add_auto_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return run_auto_convert(args)
    except KeyboardInterrupt:
        print("autoconvert: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # translated at the boundary: one line, no traceback
        code = getattr(exc, "exit_code", None)
        if isinstance(code, int):
            print(f"autoconvert: error: {exc}", file=sys.stderr)
            return code
        print(f"autoconvert: internal error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1


def command(src: Path, dst: Path, report: Path, dtype: str, target: str, pass_root: Path,
            inputs: Path | None, tolerance: str | None = None) -> list[str]:
    """The subprocess command line the job runs for policy ``auto`` (cwd: this checkout)."""
    cmd = [sys.executable, "-m", "workers.revision.autoconvert", str(src), "-o", str(dst), "--dtype", dtype,
           "--policy", "auto", "--target", target, "--report", str(report), "--pass-root", str(pass_root)]
    if inputs is not None:  # the job's own feeds, made from the zoo entry's input spec
        cmd += ["--calibration-data", str(inputs), "--inputs-source", "zoo spec (the job's inputs)"]
    if tolerance is not None:
        cmd += ["--tolerance", tolerance]
    return cmd


if __name__ == "__main__":
    sys.exit(main())
