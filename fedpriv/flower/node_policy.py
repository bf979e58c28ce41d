"""A node's own privacy policy: what this node agrees to send, whatever a message asks.

A secure-mode node protects its users only if it refuses what a deviating server might ask:
plaintext statistics, a plan with too little noise, more releases than its budget, a key file
whose bytes the server knows. The policy that decides comes from the **node's own
configuration**, never from a message nor from the run config (which, in a deployment, whoever
submits the run writes):

- ``context.node_config`` keys ``policy-*`` (a SuperNode's ``--node-config``; ``fedpriv deploy``
  writes them, :func:`node_config_items`);
- else the JSON file named by the environment variable ``FEDPRIV_NODE_POLICY`` (the engines
  where the user operates every node writes it from the user's own options: the ``flwr run``
  launcher, the Flower simulation, the in-process grid of the tests and the red team);
- else :data:`DEFAULT`.

Fields (:class:`NodePolicy`):

``aggregation``
    ``"secure"``: only the secure-summation handlers answer (``secagg_*``, ``info``,
    ``pam_info`` and the recommendation's picks); every plaintext handler refuses.
    ``"central"`` or ``"any"``: the plaintext handlers answer too (central mode trusts the server).
``max_epsilon`` / ``delta``
    The node's budget: every secure release this node adds a noise share to is recorded in a
    node-side ledger (``context.state``, per run) as the node sees it (its own sensitivity, its
    own contributor assumptions), composed with dp-accounting
    (:func:`fedpriv.privacy.accounting.epsilon_rdp`); a release that would bring it above
    ``max_epsilon`` at ``delta`` is refused before the node draws its share.
``min_noise_multiplier``
    Each part of a plan must carry, as the node sees it, at least this noise std per unit of
    the node's own sensitivity.
``min_contributors`` / ``colluders``
    The node assumes at least ``min_contributors`` nodes' shares in every sum, ``colluders`` of
    which may be known to the server: the noise it counts on is its share variance times
    ``min_contributors - colluders``, whatever the plan claims. None: the plan's own values
    (trusts the server).
``max_secure_sums``
    At most this many noised secure sums per run (None: only the budget limits them).
``reproducible``
    Whether a key file named in a message may be read (reproducible noise,
    :mod:`fedpriv.flower.node_secrets`); otherwise such a message is refused.

The default (nothing configured) is safe: central and secure both answered (an unconfigured
node cannot know which the user chose), no key file read, and a budget of epsilon 10 at delta
1e-5 counted as if only the node's own share were secret (2 contributors, 1 colluder). Every
refusal is logged with its reason and becomes an error reply.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..errors import ConfigError, PrivacyError

log = logging.getLogger("fedpriv.flower")

POLICY_ENV = "FEDPRIV_NODE_POLICY"
PREFIX = "policy-"
MODES = ("any", "central", "secure")
LEDGER_KEY = "fedpriv-node-ledger"


@dataclass(frozen=True)
class NodePolicy:
    """The node's own privacy policy (see the module docstring)."""

    aggregation: str = "any"
    max_epsilon: float | None = 10.0
    delta: float = 1e-5
    min_noise_multiplier: float | None = None
    min_contributors: int | None = 2
    colluders: int | None = 1
    max_secure_sums: int | None = None
    reproducible: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "NodePolicy":
        if self.aggregation not in MODES:
            raise ConfigError(f"must be one of {', '.join(MODES)}, got {self.aggregation!r}", field="policy-aggregation")
        if self.max_epsilon is not None and not (self.max_epsilon > 0 and math.isfinite(self.max_epsilon)):
            raise ConfigError(f"must be a finite number > 0, got {self.max_epsilon!r}", field="policy-max-epsilon")
        if not (0 < self.delta < 1):
            raise ConfigError(f"must be in (0, 1), got {self.delta!r}", field="policy-delta")
        if self.min_noise_multiplier is not None and not (self.min_noise_multiplier > 0 and math.isfinite(self.min_noise_multiplier)):
            raise ConfigError(f"must be a finite number > 0, got {self.min_noise_multiplier!r}", field="policy-min-noise-multiplier")
        if (self.min_contributors is None) != (self.colluders is None):
            raise ConfigError("set both or neither of policy-min-contributors and policy-colluders", field="policy-min-contributors")
        if self.min_contributors is not None and not (0 <= self.colluders < self.min_contributors):
            raise ConfigError(f"must be in [0, policy-min-contributors={self.min_contributors}), got {self.colluders!r}", field="policy-colluders")
        if self.max_secure_sums is not None and self.max_secure_sums < 0:
            raise ConfigError(f"must be an integer >= 0, got {self.max_secure_sums!r}", field="policy-max-secure-sums")
        return self

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_mapping(cls, d: dict) -> "NodePolicy":
        """From ``{field: value}`` (JSON) or ``{"policy-field-name": value}`` (node config);
        "none" or null clears an optional field. Unknown keys are an error naming the key."""
        names = {f.name: f for f in fields(cls)}
        kw = {}
        for key, value in d.items():
            name = str(key).removeprefix(PREFIX).replace("-", "_")
            if name not in names:
                raise ConfigError(f"unknown node policy key (known: {', '.join(PREFIX + n.replace('_', '-') for n in names)})", field=str(key))
            kw[name] = _parse(name, value)
        return cls(**kw)

    @classmethod
    def permissive(cls) -> "NodePolicy":
        """No policy at all (the behaviour before node policies): every handler answers, any plan
        is trusted, key files are read. Tests and the red team's positive controls only."""
        return cls("any", None, 1e-5, None, None, None, None, True)

    @classmethod
    def for_run(cls, *, aggregation: str, epsilon: float | None, delta: float, nodes: int, dropout: float = 0.0, collusion: int = 1,
                reproducible: bool = False) -> "NodePolicy":
        """The policy the user writes for nodes the user operates (simulation, ``flwr run``, the
        in-process grid) from the user's own run options: the mode, the run's (epsilon, delta)
        as the node's budget, the contributors the run's dropout allows and its colluders, and
        reproducible noise only when a noise seed was given. An honest run stays within it."""
        secure = aggregation == "secure"
        m = max(1, int(nodes) - math.floor(float(dropout) * int(nodes)))
        c = int(collusion)
        assume = secure and 0 <= c < m
        return cls("secure" if secure else "any", float(epsilon) if (secure and epsilon is not None) else None, float(delta), None,
                   m if assume else None, c if assume else None, None, bool(reproducible))

    @classmethod
    def for_config(cls, config, *, epsilon: float | None, delta: float, nodes: int, reproducible: bool) -> "NodePolicy":
        """:meth:`for_run` from an algorithm configuration (its ``aggregation`` options)."""
        agg = getattr(config, "aggregation", None)
        if agg is None:
            return cls.for_run(aggregation="central", epsilon=epsilon, delta=delta, nodes=nodes, reproducible=reproducible)
        return cls.for_run(aggregation=agg.mode, epsilon=epsilon, delta=delta, nodes=nodes, dropout=agg.dropout, collusion=agg.collusion, reproducible=reproducible)

    def with_changes(self, **kw) -> "NodePolicy":
        return replace(self, **kw)

    # ------------------------------------------------------------------ writing
    def to_dict(self) -> dict:
        return asdict(self)

    def write(self, path: str | Path) -> str:
        """The policy as a JSON file (for ``FEDPRIV_NODE_POLICY``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return str(path)

    def node_config_items(self) -> dict[str, str | int | float | bool]:
        """The ``policy-*`` keys of a SuperNode's ``--node-config`` ("none" for an unset field)."""
        out = {}
        for k, v in self.to_dict().items():
            out[PREFIX + k.replace("_", "-")] = "none" if v is None else v
        return out


