"""The fused native statistics kernel (``_segment_stats.c``), compiled for this machine on first use.

The C source ships with the package. The first process that needs it compiles it with the
system C compiler (``$CC``, else ``cc`` or ``gcc``; ``-O3 -march=native``) into a cache folder
(``FEDPRIV_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/fedpriv``, else ``~/.cache/fedpriv``, else the
temporary folder), named by a hash of the source, the compiler, its flags and the CPU's feature
flags, and written atomically, so that concurrent processes (Ray workers, SuperNodes) and other
machines sharing the folder never load a half-written or foreign library. Later processes load
the cached library.

Without a compiler, or when compiling fails, or with ``FEDPRIV_NATIVE=0``, :func:`library`
returns None and :mod:`fedpriv.algorithms.kernels` runs its torch/numpy path, which computes
the same sums (tests compare the two). The reason is kept in :func:`unavailable_reason`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("_segment_stats.c")
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=gnu11"]
_lib = None
_tried = False
_reason = ""
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("FEDPRIV_NATIVE", "1").strip() != "0"


def _compiler() -> str | None:
    for name in (os.environ.get("CC", ""), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path:
    for base in (
        os.environ.get("FEDPRIV_NATIVE_CACHE"),
        os.environ.get("XDG_CACHE_HOME") and Path(os.environ["XDG_CACHE_HOME"]) / "fedpriv",
    ):
        if base:
            return Path(base)
    home = Path.home()
    return (
        home / ".cache" / "fedpriv"
        if home.is_dir() and os.access(home, os.W_OK)
        else Path(tempfile.gettempdir()) / "fedpriv-native"
    )


def _build(cc: str) -> Path:
    source = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.blake2b(
        b"\0".join(
            [source, version.encode(), " ".join(FLAGS).encode(), _cpu_flags().encode(), platform.machine().encode()]
        ),
        digest_size=12,
    ).hexdigest()
    folder = _cache_dir()
    target = folder / f"segment_stats-{key}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{Path(cc).name} failed: {done.stderr.strip()[:400]}")
        os.replace(tmp, target)  # atomic: another process sees the whole library or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def library():
    """The loaded kernel library, or None (see :func:`unavailable_reason`)."""
    if not enabled():
        return None
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            _load()
    return _lib


def _load() -> None:
    global _tried
    try:
        _load_library()
    finally:
        _tried = True  # after _lib is set: threads that skip the lock see the final value


def _load_library() -> None:
    global _lib, _reason
    cc = _compiler()
    if cc is None:
        _reason = "no C compiler found ($CC, cc, gcc)"
        return
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (OSError, subprocess.SubprocessError) as e:
        _reason = str(e)
        return
    f32, i64 = (np.ctypeslib.ndpointer(dtype=t, flags="C_CONTIGUOUS") for t in (np.float32, np.int64))
    i64_, ptr = ctypes.c_int64, ctypes.c_void_p  # optional arrays: checked by segment_stats below
    fn = lib.fedpriv_segment_stats
    fn.restype = i64_
    fn.argtypes = [f32, i64_, i64_, i64, i64, i64_, i64_, ptr, ptr, ptr, i64_, ptr, ptr, ptr]
    lib.fedpriv_vector_width.restype = ctypes.c_int
    lib.fedpriv_multiply_adds_per_entry.restype = ctypes.c_int64
    lib.fedpriv_multiply_adds_per_entry.argtypes = [ctypes.c_int64]
    _lib = lib


def unavailable_reason() -> str:
    """Why :func:`library` returned None ('' when it did not, or was never asked)."""
    if not enabled():
        return "FEDPRIV_NATIVE=0"
    return _reason


def _ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data


def native_segment_stats(
    lib, F: np.ndarray, index: np.ndarray, indptr: np.ndarray, s0: int, s1: int, w, y, order, n_wy: int, A, b, c
) -> None:
    """Run the kernel on segments [s0, s1) into the float32 outputs A (n, d, d), b (n, d), c (n).
    The GIL is released during the call (ctypes), so threads can run disjoint segment ranges."""
    n_src, d = F.shape
    n_seg = len(indptr) - 1
    for name, a, dtype, shape in (
        ("weights", w, np.float64, None),
        ("targets", y, np.float64, None),
        ("order", order, np.int64, (len(index),)),
        ("A", A, np.float32, (n_seg, d, d)),
        ("b", b, np.float32, (n_seg, d)),
        ("c", c, np.float32, (n_seg,)),
    ):
        if a is not None and (
            a.dtype != dtype
            or not a.flags.c_contiguous
            or (shape is not None and a.shape != shape)
            or (shape is None and a.shape != (n_wy,))
        ):
            raise TypeError(
                f"native segment_stats: {name} must be a C-contiguous {np.dtype(dtype).name} "
                f"array of shape {shape or (n_wy,)}"
            )
    if not 0 <= s0 <= s1 <= n_seg:
        raise ValueError(f"native segment_stats: segment range {s0}..{s1} outside 0..{n_seg}")
    status = lib.fedpriv_segment_stats(
        F, n_src, d, index, indptr, s0, s1, _ptr(w), _ptr(y), _ptr(order), n_wy, _ptr(A), _ptr(b), _ptr(c)
    )
    if status == -(1 << 62):
        raise MemoryError("segment_stats: cannot allocate the kernel's scratch buffers")
    if status < 0:
        r = -1 - status
        raise IndexError(
            f"segment_stats: entry {r} points outside its source table ({n_src} rows) or its weights/targets ({n_wy})"
        )
