"""Evaluation objects: what a run measures on its held-out data, one class per protocol.

A :class:`~fedpriv.run.job.Plan` picks its evaluation once (:func:`fedpriv.run.job.prepare_plan`)
(:func:`evaluation_for`, from the split protocol and the algorithm's spec) and the run layer calls
``measure(state, split, metrics, on_nodes=...)`` after any engine has trained: the evaluation adds its keys of
``metrics.json``. ``on_nodes``: the engine already measured the node-side part (a Flower run's
nodes evaluate their own held-out ratings and the engine put the sums in ``metrics``), so only
what the released model gives here is added.

- :class:`RatingRegression`: valid/test RMSE with item-frequency slices, then :class:`Ranking`;
- :class:`Ranking`: the released model's top-10 lists on the test ratings beside the most-popular
  list (:mod:`fedpriv.algorithms.ranking`);
- :class:`Logistic`: valid/test log loss and accuracy;
- :class:`HeldoutUsers`: Recall@k of held-out users folded in from their history;
- :class:`BlockEvaluation`: a block family's measurement (DP model personalization's test MSE
  and subspace error);
- :class:`OnNodes`: a deployment's server, which holds no ratings: the nodes measured everything.

A family with a metric of its own registers ``evaluation=`` on its
:class:`~fedpriv.algorithms.registry.AlgorithmSpec` (a callable of the protocol name that returns
an evaluation); the run layer does not change. Every measurement here is of held-out data,
outside the privacy guarantee (``docs/explanations/privacy.md``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..privacy.target import ADD_REMOVE
from . import evaluation


class Evaluation:
    """Adds a run's measurements to ``metrics`` (see the module docstring)."""

    def measure(self, state, split, metrics: dict, *, on_nodes: bool = False) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Ranking(Evaluation):
    """Random split, explicit ratings: the released model's top-10 lists on the test ratings
    beside two non-private references measured on the same held-out ratings: the most-popular
    list and the global-mean predictor's test RMSE. Computed from the released model on every
    engine."""

    def measure(self, state, split, metrics: dict, *, on_nodes: bool = False) -> None:
        from . import ranking

        train = split.train
        blend = ranking.blend_for(
            metrics.get("epsilon") if state.private else None,
            metrics.get("delta"),
            state.n_items,
            state.n_users,
            metrics.get("neighbouring_relation", ADD_REMOVE),  # the run's (fedpriv.run.execute's header)
        )
        rank = ranking.evaluate_ranking(state, train, split.test, blend=blend)
        popular = ranking.popular_reference(train, split.test, k=rank["k"], threshold=rank["threshold"])
        score = (
            "the family's own ranking score"
            if state.spec.ranker is not None
            else f"released popularity + {blend:g} x predicted rating (standardized)"
        )
        metrics["ranking"] = {**rank, "blend": blend, "score": score}
        mean = float(np.mean(train.ratings)) if len(train.ratings) else 0.0
        test = split.test.ratings.astype(np.float64)
        metrics["references"] = {
            "global_mean_test_rmse": float(np.sqrt(np.mean((test - mean) ** 2))) if len(test) else None,
            "popular_recall": popular["recall"],
            "popular_ndcg": popular["ndcg"],
            "popular_median_train_count": popular["median_train_count"],
            "rating_range": [float(x) for x in state.rating_range],
        }


@dataclass(frozen=True)
class RatingRegression(Evaluation):
    """Valid and test RMSE (with item-frequency slices) of the random split, then the ranking."""

    def measure(self, state, split, metrics: dict, *, on_nodes: bool = False) -> None:
        if not on_nodes:
            item_counts = split.train.item_counts()
            metrics["valid_rmse"], metrics["valid_sliced"] = evaluation.evaluate_rmse(
                state, split.train, split.valid, item_counts
            )
            metrics["test_rmse"], metrics["sliced"] = evaluation.evaluate_rmse(
                state, split.train, split.test, item_counts
            )
        Ranking().measure(state, split, metrics)


@dataclass(frozen=True)
class Logistic(Evaluation):
    """Valid and test log loss and accuracy (with slices) of a logistic model."""

    def measure(self, state, split, metrics: dict, *, on_nodes: bool = False) -> None:
        if on_nodes:
            return
        item_counts = split.train.item_counts()
        for part in ("valid", "test"):
            loss, acc, sliced = evaluation.evaluate_logistic(state, split.train, getattr(split, part), item_counts)
            metrics[f"{part}_logloss"], metrics[f"{part}_accuracy"] = loss, acc
            metrics["valid_sliced" if part == "valid" else "sliced"] = sliced


@dataclass(frozen=True)
class HeldoutUsers(Evaluation):
    """Held-out users are not members of the federation; their fold-in (a user solve on the
    history part) and Recall@k use only the released item embeddings, on every engine."""

    k: int = 20

    def measure(self, state, split, metrics: dict, *, on_nodes: bool = False) -> None:
        item_counts = split.train.item_counts()
        metrics[f"valid_recall_at_{self.k}"], metrics["valid_sliced"] = evaluation.evaluate_recall(
            state, split.valid_history, split.valid_targets, split.valid_users, item_counts, self.k
        )
        metrics[f"test_recall_at_{self.k}"], metrics["sliced"] = evaluation.evaluate_recall(
            state, split.test_history, split.test_targets, split.test_users, item_counts, self.k
        )


@dataclass(frozen=True)
class OnNodes(Evaluation):
    """A partitioned deployment's server: it holds no ratings, the nodes measured everything."""

    def measure(self, state, split, metrics: dict, *, on_nodes: bool = False) -> None:
        return None


#: the evaluation of each split protocol (a name only at this edge: the run config's ``split``)
_BY_PROTOCOL = {
    "random": RatingRegression,
    "heldout": HeldoutUsers,
    "deployment": OnNodes,
}


def evaluation_for(protocol: str, spec, cfg) -> Evaluation:
    """The evaluation of a plan: the family's own (``spec.evaluation``) when it registers one,
    else the protocol's, with a logistic model's on the random split."""
    own = getattr(spec, "evaluation", None)
    if own is not None:
        return own(protocol)
    if getattr(spec, "logistic", False) and protocol == "random":
        return Logistic()
    kind = _BY_PROTOCOL[protocol]
    return kind(k=cfg.eval_k) if kind is HeldoutUsers else kind()


@dataclass(frozen=True)
class BlockEvaluation(Evaluation):
    """A block family's measurement (:class:`~fedpriv.algorithms.families.Family`): the sum of
    every block's evaluation sums, read by the family; a Flower run's nodes measured already."""

    family: object
    users_per_shard: int = 4096

    def measure(self, state, split, metrics: dict, *, on_nodes: bool = False) -> None:
        if on_nodes:
            return
        from .shards import split_users

        family = self.family
        n = family.n_users(split)
        index = np.arange(n)
        sums = sum(family.eval_sums(family.block(split, index[u]), state) for u in split_users(n, self.users_per_shard))
        metrics.update(family.evaluate_sums(sums, split, state))
