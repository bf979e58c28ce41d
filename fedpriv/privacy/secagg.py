"""Secure summation of integer vectors over a sparse neighbour graph (SecAgg+ style).

The server learns the sum modulo ``2**bits`` of the vectors of the nodes that stayed until the
end of a release, and nothing else about any single vector, while nodes may drop out at any
point. The module is pure Python on bytes and ``numpy.uint64`` arrays; it knows nothing about
Flower, so message handlers only carry its inputs and outputs.

Protocol
--------
*Once per run* every node makes a *channel* X25519 key pair and advertises the public half.
The server draws a public 32-byte seed and builds from it a random ``degree``-regular,
connected, symmetric *neighbour graph* (:func:`neighbour_graph`); a node only ever talks
(through the server) to its neighbours.

*Per release* (a release is named by a public label such as ``b"step-3/item_stats"``):

1. ``share``. Node ``u`` makes a fresh *mask* key pair ``(s_sk, s_pk)`` and a fresh 32-byte
   self-mask seed ``b``. It splits ``b`` and ``s_sk`` with Shamir's scheme (threshold ``t``) into
   one share of each per neighbour, encrypts the two shares for that neighbour with AES-GCM
   under a key agreed on the two nodes' channel keys, and sends ``s_pk`` plus the ciphertexts.
   The associated data binds sender, receiver and release label, so a ciphertext is useless
   anywhere else.
2. ``mask``. The server forwards to ``u`` the mask public keys of its neighbours that completed
   step 1 and the ciphertexts addressed to ``u``. ``u`` keeps the decrypted shares and sends
   ``y_u = x_u + PRG(b_u) + sum_v sign(u, v) * PRG(X25519(s_sk_u, s_pk_v))  (mod 2**bits)``
   where ``sign(u, v) = +1`` if ``u < v`` else ``-1``. Each pairwise mask enters two vectors
   with opposite signs, so it cancels in the sum when both nodes stay.
3. ``unmask``. Survivors (nodes whose ``y`` arrived) are asked, for every neighbour ``v`` whose
   shares they hold, for the ``b``-share of ``v`` if ``v`` survived and for the ``s_sk``-share
   of ``v`` if ``v`` dropped (completed step 1, sent no ``y``). With ``t`` shares the server
   removes each survivor's self mask and the pairwise masks between survivors and dropped
   nodes; it checks each recovered ``s_sk`` against the advertised ``s_pk``.

Masks are ChaCha20 keystreams under ``HKDF(secret, info=b"fedpriv secagg mask" + label)``, read
as little-endian 64-bit words and reduced modulo ``2**bits``; every secret comes from
``os.urandom`` and is used for one release only, so the masks of two releases are independent.

Trust assumptions
-----------------
* Unauthenticated nodes (no ``identity``) assume a *semi-honest* server: one that follows the
  protocol, in particular relays the channel public keys faithfully (a server that substituted
  them could read the shares: ``simulations/deviant_keys.py``), but may try to learn
  individual vectors from what it sees.
* Authenticated nodes (an ``identity``: a signing key and a roster from the node's own
  configuration, :mod:`fedpriv.privacy.secagg_auth`) also hold against a server that deviates:
  a node encrypts shares only to channel keys signed by a roster member for that node id and
  run, checks its neighbours against the public graph, and unmasks only a view (survivors,
  dropped) that ``threshold`` of its share holders signed in the consistency round. The server
  cannot forge keys; what a deviating server colluding with ``c`` nodes can still do is bounded
  below (``c < t`` in total; and ``2t > degree + 1 + c`` so that no two disjoint groups of
  honest holders can be made to reveal the two secrets of one node).
* An honest node reveals, within one release, at most one of the two shares (``b`` or
  ``s_sk``) of each neighbour, and refuses inconsistent requests (a node listed both as
  survivor and dropped, itself listed as dropped, a flip between the two kinds, too few
  survivors). Together with the default threshold ``t = floor((k + 1 + c)/2) + 1`` against
  ``c`` colluding nodes (each node refuses a lower one for the ``c`` of its own configuration)
  no one can collect ``t`` shares of both secrets of the same node, because two groups of ``t``
  holders, each topped up by the ``c`` colluders, must overlap in an honest holder.
* Privacy of ``x_u`` fails if ``t`` or more of ``u``'s neighbours collude with the server.
  Larger degrees make a colluding majority of a neighbourhood less likely for a random graph;
  the default degree ``~2*log2(n)`` trades that against cost.
* Nothing here checks the *values*: a malicious client can submit any vector in range (or
  wrong shares) and so shift or spoil the sum. Clipping and quantization are enforced only in
  honest client code, before :meth:`SecAggNode.mask` is called.
"""

from __future__ import annotations

import math
import json
import os
import struct
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import PrivacyError
from . import defences
from .secagg_auth import NodeIdentity, advert_message, graph_digest, view_digest, view_message

__all__ = [
    "SecAggError",
    "SecAggNode",
    "SecAggParams",
    "SecAggServer",
    "default_degree",
    "default_threshold",
    "expand_mask",
    "neighbour_graph",
    "plan_params",
]

# HKDF ``info`` labels, one per purpose
_INFO_CHANNEL = b"fedpriv secagg channel"
_INFO_PAIRWISE = b"fedpriv secagg pairwise"
_INFO_MASK = b"fedpriv secagg mask"
_INFO_GRAPH = b"fedpriv secagg graph"
_AAD_SHARE = b"fedpriv secagg share"

_KEY_BYTES = 32
_NONCE_BYTES = 12
_INDEX = struct.Struct(">I")  # Shamir share index on the wire
_SHARE_BYTES = _INDEX.size + _KEY_BYTES  # index + two 16-byte halves
_SELF = "self"
_PAIRWISE = "pairwise"


class SecAggError(PrivacyError):
    """Secure aggregation cannot proceed safely (bad input, refused request, failed check).

    ``field`` names the offending parameter and ``node`` the offending node, when known.
    """

    def __init__(self, message: str, *, field: str | None = None, node: int | None = None):
        self.field = field
        self.node = node
        super().__init__((f"{field}: " if field else "") + message)


# ------------------------------------------------------------------------------- parameters


def _check_int(value: object, name: str, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]``; SecAggError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SecAggError(f"must be an integer, got {value!r}", field=name)
    value = int(value)
    if value < low or (high is not None and value > high):
        upper = "" if high is None else f", <= {high}"
        raise SecAggError(f"must be >= {low}{upper}, got {value}", field=name)
    return value


@dataclass(frozen=True)
class SecAggParams:
    """Parameters of one secure summation.

    ``bits``: arithmetic is in ``Z_(2**bits)``, 1 <= bits <= 64 (inputs must already be reduced).
    ``degree``: number of neighbours of every node in the neighbour graph.
    ``threshold``: Shamir threshold ``t``, 1 <= t <= degree + 1, over a node's ``degree + 1``
    share holders (its neighbours and itself): ``t`` holders must answer the unmask round for
    the node's masks to be removed, and ``t`` colluding neighbours could unmask it.
    """

    bits: int
    degree: int
    threshold: int

    def __post_init__(self) -> None:
        _check_int(self.bits, "bits", 1, 64)
        _check_int(self.degree, "degree", 1)
        _check_int(self.threshold, "threshold", 1, int(self.degree) + 1)

    @property
    def modulus_mask(self) -> np.uint64:
        """``2**bits - 1`` as a uint64 (AND with it reduces modulo ``2**bits``)."""
        return np.uint64((1 << self.bits) - 1)


