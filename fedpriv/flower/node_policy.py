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
    ``block_info`` and the recommendation's picks); every plaintext handler refuses.
    ``"central"`` or ``"any"``: the plaintext handlers answer too (central mode trusts the server).
``max_epsilon`` / ``delta`` / ``relation``
    The node's budget: every secure release this node adds a noise share to is recorded in a
    node-side ledger (:class:`NodeLedger`) as the node sees it (its own sensitivity, its own
    contributor assumptions), composed with dp-accounting
    (:func:`fedpriv.privacy.accounting.epsilon_rdp`) under ``relation`` (``add_remove``, or
    ``replace_one`` where the enrolled count is public, as in a deployment); a release that
    would bring it above ``max_epsilon`` at ``delta`` is refused before the node draws its share.
``ledger`` / ``period_days``
    Where the node ledger lives: a file on the node's disk (``{partition}`` is replaced by the
    node's partition id), written atomically before the node replies and read by every later
    message, run and restart, so the budget holds over the node's lifetime, or over the last
    ``period_days`` days. None: in ``context.state``, for one run only (a new run id starts a
    fresh ledger): only for nodes that live for one run (a simulation).
``max_recommend_epsilon`` / ``max_recommendations``
    The recommendation handler's own budget: the pure epsilon of the node's local-DP picks,
    composed over its lifetime (basic composition; doubled under replace-one), and the number
    of recommendation queries it answers per run. The message's epsilon is checked against
    both and recorded before any pick is drawn. The node's whole guarantee is the budget of its
    sums and this one, composed.
``max_measurements``
    Exact measurement sums (evaluation totals) per run.
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

The default (nothing configured): central and secure both answered (an unconfigured node
cannot know which the user chose), no key file read, a budget of epsilon 10 at delta 1e-5
counted as if only the node's own share were secret (2 contributors, 1 colluder), per run in
memory, recommendation picks capped at epsilon 1 (one query per run). ``fedpriv deploy`` writes
a secure policy with a ledger on the node's disk. Every refusal is logged with its reason and the
defence that refused (``[identifier]``, :mod:`fedpriv.privacy.defences`) and becomes an error
reply.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..errors import ConfigError, PrivacyError
from ..privacy import defences

log = logging.getLogger("fedpriv.flower")

