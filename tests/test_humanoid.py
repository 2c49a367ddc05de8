"""The Humanoid preset (``+env=humanoid``): DiffRL's Humanoid as data for the robot env.

Its loading (DiffRL's 21 motors in the file's joint order at 0.35 x its strengths, the file's
springs, armature and damping with dflex's limit damping everywhere, 76 observations), its reward
against DiffRL's formula, its fall and rest at zero action, the tape against central differences
through the feet's contacts, captured equal to eager, and bad values refused in one line."""

from __future__ import annotations

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
# fewer substeps where a test needs no more than a stable few steps (the preset's 48 cost 48 solver steps each)
QUICK = ("env.settle_time=0", "env.substeps=12", "env.mass_matrix_every=12", "env.collide_every=12")
# DiffRL's envs/humanoid.py: 0.35 x these, in the file's joint order
STRENGTHS = [200, 200, 200, 200, 200, 600, 400, 100, 100, 200, 200, 600, 400, 100, 100, 100, 100, 200, 100, 100, 200]
JOINTS = ["abdomen_z", "abdomen_y", "abdomen_x", "right_hip_x", "right_hip_z", "right_hip_y", "right_knee",
          "right_ankle_y", "right_ankle_x", "left_hip_x", "left_hip_z", "left_hip_y", "left_knee", "left_ankle_y",
          "left_ankle_x", "right_shoulder1", "right_shoulder2", "right_elbow", "left_shoulder1", "left_shoulder2",
          "left_elbow"]  # fmt: skip


def humanoid(*overrides: str) -> RobotEnv:
    cfg, _ = config.compose_config("train", ["+env=humanoid", "device=cpu", *overrides])
    return build.build_env(cfg, "cpu", None, None)


def humanoid_config(*overrides: str) -> RobotConfig:
    cfg, _ = config.compose_config("train", ["+env=humanoid", *overrides])
    return RobotConfig(**{k: v for k, v in cfg.env.items() if k != "_target_"})


# each hinge's axis and range in the file (degrees), in JOINTS' order
AXES = [(0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 0, 0), (0, 0, 1), (0, 1, 0), (0, -1, 0), (0, 1, 0), (1, 0, 0.5),
        (-1, 0, 0), (0, 0, -1), (0, 1, 0), (0, -1, 0), (0, 1, 0), (1, 0, 0.5), (2, 1, 1), (0, -1, 1), (0, -1, 1),
        (-2, 1, -1), (0, -1, -1), (0, -1, -1)]  # fmt: skip
RANGES = [(-45, 45), (-75, 30), (-35, 35), (-25, 5), (-60, 35), (-80, 20), (-160, 2), (-50, 50), (-50, 50),
          (-25, 5), (-60, 35), (-80, 20), (-160, 2), (-50, 50), (-50, 50), (-60, 60), (-60, 60), (-90, 50),
          (-60, 60), (-60, 60), (-90, 50)]  # fmt: skip


def test_the_preset_drives_diffrls_21_motors_in_the_files_joint_order():
    cfg = humanoid_config()
    layout = cfg.layout()
    assert layout.root_free and layout.body_names[layout.root_body] == "torso"
    # Newton joins a body's hinges into one joint: the dofs keep the file's order, DiffRL's action order
    assert "_".join(layout.actuated_names) == "_".join(JOINTS)
    assert layout.torque == pytest.approx([0.35 * s for s in STRENGTHS])
    assert cfg.action_dim() == 21 and cfg.observation_dim() == 76  # DiffRL's 76
    # dof by dof: the file's hinge (its axis and range) in that order
    env = humanoid("env.world_count=1", "env.horizon=1", *QUICK)
    dofs = list(env.layout.actuated_dofs)
    axes = env.model.joint_axis.numpy()[dofs]
    np.testing.assert_allclose(axes, [np.array(a) / np.linalg.norm(a) for a in AXES], atol=1e-6)
    lower, upper = env.model.joint_limit_lower.numpy()[dofs], env.model.joint_limit_upper.numpy()[dofs]
    np.testing.assert_allclose(np.degrees(np.stack([lower, upper], axis=1)), RANGES, atol=1e-3)