def _parse(name: str, value):
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
        if name in ("aggregation", "delta", "reproducible"):
            raise ConfigError("must be set", field=PREFIX + name.replace("_", "-"))
        return None
    try:
        if name == "aggregation":
            return str(value)
        if name == "reproducible":
            if isinstance(value, str):
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                return value.lower() == "true"
            return bool(value)
        if name in ("min_contributors", "colluders", "max_secure_sums"):
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError(value)
            return int(float(value))
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"not a valid value: {value!r}", field=PREFIX + name.replace("_", "-")) from None


DEFAULT = NodePolicy()


def node_policy(context) -> NodePolicy:
    """This node's policy: its node config's ``policy-*`` keys, else the file named by
    ``FEDPRIV_NODE_POLICY``, else :data:`DEFAULT`. Never the run config, never a message."""
    cfg = getattr(context, "node_config", None) or {}
    keys = {k: v for k, v in cfg.items() if str(k).startswith(PREFIX)}
    if keys:
        return NodePolicy.from_mapping(keys)
    path = os.environ.get(POLICY_ENV)
    if path:
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the node policy file {path!r}: {exc}", field=POLICY_ENV) from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: a node policy file holds one JSON object", field=POLICY_ENV)
        return NodePolicy.from_mapping(d)
    return DEFAULT


