"""Static range safety of constant tensors (initializers, Constant / ConstantOfShape values).

A constant is unsafe for a low dtype when any finite value exceeds the dtype's largest finite value
(fp16: 65504) or when a bulk of its non-zero values would flush to zero.  Unsafe constants keep their
consumers in fp32, so they never silently become inf or 0.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from amp_pass.errors import InvalidModelError

#: A tensor underflows "in bulk" when the values that flush to zero carry more than this fraction of
#: its L2 norm (a few tiny values next to large ones are harmless; a tensor of 1e-9s is not).
UNDERFLOW_NORM_FRACTION = 1e-3

_INFO = {ir.DataType.FLOAT16: np.finfo(np.float16), ir.DataType.BFLOAT16: ml_dtypes.finfo(ml_dtypes.bfloat16)}
NUMPY_DTYPE = {ir.DataType.FLOAT16: np.dtype(np.float16), ir.DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
               ir.DataType.FLOAT: np.dtype(np.float32)}
LOW_NAMES = {ir.DataType.FLOAT16: "fp16", ir.DataType.BFLOAT16: "bf16"}


def range_problem(array: np.ndarray, low: ir.DataType, what: str) -> str | None:
    """A reason string when ``array`` cannot be represented in ``low`` without damage, else None."""
    if array.size == 0 or array.dtype != np.float32:
        return None
    info = _INFO[low]
    peak = max(float(array.max()), -float(array.min()))
    if not np.isfinite(peak):  # inf/nan stay inf/nan in any dtype: judge the finite part
        finite = array[np.isfinite(array)]
        if finite.size == 0:
            return None
        return range_problem(finite, low, what)
    if peak > float(info.max):
        return f"range: {what} max |x|={peak:.3g} exceeds {LOW_NAMES[low]} max {float(info.max):.5g}"
    tiny = float(info.smallest_subnormal) / 2
    small = array[(array <= tiny) & (array >= -tiny)]
    if np.any(small):
        lost = float(np.linalg.norm(small.astype(np.float64)))
        total = float(np.linalg.norm(array))
        if total < 1e-18:  # the float32 sum of squares underflowed (values of ~1e-20 and below)
            total = float(np.linalg.norm(array.astype(np.float64)))
        if lost > UNDERFLOW_NORM_FRACTION * total:
            flushed = int(np.count_nonzero(small))
            return (f"underflow: {what} has {flushed}/{array.size} non-zero values that flush to zero "
                    f"in {LOW_NAMES[low]} ({lost / total:.1%} of its norm)")
    return None


def check_and_convert(array: np.ndarray, low: ir.DataType, what: str) -> tuple[str | None, np.ndarray | None]:
    """``(problem, converted)``: the range problem of ``array`` (as ``range_problem``) and, when there is
    none, ``array`` rounded to ``low``.  Fast path: two reductions, the conversion and two non-zero
    counts (the second on the 16-bit pattern); the detailed analysis runs only when something
    overflows, is not finite or flushes to 0.
    """
    if array.size == 0 or array.dtype != np.float32:
        return None, None
    hi, lo = float(array.max()), float(array.min())
    info = _INFO[low]
    if not (np.isfinite(hi) and np.isfinite(lo)) or max(hi, -lo) > float(info.max):
        return range_problem(array, low, what), None
    converted = array.astype(NUMPY_DTYPE[low])
    # non-zero count of the 16-bit result on its bit pattern (sign masked: -0 is zero): counting on the
    # float16 view itself converts every element back to float32 (10x slower on large weights)
    if np.count_nonzero(array) != np.count_nonzero(converted.view(np.uint16) & np.uint16(0x7FFF)):
        problem = range_problem(array, low, what)
        if problem:
            return problem, None
    return None, converted


def convert_clean(arrays: list[np.ndarray], low: ir.DataType) -> list[np.ndarray | None]:
    """For each non-empty float32 array, ``check_and_convert(array, low, ...)[1]`` when its fast path
    finds nothing to analyse (finite, in range, nothing flushed to zero), else None (call
    ``check_and_convert`` for that one).  Vectorised over all arrays at once: for many small constants
    it replaces several numpy calls per array by a few over their concatenation."""
    if not arrays:
        return []
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays), dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    with np.errstate(over="ignore", invalid="ignore"):  # arrays out of range are not clean: not returned
        hi = np.maximum.reduceat(flat, offsets).astype(np.float64)
        lo = np.minimum.reduceat(flat, offsets).astype(np.float64)
        converted = flat.astype(NUMPY_DTYPE[low])
    nonzero = np.add.reduceat((flat != 0).astype(np.int64), offsets)
    kept = np.add.reduceat(((converted.view(np.uint16) & np.uint16(0x7FFF)) != 0).astype(np.int64), offsets)
    clean = np.isfinite(hi) & np.isfinite(lo) & (np.maximum(hi, -lo) <= float(_INFO[low].max)) & (nonzero == kept)
    out: list[np.ndarray | None] = []
    for i, a in enumerate(arrays):
        start = int(offsets[i])
        out.append(converted[start:start + a.size].reshape(a.shape) if clean[i] else None)
    return out


def to_low(array: np.ndarray, low: ir.DataType) -> np.ndarray:
    """``array`` rounded to ``low`` (round-to-nearest-even through ml_dtypes for bf16)."""
    return np.asarray(array, dtype=np.float32).astype(NUMPY_DTYPE[low])


def constant_array(value: ir.Value) -> np.ndarray | None:
    """The fp32 contents of an initializer or a Constant/ConstantOfShape output, else None."""
    if value.dtype is not ir.DataType.FLOAT:
        return None
    tensor = value.const_value
    if tensor is None:
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Constant":
            attr = node.attributes.get("value")
            if attr is None or attr.type is not ir.AttributeType.TENSOR:
                if (fa := node.attributes.get("value_float")) is not None:
                    return np.asarray(fa.value, dtype=np.float32)
                if (fs := node.attributes.get("value_floats")) is not None:
                    return np.asarray(list(fs.value), dtype=np.float32)
                return None
            tensor = attr.value
        elif node.op_type == "ConstantOfShape":
            attr = node.attributes.get("value")
            if attr is None:
                return np.zeros((1,), dtype=np.float32)
            tensor = attr.value
        else:
            return None
    try:
        return tensor.numpy()
    except Exception as exc:  # noqa: BLE001 - data that does not match its dims, unreadable external data
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidModelError(f"cannot read tensor {value.name!r} of the input model: {first}") from None
