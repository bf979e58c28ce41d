"""Private recommendation from the clients (Antonova et al. 2025, section VIII, in the federation).

After training, every client scores a public candidate set with the released item embeddings
and its local user vector (never released), and reports ONE item chosen by a private selection
mechanism (:mod:`fedpriv.privacy.selection`); the server sees only the reports. Split by
party like every algorithm here, so both engines run the same code:

- public setup (:func:`candidate_items`, :func:`public_ranges`): the candidates are the ``k``
  items with the largest released (noised) counts, else the largest released item-embedding
  norms; both are releases of the training run, so this costs no budget.
- per-candidate score ranges [lo_a, hi_a], the clipping bounds of the scores, whose width is
  the candidate's sensitivity Delta_a (a user's score for a lies in [lo_a, hi_a] whatever their
  data):
  * ``sensitivity=quantile`` (the paper's rule, privately estimated): every client adds, per
    candidate, a one-hot histogram of its users' predicted scores over public bins; the
    aggregator sums them and releases the (k x bins) histogram once through the ledger's
    Gaussian mechanism (L2 sensitivity sqrt(k): one user adds one count per candidate row);
    [lo_a, hi_a] are the ``quantiles`` of the noised histogram (post-processing).
  * ``sensitivity=norm`` (public, no budget): scores are mean + b_a + <u, v_a> with the user
    vector clipped to norm ``user_clip``, so they lie in mean + b_a +- user_clip * ||v_a||,
    intersected with the rating range.
  * ``sensitivity=range``: the rating range for every candidate (homogeneous).
- client (:func:`client_recommend`): scores clipped to [lo_a, hi_a]; items the user rated in
  training are scored lo_a with ``exclude_rated`` (still within the range, so the sensitivity
  bound holds, and they are rarely chosen); one pure epsilon-DP selection per user drawn through the client's own
  :class:`~fedpriv.privacy.ledger.PrivacyLedger`, whose records go back with the reports. The
  client also returns evaluation sums (squared error to the best score, hits on its held-out
  items, the per-user Spearman correlation of scores and sensitivities as a histogram).
- server (:func:`merge_reports`): checks every reply (indices in range, one per user, the
  client's ledger records exactly the declared selection) before merging its records into the
  run's recommendation ledger.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..privacy.ledger import PrivacyLedger, Release
from ..privacy.target import ADD_REMOVE
from ..privacy.randomness import PURPOSE_RECOMMEND, require_keys, seed_from_keys
from . import als
from .shards import UserShard

SOURCES = ("quantile", "norm", "range")
CORR_BINS = np.linspace(-1.0, 1.0, 21)  # Spearman histogram edges


class ReadOnlyDict(dict):
    """A dict that refuses changes: a frozen config's mapping field. Still a dict to JSON,
    ``dataclasses.asdict``, copies and pickles (which rebuild it from a plain dict)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} is read-only (a new config: dataclasses.replace)")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        return type(self), (dict(self),)


@dataclass(frozen=True)
class RecommendConfig:
    """The private recommendation phase's settings; frozen (a change is a new config:
    ``dataclasses.replace``), its ``params`` a read-only copy of the mapping given."""

    mechanism: str = "mgem"
    epsilon: float = 1.0  # per-user pure epsilon of the one reported item
    candidates: int = 100
    sensitivity: str = "quantile"
    quantiles: tuple[float, float] = (0.05, 0.95)
    bins: int = 40
    hist_epsilon: float = 1.0  # (epsilon, delta) of the histogram release (quantile source)
    hist_delta: float = 1e-6
    user_clip: float = 1.0  # norm source
    exclude_rated: bool = True  # score the user's training items lo_a (recommend unseen items)
    params: Mapping = field(default_factory=dict)  # mechanism parameters (beta, lam, eta, ...), read-only

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", ReadOnlyDict(self.params))

    def validate(self) -> None:
        from ..privacy import selection as mechanisms

        if self.mechanism not in mechanisms.PRIVATE:
            raise ConfigError(
                f"must be one of {', '.join(mechanisms.PRIVATE)}, got {self.mechanism!r}", field="rec_mechanism"
            )
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError(f"must be a finite number > 0, got {self.epsilon}", field="rec_epsilon")
        if not (int(self.candidates) == self.candidates and self.candidates >= 2):
            raise ConfigError(f"must be an integer >= 2, got {self.candidates}", field="rec_candidates")
        if self.sensitivity not in SOURCES:
            raise ConfigError(f"must be one of {', '.join(SOURCES)}, got {self.sensitivity!r}", field="rec_sensitivity")
        lo, hi = self.quantiles
        if not (0 <= lo < hi <= 1):
            raise ConfigError(f"need 0 <= lo < hi <= 1, got {self.quantiles}", field="rec_quantiles")
        if not (int(self.bins) == self.bins and self.bins >= 2):
            raise ConfigError(f"must be an integer >= 2, got {self.bins}", field="rec_bins")
        if self.sensitivity == "quantile" and not (
            math.isfinite(self.hist_epsilon) and self.hist_epsilon > 0 and 0 < self.hist_delta < 1
        ):
            raise ConfigError(
                f"need epsilon > 0 and delta in (0, 1), got ({self.hist_epsilon}, {self.hist_delta})",
                field="rec_hist_epsilon",
            )
        if not (math.isfinite(self.user_clip) and self.user_clip > 0):
            raise ConfigError(f"must be a finite number > 0, got {self.user_clip}", field="rec_user_clip")