def default_degree(n: int) -> int:
    """The default graph degree for ``n`` nodes: ``min(n - 1, 2 * ceil(log2 n))``, raised by
    one when ``n`` and the degree are both odd (a regular graph needs ``n * degree`` even)."""
    n = _check_int(n, "n_nodes", 2)
    k = min(n - 1, 2 * math.ceil(math.log2(n)))
    if (n * k) % 2:
        k += 1  # n odd, so n - 1 is even and k < n - 1 here
    return k


def _least_threshold(holders: int, colluders: int) -> int:
    """The least Shamir threshold ``t`` with ``2t > holders + colluders`` (the rule of
    :func:`default_threshold`, and the one every node checks in :meth:`SecAggNode.share`)."""
    return (holders + colluders) // 2 + 1


def default_threshold(degree: int, colluders: int = 0) -> int:
    """The default Shamir threshold ``floor((degree + 1 + colluders) / 2) + 1``: the least ``t``
    with ``2t > degree + 1 + colluders``. The node itself reveals only its own self-mask seed
    share (never its mask-key share) and each of ``colluders`` neighbours may reveal both, so no
    two disjoint groups of honest holders, each topped up by the colluders, can hand over ``t``
    shares (one group the self-mask seed, the other the mask key) of the same node. With
    ``colluders = 0``: a strict majority of the ``degree + 1`` share holders."""
    degree = _check_int(degree, "degree", 1)
    colluders = _check_int(colluders, "colluders", 0)
    t = _least_threshold(degree + 1, colluders)
    if t > degree + 1:
        raise SecAggError(
            f"no threshold of a node's {degree + 1} share holders holds against {colluders} colluding node(s) "
            f"(2t > {degree + 1 + colluders} needs t > {degree + 1}): "
            "use more nodes (a larger degree) or assume fewer colluders",
            field="colluders",
        )
    return t


def _check_degree(n: int, degree: int) -> int:
    """Validate that a connected ``degree``-regular graph on ``n`` nodes exists."""
    degree = _check_int(degree, "degree", 1, n - 1)
    if (n * degree) % 2:
        raise SecAggError(f"n_nodes * degree must be even ({n} * {degree})", field="degree")
    if degree == 1 and n > 2:
        raise SecAggError(f"a 1-regular graph on {n} nodes is not connected", field="degree")
    return degree


def plan_params(
    n_nodes: int, bits: int, degree: int | None = None, threshold: int | None = None, colluders: int = 0
) -> SecAggParams:
    """Validated :class:`SecAggParams` for ``n_nodes`` nodes; ``degree`` and ``threshold``
    default to :func:`default_degree` and :func:`default_threshold` (against ``colluders``
    colluding nodes)."""
    n = _check_int(n_nodes, "n_nodes", 2)
    bits = _check_int(bits, "bits", 1, 64)
    k = default_degree(n) if degree is None else _check_degree(n, degree)
    t = default_threshold(k, colluders) if threshold is None else _check_int(threshold, "threshold", 2, k + 1)
    return SecAggParams(bits=bits, degree=k, threshold=t)


# ---------------------------------------------------------------------------- small helpers