def test_the_joints_keep_the_files_springs_and_armature_and_dflexs_damping_everywhere():
    """DiffRL's loader reads each hinge's stiffness, damping and armature from the file (the knees
    its class defaults, 5, 0.1 and 0.007) and dflex damps every joint by limit_kd at every angle:
    the model's damping is the file's + 10 and no separate limit damping is left."""
    env = humanoid("env.world_count=1", "env.horizon=1", *QUICK)
    dofs = list(env.layout.actuated_dofs)
    stiffness = env.model.joint_stiffness.numpy()[dofs]
    damping = env.model.joint_damping.numpy()[dofs]
    armature = env.model.joint_armature.numpy()[dofs]
    by_name = dict(zip(JOINTS, zip(stiffness, damping, armature, strict=True), strict=True))
    assert by_name["abdomen_z"] == pytest.approx((20.0, 5.0 + 10.0, 0.02))
    assert by_name["right_knee"] == pytest.approx((5.0, 0.1 + 10.0, 0.007))
    assert by_name["left_ankle_x"] == pytest.approx((2.0, 1.0 + 10.0, 0.006))
    assert by_name["left_shoulder1"] == pytest.approx((10.0, 5.0 + 10.0, 0.01))
    np.testing.assert_array_equal(env.model.joint_limit_kd.numpy()[dofs], 0.0)
    np.testing.assert_array_equal(env.model.joint_limit_ke.numpy()[dofs], 1000.0)
    # without the dflex law the limit damping stays Newton's, past a limit only
    plain = humanoid("env.world_count=1", "env.horizon=1", "env.limit_kd_everywhere=false", *QUICK)
    np.testing.assert_allclose(plain.model.joint_damping.numpy()[dofs], damping - 10.0, rtol=1e-5)
    np.testing.assert_array_equal(plain.model.joint_limit_kd.numpy()[dofs], 10.0)
    mass = env.model.body_mass.numpy()[: env.layout.body_count].sum()
    assert mass == pytest.approx(40.8, abs=0.2)  # density 1000 on the file's capsules


def test_the_limit_damping_everywhere_brakes_a_joint_inside_its_limits():
    """One step from rest with the abdomen turning at 1 rad/s well inside its range: with dflex's law
    the hinge loses more speed than with Newton's (the limit's damping only past the limit)."""
    speeds = {}
    for everywhere in ("true", "false"):
        env = humanoid("env.world_count=1", "env.horizon=1", f"env.limit_kd_everywhere={everywhere}",
                       "env.noise_position=0", "env.noise_rotation=0", "env.noise_joint_q=0", "env.noise_joint_qd=0",
                       *QUICK)  # fmt: skip
        env.request({})
        qd = env.initial["joint_qd"].numpy()
        dof = env.layout.actuated_dofs[0]  # abdomen_z, range +-45 degrees, at 0
        qd[dof] = 1.0
        env.initial["joint_qd"].assign(qd)
        env.reset()
        env.act(0, wp.zeros((1, 1, 21), dtype=wp.float32))
        env.step(0)
        speeds[everywhere] = float(env.state(1).joint_qd.numpy()[dof])
    assert 0.0 < speeds["true"] < speeds["false"] < 1.0


def test_observations_and_rewards_are_diffrls_formulas_of_the_state():
    """DiffRL's Humanoid (envs/humanoid.py): progress + 0.1 up + heading + the height shaped around
    0.84 m (10 h above, at most 1; -200 h^2 below) - 0.002 |a|^2; an episode ends below 0.74 m."""
    worlds, steps = 3, 45
    env = humanoid(f"env.world_count={worlds}", f"env.horizon={steps}", "env.noise_rotation=0.6", *QUICK)
    env.request({"reward": "all"})
    rng = np.random.default_rng(3)
    actions = wp.array(rng.uniform(-1.3, 1.3, (steps, worlds, 21)).astype(np.float32), dtype=wp.float32)
    obs = wp.zeros((worlds, 76), dtype=wp.float32)
    env.reset()
    for t in range(steps):
        env.act(t, actions)
        env.step(t)
        env.write_observables(t)
    env.observe(steps, obs)
    q = env.state(steps).joint_q.numpy().reshape(worlds, 28)
    qd = env.state(steps).joint_qd.numpy().reshape(worlds, 27)
    o = obs.numpy()
    np.testing.assert_allclose(o[:, 0], q[:, 2], rtol=1e-6)  # the torso's height
    np.testing.assert_allclose(o[:, 1:5], q[:, 3:7], rtol=1e-6)  # its quaternion
    np.testing.assert_allclose(o[:, 11:32], q[:, 7:], rtol=1e-6)  # the hinges
    np.testing.assert_allclose(o[:, 32:53], 0.1 * qd[:, 6:], rtol=1e-5, atol=1e-6)  # DiffRL's 0.1 x their speeds
    np.testing.assert_allclose(o[:, 55:], np.clip(actions.numpy()[-1], -1.0, 1.0), rtol=1e-6)
    reward = env.trajectory()["reward"].numpy()  # (steps, worlds, terms), weighted
    ended = env.trajectory()["terminated"].numpy()[:, :, 0]
    body_count = env.layout.body_count
    for t in range(steps):
        s = env.state(t + 1)
        X = s.body_q.numpy().reshape(worlds, body_count, 7)[:, 0]
        V = s.body_qd.numpy().reshape(worlds, body_count, 6)[:, 0]
        rot = [wp.quat(*x[3:]) for x in X]
        up = np.array([wp.quat_rotate(r, wp.vec3(0.0, 0.0, 1.0))[2] for r in rot])
        heading = np.array([wp.quat_rotate(r, wp.vec3(1.0, 0.0, 0.0))[0] for r in rot])
        a = np.clip(actions.numpy()[t], -1.0, 1.0)
        h = np.clip(X[:, 2] - 0.84, -1.0, 0.1)
        height = np.where(h < 0.0, -200.0 * h**2, 10.0 * h)
        diffrl = V[:, 0] + 0.1 * up + heading + height - 0.002 * (a**2).sum(axis=1)
        alive = np.ones(worlds) if t == 0 else 1.0 - ended[:t].max(axis=0)  # no reward after an end
        np.testing.assert_allclose(reward[t].sum(axis=1), alive * diffrl, rtol=2e-4, atol=2e-4)
        np.testing.assert_array_equal(ended[t], (X[:, 2] < 0.74).astype(np.float32))
    # met on the way: the height's bonus at its cap of 1 (standing), a fall, and the penalty below 0.84 m
    assert (np.abs(reward[:, :, 3] - 1.0) < 1e-6).any()
    assert ended[:-1].any()
    assert (reward[:, :, 3] < 0.0).any()


