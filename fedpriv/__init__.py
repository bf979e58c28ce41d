"""fedpriv: federated, user-level differentially private recommendation on Flower.

The Python API (:mod:`fedpriv.api`, :mod:`fedpriv.run.model`), exported here and loaded on first
use, so that ``import fedpriv`` stays light (no torch, no Flower, no pandas):

- :func:`load_data`: a data spec (``"ml-100k:PATH"``, ``"csv:PATH"``, ...) or a pandas DataFrame;
- :func:`train`: any algorithm at (epsilon, delta) on either engine, returning a :class:`Result`
  (metrics, ledger, epsilon spent, the released :class:`Model`);
- :func:`plan`: a calibrated budget plan without training;
- :func:`load_model`: a saved model, whose :meth:`Model.recommend` solves a user's vector locally
  (a personalization model, :class:`PersonalModel`, solves a user's personal vector);
- :class:`Interactions`: ratings with dense ids (``Interactions.from_pandas``);
- :class:`Job`, :class:`RunReport`: the run object behind all of these (:mod:`fedpriv.run`:
  ``Job(...).prepare().execute(engine)``).
"""

__version__ = "0.1.0"

_EXPORTS = {
    "load_data": "fedpriv.api",
    "train": "fedpriv.api",
    "plan": "fedpriv.api",
    "Result": "fedpriv.api",
    "Model": "fedpriv.run.model",
    "PersonalModel": "fedpriv.run.model",
    "load_model": "fedpriv.run.model",
    "Interactions": "fedpriv.data.interactions",
    "Job": "fedpriv.run",
    "RunReport": "fedpriv.run",
    "FedprivError": "fedpriv.errors",
    "ConfigError": "fedpriv.errors",
    "DataError": "fedpriv.errors",
    "PrivacyError": "fedpriv.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedpriv' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])
