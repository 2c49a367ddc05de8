"""Every ``_target_`` the harness builds must name an object of the kind its group needs, and
that is checked before anything is called (harness.targets): a command line that names any
other function stops in one line, exit 2, and the function never ran.

The functions named here are stand-ins for any function: called, they write a sentinel file
(importing their module writes nothing), so a test sees whether a call happened.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

import hydra
import pytest

from harness import build, clip, optim, schedules, targets
from harness.config import ConfigError
from harness.losses import WeightedLoss
from tests.helpers import ROOT, compose_run, run_harness
from tests.test_errors import assert_clean_rejection

STAND_INS = '''
"""Stand-ins for any function or class a _target_ could name: each writes the sentinel file
when called. Importing this module writes nothing."""
import os
from pathlib import Path


def touch_sentinel(*args, **kwargs):
    Path(os.environ["TARGETS_SENTINEL"]).write_text("called")


class NotAnEnv:
    def __init__(self, *args, **kwargs):
        Path(os.environ["TARGETS_SENTINEL"]).write_text("called")
'''

OWN_PARTS = '''
"""An optimizer, a clip policy and a schedule of a user's own, registered when imported."""
from harness.clip import clip_by_global_norm, register_clip_policy
from harness.optim import register_optimizer, sgd
from harness.schedules import constant, register_schedule

CALLS = []


@register_optimizer
def plain_sgd(**kwargs):
    CALLS.append("plain_sgd")
    return sgd(**kwargs)


@register_clip_policy
def unit_norm(max_norm=1.0):
    CALLS.append("unit_norm")
    return clip_by_global_norm(max_norm)


@register_schedule
def flat(**kwargs):
    CALLS.append("flat")
    return constant(**kwargs)
