"""The Hopper preset (``+env=hopper``): DiffRL's planar Hopper as data for the robot env.

Its loading (a planar root of two slides and a hinge, DiffRL's 11 observations), its reward
against DiffRL's formula, its start draws, its rest at zero action, the tape against central
differences through the foot's touchdowns and lift-offs, captured equal to eager, and a bad
value refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import warp as wp

from envs.robot import RobotConfig, RobotEnv
from envs.robot.settle import settle
from harness import build, config
from harness.gradcheck import check_gradients
from harness.losses import WeightedLoss
from harness.tasks import OpenLoop
from harness.training.step import check_capture
from tests.helpers import refused_train
from tests.test_errors import assert_clean_rejection

REWARD = {"reward": {"source": "reward", "kind": "reward"}}
QUICK = ("env.settle_time=0", "env.substeps=4", "env.mass_matrix_every=4", "env.collide_every=4")


def hopper(*overrides: str) -> RobotEnv:
    cfg, _ = config.compose_config("train", ["+env=hopper", "device=cpu", *overrides])
    return build.build_env(cfg, "cpu", None, None)


def hopper_config(*overrides: str) -> RobotConfig:
    cfg, _ = config.compose_config("train", ["+env=hopper", *overrides])
    return RobotConfig(**{k: v for k, v in cfg.env.items() if k != "_target_"})


def test_the_preset_loads_a_planar_root_and_diffrls_eleven_observations():
    layout = hopper_config().layout()
    assert not layout.root_free and layout.body_names[layout.root_body] == "torso"
    assert layout.actuated_names == ("hip", "knee", "ankle") and layout.torque == (200.0,) * 3
    # the root's coordinates are x, z (slides) and the pitch (hinge): root_q keeps z and the pitch
    assert layout.root_slides == (0, 1) and layout.root_hinges == (2,) and layout.root_q_coords == (1, 2)
    assert layout.root_dofs == (0, 1, 2) and layout.joint_coords == (3, 4, 5)
    assert hopper_config().observation_dim() == 11 and hopper_config().action_dim() == 3


def test_observations_and_rewards_are_diffrls_formulas_of_the_state():
    """DiffRL's Hopper (envs/hopper.py): the observation is joint_q[1:] and joint_qd; the reward is the
    torso's x speed, the height shaped around -0.3 m from the start, 1 - (pitch / (pi/6))^2 and
    -0.1 |a|^2 (the height term from the torso's height, 1.25 m at the start, not its slide)."""
    worlds, steps = 3, 40
    env = hopper(f"env.world_count={worlds}", f"env.horizon={steps}", "env.settle_time=0")
    env.request({"reward": "all"})
    rng = np.random.default_rng(2)
    actions = wp.array(rng.uniform(-1.3, 1.3, (steps, worlds, 3)).astype(np.float32), dtype=wp.float32)
    obs = wp.zeros((worlds, 11), dtype=wp.float32)
    env.reset()
    for t in range(steps):
        env.act(t, actions)
        env.step(t)
        env.write_observables(t)
    env.observe(steps, obs)
    q = env.state(steps).joint_q.numpy().reshape(worlds, 6)
    qd = env.state(steps).joint_qd.numpy().reshape(worlds, 6)
    np.testing.assert_allclose(obs.numpy(), np.concatenate([q[:, 1:], qd], axis=1), rtol=1e-5, atol=1e-6)
    reward = env.trajectory()["reward"].numpy()  # (steps, worlds, terms), weighted
    ended = env.trajectory()["terminated"].numpy()[:, :, 0]
    for t in range(steps):
        s = env.state(t + 1)
        q = s.joint_q.numpy().reshape(worlds, 6)
        qd = s.joint_qd.numpy().reshape(worlds, 6)
        a = np.clip(actions.numpy()[t], -1.0, 1.0)
        height = np.clip(q[:, 1] - (-0.45 + 0.15), -1.0, 0.3)
        height = np.where(height < 0.0, -200.0 * height**2, height)
        angle = 1.0 - q[:, 2] ** 2 / (math.pi / 6.0) ** 2
        diffrl = qd[:, 0] + height + angle - 0.1 * (a**2).sum(axis=1)
        alive = np.ones(worlds) if t == 0 else 1.0 - ended[:t].max(axis=0)  # no reward after an end
        np.testing.assert_allclose(reward[t].sum(axis=1), alive * diffrl, rtol=2e-4, atol=2e-4)
        np.testing.assert_array_equal(ended[t], (q[:, 1] < -0.45).astype(np.float32))  # DiffRL's early termination
    # met on the way: a fall (whose later rewards count 0) and the height penalty below the reference
    assert ended[:-1].any()  # ended before the last step: the masking of later rewards is exercised
    assert (reward[:, :, 1] < 0.0).sum() >= 5


def test_starts_move_the_planar_roots_slides_and_hinge_within_the_noise():
    """Each noise goes where it says: the root's slides (x, z) +-noise_position, its hinge (pitch)
    +-noise_rotation, the hinges +-noise_joint_q, every velocity +-noise_joint_qd (four distinct
    values, so a mix-up shows); the host's starts and the device's draws alike."""
    noise = ("env.noise_position=0.02", "env.noise_rotation=0.04", "env.noise_joint_q=0.06", "env.noise_joint_qd=0.08")
    env = hopper("env.world_count=64", "env.horizon=1", "env.settle_time=0", *noise)
    # DiffRL's loader gives every joint armature 1, the root's slides and hinge too (root_armature)
    np.testing.assert_array_equal(env.model.joint_armature.numpy().reshape(64, 6), 1.0)
    host = [env.initial[name].numpy().reshape(64, 6).copy() for name in ("joint_q", "joint_qd")]
    env.draw_initial(wp.array([5], dtype=wp.int32))
    drawn = [env.initial[name].numpy().reshape(64, 6).copy() for name in ("joint_q", "joint_qd")]
    bound = np.array([0.02, 0.02, 0.04, 0.06, 0.06, 0.06])  # x, z, pitch, hip, knee, ankle (the start: all 0)
    for q, qd in (host, drawn):
        assert (np.abs(q) <= bound + 1e-6).all() and (np.ptp(q, axis=0) > 1.5 * bound).all()
        assert (np.abs(qd) <= 0.08 + 1e-6).all() and (np.ptp(qd, axis=0) > 0.12).all()
    assert not np.array_equal(host[0], drawn[0])


def test_at_zero_action_it_folds_and_comes_to_rest_within_the_presets_settle_time():
    """DiffRL's hinges have no stiffness: unactuated, the hip and knee fold and the Hopper lies down,
    slowly under dflex's damping. The settle check finds it still moving at 4 s and at rest by the
    preset's 8 s."""
    cfg = hopper_config()
    assert cfg.settle_time == 8.0
    assert settle(cfg, lambda quiet: RobotEnv(quiet, device="cpu")) is None
    early = settle(hopper_config("env.settle_time=4"), lambda quiet: RobotEnv(quiet, device="cpu"))
    assert early is not None and "still moves" in early


def test_the_tape_matches_central_differences_through_the_foots_touchdowns_and_lift_offs():
    """gradcheck.yaml's rollout for the Hopper: 0.5 s of random torques, hip and knee started inside
    their limits (on a limit, central differences straddle the limit force's kink: docs/robots.md)."""
    env = hopper("env.world_count=1", "env.horizon=30", "env.start_joint_q=[-0.3,-0.3,0.0]", "env.settle_time=0")
    result, _ = check_gradients(
        env, WeightedLoss(REWARD), samples=12, tolerance=env.config.gradcheck_tolerance(), seed=0, device="cpu",
        task=OpenLoop(init_noise=0.1, seed=0),
    )  # fmt: skip
    phases = set("+".join(result.phases).split("+"))
    assert {"touchdown", "lift-off"} <= phases
    assert result.passed, result.table


def test_a_captured_rollout_equals_the_eager_one_bit_for_bit():
    env = hopper("env.world_count=2", "env.horizon=3", *QUICK)
    check_capture(env, WeightedLoss(REWARD), OpenLoop(init_noise=0.5), device="cpu")


@pytest.mark.parametrize(
    ("args", "field", "accepted"),
    [
        (["env.height_cap=-0.1"], "env.height_cap", ">= 0"),
        (["env.observation=[root_q,hips]"], "env.observation[1]: 'hips' is not a piece", "root_qd"),
        (["env.start_height=1.3"], "env.start_height: 'harness:hopper.xml' has no floating base", "null"),
    ],
    ids=["cap", "piece", "start_height"],
)
def test_bad_values_are_refused_in_one_line(request, tmp_path, args, field, accepted):
    proc = refused_train(request, ["+env=hopper", *args, "iterations=1"], tmp_path)
    assert_clean_rejection(proc, field, accepted, tmp_path)


def test_dflexs_limit_damping_everywhere_damps_the_planar_roots_slides_and_hinge_too():
    """dflex's jcalc_tau damps every slide and hinge by limit_kd at every coordinate, DiffRL's
    Hopper's root (x, z, pitch) too: with env.limit_kd_everywhere the torso is damped by 10 and
    the hinges by their 2 + 10, and no past-the-limit damping is left (the preset); without, Newton's law."""
    everywhere = hopper("env.world_count=1", "env.horizon=1", *QUICK)  # the preset's
    np.testing.assert_allclose(everywhere.model.joint_damping.numpy()[:6], [10.0, 10.0, 10.0, 12.0, 12.0, 12.0])
    np.testing.assert_array_equal(everywhere.model.joint_limit_kd.numpy()[:6], 0.0)
    newton_law = hopper("env.world_count=1", "env.horizon=1", "env.limit_kd_everywhere=false", *QUICK)
    np.testing.assert_allclose(newton_law.model.joint_damping.numpy()[:6], [0.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    np.testing.assert_array_equal(newton_law.model.joint_limit_kd.numpy()[3:6], 10.0)
