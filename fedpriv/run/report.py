"""The typed result of one run: :class:`RunReport`.

A frozen dataclass over the content of ``metrics.json``: the facts every run has are typed
fields (algorithm, data, engine, privacy, the evaluation metrics, the resolved config), and the
whole document is kept in its key order, so ``to_json()`` gives back exactly what ``metrics.json``
holds (``tests/test_output_schema.py`` pins that round trip and the schema of the file).
``summary()`` is the short human table that every engine prints.

Every run is judged against the trivial references of its task (:func:`verdicts`, the
``verdict`` object of ``metrics.json``): the global mean for rating prediction (test RMSE), the
most-popular list for top-k (Recall@10, NDCG@10), the best shared model for personalization (test
MSE). A run worse than one says so in one summary line. A run that rejected more than a given
share of its replies (:func:`check_rejections`) fails the command."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import FedprivError

if TYPE_CHECKING:
    from .model import Model

#: the share of a run's replies that may be rejected before the command fails (``fedpriv run
#: --max-rejected-fraction``)
MAX_REJECTED_FRACTION = 0.5

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
        scalars = {
            k: v for k, v in doc.items() if k.startswith(("valid_", "test_")) and not isinstance(v, (list, dict))
        }
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
        shown = ", ".join(
            f"{k}={v:.4g}" for k, v in self.metrics.items() if isinstance(v, float) and k.startswith("test_")
        )
        eps = (
            "non-private"
            if not self.private
            else (f"epsilon_spent={self.epsilon_spent:.4g}" if self.epsilon_spent is not None else "epsilon_spent=None")
        )
        return f"RunReport({self.algorithm} on {self.dataset}, {self.engine}, {eps}{', ' + shown if shown else ''})"

    # ------------------------------------------------------------------ the verdict
    @property
    def verdict(self) -> dict[str, dict]:
        """The run against the trivial references of its task (:func:`verdicts`): the
        ``verdict`` object of ``metrics.json``, or computed from the file's references when an
        older file has none."""
        got = self.get("verdict")
        return got if isinstance(got, dict) else verdicts(self._document)

    def verdict_line(self) -> str | None:
        """One line naming every reference the run is worse than, or None."""
        by_reference: dict[str, list[str]] = {}
        for v in self.verdict.values():
            if v.get("worse"):
                label = _VERDICT_LABELS.get(v["metric"], v["metric"])
                sign = ">" if v["metric"] in _LOWER_IS_BETTER else "<"
                by_reference.setdefault(v["reference"], []).append(
                    f"{label} {v['value']:.4f} {sign} {v['reference_value']:.4f}"
                )
        return "; ".join(f"WORSE than the {ref}: {', '.join(parts)}" for ref, parts in by_reference.items()) or None

    @property
    def rejected_fraction(self) -> float | None:
        """Rejected replies over the replies asked for (a Flower run's rounds), None without rounds."""
        return rejected_fraction(self._document)

    # ------------------------------------------------------------------ the human summary
    def model_line(self) -> str:
        """What was trained: the resolved rank and steps, and who chose them."""
        cfg = self.config
        if self.get("samples_per_user") is not None:  # personalization: its rank 0 means the data's k
            k = self.get("k")
            return (
                f"{self.algorithm}: a shared subspace of rank {k}, a personal vector per user"
                if k is not None
                else self.algorithm
            )
        if "rank" not in cfg:
            return self.algorithm
        rank, steps = cfg.get("rank"), cfg.get("steps")
        given = {k for k in str(cfg.get("given", "")).split(",") if k}
        shape = "the bias model (rank 0)" if rank == 0 else f"rank {rank}, {steps} step{'s' if steps != 1 else ''}"
        if _ranks_only(self.algorithm):  # a top-k model: its rank-0 form is no bias model
            if _setup_only(self.algorithm):
                shape = "the most-popular list of the released item counts (it ranks items; it predicts no ratings)"
            else:
                shape = (
                    "a ranking model"
                    if rank == 0
                    else f"a ranking model of rank {rank}, {steps} step{'s' if steps != 1 else ''}"
                ) + " (it predicts no ratings)"
        choice = self.get("noise_aware")
        if isinstance(choice, dict) and not {"rank", "steps"} <= given:
            return f"{self.algorithm} asked; the noise-aware rule chose {choice['model']}"
        if cfg.get("defaults") == "noise-aware" and not {"rank", "steps"} <= given:
            return (
                f"{shape}, chosen by the noise-aware defaults from epsilon, delta, the catalogue and the released "
                "user count"
            )
        return shape

    def _privacy_rows(self) -> list[tuple[str, str]]:
        """The summary's privacy lines: the guarantee, its neighbours, the PLD second opinion."""
        if not self.private:
            return [("privacy", "none (a non-private reference)")]
        spent = "?" if self.epsilon_spent is None else f"{self.epsilon_spent:.4f}"
        target = "" if self.epsilon is None else f" of {self.epsilon:g}"
        rows = [
            ("privacy", f"epsilon {spent}{target}, delta {self.delta:g}: the guarantee (dp-accounting on the ledger)")
        ]
        if self.neighbouring_relation == "replace_one":
            rows.append(
                (
                    "",
                    "neighbours: one user's data replaced by anybody's (replace-one: the enrolled count is public); "
                    "adding or removing a user is not hidden",
                )
            )
        pld = self.get("epsilon_spent_pld")
        if isinstance(pld, float):
            rows.append(("", f"PLD accounting of the same ledger: {pld:.4f} (a second opinion, not the guarantee)"))
        if self.get("noise") == "reproducible":
            rows.append(
                ("noise", "reproducible from a noise seed: privacy holds only against those who do not know the seed")
            )
        return rows

    def _score_rows(self, rated: bool) -> tuple[list[str], tuple[str, str] | None]:
        """The summary's scores (with their trivial references) and its top-k row."""
        scores = []
        refs = self.get("references") or {}
        for key, label in _METRIC_LABELS:
            v = self.metrics.get(key)
            if (
                rated and isinstance(v, float) and math.isfinite(v)
            ):  # a top-k model's RMSE judges no prediction of its own
                scores.append(f"{label} {v:.4f}")
        if scores and key_is_rmse(self.metrics) and isinstance(refs.get("global_mean_test_rmse"), float):
            lo, hi = refs.get("rating_range") or (None, None)
            scale = f"; ratings {lo:g} to {hi:g}" if lo is not None else ""
            scores.append(f"(global-mean predictor: test RMSE {refs['global_mean_test_rmse']:.4f}{scale})")
        if (
            scores
            and isinstance(refs.get("shared_model_test_mse"), float)
            and isinstance(self.metrics.get("test_mse"), float)
        ):
            scores.append(f"(best shared model: test MSE {refs['shared_model_test_mse']:.4f})")
        for key, v in self.metrics.items():
            if "recall_at" in key and isinstance(v, float) and key.startswith("test_"):
                scores.append(f"test Recall@{key.rsplit('_', 1)[-1]} {v:.4f}")
        rank = self.get("ranking")
        topk_row = None
        if isinstance(rank, dict) and isinstance(rank.get("recall"), float):
            line = f"Recall@{rank['k']} {rank['recall']:.4f}, NDCG@{rank['k']} {rank['ndcg']:.4f}"
            if isinstance(refs.get("popular_recall"), float):
                line += f" (most-popular list: {refs['popular_recall']:.4f}, {refs['popular_ndcg']:.4f})"
            if rank.get("median_train_count") is not None:
                line += (
                    f"; recommended items: median {rank['median_train_count']:.0f} training ratings, "
                    f"{100 * rank['coverage']:.1f}% of the catalogue"
                )
            topk_row = (f"top-{rank['k']}", line + f"; relevant = test ratings >= {rank['threshold']:g}")
        return scores, topk_row

    def summary(self, *, out: str | None = None) -> str:
        """A short table a person reads: what ran, what it spent, what it scored, where it went."""
        rows: list[tuple[str, str]] = [
            (
                "run",
                f"{self.algorithm} on {self.dataset} ({self.engine} engine"
                + (f", {self.aggregation} aggregation)" if self.aggregation else ")"),
            )
        ]
        rows.append(("model", self.model_line()))
        choice = self.get("noise_aware")
        if isinstance(choice, dict) and "snr" in str(choice.get("model", "")):
            rows.append(
                (
                    "",
                    f"snr: the per-item signal against the noise, released users x sqrt(rho) / sqrt(items), rho the "
                    f"zCDP budget of "
                    f"(epsilon, delta); factors need snr >= {choice.get('factor_snr', 350):g}",
                )
            )
        rows += self._privacy_rows()
        data = [
            f"{v:,} {k}"
            for k, v in (("users", self.n_users), ("items", self.n_items), ("ratings", self.n_ratings))
            if isinstance(v, int)
        ]
        if data:
            rows.append(("data", ", ".join(data)))
        rated = not _ranks_only(self.algorithm)
        scores, topk_row = self._score_rows(rated)
        if topk_row is not None and not rated:  # a top-k model leads with its ranking
            rows.append(topk_row)
        if scores:
            rows.append(("scores", "; ".join(scores).replace("; (", " (")))
        if topk_row is not None and rated:
            rows.append(topk_row)
        rows += self._closing_rows(out)
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def _closing_rows(self, out: str | None) -> list[tuple[str, str]]:
        """The summary's last rows: the verdict, rejected replies, warnings, rounds, time, where it went."""
        rows: list[tuple[str, str]] = []
        worse = self.verdict_line()
        if worse:
            rows.append(("verdict", worse))
        fraction = self.rejected_fraction
        if fraction:
            rows.append(
                (
                    "rejected",
                    f"{100 * fraction:.1f}% of the replies asked for were rejected (metrics.json rejected_replies "
                    f"gives each reason)",
                )
            )
        if self.get("delta_warning"):
            rows.append(("warning", self.get("delta_warning")))
        if self.get("rounds") is not None:
            rows.append(
                (
                    "rounds",
                    f"{self.get('rounds')} protocol rounds on {self.get('nodes')} nodes; {self.get('bytes_up'):,} "
                    f"bytes up, {self.get('bytes_down'):,} down "
                    "(evaluation rounds are measurement, not counted)",
                )
            )
        elif self.config.get("users_per_shard"):  # the in-process engine's shards (a Flower run counts rounds)
            rows.append(
                (
                    "nodes",
                    f"{self.config.get('nodes')} nodes of up to {self.config['users_per_shard']} users each, run in "
                    f"this process",
                )
            )
        if self.wall_seconds is not None:
            launcher = self.get("launcher_wall_seconds")
            extra = f" ({launcher:.1f} s with Flower's start-up and stop)" if isinstance(launcher, float) else ""
            rows.append(("time", f"{self.wall_seconds:.1f} s training and evaluation{extra}"))
        if out is not None:
            rows.append(("wrote", out))
        return rows


#: the verdict's metrics: their labels; those where a lower value is better
_VERDICT_LABELS = {
    "test_rmse": "test RMSE",
    "recall_at_10": "Recall@10",
    "ndcg_at_10": "NDCG@10",
    "test_mse": "test MSE",
}
_LOWER_IS_BETTER = frozenset({"test_rmse", "test_mse"})


def _spec_task(algorithm: str) -> str | None:
    """The registry's task of ``algorithm`` (None for a name it does not know)."""
    from ..algorithms import registry

    try:
        return registry.task_of(algorithm)
    except FedprivError:
        return None


def _ranks_only(algorithm: str) -> bool:
    """A top-k model: it ranks items and predicts no ratings."""
    from ..algorithms import registry

    task = _spec_task(algorithm)
    return task is not None and registry.kind_of(task) == "top-k"


def _setup_only(algorithm: str) -> bool:
    from ..algorithms import registry

    return _spec_task(algorithm) is not None and algorithm in registry.names() and registry.get(algorithm).setup_only


def _entry(task: str, metric: str, value, reference: str, reference_value) -> dict | None:
    if not (isinstance(value, (int, float)) and isinstance(reference_value, (int, float))):
        return None
    if not (math.isfinite(value) and math.isfinite(reference_value)):
        return None
    worse = value > reference_value if metric in _LOWER_IS_BETTER else value < reference_value
    return {
        "task": task,
        "metric": metric,
        "value": float(value),
        "reference": reference,
        "reference_value": float(reference_value),
        "worse": bool(worse),
    }


def verdicts(metrics: Mapping[str, Any]) -> dict[str, dict]:
    """The run against the trivial references of its task, one entry per task metric (keyed by
    the metric): ``{"task", "metric", "value", "reference", "reference_value", "worse"}``.

    - rating prediction: test RMSE against the global mean of the training ratings;
    - top-k (every run with the top-10 ranking): Recall@10 and NDCG@10 against the most-popular
      list (not for ``popular``, which is that list, privately);
    - personalization: test MSE against the best shared model (one regression vector for every
      user, fitted to the ground truth: no personalization); ``pam-single-model``, itself a
      shared model, against predicting 0.

    A metric without its reference (a logistic model, held-out users) gets no entry."""
    from ..algorithms import registry

    algorithm = str(metrics.get("algorithm"))
    task = _spec_task(algorithm)
    refs = metrics.get("references") or {}
    out: dict[str, dict] = {}

    def add(entry):
        if entry is not None:
            out[entry["metric"]] = entry

    if task is not None and registry.is_personalization(task):
        if registry.is_shared_model(algorithm):
            add(
                _entry(
                    "personalization",
                    "test_mse",
                    metrics.get("test_mse"),
                    "zero predictor",
                    refs.get("zero_predictor_test_mse"),
                )
            )
        else:
            add(
                _entry(
                    "personalization",
                    "test_mse",
                    metrics.get("test_mse"),
                    "best shared model",
                    refs.get("shared_model_test_mse"),
                )
            )
        return out
    if task is None or registry.predicts_ratings(algorithm):
        add(_entry("ratings", "test_rmse", metrics.get("test_rmse"), "global mean", refs.get("global_mean_test_rmse")))
    rank = metrics.get("ranking")
    if isinstance(rank, Mapping) and rank.get("k") == 10 and not _setup_only(algorithm):
        add(_entry("top-k", "recall_at_10", rank.get("recall"), "most-popular list", refs.get("popular_recall")))
        add(_entry("top-k", "ndcg_at_10", rank.get("ndcg"), "most-popular list", refs.get("popular_ndcg")))
    return out


def rejected_fraction(metrics: Mapping[str, Any]) -> float | None:
    """The rejected replies (``rejected_replies``) over the replies asked for (the ``nodes`` of
    every round of ``round_log``), at most 1; None for a run without rounds (in process)."""
    log = metrics.get("round_log")
    if not log:
        return None
    asked = sum(int(r.get("nodes") or 0) for r in log)
    rejected = len(metrics.get("rejected_replies") or [])
    if asked <= 0:
        return None
    return min(1.0, rejected / asked)


class TooManyRejected(FedprivError, RuntimeError):
    """More of a run's replies were rejected than the limit allows: its model was trained on
    what a minority of the nodes sent (or on nothing)."""


def check_rejections(report: RunReport | Mapping[str, Any], limit: float = MAX_REJECTED_FRACTION) -> None:
    """Raise :class:`TooManyRejected` when more than ``limit`` of the replies of ``report`` (a
    RunReport or a ``metrics.json`` document) were rejected."""
    doc = report._document if isinstance(report, RunReport) else report
    fraction = rejected_fraction(doc)
    if fraction is None or fraction <= limit:
        return
    rejected = doc.get("rejected_replies") or []
    reasons: dict[str, int] = {}
    for r in rejected:
        reason = str(r.get("reason", "?")).split(":")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    common = ", ".join(f"{n} x {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
    raise TooManyRejected(
        f"{len(rejected)} replies rejected, {100 * fraction:.1f}% of those asked for (limit {100 * limit:g}%): "
        f"the run is not trustworthy ({common}; metrics.json rejected_replies lists each). "
        "Raise the limit with --max-rejected-fraction if this is expected"
    )


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
