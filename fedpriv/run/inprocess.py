"""The in-process engine: every client's step in this process, on shards of users (the rating
family, :mod:`fedpriv.engine.inprocess`) or blocks of users (a block family,
:mod:`fedpriv.engine.blocks`) that play the nodes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..errors import ConfigError
from .base import Candidates, Engine, Trained
from .inputs import RunOptions
from .nodes import SECURE_USERS_PER_NODE, node_layout


def inprocess_shard_size(opts, n_users: int, secure: bool) -> int | None:
    """Users per shard of the in-process engine: ``users_per_shard`` when given, else the node
    layout of ``nodes`` / ``users_per_node`` (:mod:`fedpriv.run.nodes`); with neither, one shard
    in central mode and :data:`~fedpriv.run.nodes.SECURE_USERS_PER_NODE` users per node in secure
    mode. None: one shard."""
    if opts.users_per_shard:
        return int(opts.users_per_shard)
    if not (opts.nodes or opts.users_per_node or secure):
        return None
    layout = node_layout(
        n_users, nodes=opts.nodes, users_per_node=opts.users_per_node, default_users_per_node=SECURE_USERS_PER_NODE
    )
    return None if layout.nodes == 1 else layout.users_per_node


@dataclass(frozen=True)
class InProcess(Engine):
    """Every client in this process, on shards of users that play the nodes: ``nodes`` and
    ``users_per_node`` mean what they mean on every engine (:mod:`fedpriv.run.nodes`; default one
    shard in central mode, 20 users per node in secure mode); ``users_per_shard`` sets the
    shard size directly."""

    users_per_shard: int | None = None
    nodes: int | None = None
    users_per_node: int | None = None
    device: str | None = None  # where the kernels compute: "cpu" (default), "cuda", "cuda:N" (fedpriv.util.device)
    name: ClassVar[str] = "inprocess"
    sets: ClassVar[tuple[str, ...]] = ("users_per_shard", "nodes", "users_per_node")
    honours: ClassVar[frozenset[str]] = frozenset({"users_per_shard"})

    def execute(self, plan, *, progress: bool = False, second_opinion: bool = True):
        from ..util import device

        with device.use(self.device):  # the same releases and ledger on every device
            return super().execute(plan, progress=progress, second_opinion=second_opinion)

    def layout(self, opts: RunOptions, plan) -> RunOptions:
        if plan.family.blocks:  # a block family: its blocks are laid out in train()
            return opts
        shard = inprocess_shard_size(opts, plan.n_users, plan.config.aggregation.secure) or 0
        if shard:  # recorded as on every engine: the nodes the shards play
            return replace(opts, users_per_shard=shard, users_per_node=shard, nodes=-(-plan.n_users // shard))
        return replace(opts, users_per_shard=shard)

    def train(self, plan, opts: RunOptions, secrets, *, progress: bool = False) -> Trained:
        if plan.family.blocks:
            return self._train_blocks(plan, opts, secrets, progress)
        if not plan.here:
            raise ConfigError(
                "public:DIR holds no ratings: it is the server side of a partitioned deployment (--engine flower)",
                field="--data",
            )
        from ..engine.inprocess import recommend_inprocess, train_inprocess

        train = plan.split.train
        result = train_inprocess(
            plan.algorithm,
            train,
            plan.config,
            rating_range=plan.rating_range,
            implicit=plan.implicit,
            epsilon=plan.job.epsilon,
            delta=plan.job.delta,
            users_per_shard=opts.users_per_shard or None,
            item_features=plan.dataset.item_features,
            progress=progress,
            secrets=secrets,
            relation=plan.job.relation,
        )
        trained = Trained(result.state, result.ledger, result.timings)
        if plan.recommend is not None:
            trained.recommendation, trained.rec_ledger, _ = recommend_inprocess(
                result.state,
                train,
                plan.split.test,
                plan.recommend,
                users_per_shard=opts.users_per_shard or None,
                secrets=secrets,
                relation=plan.job.relation,
            )
        return trained

    def _train_blocks(self, plan, opts: RunOptions, secrets, progress: bool) -> Trained:
        from ..engine.blocks import train_blocks

        shard = inprocess_shard_size(opts, plan.n_users, plan.config.aggregation.secure) or 4096
        state, ledger, timings = train_blocks(
            plan.family,
            plan.algorithm,
            plan.dataset,
            plan.config,
            epsilon=plan.job.epsilon if plan.private else None,
            delta=plan.job.delta,
            relation=plan.relation,
            users_per_shard=shard,
            secrets=secrets,
            progress=progress,
        )
        return Trained(state, ledger, timings, users_per_node=opts.users_per_node or 1)

    def tuning_candidates(self, plan, opts: RunOptions) -> Candidates:
        from ..engine.inprocess import tuning_candidate

        run = tuning_candidate(
            plan.algorithm, plan.split, plan.rating_range, plan.job.epsilon, plan.job.delta, plan.dataset.item_features
        )
        return Candidates(run, lambda result, ledger: Trained(result.state, ledger, result.timings))