# ---------------------------------------------------------------- public setup
def candidate_items(state: als.PublicState, k: int) -> np.ndarray:
    """The k public candidates: largest released counts, else largest item-embedding norms."""
    k = min(int(k), state.n_items)
    if state.counts_hat is not None:
        key = np.asarray(state.counts_hat, dtype=np.float64)
    else:
        key = np.linalg.norm(np.asarray(state.item_factors, dtype=np.float64), axis=1)
    return np.sort(np.argsort(-key, kind="stable")[:k]).astype(np.int64)


def hist_edges(state: als.PublicState, bins: int) -> np.ndarray:
    return np.linspace(*state.rating_range, int(bins) + 1)


def public_ranges(
    state: als.PublicState, candidates: np.ndarray, cfg: RecommendConfig
) -> tuple[np.ndarray, np.ndarray]:
    """[lo_a, hi_a] of the sources that need no release (norm, range)."""
    r0, r1 = (float(x) for x in state.rating_range)
    k = len(candidates)
    if cfg.sensitivity == "range":
        return np.full(k, r0), np.full(k, r1)
    if cfg.sensitivity != "norm":
        raise ConfigError("the quantile source needs the histogram release (release_ranges)", field="rec_sensitivity")
    V = als.user_design(state).astype(np.float64)[candidates]
    centre = state.mean + (state.item_bias[candidates] if state.item_bias is not None else 0.0)
    half = cfg.user_clip * np.linalg.norm(V, axis=1)
    lo, hi = np.clip(centre - half, r0, r1), np.clip(centre + half, r0, r1)
    return _widen(lo, hi, r0, r1, (r1 - r0) / cfg.bins)


def _widen(lo: np.ndarray, hi: np.ndarray, r0: float, r1: float, width: float) -> tuple[np.ndarray, np.ndarray]:
    """Ranges at least ``width`` wide (a zero sensitivity is not allowed), within [r0, r1]."""
    short = hi - lo < width
    mid = 0.5 * (lo + hi)
    lo = np.where(short, np.clip(mid - width / 2, r0, r1 - width), lo)
    hi = np.where(short, lo + width, hi)
    return lo, hi


# ---------------------------------------------------------------- client
def client_scores(
    shard: UserShard,
    state: als.PublicState,
    candidates: np.ndarray,
    user_clip: float | None = None,
    *,
    clip: bool = True,
) -> np.ndarray:
    """(n_users, k) predicted ratings of the shard's users for the candidates, clipped to the
    rating range (``clip=False``: as predicted, for ranking); the user vectors are solved
    locally (and clipped to ``user_clip``). The one scoring function of the ClientApp's private
    recommendation and of a saved model's :meth:`fedpriv.run.model.Model.recommend`."""
    return client_score_maker(shard, state, candidates, user_clip, clip=clip)()


