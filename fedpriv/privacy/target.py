"""A run's privacy target as one value: (epsilon, delta), the neighbouring relation every epsilon
holds under, and the noise seed (:class:`Privacy`). The relation is a parameter of the job
(:attr:`fedpriv.run.Job.relation`), never ambient state: the plan, the ledger and the accountants
all carry the one the job was given.

Light on purpose (no dp-accounting, no numpy): the run layer and the ledger read the relations
from here; :mod:`fedpriv.privacy.accounting` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError

#: one user added or removed (the default: runs that publish no exact user count)
ADD_REMOVE = "add_remove"
#: one user's data replaced by anybody's, the number of users unchanged: what holds where the
#: enrolled count is public (a deployment's ``public/meta.json``, its one node per user)
REPLACE_ONE = "replace_one"
RELATIONS = (ADD_REMOVE, REPLACE_ONE)


def check_relation(relation: str, field: str = "neighbouring") -> str:
    """``relation`` when it is one of :data:`RELATIONS`, else a ConfigError naming ``field``."""
    if relation not in RELATIONS:
        raise ConfigError(f"must be one of {', '.join(RELATIONS)}, got {relation!r}", field=field)
    return relation


@dataclass(frozen=True)
class Privacy:
    """The privacy target of a run: ``epsilon`` at ``delta`` (None: a non-private run), under
    the neighbouring ``relation`` (:data:`ADD_REMOVE`, or :data:`REPLACE_ONE` for a deployment,
    whose enrolled count is public); ``noise_seed``: reproducible noise (privacy then holds only
    against those who know not the seed), None for secret noise."""

    epsilon: float | None
    delta: float = 1e-5
    relation: str = ADD_REMOVE
    noise_seed: int | None = field(default=None, repr=False)  # as the ledger's: never in a repr

    def __post_init__(self) -> None:
        check_relation(self.relation, field="relation")
