"""Configurations cannot change under you: every algorithm and recommendation config is a
frozen dataclass (a change is a new object, ``dataclasses.replace``), and the noise-aware rule
hands the training state a new config instead of editing the plan's."""

import copy
import dataclasses
import json
import pickle

import pytest

from fedpriv.algorithms import defaults, options
from fedpriv.algorithms.config import Aggregation, ALSConfig, PAMConfig
from fedpriv.algorithms.recommend import RecommendConfig
from fedpriv.algorithms.topk import TopKOptions

OPTIONS = (
    options.Sampled,
    options.DPSGDOptions,
    options.EncoderOptions,
    options.ServerSteps,
    options.SSPOptions,
    options.ConvexOptions,
    options.EncoderDPSGDOptions,
    TopKOptions,
)


def _configs():
    yield ALSConfig.from_overrides({}, "adadpals")
    yield ALSConfig.from_overrides({}, "am-ssp")  # with its own options
    yield PAMConfig.from_overrides({})
    yield RecommendConfig(params={"beta": 0.5})
    yield Aggregation()
    yield from (cls() for cls in OPTIONS)


@pytest.mark.parametrize("cfg", list(_configs()), ids=lambda c: type(c).__name__)
def test_every_field_of_a_config_refuses_assignment(cfg):
    for f in dataclasses.fields(cfg):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cfg, f.name, getattr(cfg, f.name))
    first = dataclasses.fields(cfg)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(cfg, first)


def test_a_change_is_a_new_config():
    cfg = ALSConfig.from_overrides({"rank": "4"}, "adadpals")
    new = dataclasses.replace(cfg, gravity=0.1)
    assert (cfg.gravity, new.gravity) == (0.0, 0.1)
    assert dataclasses.replace(new, gravity=0.0) == cfg
    ssp = ALSConfig.from_overrides({"ssp_steps": "7"}, "am-ssp")
    assert ssp.options.ssp_steps == 7 and ALSConfig.from_dict(ssp.to_dict(), "am-ssp") == ssp


def test_the_recommendation_params_are_read_only_and_travel():
    given = {"beta": 0.5}
    cfg = RecommendConfig(params=given)
    given["beta"] = 2.0  # the caller's dict is not the config's
    assert cfg.params == {"beta": 0.5}
    with pytest.raises(TypeError):
        cfg.params["beta"] = 1.0
    with pytest.raises(TypeError):
        cfg.params.update(beta=1.0)
    assert copy.deepcopy(cfg) == cfg and pickle.loads(pickle.dumps(cfg)) == cfg
    assert json.dumps(dataclasses.asdict(cfg)["params"]) == '{"beta": 0.5}'
    assert dataclasses.replace(cfg, epsilon=2.0).params == {"beta": 0.5}


def test_the_noise_aware_rule_leaves_the_plans_config_as_it_was():
    from fedpriv.run import Job

    data = "synthetic-mf:users=120,items=40,ratings=2400,seed=3"
    plan = Job("adadpals", data, epsilon=2.0, noise_seed=7, params={"rank": 3, "steps": 2}).prepare()
    assert plan.config.defaults == "noise-aware"
    before = copy.deepcopy(plan.config)
    out = plan.execute()
    assert plan.config == before
    doc = out.report.to_json()
    chose = doc["noise_aware"]
    rule = defaults.noise_aware_config(
        before, "adadpals", 2.0, doc["delta"], chose["n_items"], chose["released_n_users"]
    )
    assert rule != before  # the rule changed something (the public-feature prior at least)
    assert out.state.config == rule
    assert {k: v for k, v in doc["config"].items() if k in rule.to_dict()} == rule.to_dict()
    assert doc["config"]["bias_prior"] is True and before.bias_prior is False
