"""The own options of DP-SGD and the encoder family (fedpriv/algorithms/options.py): ALSConfig
carries only the shared keys, the JSON forms keep the flat keys in their order, and every key
is still parsed strictly."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fedpriv.algorithms import options, registry
from fedpriv.algorithms.config import ALSConfig
from fedpriv.errors import ConfigError

OWN = {"dpsgd": options.DPSGDOptions, "am-ssp": options.SSPOptions, "am-ssp1": options.SSPOptions,
       "am-ssp-convex": options.ConvexOptions, "am-dpsgd": options.EncoderDPSGDOptions}  # fmt: skip


def test_alsconfig_carries_none_of_the_own_keys():
    shared = {f.name for f in dataclasses.fields(ALSConfig)}
    assert not shared & set(options.JSON_KEYS)
    for name, cls in OWN.items():
        assert registry.get(name).options is cls
        assert not set(registry.get(name).keys) & set(options.JSON_KEYS)  # declared once: in the options


@pytest.mark.parametrize("name", sorted(registry.names()))
def test_the_json_keeps_the_flat_keys_after_seed_and_comes_back(name):
    cfg = ALSConfig.from_overrides({}, name)
    d = cfg.to_dict()
    keys = list(d)
    at = keys.index("seed") + 1
    assert keys[at : at + len(options.JSON_KEYS)] == list(options.JSON_KEYS)
    back = ALSConfig.from_dict(json.loads(json.dumps(d)), name)
    assert back == cfg and back.to_dict() == d


def test_a_set_key_is_written_flat_and_read_back_into_the_options():
    cfg = ALSConfig.from_overrides({"ssp_steps": "7", "features": "genre,year,id", "rank": "2"}, "am-ssp")
    assert (cfg.options.ssp_steps, cfg.options.features, cfg.rank) == (7, "genre,year,id", 2)
    d = cfg.to_dict()
    assert d["ssp_steps"] == 7 and d["features"] == "genre,year,id" and d["sgd_lr"] == options.JSON_KEYS["sgd_lr"]
    assert ALSConfig.from_dict(d, "am-ssp").options == cfg.options


def test_a_file_written_before_the_split_loads():
    """A dpsgd config as the JSON held it when ALSConfig carried every key (flat, sgd_clip set)."""
    legacy = {**ALSConfig.from_overrides({}, "adadpals").to_dict(), "sgd_clip": 0.3, "sgd_sampling_rate": 0.2, "ssp_steps": 200}
    cfg = ALSConfig.from_dict(legacy, "dpsgd")
    assert isinstance(cfg.options, options.DPSGDOptions) and (cfg.options.sgd_clip, cfg.options.sgd_sampling_rate) == (0.3, 0.2)
    # the flat keys of an algorithm without own options are its defaults: dropped
    assert ALSConfig.from_dict(legacy, "adadpals").options is None


@pytest.mark.parametrize("name,key,value", [("am-ssp", "ssp_steps", "0"), ("dpsgd", "sgd_sampling_rate", "1.5"), ("am-dpsgd", "features", ","),
                                            ("am-ssp-convex", "convex_threshold", "nan"), ("dpsgd", "sgd_clip", "inf"), ("am-ssp", "ssp_lr", "two")])  # fmt: skip
def test_bad_own_values_name_their_key(name, key, value):
    with pytest.raises(ConfigError) as info:
        ALSConfig.from_overrides({key: value}, name)
    assert info.value.field == key


def test_a_misspelt_own_key_is_suggested():
    with pytest.raises(ConfigError, match="did you mean 'ssp_steps'"):
        ALSConfig.from_overrides({"ssp_stepz": "3"}, "am-ssp")
    with pytest.raises(ConfigError, match="did you mean 'ssp_steps'"):
        ALSConfig.as_written({"ssp_stepz": "3"}, "am-ssp")


def test_as_written_takes_no_algorithm_defaults_and_checks_the_reader():
    cfg = ALSConfig.as_written({"rank": "3", "sgd_sampling_rate": "0.5"}, "dpsgd")
    assert cfg.defaults == "fixed" and cfg.options.sgd_sampling_rate == 0.5 and cfg.given == frozenset()
    assert ALSConfig.from_overrides({}, "dpsgd").defaults == "noise-aware"  # (the algorithm's own start)
    with pytest.raises(ConfigError, match="adadpals does not use this key") as info:
        ALSConfig.as_written({"sgd_lr": "1"}, "adadpals")
    assert info.value.field == "sgd_lr"


def test_options_of_gives_defaults_without_options_and_refuses_another_algorithms():
    assert options.of(ALSConfig(), options.Sampled) == options.Sampled()
    ssp = ALSConfig.from_overrides({}, "am-ssp")
    assert options.of(ssp, options.ServerSteps) is ssp.options
    with pytest.raises(ConfigError, match="SSPOptions, not DPSGDOptions"):
        options.of(ssp, options.DPSGDOptions)
