"""Per-node data of a deployment (``fedpriv deploy partition`` and ``deploy up --data``): the data
owner's step, run once before anything starts. It reads the data set and writes, for node i, a
folder with only its users' ratings plus a copy of the public metadata, and a ``public`` folder
for the server (:mod:`fedpriv.data.public`). The server of the deployment starts from that public
folder only (data spec ``public:DIR``); each node splits its own users' ratings with the public
seed (the split is keyed by raw ids, so it equals the global split restricted to the node)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError
from .config import DeployConfig

SPLIT_SEED = 1234  # the default public split seed of fedpriv runs (RunOptions.split_seed)


@dataclass
class Partition:
    """A data set cut into node blocks of ``users_per_node`` users (not yet written)."""

    interactions: object  # Interactions
    item_features: object
    rating_range: tuple[float, float]
    source: str
    users_per_node: int
    split_seed: int = SPLIT_SEED

    @property
    def n_users(self) -> int:
        return int(self.interactions.n_users)

    def public_meta(self, nodes: int) -> dict:
        inter = self.interactions
        return {
            "source": self.source,
            "n_users": int(inter.n_users),
            "n_items": int(inter.n_items),
            "rating_range": [float(x) for x in self.rating_range],
            "implicit": False,
            "protocol": "random",
            "split_seed": int(self.split_seed),
            "nodes": int(nodes),
            "users_per_node": int(self.users_per_node),
        }


def split_job(
    data: str, users_per_node: int, split_seed: int = SPLIT_SEED, options: dict[str, str] | None = None
) -> Partition:
    """Load ``data`` (the data owner's side; ``options``: the ``--data-opt`` options of a
    csv/parquet file) and cut it into node blocks. Partitioned deployments use the random split,
    evaluated on the nodes (the held-out-users protocol evaluates on the server and is refused
    here)."""
    from ...data.spec import HELDOUT_KINDS, PUBLIC_KIND, load_spec, parse_data_spec, require_declared_catalogue

    spec = parse_data_spec(data, options or None)
    if spec.kind == PUBLIC_KIND or spec.kind == "synthetic-personal":
        raise ConfigError(f"give the rating data set to partition, not {spec.kind}:", field="--data")
    ds = load_spec(spec)
    require_declared_catalogue(ds, spec, "a deployment")  # its public metadata fixes n_items for every run
    if ds.implicit or spec.kind in HELDOUT_KINDS:
        raise ConfigError(
            f"{spec.kind}: a partitioned deployment evaluates on its nodes with the random split; "
            "the held-out-users protocol (implicit data) is not supported there yet",
            field="--data",
        )
    return Partition(
        ds.interactions,
        ds.item_features,
        tuple(ds.rating_range),
        str(spec),
        max(1, int(users_per_node)),
        int(split_seed),
    )


def n_partitions(part: Partition) -> int:
    return -(-part.n_users // part.users_per_node)


def write_partition(part: Partition, nodes: int, out: Path, node_dir=None) -> None:
    """``out/public`` (the server's) and one folder per node (``node_dir(i)``, default
    ``out/node-<i>``) holding that node's users' ratings and a copy of ``public``."""
    from ...algorithms.shards import user_block
    from ...data.public import write_node_ratings, write_public

    if n_partitions(part) > nodes:
        raise ConfigError(
            f"{n_partitions(part)} partitions of {part.users_per_node} users need at least {n_partitions(part)} nodes, "
            f"got {nodes}",
            field="--nodes",
        )
    out = Path(out)
    public = write_public(out / "public", part.public_meta(nodes), part.interactions.item_ids, part.item_features)
    for i in range(nodes):
        folder = Path(node_dir(i)) if node_dir is not None else out / f"node-{i}"
        write_node_ratings(folder, part.interactions, user_block(i, part.users_per_node, part.n_users))
        shutil.copytree(public, folder / "public")


def write_node_data(cfg: DeployConfig, part: Partition, root: Path | None = None) -> None:
    """The run folder's partition: ``public/`` and node i's ``node-data/node-<i>/``."""
    base = root or cfg.run_dir
    write_partition(part, cfg.nodes, base, node_dir=lambda i: base / cfg.node_data_dir(i).relative_to(cfg.run_dir))