'''

NOT_AN_ENV_YAML = """
_target_: stand_ins.NotAnEnv
horizon: 4
world_count: 1
"""


@pytest.fixture
def folder(tmp_path):
    """``code/stand_ins.py`` and ``configs/env/not_an_env.yaml`` outside this checkout; ``work/``."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "stand_ins.py").write_text(textwrap.dedent(STAND_INS))
    (tmp_path / "configs" / "env").mkdir(parents=True)
    (tmp_path / "configs" / "env" / "not_an_env.yaml").write_text(NOT_AN_ENV_YAML)
    (tmp_path / "work").mkdir()
    return tmp_path


def harness(folder, *args):
    env = {
        "PYTHONPATH": os.pathsep.join([str(folder / "code"), str(ROOT)]),
        "HARNESS_CONFIG_PATH": str(folder / "configs"),
        "TARGETS_SENTINEL": str(folder / "sentinel"),
    }
    return run_harness("train", *args, cwd=folder / "work", env=env, timeout=120)


ENV = ["+env=cartpole", "env.horizon=4", "env.world_count=1", "iterations=1"]
CALL = "stand_ins.touch_sentinel"

CASES = [
    # (id, arguments, field named, what is accepted)
    ("optim", [*ENV, f"optim._target_={CALL}"], "optim._target_", "harness.optim.register_optimizer"),
    ("clip", [*ENV, f"clip._target_={CALL}"], "clip._target_", "harness.clip.register_clip_policy"),
    ("schedule", [*ENV, f"schedule._target_={CALL}"], "schedule._target_", "harness.schedules.register_schedule"),
    ("loss", [*ENV, f"loss._target_={CALL}"], "loss._target_", "harness.losses.WeightedLoss"),
    ("task", [*ENV, f"task._target_={CALL}"], "task._target_", "a harness.tasks.Task subclass"),
    ("env", [*ENV, "env._target_=stand_ins.NotAnEnv"], "env._target_", "a harness.env.Env subclass"),
    ("nested_in_optim", [*ENV, f"+optim.extra._target_={CALL}"], "optim.extra._target_", "plain values"),
    (
        "nested_in_loss",
        [*ENV, f"+loss.terms.pose._target_={CALL}"],
        "loss.terms.pose._target_: 'stand_ins.touch_sentinel' is not a loss term",
        "harness.losses.LossTerm",
    ),
    (
        "chain_member",
        [*ENV, "clip=chain", f"clip.policies.1._target_={CALL}"],
        "clip.policies.1._target_",
        "harness.clip.clip_by_global_norm",
    ),
    (
        "second_group",
        [*ENV, "task=shac", f"task.critic.optim._target_={CALL}"],
        "task.critic.optim._target_",
        "harness.optim.adam",
    ),
    (
        "hydra_callback",
        [*ENV, f"+hydra.callbacks.mine._target_={CALL}"],
        "hydra.callbacks.mine._target_",
        "hydra.experimental.callback.Callback",
    ),
    ("user_env_from_outside", ["+env=not_an_env"], "env._target_", "a harness.env.Env subclass"),
    ("unimportable", [*ENV, "optim._target_=stand_inz.adam"], "optim._target_: cannot import 'stand_inz.adam'", "adam"),
]


@pytest.mark.parametrize(("args", "field", "accepted"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_target_of_the_wrong_kind_is_refused_in_one_line_and_never_called(folder, args, field, accepted):
    proc = harness(folder, *args)
    assert_clean_rejection(proc, field, accepted, folder / "work")
    assert not (folder / "sentinel").exists(), "the named function ran"


def test_os_remove_as_a_loss_leaves_the_file_it_names(folder):
    """With its terms dropped and the file as its one argument, Hydra would call
    ``os.remove(<file>)``: refused, the file is still there."""
    keep = folder / "keep.txt"
    keep.write_text("kept")
    proc = harness(folder, *ENV, "loss._target_=os.remove", "~loss.terms", f"+loss._args_=['{keep}']")
    assert_clean_rejection(proc, "loss._target_: 'os.remove' is not a loss", "WeightedLoss", folder / "work")
    assert keep.read_text() == "kept"


def test_the_stand_ins_are_called_when_hydra_builds_a_section_unchecked(folder, monkeypatch):
    """The control of the tests above: Hydra alone calls the top-level target and a nested one
    (before the outer call fails), so a missing sentinel there means the check stopped a call."""
    monkeypatch.syspath_prepend(str(folder / "code"))
    monkeypatch.setenv("TARGETS_SENTINEL", str(folder / "sentinel"))
    hydra.utils.instantiate({"_target_": CALL, "lr": 0.5})
    assert (folder / "sentinel").read_text() == "called"
    (folder / "sentinel").unlink()
    with pytest.raises(hydra.errors.InstantiationException):
        hydra.utils.instantiate({"_target_": "harness.optim.adam", "lr": 0.5, "extra": {"_target_": CALL}})
    assert (folder / "sentinel").read_text() == "called"


@pytest.fixture
def registries(monkeypatch):
    """The registries as copies, so what a test registers is gone after it."""
    monkeypatch.setattr(optim, "OPTIMIZERS", dict(optim.OPTIMIZERS))
    monkeypatch.setattr(clip.policies, "CLIP_POLICIES", dict(clip.policies.CLIP_POLICIES))
    monkeypatch.setattr(schedules, "SCHEDULES", dict(schedules.SCHEDULES))


def test_factories_registered_by_a_users_module_are_accepted_and_built(tmp_path, monkeypatch, registries):
    (tmp_path / "own_parts_for_targets.py").write_text(textwrap.dedent(OWN_PARTS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "own_parts_for_targets", raising=False)
    cfg, choices = compose_run(
        *ENV,
        "optim=sgd",
        "optim._target_=own_parts_for_targets.plain_sgd",
        "clip=chain",
        "clip.policies.1._target_=own_parts_for_targets.unit_norm",
        "schedule._target_=own_parts_for_targets.flat",
    )
    run = build.validate(cfg, choices)
    assert sys.modules["own_parts_for_targets"].CALLS == ["unit_norm", "plain_sgd", "flat"]
    assert run.optimizer.name == "sgd"
    assert [rule.name for rule in run.clip.rules] == ["value", "global_norm"]
    assert "plain_sgd" in optim.OPTIMIZERS


def test_a_registered_name_taken_by_another_factory_is_refused(registries):
    def adam(**kwargs):
        return optim.sgd(**kwargs)

    with pytest.raises(ValueError, match=re.escape("'adam' is taken by harness.optim.adam")):
        optim.register_optimizer(adam)
    assert optim.OPTIMIZERS["adam"] is optim.adam

    def zclip():
        return clip.no_clip()

    with pytest.raises(ValueError, match=re.escape("'zclip' is taken by harness.clip.policies.zclip")):
        clip.register_clip_policy(zclip)


def test_a_factory_is_accepted_under_any_module_that_holds_it():
    assert targets.resolve("clip", "harness.clip.policies.zclip", "clip._target_") is clip.zclip
    assert targets.resolve("clip", "harness.clip.zclip", "clip._target_") is clip.zclip


def test_loss_terms_given_as_objects_are_accepted_and_built():
    section = {
        "_target_": "harness.losses.WeightedLoss",
        "terms": [{"_target_": "harness.losses.LossTerm", "name": "pose", "source": "joint_q", "steps": "last"}],
    }
    assert targets.check_section("loss", section) is WeightedLoss
    assert hydra.utils.instantiate(section, _convert_="all").term_names == ["pose"]  # as harness.build builds it


def test_nested_targets_are_checked_where_hydra_builds_them_and_only_there():
    """``_recursive_: false``: Hydra builds nothing below, so a nested node is left to the
    object's own code (SHAC builds its critic's optimizer as a parameter group, checked then)."""
    task = {"_target_": "harness.tasks.OpenLoop", "critic": {"optim": {"_target_": "os.remove"}}}
    with pytest.raises(targets.TargetError, match=r"^task\.critic\.optim\._target_: 'os.remove' below task"):
        targets.check_section("task", task)
    assert targets.check_section("task", {**task, "_recursive_": False}).__name__ == "OpenLoop"
    chain = {
        "_target_": "harness.clip.chain_clips",
        "policies": [{"_target_": "harness.clip.chain_clips", "policies": [{"_target_": "builtins.exec"}]}],
    }
    with pytest.raises(targets.TargetError, match=r"^clip\.policies\.0\.policies\.0\._target_: 'builtins.exec' is"):
        targets.check_section("clip", chain)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"lr": 0.1}, "optim._target_: required; accepted: harness.optim.sgd"),
        ({"_target_": 3}, "optim._target_: expected a dotted path, got 3"),
        ({"_target_": "harness.optim.Optimizer"}, "optim._target_: 'harness.optim.Optimizer' is not an optimizer"),
        ({"_target_": "harness.optim.nadam"}, "optim._target_: cannot import 'harness.optim.nadam'"),
    ],
)
def test_a_section_without_an_accepted_target_is_refused(section, message):
    with pytest.raises(targets.TargetError) as caught:
        targets.check_section("optim", section)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_the_task_class_evaluate_and_the_sweep_read_is_checked_too(folder, monkeypatch):
    monkeypatch.syspath_prepend(str(folder / "code"))
    cfg, _ = compose_run(*ENV, "task._target_=stand_ins.NotAnEnv")
    with pytest.raises(ConfigError, match=r"^task\._target_: 'stand_ins.NotAnEnv' is not a task"):
        build.task_class(cfg)
    assert build.task_class(compose_run(*ENV, "task=shac")[0]).__name__ == "SHAC"
