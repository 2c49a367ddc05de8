"""``env.nan_guard`` (DiffRL's ``nan_state_fix``, its Humanoid's): on the real Ant, a world whose
simulation goes non-finite is rewarded 0 for the step and keeps its nan out of the gradient, the
other worlds' gradient exactly as without it; on a finite rollout the guard changes nothing; the
count is logged; the Humanoid's preset has it."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from harness import build, config
from tests.test_robot import QUICK, check_resume


def open_loop(*overrides: str):
    """The Ant's open-loop actions (one set per world: each world's gradient is its own), 3 steps."""
    cfg, choices = config.compose_config(
        "train",
        ["+env=ant", "env.world_count=3", "env.horizon=3", "capture=false", "plot_every=null", *QUICK, *overrides],
    )
    return build.build_run(cfg, choices).trainer()


def gradient(*overrides: str, blow_up: bool):
    """The actions' gradient ``(horizon, worlds, actions)``, the loss, and the count of non-finite
    worlds, with world 1's start velocities nan when ``blow_up``."""
    t = open_loop(*overrides)
    if blow_up:
        qd = t.env.initial["joint_qd"].numpy().reshape(3, -1)
        qd[1, :] = np.nan
        t.env.initial["joint_qd"].assign(qd.reshape(-1))
    t.step.forward_backward()
    grad = t.params.grad.numpy().reshape(3, 3, -1).copy()
    return grad, float(t.step.loss.total.numpy()[0]), int(t.env.nonfinite.numpy()[0])


def test_a_world_that_blows_up_keeps_its_nan_to_itself():
    guarded, loss, count = gradient("env.nan_guard=true", blow_up=True)
    assert count >= 1 and np.isfinite(loss)
    assert np.isfinite(guarded).all()
    np.testing.assert_array_equal(guarded[:, 1], 0.0)  # nothing the blown-up world's steps could say is kept
    clean, clean_loss, clean_count = gradient("env.nan_guard=true", blow_up=False)
    assert clean_count == 0 and loss > clean_loss  # less return: the blown-up world's rewards count 0
    for world in (0, 2):  # the other worlds' gradient is exactly what it is when nothing blows up
        np.testing.assert_array_equal(guarded[:, world], clean[:, world])
        assert np.abs(clean[:, world]).max() > 0
    unguarded, unguarded_loss, _ = gradient(blow_up=True)
    assert not np.isfinite(unguarded_loss) and not np.isfinite(unguarded).all()  # what the guard prevents


def test_the_guard_changes_nothing_on_a_finite_rollout(tmp_path):
    arrays = {}
    for guard in (False, True):
        cfg, choices = config.compose_config(
            "train",
            ["+env=ant", "task=shac", "env.world_count=2", "task.window=3", "task.critic_minibatches=2",
             "task.critic_epochs=1", "iterations=3", "plot_every=null", f"env.nan_guard={guard}", *QUICK],
        )  # fmt: skip
        t = build.build_run(cfg, choices).trainer()
        t.fit(tmp_path / str(guard))
        arrays[guard] = {key: value.numpy().copy() for key, value in t.state.arrays().items()}
        assert ("robot/nonfinite_worlds" in t.step.columns) == guard
    for key, value in arrays[False].items():
        np.testing.assert_array_equal(value, arrays[True][key], err_msg=key)


@pytest.mark.parametrize(("preset", "guarded"), [("humanoid", True), ("ant", False), ("hopper", False)])
def test_the_humanoid_preset_guards_as_diffrls_humanoid_does(preset, guarded):
    cfg, _ = config.compose_config("train", [f"+env={preset}"])
    assert cfg.env.nan_guard is guarded


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [(["env.nan_guard=false"], None), ([], "env.nan_guard")],
    ids=["as_it_ran", "guarded"],
)
def test_a_humanoid_checkpoint_from_before_the_guard_resumes_only_as_it_ran(tmp_path, overrides, refused):
    """Written before env.nan_guard existed (unguarded), a Humanoid run resumes with the guard off,
    and is refused in one line naming it under the preset's guard."""
    cfg, _ = config.compose_config("train", ["+env=humanoid", "task=shac", *overrides])
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["env"].pop("nan_guard")
    check_resume(saved, cfg, refused, tmp_path)