def client_score_maker(
    shard: UserShard,
    state: als.PublicState,
    candidates: np.ndarray,
    user_clip: float | None = None,
    *,
    clip: bool = True,
):
    """:func:`client_scores` in two parts: this call solves the user vectors (the statistics
    kernels, on the run's device), and the function it returns makes the (n_users, k) scores
    from them with numpy alone, so it may run on another thread (the evaluation's pool), in
    memory of the caller's where given (``make(out)``)."""
    if shard.n_users == 0:
        return lambda out=None: np.zeros((0, len(candidates)))
    U = als.client_user_vectors(shard, state).astype(np.float64)
    if user_clip is not None:
        from ..privacy.clipping import clip_rows

        U = clip_rows(U, user_clip)
    V = als.user_design(state).astype(np.float64)[candidates]
    bias = None if state.item_bias is None else state.item_bias[candidates]
    mean, bounds = state.mean, state.rating_range

    def make(out: np.ndarray | None = None) -> np.ndarray:
        """The scores, in ``out`` (float64, (n_users, k)) where given."""
        pred = np.matmul(U, V.T, out=out)  # then in place: the same sums as mean + U V^T + bias, without temporaries
        pred += mean
        if bias is not None:
            pred += bias
        return np.clip(pred, *bounds, out=pred) if clip else pred

    return make


def rated_mask(shard: UserShard, candidates: np.ndarray) -> np.ndarray:
    """(n_users, k) True where the user rated the candidate in training."""
    pos = np.searchsorted(candidates, shard.items)
    pos_c = np.minimum(pos, len(candidates) - 1)
    hit = candidates[pos_c] == shard.items
    mask = np.zeros((shard.n_users, len(candidates)), dtype=bool)
    mask[shard.local_user_of_rating[hit], pos_c[hit]] = True
    return mask


def client_histogram(
    shard: UserShard, state: als.PublicState, candidates: np.ndarray, cfg: RecommendConfig
) -> np.ndarray:
    """(k, bins) counts of the shard's users' predicted scores per candidate (one per user and
    candidate): the shard's share of the quantile release."""
    q = client_scores(shard, state, candidates)
    edges = hist_edges(state, cfg.bins)
    b = np.clip(np.searchsorted(edges, q, side="right") - 1, 0, cfg.bins - 1)  # (n, k)
    k = len(candidates)
    flat = (np.arange(k)[None, :] * cfg.bins + b).ravel()
    return np.bincount(flat, minlength=k * cfg.bins).reshape(k, cfg.bins).astype(np.float64)


@dataclass
class ClientReport:
    picks: np.ndarray  # (n_users,) index into the candidates
    records: list[dict]  # the client's ledger records
    sums: dict[str, np.ndarray]  # evaluation sums


def client_recommend(
    shard: UserShard,
    state: als.PublicState,
    candidates: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    cfg: RecommendConfig,
    heldout: UserShard | None = None,
    reproducible: bool = False,
) -> ClientReport:
    """One private report per user of the shard, plus evaluation sums (``heldout``: the same
    users' held-out ratings, for the hit rate). The picks are drawn from the OS CSPRNG, or with
    ``reproducible=True`` from the users' secret keys (reproducible-noise runs only)."""

    user_clip = cfg.user_clip if cfg.sensitivity == "norm" else None
    q = np.clip(client_scores(shard, state, candidates, user_clip), lo, hi)
    if cfg.exclude_rated:
        q = np.where(rated_mask(shard, candidates), lo[None, :], q)
    sens = hi - lo
    ledger = PrivacyLedger(seed=seed_from_keys(require_keys(shard), PURPOSE_RECOMMEND) if reproducible else None)
    picks = (
        ledger.select("recommendation", cfg.mechanism, q, sens, epsilon=cfg.epsilon, **cfg.params)
        if shard.n_users
        else np.zeros(0, np.int64)
    )
    sums = evaluation_sums(q, sens, picks, shard, candidates, heldout)
    return ClientReport(picks=np.asarray(picks, np.int64), records=ledger.to_list(), sums=sums)