POLICY_ENV = "FEDPRIV_NODE_POLICY"
PREFIX = "policy-"
MODES = ("any", "central", "secure")
RELATIONS = (
    "add_remove",
    "replace_one",
)  # fedpriv.privacy.accounting's (imported lazily: a node's start-up stays light)
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
    relation: str = "add_remove"
    ledger: str | None = None
    period_days: float | None = None
    max_recommend_epsilon: float | None = 1.0
    max_recommendations: int | None = 1
    max_measurements: int | None = 64

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "NodePolicy":
        if self.aggregation not in MODES:
            raise ConfigError(
                f"must be one of {', '.join(MODES)}, got {self.aggregation!r}", field="policy-aggregation"
            )
        if self.max_epsilon is not None and not (self.max_epsilon > 0 and math.isfinite(self.max_epsilon)):
            raise ConfigError(f"must be a finite number > 0, got {self.max_epsilon!r}", field="policy-max-epsilon")
        if not (0 < self.delta < 1):
            raise ConfigError(f"must be in (0, 1), got {self.delta!r}", field="policy-delta")
        if self.min_noise_multiplier is not None and not (
            self.min_noise_multiplier > 0 and math.isfinite(self.min_noise_multiplier)
        ):
            raise ConfigError(
                f"must be a finite number > 0, got {self.min_noise_multiplier!r}", field="policy-min-noise-multiplier"
            )
        if (self.min_contributors is None) != (self.colluders is None):
            raise ConfigError(
                "set both or neither of policy-min-contributors and policy-colluders", field="policy-min-contributors"
            )
        if self.min_contributors is not None and not (0 <= self.colluders < self.min_contributors):
            raise ConfigError(
                f"must be in [0, policy-min-contributors={self.min_contributors}), got {self.colluders!r}",
                field="policy-colluders",
            )
        for name in ("max_secure_sums", "max_recommendations", "max_measurements"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"must be an integer >= 0, got {value!r}", field=PREFIX + name.replace("_", "-"))
        if self.relation not in RELATIONS:
            raise ConfigError(f"must be one of {', '.join(RELATIONS)}, got {self.relation!r}", field="policy-relation")
        for name in ("period_days", "max_recommend_epsilon"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"must be a finite number > 0, got {value!r}", field=PREFIX + name.replace("_", "-"))
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
                raise ConfigError(
                    f"unknown node policy key (known: {', '.join(PREFIX + n.replace('_', '-') for n in names)})",
                    field=str(key),
                )
            kw[name] = _parse(name, value)
        return cls(**kw)

    @classmethod
    def permissive(cls) -> "NodePolicy":
        """No policy at all (the behaviour before node policies): every handler answers, any plan
        is trusted, key files are read. Tests and the red team's positive controls only."""
        return cls(
            "any",
            None,
            1e-5,
            None,
            None,
            None,
            None,
            True,
            max_recommend_epsilon=None,
            max_recommendations=None,
            max_measurements=None,
        )

    @classmethod
    def for_run(
        cls,
        *,
        aggregation: str,
        epsilon: float | None,
        delta: float,
        nodes: int,
        dropout: float = 0.0,
        collusion: int = 1,
        reproducible: bool = False,
        ledger: str | None = None,
        recommend=None,
    ) -> "NodePolicy":
        """The policy the user writes for nodes the user operates (simulation, ``flwr run``, the
        in-process grid) from the user's own run options: the mode, the run's (epsilon, delta)
        as the node's budget, the contributors the run's dropout allows and its colluders, and
        reproducible noise only when a noise seed was given; ``ledger``: where the node ledger
        lives (``{partition}`` replaced by the node's partition id; None: in memory, one run);
        ``recommend``: the run's recommendation phase (a
        :class:`fedpriv.algorithms.recommend.RecommendConfig`), or None: its pick epsilon raises
        the recommendation cap to it (one query per run), and its score histogram (a noised
        secure sum at ``hist_epsilon``, quantile source) is added to the budget of the sums. An
        honest run stays within it."""
        secure = aggregation == "secure"
        m = max(1, int(nodes) - math.floor(float(dropout) * int(nodes)))
        c = int(collusion)
        assume = secure and 0 <= c < m
        rec = (
            DEFAULT.max_recommend_epsilon
            if recommend is None
            else max(float(recommend.epsilon), DEFAULT.max_recommend_epsilon)
        )
        budget = float(epsilon) if (secure and epsilon is not None) else None
        if budget is not None and recommend is not None and recommend.sensitivity == "quantile":
            # the histogram is (hist_epsilon, hist_delta)-DP with hist_delta <= delta: by composition
            # (zCDP's conversion is subadditive) the sums stay within epsilon + hist_epsilon at delta
            budget += float(recommend.hist_epsilon)
        return cls(
            "secure" if secure else "any",
            budget,
            float(delta),
            None,
            m if assume else None,
            c if assume else None,
            None,
            bool(reproducible),
            ledger=ledger,
            max_recommend_epsilon=rec,
        )

    @classmethod
    def for_config(
        cls,
        config,
        *,
        epsilon: float | None,
        delta: float,
        nodes: int,
        reproducible: bool,
        ledger: str | None = None,
        recommend=None,
    ) -> "NodePolicy":
        """:meth:`for_run` from an algorithm configuration (its ``aggregation`` options)."""
        agg = getattr(config, "aggregation", None)
        kw = dict(
            epsilon=epsilon, delta=delta, nodes=nodes, reproducible=reproducible, ledger=ledger, recommend=recommend
        )
        if agg is None:
            return cls.for_run(aggregation="central", **kw)
        return cls.for_run(aggregation=agg.mode, dropout=agg.dropout, collusion=agg.collusion, **kw)

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
        if name in ("aggregation", "delta", "reproducible", "relation"):
            raise ConfigError("must be set", field=PREFIX + name.replace("_", "-"))
        return None
    try:
        if name in ("aggregation", "relation", "ledger"):
            return str(value)
        if name == "reproducible":
            if isinstance(value, str):
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                return value.lower() == "true"
            return bool(value)
        if name in ("min_contributors", "colluders", "max_secure_sums", "max_recommendations", "max_measurements"):
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


