"""Top-k recommendation from a released model, and its ranking metrics.

The ranking score (:func:`ranking_scores`, the one of :meth:`fedpriv.run.model.Model.recommend`
and of the evaluation) is popularity-aware: an item's released popularity (the noised item
counts of runs that release them, else the bias stage's noised per-item weight sums W; exact
counts for non-private runs) standardized over the catalogue, plus ``blend`` times the user's
predicted rating standardized over the candidates. Ranking by predicted rating alone puts items
with a handful of ratings on top (their biases and embeddings are mostly noise, or overfit):
measured on ML-100K at epsilon 5, Recall@10 0.001 against 0.147 for the most-popular list; the
blend (0.2-0.3, chosen on validation ratings of ML-100K and ml-latest-small) reaches it and
personalizes its order (:func:`blend_for`). Everything it reads is released or the user's own
(post-processing).

Ranking metrics (rating data): a user's relevant items are their test ratings at or above a
threshold (default: the top 20% of the rating scale); every item the user did not rate in
training is a candidate. Recall@k = hits / min(k, relevant), NDCG@k with binary gains; the
catalogue coverage (share of items recommended to at least one user) and the median training
count of the recommended items tell how popular the lists are. These are measurements on
held-out private ratings, like the test RMSE: outside the privacy guarantee (never released by
a node in secure mode except as totals).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..privacy.target import ADD_REMOVE
from ..util.threads import one_thread_each, thread_count
from . import als
from .metrics import top_k
from .shards import UserShard, shard_users, sub_shard

#: weight of the standardized predicted rating against the standardized released popularity:
#: BLEND for BLEND_SNR <= snr < FACTOR_SNR (the noise-aware statistic of fedpriv.algorithms.defaults),
#: else BLEND_EDGE. Chosen on validation ratings (docs/how-to/recommendations.md): on ML-100K and
#: ml-latest-small at epsilon 1, 5 and 20 (3 noise seeds each) 0.3 had the best mean validation
#: Recall@10 and 0.1-0.2 won at the lowest snr (ml-latest-small at epsilon 1, snr 0.9); on the
#: 70,000-user preference-dependent synthetic set at epsilon 5 (snr 469, a factor model) 0.2 won
#: (validation Recall@10 0.111 against 0.109 for 0.3)
BLEND = 0.3
BLEND_EDGE = 0.2
BLEND_SNR = 2.0
RANK_BLEND = BLEND  # the blend of a non-private model
RANK_K = 10


def blend_for(
    epsilon: float | None, delta: float | None, n_items: int, n_users: int, relation: str = ADD_REMOVE
) -> float:
    """The default blend of a model released at (epsilon, delta) for n_users (the released
    count) and n_items, the epsilon holding under the neighbouring ``relation``: public numbers
    only."""
    if epsilon is None or delta is None or not n_users:
        return BLEND
    from .defaults import FACTOR_SNR, snr

    return BLEND if BLEND_SNR <= snr(epsilon, delta, n_items, n_users, relation) < FACTOR_SNR else BLEND_EDGE


def relevance_threshold(rating_range: tuple[float, float]) -> float:
    """The default relevance threshold: the top 20% of the rating scale."""
    lo, hi = (float(x) for x in rating_range)
    return hi - 0.2 * (hi - lo)


def popularity(state: als.PublicState) -> np.ndarray | None:
    """The released popularity of every item (noised counts, else the noised weight sums W of
    the bias stage or of the bias model's step), or None when the run released neither."""
    for value in (state.counts_hat, state.item_support):
        if value is not None:
            return np.asarray(value, dtype=np.float64)
    return None


def standardized(
    x: np.ndarray, axis: int | None = None, *, overwrite: bool = False, scratch: np.ndarray | None = None
) -> np.ndarray:
    """``x`` minus its mean over ``axis``, over its standard deviation (floored at 1e-12): the
    same arithmetic as numpy's ``std``, with one temporary (the users x items scores of an
    evaluation chunk are large), in ``scratch`` where given (float64, ``x``'s shape).
    ``overwrite``: a float64 ``x`` is the result's memory."""
    keep = axis is not None
    mean = x.mean(axis=axis, keepdims=keep)
    centred = np.subtract(x, mean, out=x if overwrite and x.dtype == np.float64 else None)
    n = centred.size if axis is None else centred.shape[axis]
    std = np.sqrt(np.sum(np.square(centred, out=scratch), axis=axis, keepdims=keep) / n)
    centred /= np.maximum(std, 1e-12)
    return centred


def popularity_prior(state: als.PublicState) -> np.ndarray | None:
    """The standardized released log-popularity of every item (None without a released
    popularity): the part of every ranking score that is the same for all users."""
    pop = popularity(state)
    return None if pop is None else standardized(np.log1p(np.maximum(pop, 0.0)))


def ranking_scores(
    shard: UserShard, state: als.PublicState, candidates: np.ndarray, blend: float = RANK_BLEND
) -> np.ndarray:
    """(n_users, k) ranking scores of the shard's users for the candidates (larger is better):
    standardized log-popularity plus ``blend`` times the standardized predicted rating (the
    predicted rating alone when the run released no popularity)."""
    return ranking_score_maker(shard, state, candidates, blend)()


def ranking_score_maker(shard: UserShard, state: als.PublicState, candidates: np.ndarray, blend: float = RANK_BLEND):
    """:func:`ranking_scores` in two parts: this call does what needs the model's kernels (the
    user solves), the function it returns makes the dense scores with numpy alone (thread-safe:
    the evaluation runs it on its pool, :func:`_evaluate`): ``make(out, scratch)`` makes them in
    the caller's memory where given (``out`` then holds the scores; both float64, (n_users, k))."""
    from .recommend import client_score_maker

    if state.spec.ranker is not None:  # an algorithm with a ranking of its own (topk, ease)
        if state.spec.ranker_any_thread:  # all of it on the pool
            return lambda out=None, scratch=None: state.spec.ranker(shard, state, candidates)
        ranked = state.spec.ranker(shard, state, candidates)
        return lambda out=None, scratch=None: ranked
    make_pred = client_score_maker(shard, state, candidates, clip=True)
    prior = popularity_prior(state)
    if prior is None:
        return lambda out=None, scratch=None: make_pred(out)
    prior = prior[candidates]

    def make(out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
        """The scores, in ``out`` where given (float64, (n_users, k)), ``scratch`` (the same)
        holding a temporary."""
        pred = make_pred(out)
        if len(candidates) < 2 or blend == 0:
            return np.broadcast_to(prior, pred.shape).copy()
        scores = standardized(pred, axis=1, overwrite=True, scratch=scratch)  # pred is this call's own or out
        scores *= blend
        scores += prior[None, :]
        return scores

    return make


def _empty(n_items: int) -> dict:
    return {"users": 0.0, "recall": 0.0, "ndcg": 0.0, "hits": 0.0, "recommended": np.zeros(n_items)}


def _top_k_sums(scores_of, history: UserShard, target: UserShard, n_items: int, k: int, threshold: float) -> dict:
    """Sums over the users with a relevant target item: their lists (``scores_of(history)``:
    (users, n_items) scores, items rated in training excluded), Recall@k, NDCG@k, hits and how
    often each item was recommended."""
    prepared = _scored(scores_of, history, target, threshold)
    return _empty(n_items) if prepared is None else _lists_and_sums(*prepared, n_items, k, threshold)


def _relevant(history: UserShard, target: UserShard, threshold: float):
    """(history, target) of the users with a relevant target item, or None."""
    relevant = target.ratings >= threshold
    rel_users = np.unique(target.local_user_of_rating[relevant])
    if len(rel_users) == 0:
        return None
    keep = np.zeros(history.n_users, dtype=bool)
    keep[rel_users] = True
    return sub_shard(history, keep), sub_shard(target, keep)


def _scored(scores_of, history: UserShard, target: UserShard, threshold: float):
    """(scores with training items at -inf, the relevant users' targets), or None: the part of
    :func:`_top_k_sums` that calls the model (the statistics kernels)."""
    subs = _relevant(history, target, threshold)
    return None if subs is None else (_marked(scores_of(subs[0]), subs[0]), subs[1])


def _marked(scores, history: UserShard, own: np.ndarray | None = None) -> np.ndarray:
    """``scores`` as float64 with each user's training items at -inf (copied unless they are
    a float64 array of their own, or ``own``: memory of the caller's)."""
    mine = scores is own or (isinstance(scores, np.ndarray) and scores.base is None)
    if not (mine and scores.dtype == np.float64 and scores.flags.writeable):
        scores = np.array(scores, dtype=np.float64)
    scores[history.local_user_of_rating, history.items] = -np.inf  # rated in training: not a candidate
    return scores


#: each pool thread's reusable memory for a chunk's scores and their temporary
_scratch_space = threading.local()


def _scratch(slot: str, shape: tuple[int, int]) -> np.ndarray:
    """A float64 array of ``shape`` in this thread's reusable memory (``slot``: one per use). A
    chunk's scores are large (512 users x 41,140 items: 168 MB), and fresh memory of that size
    is mapped and zeroed by the OS on every allocation: about 40% of the scoring's time at the
    Million Song Dataset's shape (measured on the 2-core machine)."""
    size = shape[0] * shape[1]
    have = getattr(_scratch_space, slot, None)
    if have is None or have.size < size:
        have = np.empty(size)
        setattr(_scratch_space, slot, have)
    return have[:size].reshape(shape)


def _made_and_summed(make, history: UserShard, target: UserShard, n_items: int, k: int, threshold: float) -> dict:
    """A chunk's dense scores (``make(out, scratch)``, in this thread's reusable memory), their
    lists and sums: the pool's part of :func:`_evaluate`."""
    out = _scratch("scores", (history.n_users, n_items))
    scores = make(out, _scratch("square", (history.n_users, n_items)))
    return _lists_and_sums(_marked(scores, history, own=out), target, n_items, k, threshold)


def _lists_and_sums(scores: np.ndarray, sub_t: UserShard, n_items: int, k: int, threshold: float) -> dict:
    """The top-k lists of ``scores`` and their sums (numpy, and torch's ``topk`` where torch is
    loaded: both release the GIL, so chunks of users run on a thread pool, :func:`_evaluate`)."""
    return _sums(top_k(scores, min(k, n_items)), sub_t, n_items, threshold)


def _sums(top: np.ndarray, sub_t: UserShard, n_items: int, threshold: float) -> dict:
    """The sums of :func:`_top_k_sums` of the lists ``top`` (users x kk item indices, best
    first): a hit is a listed item among the user's relevant targets (found by key, without a
    users x items matrix)."""
    out = _empty(n_items)
    kk = top.shape[1]
    mask = sub_t.ratings >= threshold
    rel_keys = np.unique(sub_t.local_user_of_rating[mask].astype(np.int64) * n_items + sub_t.items[mask])
    n_rel = np.bincount(rel_keys // n_items, minlength=len(top))
    keys = np.arange(len(top), dtype=np.int64)[:, None] * n_items + top
    at = np.minimum(np.searchsorted(rel_keys, keys), max(len(rel_keys) - 1, 0))
    hit = rel_keys[at] == keys if len(rel_keys) else np.zeros(keys.shape, dtype=bool)
    discount = 1.0 / np.log2(np.arange(2, kk + 2))
    ideal = np.cumsum(discount)[np.minimum(n_rel, kk) - 1]
    out["users"] = float(len(top))
    out["recall"] = float(np.sum(hit.sum(axis=1) / np.minimum(n_rel, kk)))
    out["ndcg"] = float(np.sum((hit * discount).sum(axis=1) / ideal))
    out["hits"] = float(hit.sum())
    out["recommended"] = np.bincount(top.ravel(), minlength=n_items).astype(np.float64)
    return out


def shared_score_lists(score: np.ndarray, history: UserShard, k: int) -> np.ndarray:
    """:func:`fedpriv.algorithms.metrics.top_k`'s lists of one score per item shared by every
    user (a popularity list), each user's training items excluded (at -inf), without making
    the users x items scores: each user's list is the first k items of the score's order
    (best first, ties to the lower item) that the user did not rate, then, where fewer are
    left, the rated items by index (top_k's order of the tied -inf scores)."""
    score = np.asarray(score, dtype=np.float64)
    n, users = len(score), history.n_users
    kk = min(k, n)
    order = np.lexsort((np.arange(n), -score))
    place = np.empty(n, dtype=np.int64)
    place[order] = np.arange(n)
    per_user = np.diff(history.indptr)
    width = min(n, kk + int(per_user.max(initial=0)))  # every list lies in the first `width` places
    rated = np.zeros((users, width), dtype=bool)
    at = place[history.items]
    near = at < width
    rated[history.local_user_of_rating[near], at[near]] = True
    free = ~rated
    take = free & (np.cumsum(free, axis=1) <= kk)
    short = take.sum(axis=1) < kk  # users who rated all but fewer than k items
    top = np.empty((users, kk), dtype=np.int64)
    cols = np.nonzero(take[~short])[1]  # row by row, each row's k places in order
    top[~short] = order[cols].reshape(-1, kk)
    for u in np.flatnonzero(short):
        mine = np.zeros(n, dtype=bool)
        mine[history.items[history.indptr[u] : history.indptr[u + 1]]] = True
        unrated = order[~mine[order]]
        top[u] = np.concatenate([unrated, np.flatnonzero(mine)])[:kk]
    return top


def shard_ranking_sums(
    state: als.PublicState, history: UserShard, target: UserShard, k: int, threshold: float, blend: float = RANK_BLEND
) -> dict:
    """One shard's ranking sums of the released model (:func:`ranking_scores` over every item)."""
    everything = np.arange(state.n_items)
    return _top_k_sums(
        lambda h: ranking_scores(h, state, everything, blend), history, target, state.n_items, k, threshold
    )


def ranking_from_sums(sums: dict, item_counts: np.ndarray, k: int, threshold: float) -> dict:
    """The ranking metrics of summed shard sums."""
    users = sums["users"]
    rec = np.asarray(sums["recommended"])
    out = {
        "k": int(k),
        "threshold": float(threshold),
        "users": int(users),
        "recall": float(sums["recall"] / users) if users else None,
        "ndcg": float(sums["ndcg"] / users) if users else None,
        "coverage": float((rec > 0).mean()) if len(rec) else None,
        "median_train_count": None,
    }
    if rec.sum() > 0:
        out["median_train_count"] = float(
            np.median(np.repeat(np.asarray(item_counts, dtype=np.float64), rec.astype(np.int64)))
        )
    return out


def _evaluate(makers_of, train, test, n_items: int, k: int, threshold: float, chunk: int = 512, lists_of=None) -> dict:
    """The ranking metrics over the test users with a relevant item, in chunks of users. This
    thread does what needs the model's kernels (``makers_of(history shard)``, e.g. the user
    solves of :func:`ranking_score_maker`); the function it returns makes the chunk's dense
    scores on a thread pool, which then makes its lists and sums while this thread goes on (at
    most one chunk per thread waits). ``lists_of(history shard)``: the chunk's top-k lists made
    here directly, in place of scores. The sums are added in chunk order: the same numbers as
    one chunk after another."""
    users = np.unique(test.users[test.ratings >= threshold])
    total = _empty(n_items)

    def add(sums: dict) -> None:
        for key in total:
            total[key] = total[key] + sums[key]

    workers = min(thread_count(), max(1, len(users) // chunk))
    with ThreadPoolExecutor(workers, thread_name_prefix="fedpriv-ranking", initializer=one_thread_each) as pool:
        waiting: deque = deque()
        for start in range(0, len(users), chunk):
            part = users[start : start + chunk]
            subs = _relevant(shard_users(train, part), shard_users(test, part), threshold)
            if subs is not None and lists_of is not None:
                waiting.append(pool.submit(_sums, lists_of(subs[0]), subs[1], n_items, threshold))
            elif subs is not None:
                waiting.append(pool.submit(_made_and_summed, makers_of(subs[0]), *subs, n_items, k, threshold))
            while len(waiting) > workers:
                add(waiting.popleft().result())
        while waiting:
            add(waiting.popleft().result())
    return ranking_from_sums(total, train.item_counts(), k, threshold)


def evaluate_ranking(
    state: als.PublicState, train, test, *, k: int = RANK_K, threshold: float | None = None, blend: float = RANK_BLEND
) -> dict:
    """Ranking metrics of the released model on ``test`` (users solved from ``train``), in
    chunks of users (a chunk scores every item)."""
    threshold = relevance_threshold(state.rating_range) if threshold is None else float(threshold)
    everything = np.arange(state.n_items)
    return _evaluate(
        lambda h: ranking_score_maker(h, state, everything, blend), train, test, state.n_items, k, threshold
    )


def popular_reference(train, test, *, k: int = RANK_K, threshold: float) -> dict:
    """The non-private most-popular list (training counts) on the same users: a reference."""
    counts = train.item_counts().astype(np.float64)
    return _evaluate(None, train, test, len(counts), k, threshold, lists_of=lambda h: shared_score_lists(counts, h, k))
