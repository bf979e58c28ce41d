"""The typed result of one run: :class:`RunReport`.

A frozen dataclass over the content of ``metrics.json``: the facts every run has are typed
fields (algorithm, data, engine, privacy, the evaluation metrics, the resolved config), and the
whole document is kept in its key order, so ``to_json()`` gives back exactly what ``metrics.json``
holds (``tests/test_output_schema.py`` pins that round trip and the schema of the file).
``summary()`` is the short human table that every engine prints."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from .model import Model

#: the evaluation metrics a summary shows, in this order, with their labels
_METRIC_LABELS = (
    ("test_rmse", "test RMSE"),
    ("valid_rmse", "valid RMSE"),
    ("test_logloss", "test log-loss"),
    ("test_accuracy", "test accuracy"),
    ("test_mse", "test MSE"),
    ("subspace_error", "subspace error"),
)


def _freeze(value: Any) -> Any:
    """A read-only view of nested JSON values (dicts become mapping proxies, lists tuples)."""
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """The JSON document back from :func:`_freeze` (fresh, mutable copies)."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return copy.copy(value)


@dataclass(frozen=True)
class RunReport:
    """What one run reports. Typed fields for the facts a caller reads; :meth:`to_json` for the
    whole ``metrics.json``. Build it with :meth:`from_metrics`."""

    algorithm: str
    dataset: str
    engine: str
    private: bool
    protocol: str
    epsilon: float | None  # the target (None for a non-private run)
    delta: float | None
    epsilon_spent: float | None  # dp-accounting, from the ledger
    aggregation: str | None
    n_users: int | None
    n_items: int | None
    n_ratings: int | None
    metrics: Mapping[str, float | None]  # valid_* / test_* scalars (RMSE, recall, log-loss, ...)
    config: Mapping[str, Any]  # the resolved configuration (what the noise-aware rule chose, too)
    wall_seconds: float | None
    _document: Mapping[str, Any] = field(repr=False, compare=True)

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> RunReport:
        """The report of a ``metrics.json`` document (as :func:`fedpriv.run.execute` builds it)."""
        doc = dict(metrics)
        scalars = {k: v for k, v in doc.items() if k.startswith(("valid_", "test_")) and not isinstance(v, (list, dict))}
        if "subspace_error" in doc:
            scalars["subspace_error"] = doc["subspace_error"]
        return cls(
            algorithm=str(doc.get("algorithm")),
            dataset=str(doc.get("dataset")),
            engine=str(doc.get("engine")),
            private=bool(doc.get("private")),
            protocol=str(doc.get("protocol")),
            epsilon=doc.get("epsilon"),
            delta=doc.get("delta"),
            epsilon_spent=doc.get("epsilon_spent"),
            aggregation=doc.get("aggregation"),
            n_users=doc.get("n_users"),
            n_items=doc.get("n_items"),
            n_ratings=doc.get("n_ratings"),
            metrics=MappingProxyType(scalars),
            config=_freeze(dict(doc.get("config") or {})),
            wall_seconds=doc.get("wall_seconds"),
            _document=_freeze(doc),
        )

    @classmethod
    def read(cls, path) -> RunReport:
        """The report of a ``metrics.json`` file."""
        from pathlib import Path

        return cls.from_metrics(json.loads(Path(path).read_text()))

    def to_json(self) -> dict:
        """The ``metrics.json`` document: same keys, order and values as the run wrote."""
        return _thaw(self._document)

    def __getitem__(self, key: str) -> Any:
        """``report["test_rmse"]``: a key of ``metrics.json`` (a fresh copy of nested values)."""
        return _thaw(self._document[key])

    def get(self, key: str, default: Any = None) -> Any:
        return _thaw(self._document[key]) if key in self._document else default

    def __contains__(self, key: str) -> bool:
        return key in self._document

    @property
    def neighbouring_relation(self) -> str | None:
        """The neighbouring relation every epsilon of the run holds under: ``replace_one`` (one
        user's data replaced by anybody's; a deployment, whose enrolled count is public) or
        ``add_remove`` (one user added or removed; every other run, where ``metrics.json`` has no
        ``neighbouring_relation`` key). None for a non-private run."""
        if not self.private:
            return None
        return str(self._document.get("neighbouring_relation", "add_remove"))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in self.metrics.items() if isinstance(v, float) and k.startswith("test_"))
        eps = "non-private" if not self.private else (f"epsilon_spent={self.epsilon_spent:.4g}" if self.epsilon_spent is not None else "epsilon_spent=None")
        return f"RunReport({self.algorithm} on {self.dataset}, {self.engine}, {eps}{', ' + shown if shown else ''})"

    # ------------------------------------------------------------------ the human summary
    def model_line(self) -> str:
        """What was trained: the resolved rank and steps, and who chose them."""
        cfg = self.config
        if self.get("samples_per_user") is not None:  # personalization: its rank 0 means the data's k
            k = self.get("k")
            return f"{self.algorithm}: a shared subspace of rank {k}, a personal vector per user" if k is not None else self.algorithm
        if "rank" not in cfg:
            return self.algorithm
        rank, steps = cfg.get("rank"), cfg.get("steps")
        given = {k for k in str(cfg.get("given", "")).split(",") if k}
        shape = "the bias model (rank 0)" if rank == 0 else f"rank {rank}, {steps} step{'s' if steps != 1 else ''}"
        choice = self.get("noise_aware")
        if isinstance(choice, dict) and not {"rank", "steps"} <= given:
            return f"{self.algorithm} asked; the noise-aware rule chose {choice['model']}"
        if cfg.get("defaults") == "noise-aware" and not {"rank", "steps"} <= given:
            return f"{shape}, chosen by the noise-aware defaults from epsilon, delta, the catalogue and the released user count"
        return shape

    def _privacy_rows(self) -> list[tuple[str, str]]:
        """The summary's privacy lines: the guarantee, its neighbours, the PLD second opinion."""
        if not self.private:
            return [("privacy", "none (a non-private reference)")]
        spent = "?" if self.epsilon_spent is None else f"{self.epsilon_spent:.4f}"
        target = "" if self.epsilon is None else f" of {self.epsilon:g}"
        rows = [("privacy", f"epsilon {spent}{target}, delta {self.delta:g}: the guarantee (dp-accounting on the ledger)")]
        if self.neighbouring_relation == "replace_one":
            rows.append(("", "neighbours: one user's data replaced by anybody's (replace-one: the enrolled count is public); "
                             "adding or removing a user is not hidden"))
        pld = self.get("epsilon_spent_pld")
        if isinstance(pld, float):
            rows.append(("", f"PLD accounting of the same ledger: {pld:.4f} (a second opinion, not the guarantee)"))
        if self.get("noise") == "reproducible":
            rows.append(("noise", "reproducible from a noise seed: privacy holds only against those who do not know the seed"))
        return rows

    def summary(self, *, out: str | None = None) -> str:
        """A short table a person reads: what ran, what it spent, what it scored, where it went."""
        rows: list[tuple[str, str]] = [("run", f"{self.algorithm} on {self.dataset} ({self.engine} engine" + (f", {self.aggregation} aggregation)" if self.aggregation else ")"))]
        rows.append(("model", self.model_line()))
        choice = self.get("noise_aware")
        if isinstance(choice, dict) and "snr" in str(choice.get("model", "")):
            rows.append(("", f"snr: the per-item signal against the noise, released users x sqrt(rho) / sqrt(items), rho the zCDP budget of "
                             f"(epsilon, delta); factors need snr >= {choice.get('factor_snr', 350):g}"))
        rows += self._privacy_rows()
        data = [f"{v:,} {k}" for k, v in (("users", self.n_users), ("items", self.n_items), ("ratings", self.n_ratings)) if isinstance(v, int)]
        if data:
            rows.append(("data", ", ".join(data)))
        scores = []
        refs = self.get("references") or {}
        for key, label in _METRIC_LABELS:
            v = self.metrics.get(key)
            if isinstance(v, float) and math.isfinite(v):
                scores.append(f"{label} {v:.4f}")
        if scores and key_is_rmse(self.metrics) and isinstance(refs.get("global_mean_test_rmse"), float):
            lo, hi = refs.get("rating_range") or (None, None)
            scale = f"; ratings {lo:g} to {hi:g}" if lo is not None else ""
            scores.append(f"(global-mean predictor: test RMSE {refs['global_mean_test_rmse']:.4f}{scale})")
        for key, v in self.metrics.items():
            if "recall_at" in key and isinstance(v, float) and key.startswith("test_"):
                scores.append(f"test Recall@{key.rsplit('_', 1)[-1]} {v:.4f}")
        if scores:
            rows.append(("scores", "; ".join(scores).replace("; (", " (")))
        rank = self.get("ranking")
        if isinstance(rank, dict) and isinstance(rank.get("recall"), float):
            line = f"Recall@{rank['k']} {rank['recall']:.4f}, NDCG@{rank['k']} {rank['ndcg']:.4f}"
            if isinstance(refs.get("popular_recall"), float):
                line += f" (most-popular list: {refs['popular_recall']:.4f}, {refs['popular_ndcg']:.4f})"
            if rank.get("median_train_count") is not None:
                line += f"; recommended items: median {rank['median_train_count']:.0f} training ratings, {100 * rank['coverage']:.1f}% of the catalogue"
            rows.append((f"top-{rank['k']}", line + f"; relevant = test ratings >= {rank['threshold']:g}"))
        if self.get("delta_warning"):
            rows.append(("warning", self.get("delta_warning")))
        if self.get("rounds") is not None:
            rows.append(("rounds", f"{self.get('rounds')} protocol rounds on {self.get('nodes')} nodes; {self.get('bytes_up'):,} bytes up, {self.get('bytes_down'):,} down "
                                   "(evaluation rounds are measurement, not counted)"))
        elif self.config.get("users_per_shard"):  # the in-process engine's shards (a Flower run counts rounds)
            rows.append(("nodes", f"{self.config.get('nodes')} nodes of up to {self.config['users_per_shard']} users each, run in this process"))
        if self.wall_seconds is not None:
            launcher = self.get("launcher_wall_seconds")
            extra = f" ({launcher:.1f} s with Flower's start-up and stop)" if isinstance(launcher, float) else ""
            rows.append(("time", f"{self.wall_seconds:.1f} s training and evaluation{extra}"))
        if out is not None:
            rows.append(("wrote", out))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def key_is_rmse(metrics) -> bool:
    """The run reports a test RMSE (explicit ratings)."""
    return isinstance(metrics.get("test_rmse"), float)


@dataclass(frozen=True)
class Outcome:
    """What a run returns: its report, its ledger records and its released model (None for
    the personalization algorithms, whose personal vectors never leave the clients, and for
    runs whose model stayed in another process). ``state`` and ``train`` (the released public
    state and the training ratings) serve analyses of the released model."""

    report: RunReport
    ledger: list[dict]
    model: Model | None = field(default=None, repr=False)
    state: Any = field(default=None, repr=False)
    train: Any = field(default=None, repr=False)
    dataset: Any = field(default=None, repr=False)

    @property
    def epsilon(self) -> float | None:
        return self.report.epsilon_spent