def evaluation_sums(
    q: np.ndarray,
    sens: np.ndarray,
    picks: np.ndarray,
    shard: UserShard,
    candidates: np.ndarray,
    heldout: UserShard | None,
) -> dict[str, np.ndarray]:
    """Sums over the shard's users: squared and absolute error to the best score, hits of the
    report / of the non-private argmax / expected hits of a uniform pick on held-out items
    (users with at least one held-out candidate count in ``n_eval``), and the histogram of
    per-user Spearman correlations of (scores, sensitivities)."""
    from ..privacy import selection as mechanisms

    n = len(picks)
    rows = np.arange(n)
    err = q.max(axis=1) - q[rows, picks] if n else np.zeros(0)
    out = {
        "n": np.array([float(n)]),
        "sq_err": np.array([float(np.sum(err**2))]),
        "abs_err": np.array([float(np.sum(err))]),
        "hits": np.zeros(1),
        "argmax_hits": np.zeros(1),
        "uniform_hits": np.zeros(1),
        "n_eval": np.zeros(1),
        "spearman_hist": np.zeros(len(CORR_BINS) - 1),
    }
    if n == 0:
        return out
    rho = mechanisms.spearman(q, np.broadcast_to(sens, q.shape))
    out["spearman_hist"] = np.histogram(np.clip(rho, -1, 1), bins=CORR_BINS)[0].astype(float)
    if heldout is not None and heldout.n_ratings:
        if not np.array_equal(heldout.user_ids, shard.user_ids):
            raise ValueError("held-out shard must hold the same users")
        held = rated_mask(heldout, candidates)  # (n, k) held-out candidates of each user
        has = held.any(axis=1)
        out["n_eval"][0] = float(has.sum())
        out["hits"][0] = float(held[rows, picks][has].sum())
        out["argmax_hits"][0] = float(held[rows, np.argmax(q, axis=1)][has].sum())
        out["uniform_hits"][0] = float((held[has].sum(axis=1) / q.shape[1]).sum())
    return out


# ---------------------------------------------------------------- aggregator and server
HIST_RELEASE = "rec_score_hist"


def hist_multiplier(cfg: RecommendConfig, *, integer_orders: bool = False, relation: str = ADD_REMOVE) -> float:
    """z of the histogram release, calibrated to (hist_epsilon, hist_delta) under the neighbouring
    ``relation`` (the recommendation ledger's). ``integer_orders``: True for secure mode (Skellam
    noise, accounted at integer RDP orders only), False for central mode (dp-accounting's usual
    orders)."""
    from ..privacy.accounting import PlannedRelease, calibrate

    plan = [PlannedRelease(HIST_RELEASE, 1, 1.0)]
    cal = calibrate(plan, cfg.hist_epsilon, cfg.hist_delta, integer_orders=integer_orders, relation=relation)
    return cal.multiplier(HIST_RELEASE)


def release_ranges(
    total: np.ndarray, state: als.PublicState, cfg: RecommendConfig, ledger: PrivacyLedger, relation: str = ADD_REMOVE
) -> tuple[np.ndarray, np.ndarray]:
    """The aggregator step of the quantile source: release the summed (k x bins) histogram
    through the ledger (L2 sensitivity sqrt(k)), then read [lo_a, hi_a] off the noised
    histogram (post-processing). ``relation``: the recommendation ledger's (``ledger`` may be
    the stand-in of a secure round)."""
    k = total.shape[0]
    z = hist_multiplier(
        cfg, integer_orders=state.config.aggregation.secure, relation=relation
    )  # secure: the decoded Skellam sum's planned z
    noised = ledger.gaussian(HIST_RELEASE, total, sensitivity=math.sqrt(k), noise_multiplier=z)
    return quantile_ranges(noised, hist_edges(state, cfg.bins), cfg.quantiles)


