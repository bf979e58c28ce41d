"""How many threads fedpriv's kernels use, and how that count is set.

One number, :func:`thread_count`, drives all of it:

- ``FEDPRIV_THREADS`` if set (an integer >= 1);
- else ``OMP_NUM_THREADS`` if set: Ray sets it in each of its workers to the CPUs the worker was
  given (a Flower simulation node has ``num_cpus`` 1 by default), so several Ray workers on one
  machine do not each start one thread per core;
- else the CPUs this process may run on (``os.sched_getaffinity``).

:func:`configure` applies it to torch's intra-op pool (when this process has imported torch; it
never imports torch itself) and to the BLAS/OpenMP pools that threadpoolctl finds (numpy's
OpenBLAS among them). The kernels' batched LAPACK calls (Cholesky, eigh), which torch and
numpy run one matrix after the other, are split over the same number of Python threads
(:func:`map_chunks`); those calls release the GIL.

:func:`configure` also asks glibc's allocator (when there is one) to keep freed memory for
reuse instead of returning every large array to the kernel: a 10M-rating step allocates and
frees arrays of tens of MB many times, and each fresh mapping is paid again in page faults
(measured: 0.5 s of a 3 s step). Set ``FEDPRIV_KEEP_FREED_MEMORY=0`` to leave the allocator
alone.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

from ..errors import ConfigError

ENV = "FEDPRIV_THREADS"
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def available_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _env_count(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"must be an integer >= 1, got {raw!r}", field=name)
    return value


def thread_count() -> int:
    """Threads for one process's kernels (see the module docstring)."""
    for name in (ENV, "OMP_NUM_THREADS"):
        value = _env_count(name)
        if value is not None:
            return value
    return available_cpus()


def keep_freed_memory() -> bool:
    """glibc: serve large arrays from the heap and keep up to 1 GiB of freed memory for reuse
    (``mallopt``); False where the allocator is not glibc's or the variable turns it off."""
    if os.environ.get("FEDPRIV_KEEP_FREED_MEMORY", "1").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    ok = mallopt(m_mmap_threshold, 1 << 30) == 1
    ok = ok and mallopt(m_trim_threshold, 1 << 30) == 1
    return ok and mallopt(m_top_pad, 64 << 20) == 1


def configure(n: int | None = None) -> int:
    """Set torch's (if loaded) and the BLAS pools' thread counts to ``n`` (default
    :func:`thread_count`) and apply :func:`keep_freed_memory`; returns the count."""
    keep_freed_memory()
    n = thread_count() if n is None else int(n)
    if n < 1:
        raise ConfigError(f"must be >= 1, got {n}", field="threads")
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it the BLAS pools keep their own default
        pass
    else:
        threadpool_limits(limits=n)
    return n


def one_thread_each() -> None:
    """A pool thread runs its torch ops on one thread: with its own OpenMP team it would compete
    with the calling thread's team (measured: the main thread's kernels ran 1.7x slower after a
    pooled call had left teams behind)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def map_chunks(fn, n_items: int, min_chunk: int = 1024) -> list:
    """``[fn(slice) for slice in chunks]``: the range ``0..n_items`` cut into at most
    :func:`thread_count` contiguous slices of at least ``min_chunk`` items, run on a shared
    thread pool (for calls that release the GIL); a single slice runs in the calling thread."""
    global _pool, _pool_size
    workers = min(thread_count(), max(1, n_items // max(1, min_chunk)))
    if workers <= 1:
        return [fn(slice(0, n_items))]
    bounds = [n_items * k // workers for k in range(workers + 1)]
    slices = [slice(bounds[k], bounds[k + 1]) for k in range(workers)]
    if _pool is None or _pool_size < workers:
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool = ThreadPoolExecutor(workers, thread_name_prefix="fedpriv-linalg", initializer=one_thread_each)
        _pool_size = workers
    return list(_pool.map(fn, slices))
