"""The engines' common core: the one alternating loop with its central and secure aggregators
(loop.py), the in-process engine over user shards (inprocess.py) and its personalization
counterpart (personal.py). The Flower engine is :mod:`fedpriv.flower`."""
