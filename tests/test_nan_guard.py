"""``env.nan_guard`` (DiffRL's ``nan_state_fix``, its Humanoid's): on the real Ant, a world whose
simulation goes non-finite is rewarded 0 for the step and keeps its nan out of the gradient, the
other worlds' gradient exactly as without it; on a finite rollout the guard changes nothing; the
count is logged; the Humanoid's preset has it."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from omegaconf import OmegaConf

from harness import build, config
from harness.tasks import rollout
from harness.training.step import zero_grads
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
    world-steps. ``blow_up``: as step 1 begins, off the tape, world 1's hinge torques of that step
    become nan, so its simulation goes nan inside step 1 from a finite state (the actions are
    clipped to [-1, 1] and the torques to the motors' limits: no action can)."""
    t = open_loop(*overrides)
    env, params, loss = t.env, t.params, t.step.loss
    simulate = env.step

    def step(k: int) -> None:
        if blow_up and k == 1:
            torques = env.joint_f[env.store(1)].numpy().reshape(3, -1)
            torques[1, 6:] = np.nan  # world 1's hinges (after the free root's 6 dofs)
            env.joint_f[env.store(1)].assign(torques.reshape(-1))
        simulate(k)

    env.step = step
    zero_grads(env, loss, params, t.task)
    tape = wp.Tape()
    with tape:
        total = loss(rollout(env, t.task, params))
    tape.backward(total)
    grad = params.grad.numpy().reshape(3, 3, -1).copy()
    return grad, float(total.numpy()[0]), int(env.nonfinite.numpy()[0])


def test_a_world_that_blows_up_keeps_its_nan_to_itself():
    guarded, loss, count = gradient("env.nan_guard=true", blow_up=True)
    assert count >= 1 and np.isfinite(loss)
    assert np.isfinite(guarded).all()
    np.testing.assert_array_equal(guarded[1:, 1], 0.0)  # the blown-up step's action and the next get nothing
    assert np.abs(guarded[0, 1]).max() > 0  # the step before: its own reward's gradient, the nan cleaned out
    clean, clean_loss, clean_count = gradient("env.nan_guard=true", blow_up=False)
    assert clean_count == 0 and loss > clean_loss  # less return: the blown-up world's rewards count 0
    for world in (0, 2):  # the other worlds' gradient is exactly what it is when nothing blows up
        np.testing.assert_array_equal(guarded[:, world], clean[:, world])
        assert np.abs(clean[:, world]).max() > 0
    unguarded, unguarded_loss, _ = gradient(blow_up=True)
    assert not np.isfinite(unguarded_loss) and not np.isfinite(unguarded).all()  # what the guard prevents


def test_shac_through_a_world_that_blows_up_stays_finite():
    """SHAC on two Ant worlds, world 1's simulation nan inside step 1 of its window (as above), then
    restarted: the observation the critic values before the restart and the step's rewards are 0,
    so SHAC's objective, the critic's targets and the actor's gradient stay finite, with a tanh
    critic too (ELU's branch-free form would hide a nan input); unguarded they are not."""
    found = {}
    for guard in (True, False):
        cfg, choices = config.compose_config(
            "train",
            ["+env=ant", "task=shac", "env.world_count=2", "task.window=3", "task.critic_minibatches=2",
             "task.critic_epochs=1", "task.critic.activation=tanh", "capture=false", "plot_every=null",
             f"env.nan_guard={guard}", *QUICK],
        )  # fmt: skip
        t = build.build_run(cfg, choices).trainer()
        env, task = t.env, t.task
        simulate = env.step

        def step(k: int, env=env, simulate=simulate) -> None:
            if k == 1:
                torques = env.joint_f[env.store(1)].numpy().reshape(2, -1)
                torques[1, 6:] = np.nan
                env.joint_f[env.store(1)].assign(torques.reshape(-1))
            simulate(k)

        env.step = step
        t.step.run()
        b = task.buffers(env)
        found[guard] = (
            float(task._objective.numpy()[0]),
            t.state.groups["actor"].params.grad.numpy(),
            b.targets.numpy(),
            int(env.nonfinite.numpy()[0]),
            b.done.numpy()[1, 1],
        )
    objective, grad, targets, count, restarted = found[True]
    assert count == 1 and restarted == 1  # the world ended its episode after step 1
    assert np.isfinite(objective) and np.isfinite(targets).all() and np.isfinite(grad).all()
    assert np.abs(grad).max() > 0
    objective, grad, targets, _, _ = found[False]
    assert not (np.isfinite(objective) and np.isfinite(grad).all())


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
        assert ("robot/nonfinite_steps" in t.step.columns) == guard
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