def quantile_ranges(
    hist: np.ndarray, edges: np.ndarray, quantiles: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the left edge of the bin holding the lower quantile and the right edge of the
    bin holding the upper one, of a (noised, hence clipped at 0) histogram."""
    h = np.maximum(np.asarray(hist, dtype=np.float64), 0.0)
    cdf = np.cumsum(h, axis=1)
    tot = cdf[:, -1:]
    tot = np.where(tot > 0, tot, 1.0)
    cdf = cdf / tot
    nb = h.shape[1]
    i_lo = np.minimum((cdf < quantiles[0]).sum(axis=1), nb - 1)  # first bin with cdf >= q_lo
    i_hi = np.minimum((cdf < quantiles[1]).sum(axis=1), nb - 1)
    empty = h.sum(axis=1) == 0
    i_lo = np.where(empty, 0, i_lo)
    i_hi = np.where(empty, nb - 1, np.maximum(i_hi, i_lo))
    return edges[i_lo], edges[i_hi + 1]


class RejectedReport(ValueError):
    pass


def eval_parts() -> list[tuple[str, int]]:
    """(name, length) of a client's evaluation sums (:func:`evaluation_sums`): what secure mode
    sums as one measurement."""
    return [(key, 1) for key in ("n", "sq_err", "abs_err", "hits", "argmax_hits", "uniform_hits", "n_eval")] + [
        ("spearman_hist", len(CORR_BINS) - 1)
    ]


def check_report(picks, records, sums, n_users: int, k: int, cfg: RecommendConfig) -> list[Release]:
    """Validate one client's reply; returns its ledger records to merge. Raises
    :class:`RejectedReport` with the reason when anything is off. ``sums`` None: secure mode,
    where the evaluation sums travel as one secure measurement, not in the reply."""
    picks = np.asarray(picks)
    if picks.shape != (n_users,) or picks.dtype.kind not in "iu":
        raise RejectedReport(f"expected {n_users} integer reports, got shape {picks.shape} dtype {picks.dtype}")
    if n_users and (picks.min() < 0 or picks.max() >= k):
        raise RejectedReport(f"report outside the {k} candidates")
    try:
        rels = PrivacyLedger.releases_from_list(records)
    except (KeyError, TypeError, ValueError) as exc:
        raise RejectedReport(f"malformed ledger records ({exc})") from None
    expected = [("recommendation", "selection", float(cfg.epsilon), n_users, n_users, True)] if n_users else []
    got = [(r.name, r.mechanism, r.pure_epsilon, r.count, r.groups, r.disjoint) for r in rels if isinstance(r, Release)]
    if (
        len(rels) != len(got)
        or len(got) != len(expected)
        or any(
            g[:2] != e[:2] or g[3:] != e[3:] or not math.isclose(g[2], e[2], rel_tol=1e-12)
            for g, e in zip(got, expected)
        )
    ):
        raise RejectedReport(f"ledger records {got} differ from the declared selection {expected}")
    if sums is None:
        return [r for r in rels if isinstance(r, Release)]
    limits = {
        "n": n_users,
        "n_eval": n_users,
        "sq_err": None,
        "abs_err": None,
        "hits": n_users,
        "argmax_hits": n_users,
        "uniform_hits": n_users,
    }
    for key, lim in limits.items():
        v = np.asarray(sums.get(key, np.zeros(0)), dtype=np.float64)
        if v.shape != (1,) or not np.all(np.isfinite(v)) or v[0] < 0 or (lim is not None and v[0] > lim + 1e-9):
            raise RejectedReport(f"evaluation sum {key!r} malformed or out of [0, {lim}]")
    sh = np.asarray(sums.get("spearman_hist", np.zeros(0)), dtype=np.float64)
    if sh.shape != (len(CORR_BINS) - 1,) or not np.all(np.isfinite(sh)) or sh.min() < 0 or sh.sum() > n_users + 1e-9:
        raise RejectedReport("evaluation sum 'spearman_hist' malformed")
    return [r for r in rels if isinstance(r, Release)]


def merge_records(ledger: PrivacyLedger, rels: list[Release]) -> None:
    """Merge a checked client's selection records into the run's recommendation ledger
    (through its budget check, when it has a budget)."""
    ledger.merge(rels)


def summarize(total: dict[str, np.ndarray] | None, lo: np.ndarray, hi: np.ndarray) -> dict:
    """The run's recommendation metrics from the summed client sums (None: no reply) and the
    candidates' ranges."""
    ranges = {
        "candidates": int(len(lo)),
        "sensitivity_min": float((hi - lo).min()),
        "sensitivity_max": float((hi - lo).max()),
    }
    if total is None:
        return {"users": 0, **ranges}
    n = float(total["n"][0])
    n_eval = float(total["n_eval"][0])
    hist = total["spearman_hist"]
    centres = 0.5 * (CORR_BINS[1:] + CORR_BINS[:-1])
    return {
        "users": int(n),
        "mse_to_best": float(total["sq_err"][0] / n) if n else None,
        "mean_error_to_best": float(total["abs_err"][0] / n) if n else None,
        "hit_rate": float(total["hits"][0] / n_eval) if n_eval else None,
        "argmax_hit_rate": float(total["argmax_hits"][0] / n_eval) if n_eval else None,
        "uniform_hit_rate": float(total["uniform_hits"][0] / n_eval) if n_eval else None,
        "users_evaluated": int(n_eval),
        "spearman_hist": {"edges": CORR_BINS.tolist(), "counts": hist.astype(int).tolist()},
        "spearman_mean_binned": float((hist * centres).sum() / hist.sum()) if hist.sum() else None,
        "spearman_positive_share": float(hist[centres > 0].sum() / hist.sum()) if hist.sum() else None,
        **ranges,
    }


def add_sums(total: dict[str, np.ndarray] | None, sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if total is None:
        return {k: np.array(v, dtype=np.float64, copy=True) for k, v in sums.items()}
    for k in total:
        total[k] += sums[k]
    return total