@pytest.mark.slow  # default suite time (make test-slow runs it; the Hopper's settle test stays in the default run)
def test_at_zero_action_it_falls_and_lies_at_rest_within_the_presets_settle_time():
    """A ragdoll on its springs: unactuated it falls and lies down (DiffRL's too, whose episodes end
    below 0.74 m); the settle check finds it at rest by the preset's 3 s."""
    cfg = humanoid_config()
    assert cfg.settle_time == 3.0
    assert settle(cfg, lambda quiet: RobotEnv(quiet, device="cpu")) is None
    env = humanoid("env.world_count=1", "env.horizon=120", "env.settle_time=0", "env.noise_position=0",
                   "env.noise_rotation=0", "env.noise_joint_q=0", "env.noise_joint_qd=0")  # fmt: skip
    env.request({})
    env.reset()
    zero = wp.zeros((120, 1, 21), dtype=wp.float32)
    for t in range(120):
        env.act(t, zero)
        env.step(t)
    torso = env.state(120).body_q.numpy()[0]
    assert torso[2] < 0.3  # lying: the torso's centre 0.3 m from the ground or less, from 1.35 m


@pytest.mark.slow  # default suite time (make test-slow runs it; the Hopper's and the Ant's stay in the default run)
def test_the_tape_matches_central_differences_through_the_feets_contacts():
    """gradcheck.yaml's rollout for the Humanoid: 0.5 s of random torques from a noisy start, the feet
    landing, sliding and lifting, at the preset's 48 substeps, differences at its step of 3e-2."""
    cfg, _ = config.compose_config("gradcheck", ["+env=humanoid", "device=cpu"])
    assert cfg.gradcheck.eps == 0.03 and cfg.env.horizon == 30
    env = build.build_env(cfg, "cpu", None, None)
    result, _ = check_gradients(
        env, WeightedLoss(REWARD), samples=12, tolerance=env.config.gradcheck_tolerance(), seed=0, device="cpu",
        task=OpenLoop(init_noise=0.5, seed=0), eps=cfg.gradcheck.eps,
    )  # fmt: skip
    phases = set("+".join(result.phases).split("+"))
    assert {"touchdown", "lift-off"} <= phases
    assert result.passed, result.table


def test_a_captured_rollout_equals_the_eager_one_bit_for_bit():
    env = humanoid("env.world_count=2", "env.horizon=3", *QUICK)
    check_capture(env, WeightedLoss(REWARD), OpenLoop(init_noise=0.5), device="cpu")


@pytest.mark.parametrize(
    ("args", "field", "accepted"),
    [
        (["env.height_scale=-1"], "env.height_scale", ">= 0"),
        (["env.torque=[70,70]"], "env.torque", "21"),
        (["env.limit_kd_everywhere=sometimes"], "env.limit_kd_everywhere", "true"),
    ],
    ids=["height_scale", "torque", "limit_kd_everywhere"],
)
def test_bad_values_are_refused_in_one_line(request, tmp_path, args, field, accepted):
    proc = refused_train(request, ["+env=humanoid", *args, "iterations=1"], tmp_path)
    assert_clean_rejection(proc, field, accepted, tmp_path)
