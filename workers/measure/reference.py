"""fp32 reference outputs, cached on disk by (model sha256, input seed, input digest).

The reference is the fp32 model on the CPU provider with all graph optimizations; the *baseline*
is a plain fp32 rerun through the path the emulation uses (optimizations disabled), whose
difference from the reference is the noise floor of the accuracy rule.  Both are computed once per
key and stored together; concurrent writers never expose a partial file (atomic rename).

The cache lives in a directory that code under test may be able to write, so an entry is never
trusted as found: every entry carries the sha256 of its arrays (names, dtypes, shapes and bytes;
:func:`checksum`) inside the same file, and :meth:`ReferenceCache.get` checks it on every read.  An
entry that fails the check or cannot be read is logged (one line), deleted and recomputed by
:meth:`ReferenceCache.get_or_compute`; it is never returned.  The checksum catches a truncated,
corrupted or naively edited entry, not one rewritten with a recomputed checksum: the job's fp32 rerun
(:func:`rerun_mismatch`, used by :mod:`workers.jobs.job` on every cache hit) catches that.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from workers.measure.environment import cpu_model

log = logging.getLogger(__name__)

#: Bump when what is cached (or how) changes.  3: entries carry their checksum (:data:`CHECKSUM`).
CACHE_VERSION = 3
#: Name of the array holding an entry's :func:`checksum` (a 0-d unicode array of 64 hex digits).
CHECKSUM = "__sha256__"
#: Largest difference, in units in the last place of an output's largest magnitude, that a rerun of the
#: fp32 model may show against its cached outputs.  Measured: 0 (bit-identical) on the smoke models,
#: loop_if, silero_vad (every step of a 64-step rollout), light_squeezenet and light_resnet50, across
#: sessions and between 1 and the default intra-op threads, optimized or not, since the key pins
#: onnxruntime and the CPU (:func:`runtime_tag`).  4 ulps leave room for a kernel that splits a
#: reduction between threads; moving the rerun noise by that much moves the accuracy bound by
#: k * 4 * 6e-8 of the output's scale, far below any fp16/bf16 tolerance.
RERUN_ULPS = 4


@functools.cache
def runtime_tag() -> str:
    """What cached fp32 outputs depend on besides the model and its inputs: onnxruntime's version and the
    CPU (kernels differ by instruction set).  Part of every job's reference key, so an upgrade or another
    machine sharing the cache computes its own entry instead of failing the rerun check."""
    return f"onnxruntime {ort.__version__}|{platform.machine()}|{cpu_model()}"


def checksum(arrays: Mapping[str, np.ndarray]) -> str:
    """Hex sha256 over the names, dtypes, shapes and bytes of ``arrays`` (in name order)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(repr(a.tolist()).encode() if a.dtype.hasobject else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class ReferenceCache:
    """A directory of ``.npz`` files of named arrays, keyed by strings, each checked on read (module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @staticmethod
    def key(model_sha256: str, seed: int, digest: str, kind: str, extra: str = "") -> str:
        """The cache key of one kind of reference data for a model and its inputs."""
        raw = f"v{CACHE_VERSION}|{model_sha256}|{seed}|{digest}|{kind}|{extra}"
        return f"{model_sha256[:16]}-{kind}-{hashlib.sha256(raw.encode()).hexdigest()[:24]}"

    def path(self, key: str) -> Path:
        """The file of the entry ``key`` (it may not exist)."""
        return self.root / key[:2] / f"{key}.npz"

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        """The cached arrays, or None: also when the file is unreadable or fails its checksum (it is then
        logged and deleted).

        A file read and checked before by this process is answered from memory while it is unchanged
        (same inode, size, mtime and ctime); callers get their own copies of the arrays.
        """
        path = self.path(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        stamp = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        hit = _MEMO.get(stamp)
        if hit is not None:
            _MEMO.move_to_end(stamp)
            return {k: v.copy() for k, v in hit.items()}
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except Exception as exc:  # noqa: BLE001 - zip, npy and OS errors alike: the entry is unreadable
            _discard(path, st, f"unreadable ({type(exc).__name__}: {exc})")
            return None
        stored = arrays.pop(CHECKSUM, None)
        if stored is None or stored.shape != () or str(stored) != checksum(arrays):
            _discard(path, st, "fails its checksum" if stored is not None else "has no checksum")
            return None
        _remember(stamp, arrays)
        return {k: v.copy() for k, v in arrays.items()}

    def put(self, key: str, arrays: Mapping[str, np.ndarray]) -> Path:
        """Store arrays under ``key`` atomically, with their :func:`checksum`; return the entry's file."""
        data = {k: np.asarray(v) for k, v in arrays.items()}
        if CHECKSUM in data:
            raise ValueError(f"{CHECKSUM} is reserved for the entry's checksum")
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.part")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **data, **{CHECKSUM: np.array(checksum(data))})
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def get_or_compute(self, key: str, compute: Callable[[], Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], bool]:
        """Cached arrays for ``key`` (checked) or ``compute()`` stored; returns (arrays, was_cached)."""
        hit = self.get(key)
        if hit is not None:
            return hit, True
        arrays = {k: np.asarray(v) for k, v in compute().items()}
        self.put(key, arrays)
        return arrays, False


def _discard(path: Path, st: os.stat_result, why: str) -> None:
    """Log one line and delete a bad entry (unless a writer has replaced it meanwhile)."""
    log.warning("reference cache entry %s %s; deleted, computing it again", path, why)
    try:
        now = path.stat()
        if (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns):
            path.unlink()
    except FileNotFoundError:
        pass


def rerun_mismatch(cached: Mapping[str, np.ndarray], rerun: Mapping[str, np.ndarray],
                   ulps: int = RERUN_ULPS) -> str | None:
    """Why ``rerun`` (a fresh fp32 run) does not reproduce ``cached`` outputs, or None when it does.

    Every output of either must be in both with the same dtype and shape; non-float outputs must be
    equal; a float output must have NaN and infinities at the same places, the same values there, and
    elsewhere ``max|rerun - cached| <= ulps * spacing(max|rerun|)`` (see :data:`RERUN_ULPS`).  The bound
    comes from the rerun alone, never from cached data.
    """
    if set(cached) != set(rerun):
        return f"outputs {sorted(cached)} cached, {sorted(rerun)} computed"
    for name in sorted(rerun):
        c, r = np.asarray(cached[name]), np.asarray(rerun[name])
        if c.dtype != r.dtype or c.shape != r.shape:
            return f"{name}: cached {c.dtype}{list(c.shape)}, computed {r.dtype}{list(r.shape)}"
        if r.dtype.kind not in "fc":
            if not np.array_equal(c, r):
                return f"{name}: {int(np.count_nonzero(c != r))} of {r.size} values differ"
            continue
        fin = np.isfinite(r)
        if not np.array_equal(fin, np.isfinite(c)) or not np.array_equal(r[~fin], c[~fin], equal_nan=True):
            return f"{name}: NaN/infinity at other places"
        if not fin.any():
            continue
        scale = float(np.abs(r[fin]).max())
        bound = ulps * float(np.spacing(np.abs(np.asarray(scale, r.real.dtype))))
        worst = float(np.abs(r[fin].astype(np.complex128 if r.dtype.kind == "c" else np.float64) - c[fin]).max())
        if worst > bound:
            return f"{name}: max |cached - rerun| = {worst:.4g}, allowed {bound:.3g} ({ulps} ulps of max |output| {scale:.4g})"
    return None


#: Recently read, checked cache files (bounded by count and bytes), keyed by path and file identity.
_MEMO: OrderedDict[tuple[str, int, int, int, int], dict[str, np.ndarray]] = OrderedDict()
_MEMO_MAX, _MEMO_MAX_BYTES = 16, 64 << 20


def _remember(stamp: tuple[str, int, int, int, int], arrays: dict[str, np.ndarray]) -> None:
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
