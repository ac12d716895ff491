"""The ONNX checker's data-size rule for tensors stored in ``raw_data``, applied outside the checker.

The pass keeps weights out of what the checker sees (see ``amp_pass.prepare``), so it applies the
checker's "enough raw data for the dims" rule itself: up front on tensors of up to ``SIZE_CHECK_BYTES``
(reading ``raw_data`` from protobuf copies it), and on larger ones where their data is read anyway or,
for those the pass never reads, when they are written back (``amp_pass.protowrite``).
"""

from __future__ import annotations

import onnx

from amp_pass.errors import InvalidModelError

#: Tensors held out of the skeleton are sized up front up to this many bytes of data; larger ones when
#: their data is read, or when written back unread.
SIZE_CHECK_BYTES = 1 << 20

#: Bits per element in ``raw_data`` for each tensor data type the checker sizes (others are checked on a copy).
RAW_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 14: 64, 15: 128,
            16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8, 25: 2, 26: 2}


def raw_bytes_needed(t: onnx.TensorProto) -> int | None:
    """The ``raw_data`` size ``t``'s dims and data type call for (None for types sized otherwise)."""
    bits = RAW_BITS.get(t.data_type)
    if bits is None:
        return None
    nelem = 1
    for d in t.dims:
        nelem *= d
    return (nelem * bits + 7) // 8


def check_raw_size(t: onnx.TensorProto, what: str, need: int) -> None:
    """Raise InvalidModelError (one line, naming ``what`` and the tensor) when ``t.raw_data`` holds
    fewer than ``need`` bytes -- the checker's rule; reading the length copies the data."""
    if (size := len(t.raw_data)) < need:
        raise InvalidModelError(f"input model fails the ONNX checker: {what} {t.name}: raw_data size ({size} "
                                f"bytes) is too small for the declared shape and type ({need} bytes required)")
