"""Typed configurations per algorithm (fedpriv.algorithms.typed): each class offers exactly the
keys its algorithm reads, composed from shared pieces; a Job built from one runs as the same job
written with a name and params (same ledger, same RMSE under a noise seed), the keys given are
tracked structurally (cfg.given), and a bad value or a key given twice is a ConfigError naming it."""

from __future__ import annotations

from dataclasses import fields

import pytest

import fedpriv
from fedpriv.algorithms import registry
from fedpriv.algorithms.config import ALSConfig
from fedpriv.algorithms.typed import AdaDPALS, AMSSP, Bias, BiasStage, Budget, Clipping, Regularisation, classes, offered_keys

CLASSES = classes()
from fedpriv.errors import ConfigError
from fedpriv.run import InProcess, Job

SPEC = "synthetic-mf:users=200,items=40,ratings=4000,seed=2"
#: config keys no user sets: filled by the parser, engine options (they belong to the run), the
#: algorithm's own options object
NOT_OFFERED = {"given", "options", "aggregation"}  # aggregation: the engine options, a field of their own


def _reads(name: str) -> set[str]:
    """The keys the strict parser accepts for ``name`` (shared ones and its own), minus fixed ones."""
    spec = registry.get(name)
    keys = {f.name for f in fields(ALSConfig)} - NOT_OFFERED
    keys = {k for k in keys if registry.readers(k) is None or name in registry.readers(k)}
    return (keys | spec.option_keys) - set(spec.fixed)  # with the algorithm's own options (topk)


@pytest.mark.parametrize("name", sorted(registry.names()))
def test_each_class_offers_exactly_the_keys_its_algorithm_reads(name):
    assert set(CLASSES) == set(registry.names())  # one class per registered rating algorithm
    assert CLASSES[name].name == name  # registering named it
    if name in ("popular", "topk", "topk-lowrank", "ease"):  # no factor model: the bias coordinates mean nothing to them
        assert offered_keys(CLASSES[name]) == _reads(name) - {"user_bias", "item_bias"}
    else:
        assert offered_keys(CLASSES[name]) == _reads(name), name


def test_a_typed_job_runs_as_the_same_job_with_params():
    typed = AdaDPALS(rank=2, steps=1, mu=0.25, clipping=Clipping(user_clip=0.8), budget=Budget(b=0.6), bias_stage=BiasStage(enabled=False))
    params = {"rank": 2, "steps": 1, "mu": 0.25, "user_clip": 0.8, "share_b": 0.6, "bias_stage": False}
    assert typed.params() == params
    a = Job(typed, SPEC, epsilon=3.0, noise_seed=4).prepare()
    b = Job("adadpals", SPEC, epsilon=3.0, noise_seed=4, params=params).prepare()
    assert a.job.algorithm == "adadpals" and a.config.given == b.config.given == frozenset(params)
    ra, rb = a.execute(InProcess()), b.execute(InProcess())
    assert ra.ledger == rb.ledger and ra.report.metrics["test_rmse"] == rb.report.metrics["test_rmse"]


def test_train_and_plan_take_a_typed_configuration():
    out = fedpriv.train(Bias(regularisation=Regularisation(noise_units=2.0)), SPEC, epsilon=2.0, noise_seed=1)
    assert out.report["algorithm"] == "bias" and "reg_noise_units" in out.report.config["given"]
    typed = fedpriv.plan(AMSSP(features="genre,year", steps=2), epsilon=5.0).to_markdown()
    assert typed == fedpriv.plan("am-ssp", epsilon=5.0, features="genre,year", steps=2).to_markdown() != fedpriv.plan("am-ssp", epsilon=5.0).to_markdown()


def test_bad_values_and_keys_given_twice_name_the_key():
    with pytest.raises(ConfigError) as err:
        Job(AdaDPALS(rank=2), SPEC, epsilon=1.0, params={"rank": 3})
    assert err.value.field == "rank"
    with pytest.raises(ConfigError) as err:
        Job(AdaDPALS(mu=-1.0), SPEC, epsilon=1.0).prepare()
    assert err.value.field == "mu"
    with pytest.raises(ConfigError) as err:
        Job(object(), SPEC, epsilon=1.0)
    assert err.value.field == "algorithm"


def test_a_class_serves_one_algorithm():
    """Registration names the class; a second algorithm registering the same class is refused."""
    from fedpriv.algorithms.registry import AlgorithmSpec, register

    with pytest.raises(ValueError, match="already the typed configuration"):
        register(AlgorithmSpec("test-second-adadpals", registry.get("adadpals").rating_weights, typed=AdaDPALS))
    assert "test-second-adadpals" not in registry.names()
