"""Authenticated key agreement for the secure summation (:mod:`fedpriv.privacy.secagg`).

Every node holds a long-term Ed25519 *signing key* provisioned by its operator, and a *roster*
(``{roster name: signing public key}``) that the deployer distributes out of band, never
through the aggregating server. With them:

* a node signs the channel key it advertises, bound to its roster name, its (server-assigned)
  node id and the run (:func:`advert_message`); its neighbours check the signature against the
  roster before they encrypt a share to that key, so a server that hands a node keys of its own
  in place of its neighbours' is refused;
* before the unmask round a node signs the release's view it was shown (the public graph, the
  survivors and the dropped nodes: :func:`view_digest`, :func:`view_message`), and reveals shares
  only when ``threshold`` share holders (itself and its neighbours) signed the same view
  (Bonawitz et al. 2017, the malicious-server variant's consistency check).

The module is pure Python over ``cryptography``; files (a node's key folder) are read by
:func:`load_identity`. A folder holds ``signing_key.pem`` (PKCS#8, unencrypted, mode 0600) and
``roster.json`` (``{"version": 1, "algorithm": "ed25519", "nodes": {name: hex public key}}``);
the node's own name is the roster entry whose public key is its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import PrivacyError

__all__ = [
    "KEY_FILE",
    "ROSTER_FILE",
    "IdentityError",
    "NodeIdentity",
    "advert_message",
    "load_identity",
    "view_digest",
    "view_message",
    "write_identities",
]

KEY_FILE = "signing_key.pem"
ROSTER_FILE = "roster.json"
ROSTER_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64

_ADVERT = b"fedpriv secagg advert v1"
_VIEW = b"fedpriv secagg view v1"
_VIEW_SIG = b"fedpriv secagg view signature v1"


class IdentityError(PrivacyError):
    """A node's signing key or roster is missing or malformed; ``field`` names what."""

    def __init__(self, message: str, *, field: str | None = None):
        self.field = field
        super().__init__((f"{field}: " if field else "") + message)


def _field(data: bytes) -> bytes:
    """``data`` with its length in front (so that concatenated fields cannot be re-split)."""
    return struct.pack(">I", len(data)) + data


def _id16(node: int) -> bytes:
    return int(node).to_bytes(16, "big", signed=True)


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def advert_message(context: bytes, node_id: int, name: str, channel_key: bytes) -> bytes:
    """What a node signs when it advertises ``channel_key``: the run ``context`` (the node's own
    run id and the job label), its node id (assigned by the server), its roster ``name``."""
    return _ADVERT + _field(bytes(context)) + _id16(node_id) + _field(name.encode()) + _field(bytes(channel_key))


def view_digest(
    context: bytes, release: bytes, graph: bytes, survivors: Collection[int], dropped: Collection[int]
) -> bytes:
    """SHA-256 of one release's view: run context, release label, the graph (digest of the
    members, degree and seed the node was shown), the sorted survivors and dropped nodes."""
    h = hashlib.sha256(_VIEW)
    for part in (bytes(context), bytes(release), bytes(graph)):
        h.update(_field(part))
    for ids in (survivors, dropped):
        ids = sorted(int(v) for v in ids)
        h.update(struct.pack(">I", len(ids)) + b"".join(_id16(v) for v in ids))
    return h.digest()


def view_message(digest: bytes, node_id: int) -> bytes:
    """What node ``node_id`` signs in the consistency round for the view ``digest``."""
    return _VIEW_SIG + _field(bytes(digest)) + _id16(node_id)


def graph_digest(members: Iterable[int], degree: int, seed: bytes) -> bytes:
    """SHA-256 of the public neighbour graph's inputs (sorted members, degree, seed)."""
    ids = sorted(int(v) for v in members)
    return hashlib.sha256(
        b"fedpriv secagg graph v1"
        + struct.pack(">II", len(ids), int(degree))
        + b"".join(_id16(v) for v in ids)
        + _field(bytes(seed))
    ).digest()