def refuse(what: str, why: str, exc=PermissionError, defence: str = "plaintext-handler"):
    """Log and raise the refusal (an error reply on a SuperNode), naming its ``defence``
    (:mod:`fedpriv.privacy.defences`)."""
    log.warning("node policy: refused %s: %s %s", what, why, defences.tag(defence))
    return exc(f"node policy: refused {what}: {why} {defences.tag(defence)}")


def _on(defence: str) -> bool:
    return defences.active(defence)


# ---------------------------------------------------------------------------- (a) plaintext handlers
def plaintext(handler, what: str | None = None):
    """``handler`` answered only where the node's policy accepts plaintext replies (not secure)."""
    name = what or getattr(handler, "__name__", "handler")

    def guarded(msg, context):
        if node_policy(context).aggregation == "secure" and _on("plaintext-handler"):
            raise refuse(
                f"plaintext handler {name!r}",
                "this node is configured for secure aggregation (policy-aggregation=secure)",
            )
        return handler(msg, context)

    guarded.__name__ = getattr(handler, "__name__", name)
    guarded.__doc__ = handler.__doc__
    return guarded


# ---------------------------------------------------------------------------- the node ledger
class NodeLedger:
    """What this node released, as it sees it: one record per noised secure part
    (``"mechanism": "skellam"``), per recommendation query (``"selection"``, its pure epsilon)
    and per exact measurement (``"measurement"``, no epsilon), each with its run id and time.

    Where it lives (the node's own configuration, never a message): the file the policy's
    ``ledger`` names (``{partition}`` replaced by the node's partition id), written atomically
    under a lock before the node replies, and read back by every later message, run and
    restart: the budget holds over the node's lifetime (or the policy's ``period_days``). With
    no ``ledger`` configured it lives in ``context.state`` and holds for one run only (a new run
    id starts a fresh one): a weaker guarantee, logged once."""

    VERSION = 1

    def __init__(self, context, policy: NodePolicy):
        self.context, self.policy = context, policy
        self.run = int(getattr(context, "run_id", 0) or 0)
        self.path = ledger_path(context, policy)

    # -- storage
    def _read_all(self) -> list[dict]:
        if self.path is None:
            rec = self.context.state.config_records.get(LEDGER_KEY)
            if rec is None or int(rec.get("run", -1)) != self.run:
                return []
            return json.loads(str(rec["records"]))
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:  # a ledger it cannot read: refuse rather than start afresh
            raise refuse(
                "to answer", f"its node ledger {self.path} cannot be read ({exc})", PrivacyError, "node-budget"
            ) from None
        if not isinstance(doc, dict) or doc.get("version") != self.VERSION or not isinstance(doc.get("records"), list):
            raise refuse(
                "to answer",
                f"its node ledger {self.path} is not a version-{self.VERSION} node ledger",
                PrivacyError,
                "node-budget",
            )
        return doc["records"]

    def records(self) -> list[dict]:
        """The records that count against the budget now (the policy's period, or all)."""
        out = self._read_all()
        if self.policy.period_days is not None:
            since = time.time() - 86400.0 * self.policy.period_days
            out = [r for r in out if float(r.get("time", 0.0)) >= since]
        return out

    def this_run(self) -> list[dict]:
        return [r for r in self._read_all() if int(r.get("run", -1)) == self.run]

    def append(self, new: list[dict]) -> None:
        now = time.time()
        new = [dict(r, run=self.run, time=now) for r in new]
        if self.path is None:
            from flwr.app import ConfigRecord

            self.context.state[LEDGER_KEY] = ConfigRecord(
                {"run": self.run, "records": json.dumps(self._read_all() + new)}
            )
            return
        from ..util.atomic import write_text

        write_text(
            self.path, json.dumps({"version": self.VERSION, "records": self._read_all() + new}) + "\n", mode=0o600
        )

    @contextlib.contextmanager
    def locked(self):
        """The file's lock for a read-check-write (another process of the same node may answer at once)."""
        if self.path is None:
            yield self
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as f:
            import fcntl

            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield self
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


