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

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

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
            raise ConfigError(
                f"device {name!r} was asked for, but torch sees no CUDA device on this machine "
                f"(torch {torch.__version__}); use device 'cpu'",
                field="device",
            )
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)", field="device"
            )
        return name
    raise ConfigError(
        f"unknown device {name!r}: 'cpu' (default), 'cuda', 'cuda:N' or 'torch:cpu' "
        "(the GPU path on the CPU, for tests)",
        field="device",
    )


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
_KEPT_ENTRIES = 512  # a shard keeps about 7, 3 more per chunk of its user solve
#                      (5 chunks at the MSD shape with d = 32, 72 with d = 128), a step 6
_kept: OrderedDict = OrderedDict()


def read_only_root(arr) -> object | None:
    """The array owning ``arr``'s memory when that memory is read-only (it cannot change while
    it lives), else None."""
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
    it), or None: for a :class:`DeviceArray` on ``dev``, its tensor. The caller must not write to
    the tensor."""
    if isinstance(arr, DeviceArray):
        return arr.tensor if tag is None and _device_name(arr.device) == _device_name(dev) else None
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
    dies, or when later arrays push it out. A :class:`DeviceArray` is its own device copy."""
    if isinstance(arr, DeviceArray):
        return
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


class DeviceArray(NDArrayOperatorsMixin):
    """A read-only array whose values live on a device: what a device kernel or the ledger's
    device noise returns where the next reader may be on the device too (a shard's item
    statistics, their sums, a release). A device kernel reads its tensor where it is
    (:func:`kept`), so the item side of a step goes from the client's statistics to the
    server's solve without leaving the device.

    Host code reads it as a numpy array: ``np.asarray``, numpy's functions and operators, and
    ndarray attributes (``x.sum()``, ``x.tolist()``) copy it to the host once (counted in
    :data:`transfers`), read-only, and keep that copy. Indexing with integers and slices gives
    the part as a DeviceArray (copied alone where it is read). ``shape``, ``dtype``, ``ndim``,
    ``size``, ``len`` and ``astype`` copy nothing to the host. The caller must not write to its
    tensor."""

    def __init__(self, tensor, dev):
        self.tensor, self.device = tensor, dev
        self._host = None

    @property
    def shape(self) -> tuple:
        return tuple(self.tensor.shape)

    @property
    def dtype(self):
        return _numpy_dtype(self.tensor.dtype)

    @property
    def ndim(self) -> int:
        return self.tensor.dim()

    @property
    def size(self) -> int:
        return self.tensor.numel()

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def __len__(self) -> int:
        return len(self.tensor)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={_device_name(self.device)!r})"

    def host(self):
        """The values as a read-only numpy array that owns its memory (copied on the first call),
        with the tensor kept as its device copy (:func:`keep`)."""
        if self._host is None:
            self._host = to_host_kept(self.tensor, self.device)
        return self._host

    def __array__(self, dtype=None, copy=None):
        h = self.host()
        if dtype is not None and h.dtype != dtype:
            if copy is False:
                raise ValueError(f"{self!r} as {np.dtype(dtype)}: a change of dtype needs a copy")
            return h.astype(dtype)
        return h.copy() if copy else h

    def astype(self, dtype, copy: bool = True):
        """The values in ``dtype``, on the device (``copy=False``: itself when already in it)."""
        dtype = np.dtype(dtype)
        if not copy and dtype == self.dtype:
            return self
        torch = torch_device_module()
        return DeviceArray(self.tensor.to(torch.from_numpy(np.empty(0, dtype=dtype)).dtype, copy=True), self.device)

    def __getitem__(self, key):
        """Integers and slices (the basic indexes torch takes): the part, still on the device
        (copied alone where host code reads it); any other index reads the host copy."""
        basic = all(
            k is None or k is Ellipsis or isinstance(k, int) or (isinstance(k, slice) and (k.step or 1) > 0)
            for k in (key if isinstance(key, tuple) else (key,))
        )
        if not basic or self._host is not None:
            return self.host()[key]
        return DeviceArray(self.tensor[key], self.device)

    def __iter__(self):
        return iter(self.host())

    def __format__(self, spec: str) -> str:
        return format(self.host(), spec) if self.ndim else format(self.host().item(), spec)

    def __float__(self) -> float:
        return float(self.host())

    def __int__(self) -> int:
        return int(self.host())

    def __bool__(self) -> bool:
        return bool(self.host())

    def __getattr__(self, name: str):  # the ndarray attributes not defined here: on the host copy
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.host(), name)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_on_host(x) for x in out)
        return getattr(ufunc, method)(*(_on_host(x) for x in inputs), **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return func(*_on_host(args), **_on_host(kwargs))


def _on_host(x):
    """``x`` with every :class:`DeviceArray` in it (in lists, tuples, dicts) as its host copy."""
    if isinstance(x, DeviceArray):
        return x.host()
    if isinstance(x, (list, tuple)):
        return type(x)(_on_host(v) for v in x)
    if isinstance(x, dict):
        return {k: _on_host(v) for k, v in x.items()}
    return x


def _numpy_dtype(torch_dtype) -> np.dtype:
    return np.dtype(str(torch_dtype).removeprefix("torch."))


def to_host_kept(t, dev):
    """The device tensor ``t`` as a read-only numpy array that owns its memory, ``t`` kept as
    its device copy on ``dev`` (a device kernel that reads the array reads ``t``). Counted in
    :data:`transfers`."""
    host = np.empty(tuple(t.shape), dtype=_numpy_dtype(t.dtype))
    torch_device_module().from_numpy(host).copy_(t)
    transfers["to_host"] += host.nbytes
    host.flags.writeable = False
    keep(host, dev, t)
    return host


def as_tensor(x, dev, dtype=None, *, own: bool = False):
    """``x`` as a tensor on the torch device ``dev`` (in ``dtype``). A :class:`DeviceArray` on
    ``dev``, or a read-only array with a kept copy there (:func:`kept`), is read where it is;
    anything else is copied from the host, contiguous (counted in :data:`transfers`). ``own``: a
    copy of what is on the device, the caller's to write to; else shared (a converted copy for
    another dtype): the caller must not write to it."""
    torch = torch_device_module()
    on_device = kept(x, dev)
    if on_device is None and not isinstance(x, DeviceArray):
        x = np.asarray(x)
        on_device = kept(x, dev)
    if on_device is not None:
        return on_device.to(dtype=dtype or on_device.dtype, copy=own)
    x = np.asarray(x)
    copied = not x.flags.writeable or any(
        s < 0 for s in x.strides
    )  # torch takes neither a read-only array nor negative strides
    t = torch.from_numpy(x.copy() if copied else x)
    if not t.is_contiguous():
        t, copied = t.contiguous(), True
    transfers["to_device"] += t.numel() * t.element_size()
    # own: on torch's CPU device, .to() alone would hand back the caller's own host memory
    return t.to(device=dev, dtype=dtype, copy=own and not copied)
