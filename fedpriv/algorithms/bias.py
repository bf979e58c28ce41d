"""The private bias model: r_ui ~ mean + b_i + c_u. The mean is released privately, each user
solves its own bias c_u locally (it is never sent and costs no privacy), and the item biases are
solved on the server from private per-item statistics summed over clipped per-user
contributions. It is the ALS family's step with no factors (rank 0): the released user vector
is the fixed bias coordinate kappa alone, so item i's statistics are A_i = sum_j w_ij kappa^2 and
b_i = sum_j w_ij kappa clip(r_ij - mean - c_j), noised once per step.

Each user's weights are uniform over its ratings and clipped so that sum_i w_ij^2 <= beta:
w_ij = min(1, sqrt(beta / n_j)). A user with few ratings counts fully on each of them; a heavy
user's influence is spread over its items (the same L2 budget per user as the other members of
the family). Adding it is this module and its registration (fedpriv.algorithms.__init__)."""

from __future__ import annotations

import numpy as np

from ..privacy.weights import uniform_user_weights
from . import als
from .steps import AlternatingStep
from .registry import AlgorithmSpec, register
from .typed import Bias


def bias_rating_weights(shard, state) -> np.ndarray:
    """w_ij = min(1, sqrt(beta / n_j)) on each of user j's ratings."""
    return uniform_user_weights(shard.indptr, state.config.beta)


class BiasStep(AlternatingStep):
    """The family's step at rank 0; with ``bias_prior`` (public item features on the server)
    each item's bias is then shrunk towards its feature groups' pooled effect (post-processing
    of the released statistics: :func:`fedpriv.algorithms.als.step_bias_prior`)."""

    def setup(self, state, features):
        super().setup(state, features)
        return features  # public: the server's item features, for the prior

    def server(self, release, state, server) -> None:
        super().server(release, state, server)
        if state.config.bias_prior:
            A, b, *_ = release
            als.step_bias_prior(A, b, state, server)


BIAS_STEP = BiasStep()

SPEC = register(
    AlgorithmSpec(
        "bias",
        bias_rating_weights,
        task="reference: ratings",
        summary="private bias model: private mean and item biases, user biases solved locally",
        # one step; the ridge (in noise standard deviations) and the residual clip are chosen by the
        # noise-aware rule from the released user count (fedpriv.algorithms.defaults.bias_settings;
        # without it, --set defaults=fixed: 3 and 1); kappa takes the whole norm bound
        defaults=(
            ("rank", "0"),
            ("steps", "1"),
            ("reg_noise_units", "3"),
            ("item_bias", "true"),
            ("user_bias", "true"),
            ("bias_share", "0.99"),
            ("defaults", "noise-aware"),
        ),
        fixed=("rank", "item_bias", "user_bias"),
        bias_model=True,
        step=BIAS_STEP,
        typed=Bias,
    )
)