_warned_memory = False


def ledger_path(context, policy: NodePolicy) -> Path | None:
    """The file of this node's ledger, or None (in memory, one run)."""
    global _warned_memory
    if policy.ledger is None:
        if (
            not _warned_memory and policy.aggregation == "secure" and policy.max_epsilon is not None
        ):  # a budget that lasts one run
            _warned_memory = True
            log.warning(
                "node policy: no policy-ledger configured: this node's budget is counted per run, in memory; "
                "a new run starts a fresh ledger (set policy-ledger for a lifetime budget)"
            )
        return None
    pid = int((getattr(context, "node_config", None) or {}).get("partition-id", 0))
    return Path(str(policy.ledger).replace("{partition}", str(pid)))


def _releases(records: list[dict]):
    """Ledger records (merged by kind, as the server's ledger merges them)."""
    from ..privacy.records import Release

    merged: dict[tuple, Release] = {}
    for r in records:  # noised secure parts only (node_epsilon filters them)
        rel = Release(
            r["name"],
            "skellam",
            float(r["delta2"]),
            float(r["std"]),
            1,
            None,
            int(r["dim"]),
            1,
            l1_sensitivity=float(r["delta1"]),
            shares=int(r["shares"]),
            colluders=int(r["colluders"]),
        )
        merged[rel.key()] = merged[rel.key()].merged(rel) if rel.key() in merged else rel
    return list(merged.values())


def _noised(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("mechanism", "skellam") == "skellam"]


def node_epsilon(records: list[dict], delta: float, relation: str = "add_remove") -> float:
    """Epsilon (dp-accounting, RDP, under ``relation``) of the noised secure releases this node
    contributed to, per user: records of disjoint user groups (one group of G per release)
    compose in parallel when every grouped record names the same G and comes from one run;
    otherwise every record counts for every user."""
    from ..privacy.accounting import epsilon_rdp

    records = _noised(records)
    if not records:
        return 0.0
    common = [r for r in records if r.get("group") is None]
    grouped = [r for r in records if r.get("group") is not None]
    sizes = {int(r["group"][0]) for r in grouped}
    runs = {r.get("run") for r in grouped}
    if len(sizes) > 1 or len(runs) > 1:
        return epsilon_rdp(_releases(records), delta, relation=relation)
    labels = sorted({int(r["group"][1]) for r in grouped}) or [None]
    return max(
        epsilon_rdp(_releases(common + [r for r in grouped if int(r["group"][1]) == g]), delta, relation=relation)
        for g in labels
    )


def recommend_epsilon(records: list[dict], relation: str = "add_remove") -> float:
    """The pure epsilon of this node's recommendation reports, by basic composition (each query
    is one local-DP report per user; replace-one doubles it)."""
    factor = 2.0 if relation == "replace_one" else 1.0
    return factor * sum(float(r["pure_epsilon"]) for r in records if r.get("mechanism") == "selection")


def _scale_rule(length: int, sensitivity: float) -> float:
    """The public rule of :func:`fedpriv.privacy.distributed.plan_round` for a part's scale."""
    from ..privacy.distributed import MIN_WORDS_PER_UNIT, ROUNDING_SHARE

    return max(MIN_WORDS_PER_UNIT, math.sqrt(max(int(length), 1)) / ROUNDING_SHARE) / float(sensitivity)


