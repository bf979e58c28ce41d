"""Where the statistics kernels compute: the ``device`` option.

- ``"cpu"`` (the default): the CPU back ends of :mod:`fedpriv.algorithms.kernels` (the native
  kernel, else torch or numpy on the CPU);
- ``"cuda"`` or ``"cuda:N"``: the same sums and solves in torch on that GPU
  (:mod:`fedpriv.algorithms.device_kernels`);
- ``"torch:cpu"``: the GPU code path run by torch on the CPU. It is how the path is tested on
  machines without a GPU (CPU/GPU parity), not a faster CPU back end.

The device changes where arithmetic runs, never what is released: the ledger records the same
releases on every device. Its noise is drawn where the statistics are: on a device, by
:mod:`fedpriv.privacy.device_sampling` (the same exact lattice discrete Gaussian, keyed with 128
bits of OS entropy per ledger); with a noise seed, on the CPU from the seed (so a seeded run
is the same on every device). A process holds one current device; :func:`use` sets it for a
block (the in-process engine enters it for a run)."""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections import Counter, OrderedDict

from ..errors import ConfigError

_local = threading.local()

#: bytes the device path copied to a device ("to_device") and back to the host ("to_host")
#: since the process started: the statistics kernels and the ledger's device noise count theirs
#: (a benchmark reads the difference over a step)
transfers: Counter = Counter()


def checked(name: str) -> str:
    """``name`` if it is a device this process can use, else a ConfigError naming the keyword."""
    if name in ("cpu", "torch:cpu"):
        return name
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} was asked for, but torch sees no CUDA device on this machine (torch {torch.__version__}); use device 'cpu'", field="device")
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)", field="device")
        return name
    raise ConfigError(f"unknown device {name!r}: 'cpu' (default), 'cuda', 'cuda:N' or 'torch:cpu' (the GPU path on the CPU, for tests)", field="device")


def current() -> str:
    return getattr(_local, "name", "cpu")


@contextlib.contextmanager
def use(name: str | None):
    """Run the block on device ``name`` (None or "cpu": the CPU back ends)."""
    name = checked(name or "cpu")
    before = current()
    _local.name = name
    try:
        yield name
    finally:
        _local.name = before


def torch_device_module():
    """torch (imported only by the device path)."""
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    return torch


def torch_device():
    """The torch device of the current device, or None for the CPU back ends ("cpu")."""
    name = current()
    if name == "cpu":
        return None
    return torch_device_module().device("cpu" if name == "torch:cpu" else name)


# ---------------------------------------------------------------------------- kept copies
#: read-only host arrays whose copy on a device is kept (the last _KEPT_ENTRIES): a shard's index
#: arrays between steps, and a release the ledger's device noise produced, for the server's solve
_KEPT_ENTRIES = 64  # a shard keeps about 7, 3 more per chunk of its user solve (5 chunks at the MSD shape), a step 6
_kept: OrderedDict = OrderedDict()


def read_only_root(arr) -> object | None:
    """The array owning ``arr``'s memory when that memory is read-only (it cannot change while
    it lives), else None."""
    import numpy as np

    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.base is not None or root.flags.writeable or arr.flags.writeable:
        return None
    return root


def _device_name(dev) -> str:
    """``dev`` by one name: torch calls the current GPU "cuda" where it is asked for and
    "cuda:N" on the tensors it makes there."""
    name = str(dev)
    if name == "cuda":
        torch = torch_device_module()
        name = f"cuda:{torch.cuda.current_device() if torch.cuda.is_available() else 0}"
    return name


def _key(arr, root, dev, tag) -> tuple:
    offset = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return (id(root), offset, arr.shape, arr.strides, arr.dtype.str, _device_name(dev), tag)


def kept(arr, dev, tag=None):
    """The kept device copy of the read-only array ``arr`` on ``dev`` (with what was kept beside
    it), or None. The caller must not write to the tensor."""
    root = read_only_root(arr)
    if root is None:
        return None
    key = _key(arr, root, dev, tag)
    hit = _kept.get(key)
    if hit is None or hit[0]() is not root:
        return None
    _kept.move_to_end(key)
    return hit[1]


def keep(arr, dev, copy, tag=None) -> None:
    """Remember ``copy`` (a tensor on ``dev``, and whatever goes with it) as the device copy of
    ``arr``, when ``arr``'s memory is read-only; else nothing. The copy is dropped when ``arr``
    dies, or when later arrays push it out."""
    root = read_only_root(arr)
    if root is None:
        return
    key = _key(arr, root, dev, tag)

    def gone(ref, key=key) -> None:  # the array died: free its device copy now
        entry = _kept.get(key)
        if entry is not None and entry[0] is ref:
            _kept.pop(key, None)

    _kept[key] = (weakref.ref(root, gone), copy)
    while len(_kept) > _KEPT_ENTRIES:
        _kept.popitem(last=False)


def kept_or_make(arr, dev, tag, make):
    """The kept device copy of ``arr`` under ``tag``, else ``make()``, kept for the next call
    (when ``arr``'s memory is read-only). Shared: the caller must not write to it."""
    hit = kept(arr, dev, tag)
    if hit is None:
        hit = make()
        keep(arr, dev, hit, tag)
    return hit


def to_host_kept(t, dev):
    """The device tensor ``t`` as a read-only numpy array that owns its memory, ``t`` kept as
    its device copy on ``dev``: the next reader (a kernel, the ledger) reads it there instead
    of copying it back. Counted in :data:`transfers`."""
    import numpy as np

    torch = torch_device_module()
    host = np.empty(tuple(t.shape), dtype=torch.empty((), dtype=t.dtype).numpy().dtype)
    torch.from_numpy(host).copy_(t)
    transfers["to_host"] += host.nbytes
    host.flags.writeable = False
    keep(host, dev, t)
    return host
