"""The algorithms: pure client / aggregator / server functions. Importing the package registers
every rating algorithm (:mod:`fedpriv.algorithms.registry`): the built-in family
(:mod:`fedpriv.algorithms.family`), then each algorithm that lives in a module of its own."""

from . import family  # noqa: F401 - registers the built-in members
from . import ratings  # noqa: F401 - the rating family, first in the catalogue of families
from . import pam  # noqa: F401 - DP model personalization, a block family
from . import dpals_uniform  # noqa: F401 - registers itself
from . import bias  # noqa: F401 - registers itself
from . import popular  # noqa: F401 - registers itself
from . import topk  # noqa: F401 - registers topk and ease