def check_plan(
    context, kind: str, plan, own_parts: list[tuple[str, int, float]], group: tuple[int, int] | None = None
) -> None:
    """Check a noised plan against this node's policy before it draws its share, and record it in
    the node ledger. ``own_parts``: [(name, length, L2 sensitivity)] that the node's own
    clipping gives to what it encodes (from the state it computes its values with).

    Refused (logged, PrivacyError, naming the defence): a part the node does not compute, or of
    another length, or a declared sensitivity below the node's own bound (``plan-parts``); a
    scale other than the public rule's (``plan-scale``); noise per unit of the node's
    sensitivity below ``min_noise_multiplier`` (``noise-floor``); more than ``max_secure_sums``
    noised sums in the run (``secure-sums``); a release that brings the node's epsilon (its
    ledger, across runs where the ledger is on disk) above ``max_epsilon`` (``node-budget``)."""
    policy = node_policy(context)
    own = {name: (int(length), float(sens)) for name, length, sens in own_parts}
    names = [p.name for p in plan.parts]
    what = f"secure round {kind!r}"
    if sorted(names) != sorted(own) and _on("plan-parts"):
        raise refuse(
            what,
            f"the plan's parts {sorted(names)} are not the ones this node computes {sorted(own)}",
            PrivacyError,
            "plan-parts",
        )
    m = plan.min_contributors if policy.min_contributors is None else policy.min_contributors
    c = plan.colluders if policy.colluders is None else policy.colluders
    new = []
    for p in plan.parts:
        length, sens = own.get(p.name, (p.length, p.sensitivity))
        if _on("plan-parts"):
            if p.length != length:
                raise refuse(
                    what,
                    f"part {p.name!r} has {p.length} words, this node computes {length}",
                    PrivacyError,
                    "plan-parts",
                )
            if p.sensitivity < sens * (1 - 1e-9):
                raise refuse(
                    what,
                    f"part {p.name!r} declares sensitivity {p.sensitivity:g} below the bound {sens:g} "
                    "of this node's own clipping",
                    PrivacyError,
                    "plan-parts",
                )
        rule = _scale_rule(p.length, p.sensitivity)
        if _on("plan-scale") and not math.isclose(p.scale, rule, rel_tol=1e-9):
            raise refuse(
                what,
                f"part {p.name!r} has scale {p.scale:.6g}, the public rule gives {rule:.6g} "
                "(a plan made for this node alone?)",
                PrivacyError,
                "plan-scale",
            )
        delta2 = sens * p.scale + math.sqrt(p.length)  # integer units: the node's own bound, rounding included
        std = math.sqrt(plan.share_variance(p) * (m - c))  # the noise this node counts on
        if (
            policy.min_noise_multiplier is not None
            and std < policy.min_noise_multiplier * delta2 * (1 - 1e-9)
            and _on("noise-floor")
        ):
            raise refuse(
                what,
                f"part {p.name!r} carries noise {std / delta2:.3g} x its sensitivity "
                f"(with {m} contributors, {c} colluding), below this node's floor {policy.min_noise_multiplier:g}",
                PrivacyError,
                "noise-floor",
            )
        new.append(
            {
                "mechanism": "skellam",
                "name": p.name,
                "delta2": delta2,
                "delta1": min(delta2**2, math.sqrt(p.length) * delta2),
                "std": std,
                "dim": p.length,
                "shares": m,
                "colluders": c,
                "group": list(group) if group is not None else None,
            }
        )
    ledger = NodeLedger(context, policy)
    with ledger.locked():
        sums = 1 + len({r["sum"] for r in _noised(ledger.this_run())})
        if policy.max_secure_sums is not None and sums > policy.max_secure_sums and _on("secure-sums"):
            raise refuse(
                what,
                f"this node joins at most {policy.max_secure_sums} noised secure sums per run (policy-max-secure-sums)",
                PrivacyError,
                "secure-sums",
            )
        for r in new:
            r["sum"] = sums
        if policy.max_epsilon is not None and _on("node-budget"):
            eps = node_epsilon(ledger.records() + [dict(r, run=ledger.run) for r in new], policy.delta, policy.relation)
            if not eps <= policy.max_epsilon * (1 + 1e-3):
                raise refuse(
                    what,
                    f"it would bring this node's epsilon to {eps:.4g} > its budget {policy.max_epsilon:g} "
                    f"(delta {policy.delta:g}, {policy.relation}, "
                    f"{'its ledger ' + str(ledger.path) if ledger.path else 'this run'}); no noise share was drawn",
                    PrivacyError,
                    "node-budget",
                )
        ledger.append(new)


