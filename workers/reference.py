"""fp32 reference outputs, cached on disk by (model sha256, input seed, input digest).

The reference is the fp32 model on the CPU provider with all graph optimizations; the *baseline*
is a plain fp32 rerun through the path the emulation uses (optimizations disabled), whose
difference from the reference is the noise floor of the accuracy rule.  Both are computed once per
key and stored together; concurrent writers never expose a partial file (atomic rename).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

#: Bump when what is cached (or how) changes.
CACHE_VERSION = 2


class ReferenceCache:
    """A directory of ``.npz`` files of named arrays, keyed by strings."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @staticmethod
    def key(model_sha256: str, seed: int, digest: str, kind: str, extra: str = "") -> str:
        """The cache key of one kind of reference data for a model and its inputs."""
        raw = f"v{CACHE_VERSION}|{model_sha256}|{seed}|{digest}|{kind}|{extra}"
        return f"{model_sha256[:16]}-{kind}-{hashlib.sha256(raw.encode()).hexdigest()[:24]}"

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.npz"

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        """The cached arrays, or None (also when the file is unreadable: it is then deleted).

        A file read before by this process is answered from memory while it is unchanged (same
        inode, size and mtime); callers get their own copies of the arrays.
        """
        path = self._path(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        stamp = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        hit = _MEMO.get(stamp)
        if hit is not None:
            _MEMO.move_to_end(stamp)
            return {k: v.copy() for k, v in hit.items()}
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError, EOFError):
            path.unlink(missing_ok=True)
            return None
        _remember(stamp, arrays)
        return {k: v.copy() for k, v in arrays.items()}

    def put(self, key: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Store arrays under ``key`` atomically."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.part")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get_or_compute(self, key: str, compute: Callable[[], Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], bool]:
        """Cached arrays for ``key`` or ``compute()`` stored; returns (arrays, was_cached)."""
        hit = self.get(key)
        if hit is not None:
            return hit, True
        arrays = {k: np.asarray(v) for k, v in compute().items()}
        self.put(key, arrays)
        return arrays, False


#: Recently read cache files (bounded by count and bytes), keyed by path and file identity.
_MEMO: OrderedDict[tuple[str, int, int, int], dict[str, np.ndarray]] = OrderedDict()
_MEMO_MAX, _MEMO_MAX_BYTES = 16, 64 << 20


def _remember(stamp: tuple[str, int, int, int], arrays: dict[str, np.ndarray]) -> None:
    size = sum(a.nbytes for a in arrays.values())
    if size > _MEMO_MAX_BYTES // 4:
        return
    _MEMO[stamp] = arrays
    while len(_MEMO) > _MEMO_MAX or sum(a.nbytes for v in _MEMO.values() for a in v.values()) > _MEMO_MAX_BYTES:
        _MEMO.popitem(last=False)


def split(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays stored under ``prefix/`` with the prefix removed."""
    return {k[len(prefix) + 1:]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def join(**groups: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Flatten named groups of arrays into one mapping with ``group/name`` keys."""
    return {f"{g}/{k}": v for g, arrays in groups.items() for k, v in arrays.items()}
