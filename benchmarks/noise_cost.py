"""The cost of floating-point-safe central noise at the 10M-rating step (issue 41).

Times the ledger's previous floating-point Gaussian samplers against the lattice discrete
Gaussian (:mod:`fedpriv.privacy.sampling`, the ledger's sampler now) on the releases of one
AdaDPALS alternating step on ML-10M-sized synthetic data (default: 69,878 users, 10,677 items,
10M ratings, the default rank), and the whole step for context.

Usage:
    python benchmarks/noise_cost.py                  # ML-10M size, the default rank
    python benchmarks/noise_cost.py --quick          # 6,040 users, 3,706 items, 1M ratings
    python benchmarks/noise_cost.py --rank 32 --repeats 5
    python benchmarks/noise_cost.py --device cuda    # also the device sampler (issue 43)

Prints one JSON object:
- ``releases``: name and number of noised coordinates of each release of the step
  (``item_stats_A`` counts the upper triangles: what the ledger noises);
- ``samplers``: per sampler, the best of ``--repeats`` seconds for all the step's releases:
  ``float_os`` (Box-Muller on ``os.urandom``: the previous default), ``float_seeded`` (numpy's
  normal: the previous ``--noise-seed`` path), ``lattice_os`` (the default now, split over the
  kernels' threads), ``lattice_os_one_thread`` and ``lattice_seeded`` (one thread: reproducible);
  with ns per coordinate and the ratio to the float sampler of the same mode;
- ``step``: the seconds of one steady AdaDPALS step with the ledger as it is now (client
  statistics, noised release, server solve; median of ``--repeats``), and the added cost of the
  lattice over the float sampler as a share of that step;
- with ``--device``: ``lattice_device`` in ``samplers``, the same releases drawn on that device
  (:mod:`fedpriv.privacy.device_sampling`, keyed with 128 bits of OS entropy), the values'
  copies to the device and back included, as the ledger makes them; its ratio is to
  ``float_os``. ``device_sampler_only_seconds``: the draws alone, values already there;
  ``device_sampler_block``: what one block of the device sampler asks of the device (at the
  step's largest noise), counted on any device, GPU or not: torch ops (kernel launches),
  ``host_waits`` (ops whose result size depends on the data, or that copy to the host: each
  makes the host wait for the device) and the GB the ops read and write, with the tries'
  decisions eager (compiled, on a GPU, they are one kernel: about 270 bytes per try, the
  random words' generation included, against about 1,600 eager); ``device_sampler_mode``:
  whether the decisions ran compiled, and the draws' seconds with them eager;
- ``opendp``: OpenDP's exact discrete Gaussian (``make_gaussian`` on i64 vectors) per coordinate,
  when OpenDP is installed (it is not a dependency: null otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import numpy as np

from fedpriv.algorithms import als
from fedpriv.algorithms.shards import shard_users
from fedpriv.data.synthetic import make_mf
from fedpriv.engine.inprocess import new_state
from fedpriv.privacy import sampling
from fedpriv.privacy.ledger import PrivacyLedger, secure_standard_normal
from fedpriv.privacy.symmetric import upper
from fedpriv.privacy.weights import adaptive_omega
from fedpriv.util import threads

PRESETS = {"ml10m": (69_878, 10_677, 10_000_054), "quick": (6_040, 3_706, 1_000_209)}


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _step_state(inter, rank: int):
    cfg = als.ALSConfig(rank=rank, steps=10)
    state, ledger = new_state("adadpals", cfg, inter, (1.0, 5.0), False, 5.0, 1e-5)
    state.mean = 3.5
    state.counts_hat = inter.item_counts().astype(np.float64)
    state.omega = adaptive_omega(state.counts_hat, cfg.mu, inter.n_users, cfg.beta)
    als.server_init(state)
    return state, ledger


def _step(shard, state, ledger) -> dict:
    t0 = time.perf_counter()
    part = als.client_item_stats(shard, state)
    t1 = time.perf_counter()
    A, b, g = als.sum_item_stats([part], state.n_items, part.A.shape[-1])
    A, b, g = als.release_item_stats(A, b, g, state, ledger)
    t2 = time.perf_counter()
    als.server_item_update(A, b, g, state)
    t3 = time.perf_counter()
    return {"client_seconds": t1 - t0, "release_seconds": t2 - t1, "server_seconds": t3 - t2, "step_seconds": t3 - t0}


def _opendp_ns(n: int = 20_000) -> dict | None:
    try:
        import opendp.prelude as dp
    except ImportError:
        return None
    dp.enable_features("contrib")
    meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64"), scale=1e6)
    zeros = [0] * n
    sec = _best(lambda: meas(zeros), 2)
    return {"coordinates": n, "seconds": sec, "ns_per_coordinate": sec / n * 1e9}


def _device_timings(values: dict, sens: dict, z: dict, name: str, repeats: int) -> tuple[float, float, dict]:
    """(seconds with the copies, as the ledger draws; seconds of the draws alone; whether the
    tries' decisions ran compiled, and the draws' seconds with them eager) on ``name``."""
    import torch

    from fedpriv.privacy import device_sampling
    from fedpriv.util import device

    with device.use(name):
        dev = device.torch_device()
        bits = device_sampling.DeviceBits(torch, dev)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

        def with_copies():
            for k, v in values.items():
                device_sampling.release(v, sens[k], z[k], False, bits)  # what the ledger runs (v: the triangles already)

        on_device = {k: torch.tensor(v, device=dev) for k, v in values.items()}

        def draws_only():
            for k, v in on_device.items():
                device_sampling.lattice_gaussian_on_device(v, sens[k], z[k], bits)
            sync()

        with_copies()  # warm-up (and, on a GPU, the compile of the tries' decisions)
        timed = _best(with_copies, repeats), _best(draws_only, repeats)
        compiled = device_sampling._decider(dev, max(1, len(bits.generators))) is not device_sampling._decide
        with _eager_decisions():
            eager = _best(draws_only, repeats)
        return (*timed, {"compiled": compiled, "eager_draws_only_seconds": eager})


@contextlib.contextmanager
def _eager_decisions():
    """The device sampler's tries decided by eager torch ops, not compiled, on every device."""
    from fedpriv.privacy import device_sampling

    saved, device_sampling.COMPILE = device_sampling.COMPILE, set()
    try:
        yield
    finally:
        device_sampling.COMPILE = saved


