"""Red team, deviations (d) *key substitution* and (f) *a threshold too low for a colluding
node* by a server that deviates (:func:`colluding_threshold`; below, (d)).

The server sits between one victim node and its neighbours. In the keys/share relay it hands the
victim channel keys of its own in place of the victim's neighbours', and hands each neighbour a
key of its own in place of the victim's (a man in the middle on every edge of the victim, so the
protocol still completes). It then decrypts the Shamir shares the victim encrypted for its
neighbours, rebuilds the victim's self-mask seed and mask key from ``threshold`` of them, and
removes every mask from the victim's masked vector: the victim's input alone.

Every node has a signing key and the roster (:mod:`fedpriv.privacy.secagg_auth`), and (f)'s
nodes assume one colluder, as their policy does. ``defence=True``: the server cannot sign its
substituted keys, and the victim and its neighbours refuse to encrypt shares to them
(``[key-substitution]``); (f)'s nodes refuse the threshold (``[shamir-threshold]``).
``defence=False`` is the positive control: the same nodes with only that defence turned off
(:func:`fedpriv.privacy.defences.disabled`): the attack recovers the input exactly. Each line
carries ``defence_id`` and ``refused_by`` (the defence the refusals name, the most common one).

Everything a node does is the real node code (:class:`fedpriv.privacy.secagg.SecAggNode`, the
class the Flower handlers of :mod:`fedpriv.flower.secure_client` run); only the server is
replaced.

    python simulations/deviant_keys.py [--nodes 8] [--threshold 4]

prints one JSON line per setting (defence off, then on).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedpriv.privacy import defences  # noqa: E402
from fedpriv.privacy.secagg import (  # noqa: E402
    SecAggError,
    SecAggNode,
    SecAggServer,
    _channel,
    _combine,
    _NONCE_BYTES,
    _pairwise_secret,
    _private_key,
    _public_bytes,
    _share_aad,
    _SHARE_BYTES,
    _INDEX,
    expand_mask,
    plan_params,
)
from fedpriv.privacy.secagg_auth import load_identity, write_identities  # noqa: E402

BITS = 32
RUN = b"flower-run=1;job=deviant-keys"


def _line(defence_id: str):
    """Play with the defence (``defence=True``) or as its positive control (only ``defence_id``
    off); add ``defence_id`` and ``refused_by`` (the most common defence the refusals name)."""

    def wrap(fn):
        @functools.wraps(fn)
        def play(defence: bool, *args, **kw) -> dict:
            with (contextlib.nullcontext() if defence else defences.disabled(defence_id)):
                out = fn(defence, *args, **kw)
            named = collections.Counter(d for d in (defences.refused_by(x["reason"]) for x in out["refused"]) if d is not None)
            out["defence_id"] = defence_id
            out["refused_by"] = named.most_common(1)[0][0] if named else None
            if not defence:
                out["disabled"] = [defence_id]
            return out

        return play

    return wrap


def _nodes(ids: list[int], defence: bool, folder: Path) -> dict[int, SecAggNode]:
    if not defence:
        return {i: SecAggNode(i) for i in ids}
    made = write_identities(folder, [f"node-{k}" for k in range(len(ids))])
    return {i: SecAggNode(i, load_identity(made[f"node-{k}"]), RUN) for k, i in enumerate(ids)}


def _advert(node: SecAggNode) -> tuple[bytes, tuple[str, bytes] | None]:
    if node.identity is None:
        return node.channel_key(), None
    key, name, sig = node.advertisement()
    return key, (name, sig)


@_line("key-substitution")
def key_substitution(defence: bool, nodes: int = 8, threshold: int = 4, seed: int = 0) -> dict:
    """Play the attack on ``nodes`` real nodes with Shamir threshold ``threshold`` (default
    graph degree); returns what the server recovered of the victim's input."""
    rng = np.random.default_rng(seed)
    ids = [101 + 7 * k for k in range(nodes)]
    params = plan_params(nodes, BITS, threshold=threshold)
    with tempfile.TemporaryDirectory(prefix="fedpriv-deviant-keys-") as tmp:
        node = _nodes(ids, True, Path(tmp))  # authenticated nodes, with and without the defence
        inputs = {i: rng.integers(0, 1 << 20, size=16, dtype=np.uint64) for i in ids}
        server = SecAggServer(ids, params, seed=os.urandom(32))
        victim = ids[0]
        hood = list(server.graph[victim])
        real = {i: _advert(node[i]) for i in ids}
        keys = {i: k for i, (k, _) in real.items()}
        # the server's own channel keys: one posing as each neighbour (shown to the victim), one
        # posing as the victim (shown to each neighbour)
        as_neighbour = {w: _private_key(os.urandom(32)) for w in hood}
        as_victim = {w: _private_key(os.urandom(32)) for w in hood}
        out = {"deviation": "d", "name": "key substitution", "defence": bool(defence), "nodes": nodes,
               "threshold": params.threshold, "degree": params.degree, "victim": victim, "recovered": False,
               "shares_decrypted": 0, "refused": []}

        release = b"deviant-keys/step-1"
        shares: dict[int, tuple[bytes, dict[int, bytes]]] = {}
        for u in ids:
            shown = server.channel_keys_for(u, keys)
            adverts = {v: real[v][1] for v in shown}
            if u == victim:
                shown = {w: _public_bytes(as_neighbour[w]) for w in shown}
            elif u in hood:
                shown = {**shown, victim: _public_bytes(as_victim[u])}
            try:
                shares[u] = node[u].share(release, params, shown, adverts=adverts, graph=(ids, server.seed))
            except SecAggError as exc:
                out["refused"].append({"node": u, "round": "share", "reason": str(exc)})
        if victim not in shares:  # the victim encrypted nothing to the server's keys
            out["reason"] = "the victim refused to encrypt its shares to the substituted keys"
            return out

        # man in the middle: open what the victim sent each neighbour (under the server's key),
        # and re-encrypt what each neighbour sent the victim under the victim's view of that edge
        stolen = []
        victim_pk = keys[victim]
        for w, blob in shares[victim][1].items():
            plain = _channel(as_neighbour[w], victim_pk, victim).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], _share_aad(victim, w, release))
            stolen.append(plain)
            nonce = os.urandom(_NONCE_BYTES)  # re-encrypted for w under w's view of the edge: w notices nothing
            shares[victim][1][w] = nonce + _channel(as_victim[w], keys[w], w).encrypt(nonce, plain, _share_aad(victim, w, release))
        for w in hood:
            if w not in shares:
                continue
            ct = shares[w][1][victim]
            plain = _channel(as_victim[w], keys[w], w).decrypt(ct[:_NONCE_BYTES], ct[_NONCE_BYTES:], _share_aad(w, victim, release))
            nonce = os.urandom(_NONCE_BYTES)
            shares[w][1][victim] = nonce + _channel(as_neighbour[w], victim_pk, victim).encrypt(nonce, plain, _share_aad(w, victim, release))
        out["shares_decrypted"] = len(stolen)

        routed = server.route(shares)
        masked = {}
        for u, (mask_keys, cts) in routed.items():
            try:
                masked[u] = node[u].mask(release, inputs[u], mask_keys, cts)
            except SecAggError as exc:
                out["refused"].append({"node": u, "round": "mask", "reason": str(exc)})
        if victim not in masked or len(stolen) < params.threshold:
            out["reason"] = "no masked vector of the victim, or too few shares decrypted"
            return out

        # rebuild the victim's self-mask seed and mask key from threshold of its shares
        t = params.threshold
        picked = sorted((_INDEX.unpack_from(p)[0], p) for p in stolen)[:t]
        seed_b = _combine([(i, p[_INDEX.size:_SHARE_BYTES]) for i, p in picked])
        mask_sk = _combine([(i, p[_SHARE_BYTES:]) for i, p in picked])
        out.update(_unmask_alone(masked[victim], victim, seed_b, mask_sk, {w: shares[w][0] for w in hood}, release, inputs[victim]))
        return out