def _hkdf(secret: bytes, info: bytes) -> bytes:
    """32 bytes derived from ``secret`` by HKDF-SHA256 with the given ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=_KEY_BYTES, salt=None, info=info).derive(secret)


def _keystream(key: bytes) -> Cipher:
    """A ChaCha20 cipher under ``key`` with a zero nonce (every key is used for one stream)."""
    return Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None)


def _check_release(release: object) -> bytes:
    """The release label as non-empty bytes."""
    if not isinstance(release, (bytes, bytearray)) or not release:
        raise SecAggError(f"must be non-empty bytes, got {release!r}", field="release")
    return bytes(release)


def _check_id(node: object, name: str = "node_id") -> int:
    """A node id as an int (fits in 127 bits plus sign)."""
    if isinstance(node, bool) or not isinstance(node, (int, np.integer)):
        raise SecAggError(f"node ids must be integers, got {node!r}", field=name)
    node = int(node)
    if not -(1 << 127) <= node < (1 << 127):
        raise SecAggError(f"node id {node} out of range", field=name)
    return node


def _id_bytes(node: int) -> bytes:
    return node.to_bytes(16, "big", signed=True)


def _id_set(nodes: Collection[int], name: str) -> set[int]:
    return {_check_id(v, name) for v in nodes}


def _private_key(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def _public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _agree(private: X25519PrivateKey, public: bytes, node: int) -> bytes:
    """X25519 shared secret with ``node``'s ``public`` key; SecAggError naming ``node`` if the
    key is malformed or of low order."""
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(bytes(public)))
    except (ValueError, TypeError) as e:
        raise SecAggError(f"bad X25519 public key from node {node}: {e}", node=node) from e


def _channel(private: X25519PrivateKey, public: bytes, node: int) -> AESGCM:
    """The AES-256-GCM channel with ``node``."""
    return AESGCM(_hkdf(_agree(private, public, node), _INFO_CHANNEL))


def _share_aad(sender: int, receiver: int, release: bytes) -> bytes:
    return _AAD_SHARE + _id_bytes(sender) + _id_bytes(receiver) + release


# -------------------------------------------------------------------------------- masks


def expand_mask(secret: bytes, release: bytes, length: int, bits: int) -> np.ndarray:
    """``length`` mask words in ``[0, 2**bits)`` (uint64) expanded from a 32-byte ``secret``.

    The ChaCha20 key is ``HKDF(secret, info=b"fedpriv secagg mask" + release)``, so the masks of
    two releases are independent; the keystream is read as little-endian uint64 words.
    """
    if not isinstance(secret, (bytes, bytearray)) or len(secret) != _KEY_BYTES:
        raise SecAggError("must be 32 bytes", field="secret")
    release = _check_release(release)
    length = _check_int(length, "length", 0)
    bits = _check_int(bits, "bits", 1, 64)
    key = _hkdf(bytes(secret), _INFO_MASK + release)
    stream = _keystream(key).encryptor().update(bytes(8 * length))
    words = np.frombuffer(stream, dtype="<u8").astype(np.uint64)
    if bits < 64:
        words &= np.uint64((1 << bits) - 1)
    return words


def _pairwise_secret(private: X25519PrivateKey, public: bytes, node: int) -> bytes:
    """The 32-byte seed of the pairwise mask with ``node``."""
    return _hkdf(_agree(private, public, node), _INFO_PAIRWISE)


# ---------------------------------------------------------------------------- Shamir shares


def _split(secret: bytes, t: int, n: int) -> list[bytes]:
    """``n`` shares (index i+1 at position i) of a 32-byte secret, each 16+16 bytes: one
    GF(2^128) share of each half under the same index."""
    low = Shamir.split(t, n, secret[:16], ssss=False)
    high = Shamir.split(t, n, secret[16:], ssss=False)
    return [a + b for (_, a), (_, b) in zip(low, high)]


def _combine(shares: list[tuple[int, bytes]]) -> bytes:
    """The 32-byte secret from exactly ``t`` ``(index, 32-byte share)`` pairs."""
    low = Shamir.combine([(i, s[:16]) for i, s in shares], ssss=False)
    high = Shamir.combine([(i, s[16:]) for i, s in shares], ssss=False)
    return low + high


def _decode_share(blob: object, holder: int, owner: int, degree: int) -> tuple[int, bytes]:
    """``(index, share)`` from a revealed share; SecAggError naming ``holder`` if malformed."""
    if not isinstance(blob, (bytes, bytearray)) or len(blob) != _SHARE_BYTES:
        raise SecAggError(f"malformed share of node {owner} from node {holder}", node=holder)
    (index,) = _INDEX.unpack_from(blob)
    if not 1 <= index <= degree + 1:
        raise SecAggError(f"share of node {owner} from node {holder} has index {index}", node=holder)
    return index, bytes(blob[_INDEX.size :])


# ------------------------------------------------------------------------------ graph


def _public_uniform(seed: bytes, label: bytes) -> Iterator[int]:
    """An endless public stream of uniform 64-bit ints derived from ``seed``."""
    encryptor = _keystream(_hkdf(seed, label)).encryptor()
    block = struct.Struct("<256Q")
    while True:
        yield from block.unpack(encryptor.update(bytes(block.size)))


def _below(stream: Iterator[int], bound: int) -> int:
    """A uniform int in ``[0, bound)`` by rejection sampling (no modulo bias)."""
    limit = (1 << 64) - (1 << 64) % bound
    while True:
        w = next(stream)
        if w < limit:
            return w % bound


def _permutation(items: list[int], seed: bytes) -> list[int]:
    """A Fisher-Yates shuffle of ``items`` driven by ``seed``."""
    out = list(items)
    stream = _public_uniform(seed, _INFO_GRAPH)
    for i in range(len(out) - 1, 0, -1):
        j = _below(stream, i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def _circulant_offsets(n: int, degree: int) -> list[int]:
    """Ring offsets of a Harary-style circulant: ``+-1 .. +-floor(k/2)``, plus ``n/2`` if
    ``k`` is odd (then ``n`` is even)."""
    offsets = [d for h in range(1, degree // 2 + 1) for d in (h, -h)]
    if degree % 2:
        offsets.append(n // 2)
    return offsets


def neighbour_graph(node_ids: Sequence[int], degree: int, seed: bytes) -> dict[int, tuple[int, ...]]:
    """The public neighbour graph: ``{node: sorted tuple of its neighbours}``.

    Nodes are placed on a ring in a random order drawn from ``seed`` (32 bytes) and joined to
    the ``floor(degree/2)`` nearest on each side (and to the opposite node if ``degree`` is odd).
    The graph is symmetric, ``degree``-regular, loop-free, connected and a function of the
    seed and the *set* of ids only.
    """
    ids = sorted(_id_set(node_ids, "node_ids"))
    if len(ids) != len(node_ids):
        raise SecAggError("node ids must be distinct", field="node_ids")
    n = len(ids)
    if n < 2:
        raise SecAggError(f"need at least 2 nodes, got {n}", field="node_ids")
    degree = _check_degree(n, degree)
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != 32:
        raise SecAggError("must be 32 bytes", field="seed")
    ring = _permutation(ids, bytes(seed))
    offsets = _circulant_offsets(n, degree)
    position = {v: i for i, v in enumerate(ring)}
    return {v: tuple(sorted(ring[(position[v] + d) % n] for d in offsets)) for v in ids}


# ------------------------------------------------------------------------------ node


@dataclass
class _Release:
    """What a node keeps about one release."""

    params: SecAggParams
    channels: dict[int, AESGCM]
    mask_key: X25519PrivateKey | None
    self_seed: bytes | None
    held: dict[int, tuple[int, bytes, bytes]] = field(default_factory=dict)  # v -> (i, b, sk)
    revealed: dict[int, str] = field(default_factory=dict)  # v -> _SELF / _PAIRWISE
    masked: bool = False
    peer_keys: dict[int, bytes] = field(default_factory=dict)  # channel public keys (to restore channels)
    own: tuple[int, bytes, bytes] | None = None  # the node's own share of its secrets (held until mask)
    names: dict[int, str] = field(default_factory=dict)  # authenticated: each neighbour's roster name
    graph: bytes = b""  # authenticated: digest of the graph this node was shown (members, degree, seed)
    signed: bytes | None = None  # authenticated: the view digest this node signed (consistency round)
    members: tuple[int, ...] | None = None  # the sum's members as shown in the share round (the graph), if shown
    min_contributors: int | None = None  # the node's own floor on members and survivors (its policy), if any
    bound: bytes = b""  # digest of what the node's words depend on (plan, broadcast), bound into its view signature


class SecAggNode:
    """One client of the secure summation. Keeps per-release state between rounds.

    Secrets (channel key, per-release mask key and self-mask seed) come from ``os.urandom`` and
    never leave the node except as Shamir shares encrypted for its neighbours.

    ``identity`` (:class:`fedpriv.privacy.secagg_auth.NodeIdentity`, from the node's own
    configuration) makes the node *authenticated*: it signs its advertised channel key
    (:meth:`advertisement`), encrypts shares only to neighbour keys signed by a roster member
    (:meth:`share` with ``adverts`` and ``graph``), signs the view it is shown before unmasking
    (:meth:`consistency`) and reveals shares only when ``threshold`` share holders signed the same
    view (:meth:`unmask` with ``signatures``). ``context``: the run the node's keys belong to (its
    own run id and the job label), bound into every signature. Without ``identity`` the node
    trusts the server to relay keys faithfully (semi-honest server only).
    """

    def __init__(self, node_id: int, identity: NodeIdentity | None = None, context: bytes = b""):
        self.node_id = _check_id(node_id)
        self._channel_key = _private_key(os.urandom(_KEY_BYTES))
        self._releases: dict[bytes, _Release] = {}
        self._used: set[bytes] = set()
        self.identity = identity
        self.context = bytes(context)
        self._verified: dict[
            int, tuple[str, bytes]
        ] = {}  # members whose signed advertisement this node checked: (name, channel key)

    def channel_key(self) -> bytes:
        """This node's 32-byte X25519 channel public key (made once per node object)."""
        return _public_bytes(self._channel_key)

    def advertisement(self) -> tuple[bytes, str, bytes]:
        """``(channel key, roster name, signature)`` of an authenticated node: the signature
        binds the key to the node's name, its node id and the run context."""
        ident = self._require_identity("advertisement")
        key = self.channel_key()
        return key, ident.name, ident.sign(advert_message(self.context, self.node_id, ident.name, key))

    def _require_identity(self, what: str) -> NodeIdentity:
        if self.identity is None:
            raise SecAggError(f"{what} needs the node's signing identity", field="identity")
        return self.identity

    def _verify_adverts(
        self, peers: list[int], neighbours: dict[int, bytes], adverts: dict[int, tuple[str, bytes]] | None
    ) -> dict[int, str]:
        """``{neighbour: roster name}``; SecAggError naming the first neighbour whose channel
        key is not signed by a roster member under that neighbour's node id and this run."""
        ident = self._require_identity("share")
        adverts = adverts or {}
        names: dict[int, str] = {}
        if not defences.active(
            "key-substitution"
        ):  # a positive control: the names as the server relays them, unchecked
            return {v: str(adverts[v][0]) for v in peers if isinstance(adverts.get(v), tuple)}
        for v in peers:
            entry = adverts.get(v)
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise SecAggError(
                    f"neighbour {v} came with no signed key advertisement; "
                    "refused (authenticated node) [key-substitution]",
                    field="adverts",
                    node=v,
                )
            name, sig = entry
            if not ident.verify(name, advert_message(self.context, v, str(name), bytes(neighbours[v])), sig):
                raise SecAggError(
                    f"the channel key of neighbour {v} is not signed by roster member {name!r} for this "
                    "node id and run: refusing to encrypt shares to it (key substitution?) [key-substitution]",
                    field="adverts",
                    node=v,
                )
            if name == ident.name:
                raise SecAggError(
                    f"neighbour {v} claims this node's own roster name {name!r} [key-substitution]",
                    field="adverts",
                    node=v,
                )
            names[v] = str(name)
        if len(set(names.values())) != len(names):
            raise SecAggError("two neighbours carry the same roster name", field="adverts")
        return names

    def _check_graph(
        self, peers: list[int], params: SecAggParams, graph: tuple[Collection[int], bytes] | None
    ) -> bytes:
        """The graph digest, after checking that ``peers`` are this node's neighbours in the
        public graph of ``graph = (members, seed)``."""
        if graph is None:
            raise SecAggError("an authenticated node needs the graph's members and seed", field="graph")
        members, seed = graph
        members = [_check_id(v, "members") for v in members]
        if self.node_id not in members:
            raise SecAggError(f"node {self.node_id} is not a member of the graph it was shown", field="graph")
        expected = neighbour_graph(members, params.degree, seed)[self.node_id]
        if list(expected) != peers:
            raise SecAggError(
                f"the neighbours sent ({peers}) are not this node's neighbours in the graph ({list(expected)})",
                field="graph",
            )
        return graph_digest(members, params.degree, seed)

    # -- round 1 ---------------------------------------------------------------------------

    def share(
        self,
        release: bytes,
        params: SecAggParams,
        neighbours: dict[int, bytes],
        *,
        adverts: dict[int, tuple[str, bytes]] | None = None,
        graph: tuple[Collection[int], bytes] | None = None,
        colluders: int = 0,
        min_contributors: int | None = None,
        member_keys: dict[int, bytes] | None = None,
    ) -> tuple[bytes, dict[int, bytes]]:
        """Start ``release``: make a fresh mask key pair and self-mask seed, and Shamir-share
        both among ``neighbours`` (``{id: channel public key}``).

        ``colluders``: how many of its share holders this node assumes may collude with the
        server (the node's own configuration, never the server's message). It refuses a
        threshold ``t`` with ``2t <= degree + 1 + colluders`` (the server and the colluders could
        collect ``t`` shares of both its secrets from two groups of honest holders).

        An authenticated node also needs ``adverts`` (``{id: (roster name, signature)}`` from
        each neighbour's :meth:`advertisement`) and ``graph`` (``(members, seed)`` of the public
        neighbour graph) and refuses a key that a roster member did not sign, or neighbours that
        are not its own in that graph.

        ``min_contributors``: the node's own floor (its policy; None: trust the server). The
        node then needs the graph and refuses fewer members than that (``[min-contributors]``);
        an authenticated node also needs every member's signed advertisement (``adverts`` and
        ``member_keys``, the members' channel keys) and refuses a member without a valid roster
        signature or fewer distinct roster names than the floor (``[roster]``): a server cannot
        invent peers.

        Returns ``(mask public key, {neighbour id: ciphertext})``. A release label can be used
        only once per node.
        """
        release = _check_release(release)
        if not isinstance(params, SecAggParams):
            raise SecAggError("must be SecAggParams", field="params")
        if release in self._used:
            raise SecAggError(f"release {release!r} already started on node {self.node_id}", field="release")
        peers = sorted(_id_set(neighbours, "neighbours"))
        if self.node_id in peers:
            raise SecAggError(f"node {self.node_id} cannot be its own neighbour", field="neighbours")
        if len(peers) + 1 < params.threshold:
            raise SecAggError(
                f"{len(peers)} neighbours and this node hold fewer shares than the threshold {params.threshold}",
                field="neighbours",
            )
        colluders = _check_int(colluders, "colluders", 0)
        # (t <= holders, checked above, and 2t > holders + colluders give t > colluders too)
        if params.threshold < _least_threshold(len(peers) + 1, colluders) and defences.active("shamir-threshold"):
            # a smaller threshold would let a deviating server (with the colluders' shares of both
            # kinds) collect both kinds of share of one node: the self-mask seed from one group of
            # honest holders, the mask key from another
            raise SecAggError(
                f"threshold {params.threshold} is too low for the {len(peers) + 1} share holders (this node and its "
                f"{len(peers)} neighbours) with {colluders} colluding: needs 2t > {len(peers) + 1 + colluders}; "
                "refused [shamir-threshold]",
                field="threshold",
            )
        names, digest, members = {}, b"", None
        if graph is not None:
            members = tuple(sorted({_check_id(v, "members") for v in graph[0]}))
        if min_contributors is not None:
            min_contributors = _check_int(min_contributors, "min_contributors", 1)
            if members is None:
                raise SecAggError(
                    f"a node with a floor of {min_contributors} contributors needs the sum's "
                    "members (the graph); refused [min-contributors]",
                    field="graph",
                )
            if len(members) < min_contributors and defences.active("min-contributors"):
                raise SecAggError(
                    f"the sum has {len(members)} members, fewer than this node's "
                    f"min_contributors {min_contributors}; refused [min-contributors]",
                    field="graph",
                )
        if self.identity is not None:
            names = self._verify_adverts(peers, neighbours, adverts)
            digest = self._check_graph(peers, params, graph)
            if min_contributors is not None:
                names = self._verify_members(
                    members, {**(member_keys or {}), **neighbours}, adverts, names, min_contributors
                )
        elif graph is not None:
            digest = self._check_graph(peers, params, graph)
        channels = {v: _channel(self._channel_key, neighbours[v], v) for v in peers}
        mask_raw, self_seed = os.urandom(_KEY_BYTES), os.urandom(_KEY_BYTES)
        mask_key = _private_key(mask_raw)
        ciphertexts, own = self._encrypt_shares(release, params.threshold, peers, channels, self_seed, mask_raw)
        self._used.add(release)
        self._releases[release] = _Release(
            params,
            channels,
            mask_key,
            self_seed,
            peer_keys={v: bytes(neighbours[v]) for v in peers},
            own=own,
            names=names,
            graph=digest,
            members=members,
            min_contributors=min_contributors,
        )
        return _public_bytes(mask_key), ciphertexts

    def _verify_members(
        self,
        members: tuple[int, ...],
        keys: dict[int, bytes],
        adverts: dict[int, tuple[str, bytes]] | None,
        names: dict[int, str],
        floor: int,
    ) -> dict[int, str]:
        """``{member: roster name}`` for every member but this node, each checked against its
        signed advertisement (or checked in an earlier round of the run, whose advertisement the
        server need not send again); SecAggError ``[roster]`` for a member without one or with a name
        another member carries, or fewer distinct roster names (this node included) than
        ``floor``."""
        ident = self._require_identity("share")
        adverts = adverts or {}
        out = dict(names)
        for v in members:
            if v == self.node_id or v in out:
                continue
            entry, key = adverts.get(v), keys.get(v)
            if entry is None and v in self._verified:  # checked in an earlier round of this run (not sent again)
                out[v] = self._verified[v][0]
                continue
            ok = isinstance(entry, tuple) and len(entry) == 2 and key is not None
            if ok and self._verified.get(v) == (str(entry[0]), bytes(key)):  # checked in an earlier round of this run
                out[v] = str(entry[0])
                continue
            if ok:
                ok = entry[0] != ident.name and ident.verify(
                    entry[0], advert_message(self.context, v, str(entry[0]), bytes(key)), entry[1]
                )
                if ok:
                    self._verified[v] = (str(entry[0]), bytes(key))
            if not ok:
                if defences.active("roster"):
                    raise SecAggError(
                        f"member {v} of the sum carries no valid roster signature (a peer the server "
                        "invented?); refused [roster]",
                        field="adverts",
                        node=v,
                    )
                continue
            out[v] = str(entry[0])
        distinct = len(set(out.values()) | {ident.name})
        if defences.active("roster") and len(set(out.values())) != len(out):
            raise SecAggError("two members of the sum carry the same roster name; refused [roster]", field="adverts")
        if defences.active("roster") and distinct < floor:
            raise SecAggError(
                f"the sum's members carry {distinct} distinct roster names (this node included), "
                f"fewer than this node's min_contributors {floor}; refused [roster]",
                field="adverts",
            )
        return out

    def _encrypt_shares(
        self, release: bytes, t: int, peers: list[int], channels: dict[int, AESGCM], self_seed: bytes, mask_raw: bytes
    ) -> tuple[dict[int, bytes], tuple[int, bytes, bytes]]:
        """Peer ``peers[i]`` gets share index ``i + 1`` of both secrets, encrypted for it; the
        node keeps index ``len(peers) + 1`` for itself."""
        seed_shares = _split(self_seed, t, len(peers) + 1)
        key_shares = _split(mask_raw, t, len(peers) + 1)
        own = (len(peers) + 1, seed_shares[-1], key_shares[-1])
        out = {}
        for i, v in enumerate(peers):
            plain = _INDEX.pack(i + 1) + seed_shares[i] + key_shares[i]
            nonce = os.urandom(_NONCE_BYTES)
            aad = _share_aad(self.node_id, v, release)
            out[v] = nonce + channels[v].encrypt(nonce, plain, aad)
        return out, own

    # -- round 2 ---------------------------------------------------------------------------

    def mask(
        self,
        release: bytes,
        x: np.ndarray,
        mask_keys: dict[int, bytes],
        ciphertexts: dict[int, bytes],
        bound: bytes = b"",
    ) -> np.ndarray:
        """Store the shares addressed to this node and return its masked vector ``y``.

        ``x``: uint64 vector already reduced modulo ``2**bits``. ``mask_keys``: mask public keys
        of the neighbours that completed ``share``; ``ciphertexts``: ``{sender: ciphertext}``
        from the same neighbours. ``bound``: a digest of everything ``x`` depends on (the plan,
        the broadcast state or model, the candidates), bound into the view this node signs in
        the consistency round, so that it reveals only when every survivor computed on the same.
        Allowed once per release.
        """
        release = _check_release(release)
        state = self._state(release)
        if state.masked:
            raise SecAggError(f"node {self.node_id} already sent its masked vector for {release!r}", field="release")
        x = self._check_input(x, state.params.bits)
        senders = self._check_senders(state, mask_keys, ciphertexts)
        held = {v: self._decrypt_share(state, release, v, ciphertexts[v]) for v in senders}
        held[self.node_id] = state.own  # its own share: revealed (self-mask seed only) while it survives
        y = self._masked(release, state, x, {v: mask_keys[v] for v in senders})
        state.held, state.masked, state.own, state.bound = held, True, None, bytes(bound)
        state.mask_key = state.self_seed = None  # no longer needed
        state.channels = {}
        return y

    def _state(self, release: bytes) -> _Release:
        state = self._releases.get(release)
        if state is None:
            raise SecAggError(f"node {self.node_id} has no state for release {release!r}", field="release")
        return state

    @staticmethod
    def _check_input(x: object, bits: int) -> np.ndarray:
        if not isinstance(x, np.ndarray) or x.dtype != np.uint64 or x.ndim != 1:
            raise SecAggError("must be a 1-D numpy uint64 array", field="x")
        if bits < 64 and x.size and int(x.max()) >> bits:
            raise SecAggError(f"values must be < 2**{bits}", field="x")
        return x

    def _check_senders(self, state: _Release, mask_keys: dict[int, bytes], ciphertexts: dict[int, bytes]) -> list[int]:
        keys, cts = _id_set(mask_keys, "mask_keys"), _id_set(ciphertexts, "ciphertexts")
        if keys != cts:
            raise SecAggError("mask keys and ciphertexts must come from the same neighbours", field="ciphertexts")
        strangers = sorted(keys - set(state.channels))
        if strangers:
            raise SecAggError(
                f"nodes {strangers} are not neighbours of node {self.node_id}", field="mask_keys", node=strangers[0]
            )
        if len(keys) + 1 < state.params.threshold:
            raise SecAggError(
                f"only {len(keys)} neighbours completed share: with this node, fewer "
                f"share holders than the threshold {state.params.threshold}",
                field="mask_keys",
            )
        return sorted(keys)

    def _decrypt_share(self, state: _Release, release: bytes, sender: int, blob: object) -> tuple[int, bytes, bytes]:
        """``(index, seed share, key share)`` from ``sender``; SecAggError naming it if the
        ciphertext does not authenticate for (sender, this node, release)."""
        bad = SecAggError(f"share ciphertext from node {sender} failed to authenticate", node=sender)
        if not isinstance(blob, (bytes, bytearray)) or len(blob) <= _NONCE_BYTES:
            raise bad
        blob = bytes(blob)
        aad = _share_aad(sender, self.node_id, release)
        try:
            plain = state.channels[sender].decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], aad)
        except InvalidTag:
            raise bad from None
        if len(plain) != _INDEX.size + 2 * _KEY_BYTES:
            raise bad
        (index,) = _INDEX.unpack_from(plain)
        return index, plain[_INDEX.size : _SHARE_BYTES], plain[_SHARE_BYTES:]

    def _masked(self, release: bytes, state: _Release, x: np.ndarray, keys: dict[int, bytes]) -> np.ndarray:
        bits, n = state.params.bits, x.size
        y = x.astype(np.uint64, copy=True)
        y += expand_mask(state.self_seed, release, n, bits)
        for v, pk in keys.items():
            m = expand_mask(_pairwise_secret(state.mask_key, pk, v), release, n, bits)
            if self.node_id < v:
                y += m
            else:
                y -= m
        y &= state.params.modulus_mask
        return y

    # -- round 3 ---------------------------------------------------------------------------

    def _view(self, release: bytes, state: _Release, alive: set[int], gone: set[int]) -> bytes:
        return view_digest(self.context, release, state.graph + state.bound, alive, gone)

    def consistency(self, release: bytes, survivors: Collection[int], dropped: Collection[int]) -> bytes:
        """The consistency round of an authenticated node: its signature over the view it is
        shown for ``release`` (the graph of its share round, ``survivors``, ``dropped``), after
        the same checks as :meth:`unmask`. Signed once per release: a second, different view
        is refused (the server showed this node two views)."""
        release = _check_release(release)
        ident = self._require_identity("consistency")
        state = self._masked_state(release)
        alive, gone = _id_set(survivors, "survivors"), _id_set(dropped, "dropped")
        self._check_request(state, alive, gone)
        digest = self._view(release, state, alive, gone)
        if state.signed is not None and state.signed != digest:
            raise SecAggError(
                f"node {self.node_id} already signed another view of release {release!r}; refused", field="survivors"
            )
        state.signed = digest
        return ident.sign(view_message(digest, self.node_id))

    def _check_signatures(
        self, release: bytes, state: _Release, alive: set[int], gone: set[int], signatures: dict[int, bytes] | None
    ) -> None:
        """SecAggError unless this node signed this very view and ``threshold`` share holders
        (itself and its neighbours, by the roster names they proved in the share round) signed
        it too."""
        ident = self._require_identity("unmask")
        digest = self._view(release, state, alive, gone)
        if state.signed is None:
            raise SecAggError(
                f"node {self.node_id} was asked to unmask release {release!r} before signing its view "
                "(no consistency round); refused",
                field="signatures",
            )
        if state.signed != digest:
            raise SecAggError(
                f"the survivors and dropped nodes of the unmask request differ from the view node "
                f"{self.node_id} signed; refused [view-consistency]",
                field="survivors",
            )
        signatures = signatures or {}
        valid = [self.node_id]
        for v, name in sorted(state.names.items()):
            if v in signatures and ident.verify(name, view_message(digest, v), signatures[v]):
                valid.append(v)
        if state.min_contributors is not None:  # a node with a floor: every survivor signed this very view
            unsigned = sorted(set(alive) - set(valid))
            if unsigned and defences.active("view-consistency"):
                raise SecAggError(
                    f"survivors {unsigned[:8]}{' ...' if len(unsigned) > 8 else ''} did not sign "
                    f"the view node {self.node_id} signed (its plan, broadcast and members): "
                    "the server may have shown them another plan, model or member set; "
                    "refusing to reveal shares [view-consistency]",
                    field="signatures",
                )
            return
        t = state.params.threshold
        if len(valid) < t:
            raise SecAggError(
                f"consistency check failed: {len(valid)} of this node's share holders (itself included: "
                f"{valid}) signed the view it was shown, fewer than the threshold {t}; the server may "
                "have shown different survivor sets to different nodes; refusing to reveal shares",
                field="signatures",
            )

    def _masked_state(self, release: bytes) -> _Release:
        state = self._releases.get(release)
        if state is None or not state.masked:
            raise SecAggError(f"node {self.node_id} holds no shares for release {release!r}", field="release")
        return state

    def unmask(
        self,
        release: bytes,
        survivors: Collection[int],
        dropped: Collection[int],
        signatures: dict[int, bytes] | None = None,
    ) -> dict[str, dict[int, bytes]]:
        """Reveal, for each neighbour whose shares this node holds, its self-mask seed share if
        it is a survivor and its mask-key share if it dropped.

        Returns ``{"self": {v: share}, "pairwise": {v: share}}``. Refuses (SecAggError, nothing
        revealed) a node listed as both, this node listed as dropped, fewer survivors than the
        threshold, an unknown release, or a request that would reveal, in one release, both
        kinds of share of the same node. An authenticated node also refuses unless it signed
        this view in :meth:`consistency` and ``signatures`` (``{node: signature}``, forwarded by
        the server) hold valid signatures of the same view from enough of its neighbours that,
        with its own, ``threshold`` share holders signed it.
        """
        release = _check_release(release)
        state = self._masked_state(release)
        alive, gone = _id_set(survivors, "survivors"), _id_set(dropped, "dropped")
        self._check_request(state, alive, gone)
        if self.identity is not None:
            self._check_signatures(release, state, alive, gone, signatures)
        reply: dict[str, dict[int, bytes]] = {_SELF: {}, _PAIRWISE: {}}
        for v, (index, seed_share, key_share) in state.held.items():
            if v in alive:
                reply[_SELF][v] = _INDEX.pack(index) + seed_share
                state.revealed[v] = _SELF
            elif v in gone:
                reply[_PAIRWISE][v] = _INDEX.pack(index) + key_share
                state.revealed[v] = _PAIRWISE
        return reply

    def _check_request(self, state: _Release, alive: set[int], gone: set[int]) -> None:
        """Raise if the unmask request is inconsistent or would reveal both kinds of share."""
        both = sorted(alive & gone)
        if both:
            raise SecAggError(f"nodes {both} listed both as survivors and dropped", field="dropped", node=both[0])
        if self.node_id in gone:
            raise SecAggError(f"node {self.node_id} is itself listed as dropped", field="dropped", node=self.node_id)
        if len(alive) < state.params.threshold:
            raise SecAggError(
                f"{len(alive)} survivors, fewer than the threshold {state.params.threshold}", field="survivors"
            )
        if state.members is not None and (alive | gone) - set(state.members) and defences.active("min-contributors"):
            strangers = sorted((alive | gone) - set(state.members))
            raise SecAggError(
                f"nodes {strangers[:8]} are listed as survivors or dropped but were not "
                "members of the sum; refused [min-contributors]",
                field="survivors",
            )
        if (
            state.min_contributors is not None
            and len(alive) < state.min_contributors
            and defences.active("min-contributors")
        ):
            raise SecAggError(
                f"{len(alive)} survivors, fewer than this node's min_contributors "
                f"{state.min_contributors}: the sum would carry less noise than it counts on; "
                "refused [min-contributors]",
                field="survivors",
            )
        flips = sorted(
            v
            for v in state.held
            if (v in alive and state.revealed.get(v) == _PAIRWISE) or (v in gone and state.revealed.get(v) == _SELF)
        )
        if flips:
            raise SecAggError(
                f"refusing to reveal the other share of nodes {flips} in the same release",
                field="dropped",
                node=flips[0],
            )

    def forget(self, release: bytes) -> None:
        """Drop the state of ``release`` (after its unmask round); the label stays used."""
        self._releases.pop(_check_release(release), None)

    # -- persistence -------------------------------------------------------------------------

    def export_state(self) -> bytes:
        """The node's whole state (its secrets included) as bytes, for a node whose process
        ends after each message (a Flower SuperNode starts one ClientApp process per message and
        keeps ``context.state`` for it). It must stay on the node."""

        def raw(key: X25519PrivateKey | None) -> str | None:
            if key is None:
                return None
            return key.private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
            ).hex()

        releases = {}
        for label, st in self._releases.items():
            releases[label.hex()] = {
                "params": [st.params.bits, st.params.degree, st.params.threshold],
                "mask_key": raw(st.mask_key),
                "self_seed": None if st.self_seed is None else st.self_seed.hex(),
                "held": {str(v): [i, b.hex(), k.hex()] for v, (i, b, k) in st.held.items()},
                "revealed": {str(v): r for v, r in st.revealed.items()},
                "masked": st.masked,
                "own": None if st.own is None else [st.own[0], st.own[1].hex(), st.own[2].hex()],
                "peer_keys": {str(v): k.hex() for v, k in st.peer_keys.items()} if not st.masked else {},
                "names": {str(v): n for v, n in st.names.items()},
                "graph": st.graph.hex(),
                "signed": None if st.signed is None else st.signed.hex(),
                "members": None if st.members is None else list(st.members),
                "min_contributors": st.min_contributors,
                "bound": st.bound.hex(),
            }
        blob = {
            "node_id": self.node_id,
            "channel_key": raw(self._channel_key),
            "used": sorted(u.hex() for u in self._used),
            "releases": releases,
            "context": self.context.hex(),
            "verified": {str(v): [n, k.hex()] for v, (n, k) in self._verified.items()},
        }
        return json.dumps(blob).encode()

    @classmethod
    def restore(cls, node_id: int, blob: bytes, identity: NodeIdentity | None = None) -> "SecAggNode":
        """A node from :meth:`export_state`; SecAggError if the blob is not this node's.
        ``identity`` is not part of the state: the node reads it from its own configuration."""
        try:
            d = json.loads(bytes(blob).decode())
            if int(d["node_id"]) != int(node_id):
                raise SecAggError(f"the saved state belongs to node {d['node_id']}, not {node_id}", field="node_id")
            node = cls.__new__(cls)
            node.node_id = _check_id(node_id)
            node._channel_key = _private_key(bytes.fromhex(d["channel_key"]))
            node._used = {bytes.fromhex(u) for u in d["used"]}
            node.identity = identity
            node.context = bytes.fromhex(d.get("context", ""))
            node._verified = {int(v): (str(n), bytes.fromhex(k)) for v, (n, k) in d.get("verified", {}).items()}
            node._releases = {}
            for label, st in d["releases"].items():
                peer_keys = {int(v): bytes.fromhex(k) for v, k in st["peer_keys"].items()}
                node._releases[bytes.fromhex(label)] = _Release(
                    params=SecAggParams(*st["params"]),
                    channels={v: _channel(node._channel_key, k, v) for v, k in peer_keys.items()},
                    mask_key=None if st["mask_key"] is None else _private_key(bytes.fromhex(st["mask_key"])),
                    self_seed=None if st["self_seed"] is None else bytes.fromhex(st["self_seed"]),
                    held={int(v): (int(i), bytes.fromhex(b), bytes.fromhex(k)) for v, (i, b, k) in st["held"].items()},
                    revealed={int(v): str(r) for v, r in st["revealed"].items()},
                    masked=bool(st["masked"]),
                    peer_keys=peer_keys,
                    own=None
                    if st.get("own") is None
                    else (int(st["own"][0]), bytes.fromhex(st["own"][1]), bytes.fromhex(st["own"][2])),
                    names={int(v): str(n) for v, n in st.get("names", {}).items()},
                    graph=bytes.fromhex(st.get("graph", "")),
                    signed=None if st.get("signed") is None else bytes.fromhex(st["signed"]),
                    members=None if st.get("members") is None else tuple(int(v) for v in st["members"]),
                    min_contributors=st.get("min_contributors"),
                    bound=bytes.fromhex(st.get("bound", "")),
                )
        except SecAggError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise SecAggError(f"malformed saved state ({exc})", field="state") from None
        return node