def _block_profile(name: str, sigma2: float) -> dict:
    """Ops, host waits and bytes of one block of :func:`device_sampling.discrete_gaussian_on_device`
    on ``name``, counted at torch's dispatch (no timing: the same counts on a GPU and on the CPU)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from fedpriv.privacy import device_sampling
    from fedpriv.util import device

    sized_by_data = {"aten.nonzero.default", "aten.masked_select.default", "aten._local_scalar_dense.default"}

    class Count(TorchDispatchMode):
        ops = waits = touched = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [x for x in tree_flatten((args, kwargs, out))[0] if isinstance(x, torch.Tensor)]
            self.ops += 1
            if str(func) != "aten.empty.memory_format":  # an allocation: no traffic
                self.touched += sum(x.numel() * x.element_size() for x in tensors)
            bool_index = str(func) == "aten.index.Tensor" and any(x is not None and x.dtype == torch.bool for x in args[1])
            to_host = isinstance(out, torch.Tensor) and out.device.type == "cpu" and any(x.device.type != "cpu" for x in tensors)
            self.waits += str(func) in sized_by_data or bool_index or to_host
            return out

    with _eager_decisions(), device.use(name):  # eager: a compiled kernel is not seen op by op
        bits = device_sampling.DeviceBits(torch, device.torch_device())
        device_sampling.discrete_gaussian_on_device(bits, sigma2, 1000)  # the generators made
        with Count() as c:
            device_sampling.discrete_gaussian_on_device(bits, sigma2, device_sampling.BLOCK)
    return {"samples": device_sampling.BLOCK, "sigma2": sigma2, "ops": c.ops, "host_waits": c.waits, "gb_touched": c.touched / 1e9}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="ML-1M size instead of ML-10M")
    p.add_argument("--rank", type=int, default=als.ALSConfig().rank, help="the rank (default: ALSConfig's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-opendp", action="store_true")
    p.add_argument("--device", default=None, help="also time the device sampler there (cuda, cuda:N, torch:cpu)")
    args = p.parse_args()
    n_threads = threads.configure()
    users, items, ratings = PRESETS["quick" if args.quick else "ml10m"]
    t = time.perf_counter()
    inter = make_mf(users, items, ratings, seed=0).interactions
    out = {"n_users": inter.n_users, "n_items": inter.n_items, "n_ratings": len(inter), "rank": args.rank,
           "generate_seconds": time.perf_counter() - t, "threads": n_threads, "cpus": os.cpu_count()}

    state, ledger = _step_state(inter, args.rank)
    shard = shard_users(inter)
    _step(shard, state, ledger)  # cold step (sort orders)
    part = als.client_item_stats(shard, state)
    A, b, g = als.sum_item_stats([part], state.n_items, part.A.shape[-1])
    values = {"item_stats_A": upper(A), "item_stats_b": b}
    if g is not None:
        values["gravity"] = upper(g)
    sens = {name: als.sensitivity(name, state.config, state.rating_range) for name in values}
    z = {name: state.multipliers[name] for name in values}
    out["releases"] = [{"name": k, "coordinates": int(v.size), "sensitivity": sens[k], "noise_multiplier": z[k]} for k, v in values.items()]
    n = sum(int(v.size) for v in values.values())

    def float_os():
        for k, v in values.items():
            v + sens[k] * z[k] * secure_standard_normal(v.shape)

    rng = np.random.default_rng(1)

    def float_seeded():
        for k, v in values.items():
            v + rng.normal(0.0, sens[k] * z[k], size=v.shape)

    def lattice(gen, use_threads=True):
        def run():
            for k, v in values.items():
                sampling.lattice_gaussian(v, sens[k], z[k], gen, threads=use_threads)
        return run

    timings = {
        "float_os": _best(float_os, args.repeats),
        "float_seeded": _best(float_seeded, args.repeats),
        "lattice_os": _best(lattice(None), args.repeats),
        "lattice_os_one_thread": _best(lattice(None, False), args.repeats),
        "lattice_seeded": _best(lattice(np.random.Generator(np.random.PCG64(2))), args.repeats),
    }
    if args.device:
        timings["lattice_device"], out["device_sampler_only_seconds"], out["device_sampler_mode"] = _device_timings(values, sens, z, args.device, args.repeats)
        largest = max(values, key=lambda k: values[k].size)
        out["device_sampler_block"] = _block_profile(args.device, sampling.lattice_for(sens[largest], z[largest], values[largest].size).sigma2)
    base = {"lattice_device": "float_os", "float_os": "float_os", "float_seeded": "float_seeded", "lattice_os": "float_os",
            "lattice_os_one_thread": "float_os", "lattice_seeded": "float_seeded"}
    out["coordinates"] = n
    out["samplers"] = {k: {"seconds": s, "ns_per_coordinate": s / n * 1e9, "ratio_to_float": s / timings[base[k]]} for k, s in timings.items()}

    steps = [_step(shard, state, PrivacyLedger(accountant=None)) for _ in range(args.repeats)]
    steps.sort(key=lambda s: s["step_seconds"])
    step = steps[len(steps) // 2]
    extra = timings["lattice_os"] - timings["float_os"]
    extra_seeded = timings["lattice_seeded"] - timings["float_seeded"]
    out["step"] = {**step, "all_step_seconds": [s["step_seconds"] for s in steps],
                   "lattice_extra_seconds": extra, "lattice_extra_share_of_step": extra / step["step_seconds"],
                   "seeded_lattice_extra_seconds": extra_seeded, "seeded_lattice_extra_share_of_step": extra_seeded / step["step_seconds"]}
    out["opendp"] = None if args.no_opendp else _opendp_ns()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