def check_recommendation(context, epsilon: float, n_candidates: int) -> None:
    """Before a recommendation report (one local-DP pick per user of the node, pure
    ``epsilon``): refused when the run already had ``max_recommendations`` queries
    (``recommend-count``) or when the node's recommendation reports would compose above
    ``max_recommend_epsilon`` (``recommend-epsilon``); else recorded in the node ledger."""
    policy = node_policy(context)
    what = "the recommendation query"
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps > 0):
        raise refuse(what, f"its epsilon {epsilon!r} is not a finite number > 0", PrivacyError, "recommend-epsilon")
    ledger = NodeLedger(context, policy)
    with ledger.locked():
        done = sum(1 for r in ledger.this_run() if r.get("mechanism") == "selection")
        if policy.max_recommendations is not None and done + 1 > policy.max_recommendations and _on("recommend-count"):
            raise refuse(
                what,
                f"this node answers at most {policy.max_recommendations} recommendation queries per run "
                "(policy-max-recommendations)",
                PrivacyError,
                "recommend-count",
            )
        new = [{"mechanism": "selection", "name": "recommendation", "pure_epsilon": eps, "dim": int(n_candidates)}]
        if policy.max_recommend_epsilon is not None and _on("recommend-epsilon"):
            total = recommend_epsilon(ledger.records() + new, policy.relation)
            if not total <= policy.max_recommend_epsilon * (1 + 1e-9):
                raise refuse(
                    what,
                    f"epsilon {eps:g} would bring this node's recommendation epsilon to {total:.4g} > its cap "
                    f"{policy.max_recommend_epsilon:g} (policy-max-recommend-epsilon, {policy.relation})",
                    PrivacyError,
                    "recommend-epsilon",
                )
        ledger.append(new)


def check_measurement(context, kind: str) -> None:
    """Before an exact measurement sum (evaluation totals): refused beyond ``max_measurements``
    per run (``measurement-count``); else recorded (no epsilon: documented as outside the DP
    guarantee, an aggregate over at least ``min_contributors`` nodes)."""
    policy = node_policy(context)
    ledger = NodeLedger(context, policy)
    with ledger.locked():
        done = sum(1 for r in ledger.this_run() if r.get("mechanism") == "measurement")
        if policy.max_measurements is not None and done + 1 > policy.max_measurements and _on("measurement-count"):
            raise refuse(
                f"the measurement {kind!r}",
                f"this node joins at most {policy.max_measurements} exact measurements per run "
                "(policy-max-measurements)",
                PrivacyError,
                "measurement-count",
            )
        ledger.append([{"mechanism": "measurement", "name": str(kind)}])


def spent(context) -> float:
    """The node ledger's epsilon of noised sums at the policy's delta and relation (0 before any)."""
    policy = node_policy(context)
    return node_epsilon(NodeLedger(context, policy).records(), policy.delta, policy.relation)


# ---------------------------------------------------------------------------- (c) key files
def check_key_file(context, path: str) -> None:
    """A key file named in a message is read only where the node's operator enabled
    reproducible noise; otherwise refused (its bytes may be the server's)."""
    if not node_policy(context).reproducible and _on("key-file"):
        raise refuse(
            f"the key file {path!r} named by the server",
            "this node's policy does not enable reproducible noise (policy-reproducible=false): "
            "a key whose bytes the server may know would make its noise shares predictable",
            PrivacyError,
            "key-file",
        )


__all__ = [
    "DEFAULT",
    "NodeLedger",
    "NodePolicy",
    "POLICY_ENV",
    "check_key_file",
    "check_measurement",
    "check_plan",
    "check_recommendation",
    "ledger_path",
    "node_epsilon",
    "node_policy",
    "plaintext",
    "recommend_epsilon",
    "refuse",
    "spent",
]