# ------------------------------------------------------------------------------ server


class SecAggServer:
    """The aggregating server: builds the neighbour graph, routes messages, unmasks the sum.

    ``seed``: the public 32-byte graph seed (``os.urandom(32)`` by default); it is stored as
    ``self.seed`` and may be published.
    """

    graph: dict[int, tuple[int, ...]]

    def __init__(self, node_ids: Sequence[int], params: SecAggParams, seed: bytes | None = None):
        if not isinstance(params, SecAggParams):
            raise SecAggError("must be SecAggParams", field="params")
        self.params = params
        self.seed = os.urandom(32) if seed is None else seed
        self.graph = neighbour_graph(node_ids, params.degree, self.seed)

    def _neighbours(self, node: int) -> tuple[int, ...]:
        try:
            return self.graph[node]
        except KeyError:
            raise SecAggError(f"unknown node {node}", field="node", node=node) from None

    def channel_keys_for(self, node: int, channel_keys: dict[int, bytes]) -> dict[int, bytes]:
        """The channel public keys of ``node``'s neighbours, to send it before ``share``.

        Every node of the graph must have advertised a channel key.
        """
        out = {}
        for v in self._neighbours(node):
            if v not in channel_keys:
                raise SecAggError(f"node {v} advertised no channel key", field="channel_keys", node=v)
            out[v] = channel_keys[v]
        return out

    def route(
        self, shares: dict[int, tuple[bytes, dict[int, bytes]]]
    ) -> dict[int, tuple[dict[int, bytes], dict[int, bytes]]]:
        """From the ``share`` replies ``{sender: (mask public key, {recipient: ciphertext})}``,
        the ``mask`` request of each sender: ``(mask keys of its neighbours that completed
        share, ciphertexts addressed to it)``."""
        for sender, (_, cts) in shares.items():
            if set(cts) != set(self._neighbours(sender)):
                raise SecAggError(
                    f"node {sender} did not send one ciphertext to each of its neighbours", field="shares", node=sender
                )
        out = {}
        for node in shares:
            senders = [v for v in self.graph[node] if v in shares]
            out[node] = ({v: shares[v][0] for v in senders}, {v: shares[v][1][node] for v in senders})
        return out

    def unmask_request(self, completed: Collection[int], survivors: Collection[int]) -> tuple[list[int], list[int]]:
        """``(survivors, dropped)`` to send to every survivor: ``completed`` are the nodes that
        completed ``share``, ``survivors`` those whose masked vector arrived."""
        done, alive = _id_set(completed, "completed"), _id_set(survivors, "survivors")
        strays = sorted(alive - done)
        if strays:
            raise SecAggError(
                f"nodes {strays} sent a masked vector without completing share", field="survivors", node=strays[0]
            )
        self._check_survivor_count(len(alive))
        return sorted(alive), sorted(done - alive)

    def check_unmask_reply(
        self, holder: int, reply: dict[str, dict[int, bytes]], survivors: Collection[int], dropped: Collection[int]
    ) -> None:
        """SecAggError (naming ``holder``) unless ``holder``'s unmask reply is well formed on its
        own: only shares of the nodes asked about, each held by ``holder`` and at its index. A
        server that checks every reply so can leave a malformed one out and unmask with the
        other holders' shares, where :meth:`unmask` refuses the whole release."""
        self._collect({holder: reply}, _id_set(survivors, "survivors"), _id_set(dropped, "dropped"))

    def _check_survivor_count(self, count: int) -> None:
        if count < self.params.threshold:
            raise SecAggError(f"{count} survivors, fewer than the threshold {self.params.threshold}", field="survivors")

    def unmask(
        self,
        release: bytes,
        length: int,
        mask_keys: dict[int, bytes],
        masked: dict[int, np.ndarray],
        replies: dict[int, dict[str, dict[int, bytes]]],
    ) -> np.ndarray:
        """The sum modulo ``2**bits`` of the survivors' inputs (uint64, ``length`` words).

        ``mask_keys``: ``{node: mask public key}`` of every node that completed ``share``;
        ``masked``: ``{survivor: y}``; ``replies``: ``{survivor: its unmask reply}``. Raises
        SecAggError (releasing nothing) if a survivor's self-mask seed or a dropped node's mask
        key lacks ``threshold`` shares, if a recovered mask key does not match, or if there are
        fewer than ``threshold`` survivors.
        """
        release = _check_release(release)
        length = _check_int(length, "length", 0)
        done = _id_set(mask_keys, "mask_keys")
        alive = _id_set(masked, "masked")
        if alive - done:
            raise SecAggError(f"nodes {sorted(alive - done)} have no mask key", field="masked")
        self._check_survivor_count(len(alive))
        gone = done - alive
        seed_shares, key_shares = self._collect(replies, alive, gone)
        self._check_enough(seed_shares, alive, key_shares, gone)
        seeds = self._recover(seed_shares, alive)
        keys = self._recover(key_shares, gone)
        self._check_keys(keys, mask_keys)
        total = self._sum(masked, length)
        for v in sorted(alive):
            total -= expand_mask(seeds[v], release, length, self.params.bits)
        for v in sorted(gone):
            self._remove_pairwise(total, release, v, _private_key(keys[v]), mask_keys, alive)
        total &= self.params.modulus_mask
        return total

    def _collect(
        self, replies: dict[int, dict[str, dict[int, bytes]]], alive: set[int], gone: set[int]
    ) -> tuple[dict[int, dict[int, bytes]], dict[int, dict[int, bytes]]]:
        """``({survivor: {index: share}}, {dropped: {index: share}})`` from the replies."""
        seed_shares: dict[int, dict[int, bytes]] = {}
        key_shares: dict[int, dict[int, bytes]] = {}
        for holder, reply in replies.items():
            if holder not in alive:
                raise SecAggError(
                    f"unmask reply from node {holder}, which is not a survivor", field="replies", node=holder
                )
            if not isinstance(reply, dict) or set(reply) != {_SELF, _PAIRWISE}:
                raise SecAggError(f"malformed unmask reply from node {holder}", field="replies", node=holder)
            for kind, wanted, into in ((_SELF, alive, seed_shares), (_PAIRWISE, gone, key_shares)):
                for owner, blob in reply[kind].items():
                    self._add_share(into, holder, owner, blob, wanted)
        return seed_shares, key_shares

    def _add_share(
        self, into: dict[int, dict[int, bytes]], holder: int, owner: int, blob: object, wanted: set[int]
    ) -> None:
        if owner not in wanted or (owner != holder and owner not in self.graph.get(holder, ())):
            raise SecAggError(f"node {holder} sent an unexpected share of node {owner}", field="replies", node=holder)
        index, share = _decode_share(blob, holder, owner, self.params.degree)
        # the owner gave share i + 1 to its i-th neighbour (sorted ids) and kept degree + 1
        expected = self.params.degree + 1 if owner == holder else self.graph[owner].index(holder) + 1
        if index != expected:
            raise SecAggError(
                f"share of node {owner} from node {holder} has index {index}, not the holder's {expected}",
                field="replies",
                node=holder,
            )
        slot = into.setdefault(owner, {})
        if index in slot:
            raise SecAggError(
                f"duplicate share index {index} of node {owner} (from node {holder})", field="replies", node=holder
            )
        slot[index] = share

    def _check_enough(
        self,
        seed_shares: dict[int, dict[int, bytes]],
        alive: set[int],
        key_shares: dict[int, dict[int, bytes]],
        gone: set[int],
    ) -> None:
        """SecAggError naming every survivor and dropped node short of ``threshold`` shares."""
        t = self.params.threshold
        short_seed = sorted(v for v in alive if len(seed_shares.get(v, {})) < t)
        short_key = sorted(v for v in gone if len(key_shares.get(v, {})) < t)
        if not (short_seed or short_key):
            return
        parts = []
        if short_seed:
            parts.append(f"the self-mask seed of nodes {short_seed}")
        if short_key:
            parts.append(f"the mask key of nodes {short_key}")
        raise SecAggError(
            f"fewer than {t} shares of " + " and of ".join(parts), field="replies", node=(short_seed or short_key)[0]
        )

    def _recover(self, shares: dict[int, dict[int, bytes]], owners: set[int]) -> dict[int, bytes]:
        """The 32-byte secret of every owner from its ``threshold`` lowest-index shares."""
        t = self.params.threshold
        return {v: _combine(sorted(shares[v].items())[:t]) for v in owners}

    @staticmethod
    def _check_keys(keys: dict[int, bytes], mask_keys: dict[int, bytes]) -> None:
        for v, raw in keys.items():
            if _public_bytes(_private_key(raw)) != bytes(mask_keys[v]):
                raise SecAggError(
                    f"recovered mask key of node {v} does not match its public key", field="replies", node=v
                )

    def _sum(self, masked: dict[int, np.ndarray], length: int) -> np.ndarray:
        total = np.zeros(length, dtype=np.uint64)
        for u, y in masked.items():
            if not isinstance(y, np.ndarray) or y.dtype != np.uint64 or y.shape != (length,):
                raise SecAggError(f"masked vector of node {u} is not {length} uint64 words", field="masked", node=u)
            total += y
        return total

    def _remove_pairwise(
        self,
        total: np.ndarray,
        release: bytes,
        v: int,
        key: X25519PrivateKey,
        mask_keys: dict[int, bytes],
        alive: set[int],
    ) -> None:
        """Undo, in place, the masks that survivors added for their dropped neighbour ``v``."""
        for u in self.graph[v]:
            if u not in alive:
                continue
            m = expand_mask(_pairwise_secret(key, mask_keys[u], u), release, total.size, self.params.bits)
            if u < v:
                total -= m  # u added +m
            else:
                total += m