@dataclass(frozen=True)
class NodeIdentity:
    """A node's long-term signing key, its roster name and the roster it trusts.

    ``roster``: ``{name: raw 32-byte Ed25519 public key}``, from the node's own configuration."""

    name: str
    key: Ed25519PrivateKey
    roster: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if self.roster.get(self.name) != _raw_public(self.key.public_key()):
            raise IdentityError(f"the roster does not list this node's public key under {self.name!r}", field="roster")

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(bytes(message))

    def verify(self, name: object, message: bytes, signature: object) -> bool:
        """Whether ``signature`` is ``name``'s over ``message`` (False for a name not in the
        roster or a malformed signature)."""
        public = self.roster.get(name) if isinstance(name, str) else None
        if public is None or not isinstance(signature, (bytes, bytearray)) or len(signature) != SIGNATURE_BYTES:
            return False
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(bytes(signature), bytes(message))
        except (InvalidSignature, ValueError):
            return False
        return True


# ------------------------------------------------------------------------------- files


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def write_identities(folder: str | os.PathLike, names: Iterable[str]) -> dict[str, Path]:
    """One identity folder per name under ``folder`` (``folder/NAME/signing_key.pem``, mode
    0600, and a copy of the common ``roster.json``); also ``folder/roster.json``. Returns
    ``{name: its folder}``. What a deployer does once per deployment (or a launcher per run)."""
    root = Path(folder)
    names = list(names)
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            raise IdentityError(f"bad node name {name!r} (letters, digits, '.', '_', '-')", field="names")
    if len(set(names)) != len(names):
        raise IdentityError("node names must be distinct", field="names")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    keys = {name: Ed25519PrivateKey.generate() for name in names}
    roster = (
        json.dumps(
            {
                "version": ROSTER_VERSION,
                "algorithm": "ed25519",
                "nodes": {n: _raw_public(k.public_key()).hex() for n, k in keys.items()},
            },
            indent=1,
        )
        + "\n"
    )
    (root / ROSTER_FILE).write_text(roster)
    out = {}
    for name, key in keys.items():
        d = root / name
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o700)
        _write_private(
            d / KEY_FILE,
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )
        (d / ROSTER_FILE).write_text(roster)
        out[name] = d
    return out


def read_roster(path: str | os.PathLike) -> dict[str, bytes]:
    """``{name: raw public key}`` of a ``roster.json``; IdentityError naming the field."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise IdentityError(f"cannot read {path}: {exc}", field="roster") from None
    if not isinstance(doc, dict) or doc.get("version") != ROSTER_VERSION or doc.get("algorithm") != "ed25519":
        raise IdentityError(f"{path}: expected version {ROSTER_VERSION} and algorithm 'ed25519'", field="roster")
    nodes = doc.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        raise IdentityError(f"{path}: 'nodes' must map names to public keys", field="roster.nodes")
    out = {}
    for name, hexkey in nodes.items():
        try:
            raw = bytes.fromhex(hexkey)
        except (TypeError, ValueError):
            raw = b""
        if not _NAME.match(name) or len(raw) != _PUBLIC_BYTES:
            raise IdentityError(f"{path}: bad entry {name!r}", field="roster.nodes")
        out[name] = raw
    if len(set(out.values())) != len(out):
        raise IdentityError(f"{path}: two names share a public key", field="roster.nodes")
    return out


def load_identity(folder: str | os.PathLike) -> NodeIdentity:
    """The identity in ``folder`` (``signing_key.pem``, ``roster.json``); IdentityError if a
    file is missing, malformed, readable by others, or the key is not in the roster."""
    folder = Path(folder)
    key_path = folder / KEY_FILE
    try:
        mode = key_path.stat().st_mode
        data = key_path.read_bytes()
    except OSError as exc:
        raise IdentityError(f"cannot read {key_path}: {exc}", field="signing_key") from None
    if os.name == "posix" and mode & 0o077:
        raise IdentityError(
            f"{key_path} is readable by group or others (mode {mode & 0o777:o}); chmod 600 it", field="signing_key"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(f"{key_path}: not an unencrypted PEM private key ({exc})", field="signing_key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"{key_path}: an Ed25519 key is needed", field="signing_key")
    roster = read_roster(folder / ROSTER_FILE)
    own = _raw_public(key.public_key())
    names = [n for n, k in roster.items() if k == own]
    if not names:
        raise IdentityError(f"{folder / ROSTER_FILE} does not list this node's public key", field="roster")
    return NodeIdentity(names[0], key, roster)
