"""Issue 59: the family is one object every layer asks; engines have a few methods; the engine
names mean one engine at every edge. (The third family of tests/test_third_family.py shows a new
family needs no edit of the package.)"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from fedpriv.algorithms import pam
from fedpriv.algorithms.families import all_algorithms, families, family_of
from fedpriv.algorithms.ratings import RATINGS
from fedpriv.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[1] / "fedpriv"


def test_one_catalogue_answers_for_every_algorithm():
    assert [f.name for f in families()] == ["ratings", "personal"]
    assert family_of("adadpals") is RATINGS and family_of("pam-exp") is pam.FAMILY
    assert set(all_algorithms()) >= {"adadpals", "topk", "pam", "pam-exp"} and len(all_algorithms()) == len(set(all_algorithms()))
    with pytest.raises(ConfigError, match="unknown algorithm 'adadpal'.*adadpals"):
        family_of("adadpal")


def _engine_classes():
    import fedpriv.ops.deploy.engine  # noqa: F401 - every engine of the package is a subclass by now
    import fedpriv.ops.launcher  # noqa: F401
    from fedpriv.run import Engine

    seen, todo = [], [Engine]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo += cls.__subclasses__()
    return [c for c in seen if c.__module__.startswith("fedpriv.")]


def test_an_engine_has_at_most_four_public_methods():
    engines = _engine_classes()
    assert len(engines) >= 7, [c.__name__ for c in engines]
    for cls in engines:
        public = {n for n, v in inspect.getmembers(cls) if not n.startswith("_") and inspect.isfunction(v)}
        assert public <= {"layout", "train", "tuning_candidates", "execute"}, (cls.__name__, sorted(public))


def test_no_isinstance_on_a_familys_state_or_job_decides_a_path():
    """Dispatch is the family object's (or the job's own ``serve``), never a type test."""
    family_types = {"PAMState", "PublicState", "PamJob", "BlockJob", "FlowerJob", "PamResult", "FlowerResult"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", None) for n in ast.walk(node.args[1])}
                if names & family_types:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
    # positive control: the scan sees such a test
    tree = ast.parse("if isinstance(job, PamJob): pass")
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance" for n in ast.walk(tree))


def test_the_run_options_and_the_plan_are_frozen():
    from fedpriv.run import Job
    from fedpriv.run.inputs import RunOptions

    with pytest.raises(dataclasses.FrozenInstanceError):
        RunOptions().users_per_node = 3  # type: ignore[misc]
    plan = Job("pam", "synthetic-personal:users=40,samples=4,d=3,k=1", epsilon=2.0).prepare()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.here = False  # type: ignore[misc]
    assert plan.family is pam.FAMILY and plan.here and plan.n_users == 40


def test_an_engine_name_means_one_engine_at_every_edge():
    """The command line, fedpriv.train and the experiment configs read one table."""
    from fedpriv import api
    from fedpriv.ops import engines
    from fedpriv.ops.experiments import config
    from fedpriv.ops.launcher import FlwrRun
    from fedpriv.run import FlowerSimulation, InProcess

    assert engines.ENGINE_NAMES == ("inprocess", "flower", "ray") and config.ENGINES == engines.ENGINE_NAMES
    assert type(api._engine("flower", {})) is FlwrRun and type(api._engine("ray", {})) is FlowerSimulation
    assert type(engines.engine_named("inprocess")) is InProcess
    with pytest.raises(ConfigError, match="unknown engine 'flwr'") as err:
        engines.engine_named("flwr", "--engine")
    assert err.value.field == "--engine"
    # fedpriv.run.run: 'flower' is flwr run, an operations engine: only through a runner callback here
    from fedpriv.run.engines import engine_for_run

    with pytest.raises(ConfigError, match="engine='ray'"):
        engine_for_run("flower")
    assert type(engine_for_run("ray")) is FlowerSimulation