def refuse(what: str, why: str, exc=PermissionError):
    """Log and raise the refusal (an error reply on a SuperNode)."""
    log.warning("node policy: refused %s: %s", what, why)
    return exc(f"node policy: refused {what}: {why}")


# ---------------------------------------------------------------------------- (a) plaintext handlers
def plaintext(handler, what: str | None = None):
    """``handler`` answered only where the node's policy accepts plaintext replies (not secure)."""
    name = what or getattr(handler, "__name__", "handler")

    def guarded(msg, context):
        if node_policy(context).aggregation == "secure":
            raise refuse(f"plaintext handler {name!r}", "this node is configured for secure aggregation (policy-aggregation=secure)")
        return handler(msg, context)

    guarded.__name__ = getattr(handler, "__name__", name)
    guarded.__doc__ = handler.__doc__
    return guarded


# ---------------------------------------------------------------------------- (b, e) the node ledger
def _ledger(context) -> list[dict]:
    rec = context.state.config_records.get(LEDGER_KEY)
    if rec is None or int(rec.get("run", -1)) != int(getattr(context, "run_id", 0) or 0):
        return []
    return json.loads(str(rec["records"]))


def _save_ledger(context, records: list[dict]) -> None:
    from flwr.app import ConfigRecord

    context.state[LEDGER_KEY] = ConfigRecord({"run": int(getattr(context, "run_id", 0) or 0), "records": json.dumps(records)})


def _releases(records: list[dict]):
    """Ledger records (merged by kind, as the server's ledger merges them)."""
    from ..privacy.records import Release

    merged: dict[tuple, Release] = {}
    for r in records:
        rel = Release(r["name"], "skellam", float(r["delta2"]), float(r["std"]), 1, None, int(r["dim"]), 1, l1_sensitivity=float(r["delta1"]),
                      shares=int(r["shares"]), colluders=int(r["colluders"]))
        merged[rel.key()] = merged[rel.key()].merged(rel) if rel.key() in merged else rel
    return list(merged.values())


def node_epsilon(records: list[dict], delta: float) -> float:
    """Epsilon (dp-accounting, RDP) of the releases this node contributed to, per user: records of
    disjoint user groups (one group of G per release) compose in parallel when every grouped
    record names the same G; otherwise every record counts for every user."""
    from ..privacy.accounting import epsilon_rdp

    common = [r for r in records if r.get("group") is None]
    grouped = [r for r in records if r.get("group") is not None]
    sizes = {int(r["group"][0]) for r in grouped}
    if len(sizes) > 1:
        return epsilon_rdp(_releases(records), delta)
    labels = sorted({int(r["group"][1]) for r in grouped}) or [None]
    return max(epsilon_rdp(_releases(common + [r for r in grouped if int(r["group"][1]) == g]), delta) for g in labels)