def _unmask_alone(y: np.ndarray, victim: int, self_seed: bytes, mask_key: bytes, neighbour_keys: dict[int, bytes], release: bytes,
                  truth: np.ndarray) -> dict:
    """Remove every mask from one node's masked words with its recovered self-mask seed and mask
    key (``neighbour_keys``: its neighbours' mask public keys), as the server would; whether that
    gives the node's input exactly."""
    y = y.copy()
    y -= expand_mask(self_seed, release, y.size, BITS)
    sk = _private_key(mask_key)
    for w, pk in neighbour_keys.items():
        m = expand_mask(_pairwise_secret(sk, pk, w), release, y.size, BITS)
        if victim < w:
            y -= m
        else:
            y += m
    y &= np.uint64((1 << BITS) - 1)
    return {"recovered": bool(np.array_equal(y, truth)), "max_abs_error": int(np.max(np.abs(y.astype(np.int64) - truth.astype(np.int64))))}


@_line("shamir-threshold")
def colluding_threshold(defence: bool, nodes: int = 7, seed: int = 0) -> dict:
    """Deviation (f): a server colluding with one node w asks for a Shamir threshold that holds
    only without colluders (t = 4 of a node's 7 share holders: 2t <= k + 1 + 1), then tells the
    victim u and two honest holders that u survived (self-mask seed shares) and the other three
    that u dropped (mask-key shares); w reveals both of its shares of u. Every node assumes one
    colluder (its policy's ``colluders``): with the defence it refuses that threshold before it
    shares; without (``shamir-threshold`` off), the server unmasks u's input from u's masked
    vector alone."""
    rng = np.random.default_rng(seed)
    ids = [101 + 7 * k for k in range(nodes)]
    params = plan_params(nodes, BITS, degree=nodes - 1)  # the default against no colluder
    u, w, honest = ids[0], ids[1], ids[2:]
    out = {"deviation": "f", "name": "threshold too low for a colluding node", "defence": defence, "nodes": nodes,
           "degree": params.degree, "threshold": params.threshold, "colluders": 1, "refused": [], "recovered": False}
    node = {i: SecAggNode(i) for i in ids}
    server = SecAggServer(ids, params, seed=os.urandom(32))
    keys = {i: n.channel_key() for i, n in node.items()}
    release = b"deviant-threshold"
    shares = {}
    for i in ids:
        try:
            shares[i] = node[i].share(release, params, server.channel_keys_for(i, keys), colluders=1)
        except SecAggError as exc:
            out["refused"].append({"node": i, "round": "share", "reason": str(exc)})
    if len(shares) < len(ids):
        return out  # nothing was shared: nothing to unmask
    inputs = {i: rng.integers(0, 1 << 20, size=16, dtype=np.uint64) for i in ids}
    routed = server.route(shares)
    masked = {i: node[i].mask(release, inputs[i], *routed[i]) for i in ids}
    alive_view, dropped_view = (ids, []), ([i for i in ids if i != u], [u])
    seed_shares = [node[h].unmask(release, *alive_view)["self"][u] for h in [u, *honest[:2]]]
    key_shares = [node[h].unmask(release, *dropped_view)["pairwise"][u] for h in honest[2:]]
    blob = node[w].export_state()  # the colluder answers both views (two copies of its state)
    seed_shares.append(SecAggNode.restore(w, blob).unmask(release, *alive_view)["self"][u])
    key_shares.append(SecAggNode.restore(w, blob).unmask(release, *dropped_view)["pairwise"][u])

    def secret(blobs):
        return _combine([(_INDEX.unpack_from(b)[0], bytes(b[_INDEX.size:])) for b in blobs])

    out.update(_unmask_alone(masked[u], u, secret(seed_shares), secret(key_shares), {v: shares[v][0] for v in ids[1:]}, release, inputs[u]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--threshold", type=int, default=4)
    args = p.parse_args(argv)
    for defence in (False, True):
        for r in (key_substitution(defence, args.nodes, args.threshold), colluding_threshold(defence)):
            r["refused"] = [f"node {x['node']} ({x['round']}): {x['reason']}" for x in r["refused"]][:3]
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