def check_plan(context, kind: str, plan, own_parts: list[tuple[str, int, float]], group: tuple[int, int] | None = None) -> None:
    """Check a noised plan against this node's policy before it draws its share, and record it in
    the node ledger. ``own_parts``: [(name, length, L2 sensitivity)] that the node's own
    clipping gives to what it encodes (from the state it computes its values with).

    Refused (logged, PrivacyError): a part the node does not compute, or of another length; a
    declared sensitivity below the node's own bound; noise per unit of the node's sensitivity
    below ``min_noise_multiplier``; a release that brings the node's epsilon above
    ``max_epsilon``; more than ``max_secure_sums`` noised sums in the run."""
    policy = node_policy(context)
    own = {name: (int(length), float(sens)) for name, length, sens in own_parts}
    names = [p.name for p in plan.parts]
    if sorted(names) != sorted(own):
        raise refuse(f"secure round {kind!r}", f"the plan's parts {sorted(names)} are not the ones this node computes {sorted(own)}", PrivacyError)
    m = plan.min_contributors if policy.min_contributors is None else policy.min_contributors
    c = plan.colluders if policy.colluders is None else policy.colluders
    new = []
    for p in plan.parts:
        length, sens = own[p.name]
        if p.length != length:
            raise refuse(f"secure round {kind!r}", f"part {p.name!r} has {p.length} words, this node computes {length}", PrivacyError)
        if p.sensitivity < sens * (1 - 1e-9):
            raise refuse(f"secure round {kind!r}", f"part {p.name!r} declares sensitivity {p.sensitivity:g} below the bound {sens:g} of this node's own clipping", PrivacyError)
        delta2 = sens * p.scale + math.sqrt(p.length)  # integer units: the node's own bound, rounding included
        std = math.sqrt(plan.share_variance(p) * (m - c))  # the noise this node counts on
        if policy.min_noise_multiplier is not None and std < policy.min_noise_multiplier * delta2 * (1 - 1e-9):
            raise refuse(f"secure round {kind!r}", f"part {p.name!r} carries noise {std / delta2:.3g} x its sensitivity (with {m} contributors, {c} colluding), "
                                                   f"below this node's floor {policy.min_noise_multiplier:g}", PrivacyError)
        new.append({"name": p.name, "delta2": delta2, "delta1": min(delta2**2, math.sqrt(p.length) * delta2), "std": std, "dim": p.length,
                    "shares": m, "colluders": c, "group": list(group) if group is not None else None})
    records = _ledger(context)
    sums = 1 + len({r["sum"] for r in records})
    if policy.max_secure_sums is not None and sums > policy.max_secure_sums:
        raise refuse(f"secure round {kind!r}", f"this node joins at most {policy.max_secure_sums} noised secure sums per run (policy-max-secure-sums)", PrivacyError)
    for r in new:
        r["sum"] = sums
    after = records + new
    if policy.max_epsilon is not None:
        eps = node_epsilon(after, policy.delta)
        if not eps <= policy.max_epsilon * (1 + 1e-3):
            raise refuse(f"secure round {kind!r}", f"it would bring this node's epsilon to {eps:.4g} > its budget {policy.max_epsilon:g} (delta {policy.delta:g}); "
                                                   "no noise share was drawn", PrivacyError)
    _save_ledger(context, after)


def spent(context) -> float:
    """The node ledger's epsilon at the policy's delta (0 before any release)."""
    records = _ledger(context)
    return node_epsilon(records, node_policy(context).delta) if records else 0.0


# ---------------------------------------------------------------------------- (c) key files
def check_key_file(context, path: str) -> None:
    """A key file named in a message is read only where the node's operator enabled
    reproducible noise; otherwise refused (its bytes may be the server's)."""
    if not node_policy(context).reproducible:
        raise refuse(f"the key file {path!r} named by the server", "this node's policy does not enable reproducible noise (policy-reproducible=false): "
                     "a key whose bytes the server may know would make its noise shares predictable", PrivacyError)


__all__ = ["DEFAULT", "NodePolicy", "POLICY_ENV", "check_key_file", "check_plan", "node_epsilon", "node_policy", "plaintext", "refuse", "spent"]
