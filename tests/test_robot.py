"""The robot env (envs/robot/): any robot file as an env, the Ant and the quadruped presets.

Loading with a file's own defaults; one-line refusals of bad files and names; observations and
rewards against the state; the tape against central differences through contact (touchdowns and
lift-offs); captured equal to eager; segments equal to the full tape; SHAC's early termination;
the settle check; the locomotion figures."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import warp as wp
import yaml
from omegaconf import OmegaConf

from envs.robot import RobotConfig, RobotEnv, episode_figures
from harness import build, config
from harness.gradcheck import check_gradients, contact_phase
from harness.losses import WeightedLoss
from harness.memory import segmented_forward_backward
from harness.tasks import OpenLoop, prepare
from harness.tasks import shac_kernels as k
from harness.training.step import check_capture, taped_rollout, zero_grads
from tests.helpers import ROOT, run_harness, run_harness_here
from tests.test_checkpoint import (
    assert_killed_run_resumes_bit_for_bit,
    train,
)
from tests.test_errors import assert_clean_rejection

REWARD = {"reward": {"source": "reward", "kind": "reward"}}

QUICK = ("env.settle_time=0", "env.substeps=4", "env.mass_matrix_every=4", "env.collide_every=4")
"""A cheaper Ant for tests that check plumbing, not physics: 4 substeps (stable for a few steps)."""


def robot(preset: str, *overrides: str) -> RobotEnv:
    """A preset (``ant``: torques; ``quadruped``: position drives) as the harness composes it."""
    cfg, _ = config.compose_config("train", [f"+env={preset}", "device=cpu", *overrides])
    return build.build_env(cfg, "cpu", None, None)


def ant(*overrides: str) -> RobotEnv:
    """The Ant preset as the harness composes it, with ``overrides``."""
    return robot("ant", *overrides)


def test_a_file_given_alone_loads_with_the_files_own_actuators_and_torques():
    mjcf = RobotConfig(asset="newton:nv_ant.xml").layout()
    assert mjcf.actuated_names == ("hip_1", "ankle_1", "hip_2", "ankle_2", "hip_3", "ankle_3", "hip_4", "ankle_4")
    assert mjcf.torque == (15.0,) * 8  # the file's <motor gear="15">
    assert mjcf.root_free and mjcf.body_names[mjcf.root_body] == "torso"
    urdf = RobotConfig(asset="newton:quadruped.urdf").layout()
    assert len(urdf.actuated_dofs) == 12 and urdf.torque == (80.0,) * 12  # the URDF's <limit effort="80">
    assert urdf.body_names[urdf.root_body] == "base"
    # DiffRL's 37 observations: height, rotation, velocities, 8 + 8 joints, up, heading, 8 previous actions
    cfg, _ = config.compose_config("train", ["+env=ant"])
    assert RobotConfig(**{k: v for k, v in cfg.env.items() if k != "_target_"}).observation_dim() == 37


@pytest.mark.parametrize(
    ("args", "field", "accepted"),
    [
        (["env.asset=/nonexistent/robot.xml"], "env.asset: no file '/nonexistent/robot.xml'", "an MJCF, URDF or USD"),
        (["env.asset=robot.obj"], "env.asset: 'robot.obj' is not a robot file", ".urdf"),
        (["env.actuated=[hip_1,knee_9]"], "env.actuated: 'knee_9' is not a movable joint", "hip_1, ankle_1"),
        (["env.root=tail"], "env.root: 'tail' is not a body", "torso, front_left_leg"),
        (["env.torque=[1,2,3]"], "env.torque: needs 1 or 8 values", "one per actuated dof"),
        (["env.observation=[root_height,knees]"], "env.observation[1]: 'knees' is not a piece", "joint_qd"),
        (["+env.reward.speed=1"], "env.reward.speed: not a reward term", "forward_velocity"),
        (["env.start_joint_q=[0,1]"], "env.start_joint_q: needs 8 values", "got 2"),
        (["env.control=position"], "env.target_ke: control=position needs a drive stiffness", "one value [N m/rad]"),
        (["env.control=position", "env.target_ke=[1,2]"], "env.target_ke: needs 1 or 8 values", "got 2"),
        (["env.control=speed"], "env.control: expected torque or position", "got 'speed'"),
        (
            ["env.control=position", "env.target_ke=[10]", "env.effort_limit=[1,2]"],
            "env.effort_limit: needs 1 or 8",
            "got 2",
        ),
        (
            ["env.control=position", "env.target_ke=[10]", "env.velocity_limit=[0]"],
            "env.velocity_limit[0]: must be",
            "> 0, got 0",
        ),
        (
            ["env.effort_limit=[10]"],
            "env.effort_limit: limits the position drive, and env.control is torque",
            "accepted: null, or env.control=position",
        ),
    ],
    ids=[
        "missing",
        "unknown_kind",
        "joint",
        "body",
        "torque",
        "piece",
        "term",
        "start",
        "no_gain",
        "gains",
        "control",
        "effort_count",
        "no_speed",
        "limit_of_torques",
    ],
)
def test_bad_robot_files_and_names_are_refused_in_one_line_before_anything_is_written(
    request, tmp_path, args, field, accepted
):
    command = ["train", "+env=ant", *args, "iterations=1"]
    if request.node.callspec.id in THROUGH_A_PROCESS:
        proc = train(command[1:], tmp_path)
    else:  # the same command line, refused by the same code, without a new interpreter's imports
        proc = run_harness_here(*command, cwd=tmp_path)
    assert_clean_rejection(proc, field, accepted, tmp_path)


THROUGH_A_PROCESS = {"missing", "control"}
"""The refusals above that run as a real ``python -m harness`` process; the rest run in-process."""
assert THROUGH_A_PROCESS <= set(
    next(m for m in test_bad_robot_files_and_names_are_refused_in_one_line_before_anything_is_written.pytestmark
         if m.name == "parametrize").kwargs["ids"]
), "a case named above that does not exist"  # fmt: skip


def test_a_malformed_file_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "broken.xml"
    bad.write_text("<mujoco><worldbody><body name='a'>")
    proc = train(["+env=robot", f"env.asset={bad}", "iterations=1"], tmp_path)
    assert_clean_rejection(proc, "env.asset", "is not well-formed XML", tmp_path)


def test_observations_rewards_and_terminations_match_the_state():
    env = ant("env.world_count=3", "env.horizon=3", *QUICK)
    env.request({"reward": "all"})
    rng = np.random.default_rng(1)
    actions = wp.array(rng.uniform(-1.5, 1.5, (3, 3, 8)).astype(np.float32), dtype=wp.float32)
    obs = wp.zeros((3, 37), dtype=wp.float32)
    env.reset()
    for t in range(3):
        env.act(t, actions)
        env.step(t)
        env.write_observables(t)
    env.observe(3, obs)
    state = env.state(3)
    q = state.joint_q.numpy().reshape(3, 15)
    qd = state.joint_qd.numpy().reshape(3, 14)
    body_q = state.body_q.numpy().reshape(3, 9, 7)
    body_qd = state.body_qd.numpy().reshape(3, 9, 6)
    clipped = np.clip(actions.numpy()[2], -1.0, 1.0)

    def rotate(quat: np.ndarray, v: np.ndarray) -> np.ndarray:
        x, y, z, w = quat
        u = np.array([x, y, z])
        return 2.0 * u.dot(v) * u + (w * w - u.dot(u)) * v + 2.0 * w * np.cross(u, v)

    up = np.array([rotate(body_q[w, 0, 3:], np.array([0.0, 0.0, 1.0]))[2] for w in range(3)])
    heading = np.array([rotate(body_q[w, 0, 3:], np.array([1.0, 0.0, 0.0]))[0] for w in range(3)])
    expected = np.concatenate(
        [body_q[:, 0, 2:3], body_q[:, 0, 3:7], body_qd[:, 0, 0:3], body_qd[:, 0, 3:6], q[:, 7:], 0.1 * qd[:, 6:],
         up[:, None], heading[:, None], clipped],
        axis=1,
    )  # fmt: skip
    np.testing.assert_allclose(obs.numpy(), expected, rtol=1e-5, atol=1e-6)
    reward = env.trajectory()["reward"].numpy()[2]
    terms = np.stack([body_qd[:, 0, 0], 0.1 * up, heading, body_q[:, 0, 2] - 0.27], axis=1)
    np.testing.assert_allclose(reward, terms, rtol=1e-5, atol=1e-6)
    ended = env.trajectory()["terminated"].numpy()[2, :, 0]
    np.testing.assert_array_equal(ended, (body_q[:, 0, 2] < 0.27).astype(np.float32))
    flags = wp.zeros(3, dtype=wp.int32)
    env.terminated(3, flags)
    np.testing.assert_array_equal(flags.numpy(), (body_q[:, 0, 2] < 0.27).astype(np.int32))


def test_every_path_that_ends_an_episode_reads_the_one_termination_rule():
    """envs/robot/kernels.py writes the rule once (``ends``): the observable ``terminated``, the
    Terminates role's flags and the ``alive`` a step leaves agree on states that stand, sit below
    the height, tip past the up threshold or are not finite."""
    from envs.robot import kernels

    tilt = {"stands": 0.0, "low": 0.0, "tipped": np.pi / 2, "leans": np.pi / 6, "nan": 0.0}
    height = {"stands": 0.75, "low": 0.2, "tipped": 0.75, "leans": 0.75, "nan": np.nan}
    expected = np.array([0, 1, 1, 0, 1])  # up = cos(tilt) against 0.5; height against 0.27
    worlds = len(tilt)
    env = ant(f"env.world_count={worlds}", "env.horizon=1", "env.termination_up=0.5", *QUICK)
    env.request({"reward": "all"})
    env.reset()
    body_q = env.state(1).body_q.numpy().reshape(worlds, -1, 7)
    for w, name in enumerate(tilt):  # the root (the torso) turned about x by its tilt
        body_q[w, env.layout.root_body] = [0.0, 0.0, height[name], np.sin(tilt[name] / 2), 0.0, 0.0,
                                           np.cos(tilt[name] / 2)]  # fmt: skip
    env.state(1).body_q.assign(body_q.reshape(-1, 7))
    env.write_observables(0)
    flags = wp.zeros(worlds, dtype=wp.int32)
    env.terminated(1, flags)
    alive = wp.zeros(worlds, dtype=wp.float32)
    touching = wp.zeros(env.model.body_count, dtype=wp.int32)
    nonfinite = wp.zeros(1, dtype=wp.int32)
    wp.launch(kernels.survive, dim=worlds, inputs=[env.state(1).body_q, env._termination, env.state(0).alive],
              outputs=[alive, touching, nonfinite])  # fmt: skip
    np.testing.assert_array_equal(env.trajectory()["terminated"].numpy()[0, :, 0], expected)
    np.testing.assert_array_equal(flags.numpy(), expected)
    np.testing.assert_array_equal(alive.numpy(), 1 - expected)
    assert nonfinite.numpy()[0] == 1  # the one world that is not finite is counted (env.nan_guard's figure)


def test_the_tape_matches_central_differences_through_touchdowns_and_lift_offs():
    """gradcheck's own rollout for the Ant (gradcheck.yaml: random torques, one world), shortened."""
    env = ant("env.world_count=1", "env.horizon=12", "env.settle_time=0")
    result, _ = check_gradients(
        env, WeightedLoss(REWARD), samples=10, tolerance=env.config.gradcheck_tolerance(), seed=0, device="cpu",
        task=OpenLoop(init_noise=0.5, seed=0),
    )  # fmt: skip
    assert result.phases is not None and {"touchdown", "lift-off"} & set("+".join(result.phases).split("+"))
    assert result.passed, result.table


def test_contact_phases_read_the_steps_an_action_acts_on():
    touching = np.array([[0, 0], [0, 0], [1, 0], [1, 0], [1, 1], [0, 1], [0, 0]], dtype=bool)
    assert contact_phase(touching, 0, 2) == "flight"
    assert contact_phase(touching, 1, 2) == "touchdown"
    assert contact_phase(touching, 3, 1) == "stance"
    assert contact_phase(touching, 4, 2) == "touchdown+lift-off"
    assert contact_phase(touching, 5, 2) == "lift-off"


@pytest.mark.parametrize("preset", ["ant", "quadruped"])
def test_a_captured_rollout_equals_the_eager_one_bit_for_bit(preset):
    env = robot(preset, "env.world_count=2", "env.horizon=3", *QUICK)
    check_capture(env, WeightedLoss(REWARD), OpenLoop(init_noise=0.5), device="cpu")


@pytest.mark.parametrize("preset", ["ant", "quadruped"])
def test_segments_give_the_full_tapes_gradients_bit_for_bit(preset):
    def gradients(segment_steps: int | None) -> dict:
        cfg, _ = config.compose_config("train", [f"+env={preset}", "env.world_count=2", "env.horizon=5", *QUICK])
        env = build.build_env(cfg, "cpu", segment_steps, None)
        loss = WeightedLoss(REWARD)
        task = OpenLoop(init_noise=0.5)
        params = prepare(env, task, loss, device="cpu")
        if segment_steps is None:
            tape, trajectory, total = taped_rollout(env, task, loss, params)
            tape.backward(total)
        else:
            zero_grads(env, loss, params, task)
            _, trajectory, total = segmented_forward_backward(env, task, loss, params)
        found = {"loss": total.numpy(), "gradient": params.grad.numpy()}
        found.update({name: value.numpy() for name, value in trajectory.items()})
        return {name: np.array(value, copy=True) for name, value in found.items()}

    full = gradients(None)
    assert np.abs(full["gradient"]).max() > 0
    got = gradients(2)
    for name, value in got.items():
        np.testing.assert_array_equal(value, full[name], err_msg=name)


def test_mark_terminations_ends_the_episode_values_it_zero_and_starts_the_next():
    steps, worlds, gamma, length = 6, 3, 0.9, 4
    done, ends = (wp.zeros((steps, worlds), dtype=wp.int32) for _ in range(2))
    terminal = wp.zeros((steps, worlds), dtype=wp.int32)
    cost_weight, value_weight = (wp.zeros((steps, worlds), dtype=wp.float32) for _ in range(2))
    episode_step = wp.array([0, 2, 1], dtype=wp.int32)  # world 1 reaches its limit after step 1
    no_cut = wp.zeros((steps, worlds), dtype=wp.int32)
    wp.launch(k.episode_marks, dim=worlds, inputs=[episode_step, length, steps, no_cut],
              outputs=[done, ends, cost_weight, value_weight, gamma])  # fmt: skip
    ended = wp.array([1, 1, 0], dtype=wp.int32)
    wp.launch(k.mark_terminations, dim=worlds, inputs=[ended, 1, steps, length, gamma, no_cut],
              outputs=[done, ends, terminal, cost_weight, value_weight])  # fmt: skip
    d, e, term = done.numpy(), ends.numpy(), terminal.numpy()
    cw, vw = cost_weight.numpy(), value_weight.numpy()
    # world 0 ended early after step 1: done, valued 0, a new episode from step 2 (its limit after step 5)
    np.testing.assert_array_equal(d[:, 0], [0, 1, 0, 0, 0, 1])
    np.testing.assert_array_equal(term[:, 0], [0, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(cw[:, 0], [1, gamma, 1, gamma, gamma**2, gamma**3], rtol=1e-6)
    np.testing.assert_allclose(vw[:, 0], [0, 0, 0, 0, 0, gamma**4], rtol=1e-6)
    np.testing.assert_array_equal(e[:, 0], [0, 1, 0, 0, 0, 1])
    # world 1 reached its time limit after step 1 anyway: not an early end (the critic values it)
    np.testing.assert_array_equal(term[:, 1], 0)
    np.testing.assert_allclose(vw[1, 1], gamma**2, rtol=1e-6)
    # world 2 did not end
    np.testing.assert_array_equal(term[:, 2], 0)
    following = wp.array([0, 2, 1], dtype=wp.int32)
    wp.launch(k.next_episode, dim=worlds, inputs=[following, done, length, steps])
    np.testing.assert_array_equal(following.numpy(), [0, 0, (1 + steps) % length])


def test_shac_restarts_a_fallen_ant_and_does_not_bootstrap_its_value():
    """A termination height above the start: every state ends its episode, every step restarts."""
    cfg, choices = config.compose_config(
        "train",
        ["+env=ant", "task=shac", "env.world_count=2", "task.window=3", "task.critic_minibatches=2",
         "task.critic_epochs=1", "env.termination_height=5.0", *QUICK],
    )  # fmt: skip
    trainer = build.build_run(cfg, choices).trainer()
    trainer.step.run()
    b = trainer.task.buffers(trainer.env)
    np.testing.assert_array_equal(b.done.numpy(), 1)
    np.testing.assert_array_equal(b.terminal.numpy(), 1)
    np.testing.assert_array_equal(b.value_weight.numpy(), 0.0)
    assert float(trainer.task.state(trainer.env)["last_length"].numpy()[0]) == 1.0


def test_a_file_that_does_not_come_to_rest_is_refused_in_one_line(tmp_path):
    # every joint far outside its limits, the limits very stiff and one substep: it blows up
    args = ["env.start_joint_q=[3,3,3,3,3,3,3,3]", "env.limit_ke=1e8", "env.substeps=1", "env.mass_matrix_every=1",
            "env.collide_every=1"]  # fmt: skip
    proc = train(["+env=ant", *args, "iterations=1"], tmp_path)
    assert_clean_rejection(
        proc, "env.asset: 'newton:nv_ant.xml' does not come to rest unactuated", "settle_time=0", tmp_path
    )


def test_episode_figures_count_rewards_until_the_fall_and_the_forward_distance():
    steps, dt = 4, 0.5
    reward = np.ones((steps, 2, 2))  # two terms of 1 each: 2 per step
    terminated = np.zeros((steps, 2, 1))
    terminated[1, 1, 0] = 1.0  # world 1 falls after step 1
    position = np.zeros((steps, 2, 3))
    position[-1, :, 0] = [2.0, -1.0]
    found = episode_figures(reward, terminated, position, np.zeros((2, 3)), np.array([1.0, 0.0, 0.0]), dt)
    assert found["episode_return"] == (8.0 + 4.0) / 2
    assert found["fall_fraction"] == 0.5
    assert found["forward_speed"] == pytest.approx((2.0 - 1.0) / 2 / (steps * dt))
    assert found["episode_length"] == (4 + 2) / 2
    assert "nonfinite_worlds" not in found
    position[2:, 1] = np.nan  # world 1's simulation leaves finite numbers after its fall (env.nan_guard)
    position[1, 1, 0] = -0.5
    reward[3, 1] = np.nan
    found = episode_figures(reward, terminated, position, np.zeros((2, 3)), np.array([1.0, 0.0, 0.0]), dt)
    assert found["forward_speed"] == pytest.approx((2.0 - 0.5) / 2 / (steps * dt))  # its last finite position
    assert found["episode_return"] == (8.0 + 4.0) / 2 and found["nonfinite_worlds"] == 1


def _one_substep_jacobian(env: RobotEnv, collide: bool) -> tuple[np.ndarray, np.ndarray]:
    """Tape and central differences (contact set frozen, as the tape sees it) of a random projection
    of the velocities after one substep with respect to the joint coordinates before it, in contact."""
    import newton

    model = env.model
    solver = newton.solvers.SolverFeatherstone(model, angular_damping=0.0)
    pipeline = newton.CollisionPipeline(model, requires_grad=False)
    before, after, contacts = model.state(requires_grad=True), model.state(requires_grad=True), pipeline.contacts()
    weights = wp.array(np.random.default_rng(0).normal(size=model.joint_dof_count).astype(np.float32))
    out = wp.zeros(1, dtype=wp.float32, requires_grad=True)
    q0 = env.initial["joint_q"].numpy().copy()

    @wp.kernel
    def project(v: wp.array(dtype=wp.float32), w: wp.array(dtype=wp.float32), total: wp.array(dtype=wp.float32)):
        i = wp.tid()
        wp.atomic_add(total, 0, v[i] * w[i])

    def run(q: np.ndarray, detect: bool) -> None:
        before.joint_q.assign(q)
        before.joint_qd.zero_()
        out.zero_()
        newton.eval_fk(model, before.joint_q, before.joint_qd, before)
        if detect:
            pipeline.collide(before, contacts)
        before.clear_forces()
        solver.step(before, after, None, contacts, 1.0 / 960.0)
        wp.launch(project, dim=model.joint_dof_count, inputs=[after.joint_qd, weights], outputs=[out])

    tape = wp.Tape()
    with tape:
        run(q0, True)
    assert contacts.rigid_contact_count.numpy()[0] > 0
    tape.backward(out)
    grad = before.joint_q.grad.numpy().astype(np.float64)
    fd = np.empty(len(q0))
    for i in range(len(q0)):
        values = []
        for sign in (1.0, -1.0):
            q = q0.copy()
            q[i] += sign * 1.0e-3
            run(q, False)
            values.append(float(out.numpy()[0]))
        fd[i] = (values[0] - values[1]) / 2.0e-3
    return grad, fd


@pytest.mark.parametrize("preset", ["ant", "quadruped"])
def test_one_substep_through_contact_matches_central_differences(preset):
    """With the contact set frozen (what the tape differentiates), the tape of one Featherstone substep
    in ground contact equals central differences: the model's derivative is right (envs/featherstone.py)."""
    height = {"ant": "env.start_height=0.55", "quadruped": "env.start_height=0.43"}[preset]
    cfg, _ = config.compose_config("train", [f"+env={preset}", "env.world_count=1", "env.horizon=1", height, *QUICK])
    env = build.build_env(cfg, "cpu", None, None)
    grad, fd = _one_substep_jacobian(env, True)
    scale = np.abs(fd).max()
    np.testing.assert_allclose(grad, fd, rtol=2e-3, atol=2e-3 * scale)


def test_newtons_own_featherstone_gets_the_contact_wrench_gradient_wrong():
    """newton 1.8's eval_rigid_tau writes the external wrench it read (envs/featherstone.py): with it the
    same check fails. When a newton release stops doing that, this test says the fix can go."""
    from newton._src.solvers.featherstone import solver_featherstone

    from envs import featherstone

    cfg, _ = config.compose_config("train", ["+env=ant", "env.world_count=1", "env.horizon=1", "env.start_height=0.55",
                                             *QUICK])  # fmt: skip
    env = build.build_env(cfg, "cpu", None, None)
    fixed = solver_featherstone.eval_rigid_tau
    solver_featherstone.eval_rigid_tau = featherstone._FIXED["original"]
    try:
        grad, fd = _one_substep_jacobian(env, True)
    finally:
        solver_featherstone.eval_rigid_tau = fixed
    scale = np.abs(fd).max()
    assert np.abs(grad - fd).max() > 0.1 * scale


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_sigkilled_ant_run_resumes_bit_for_bit(tmp_path):
    args = ["+env=ant", "task=shac", "env.world_count=2", "task.window=3", "task.critic_minibatches=2",
            "task.critic_epochs=2", "task.actor.hidden=[16,16]", "task.critic.hidden=[16,16]", "iterations=150",
            "checkpoint.every=10", "log_every=1", "plot_every=null", "env.horizon=20", *QUICK]  # fmt: skip
    # 20-step episodes: every world falls or times out and restarts several times before and after the kill
    assert_killed_run_resumes_bit_for_bit(args, tmp_path, iterations=150, kill_after=30, timeout=600)


def test_a_run_that_blows_up_stops_diverged_naming_the_step_and_the_body(tmp_path):
    # joints far outside very stiff limits, one substep, the settle check skipped: the first rollout blows up
    args = ["+env=ant", "env.world_count=1", "env.horizon=4", "env.start_joint_q=[3,3,3,3,3,3,3,3]",
            "env.limit_ke=1e8", "env.substeps=1", "env.mass_matrix_every=1", "env.collide_every=1",
            "env.settle_time=0", "iterations=12", "log_every=1", "plot_every=null", "hydra.run.dir=run"]  # fmt: skip
    proc = train(args, tmp_path)
    assert proc.returncode == 1, proc.stderr
    line = [line for line in proc.stderr.splitlines() if line.startswith("error: diverged")]
    assert line and "the simulation left finite numbers at step" in line[0] and "body '" in line[0], proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged" and "of world 0" in summary["diverged"]["simulation"]


def test_gradcheck_of_a_policy_on_the_ant_takes_the_robots_weight_step(tmp_path):
    """A policy's weights move every step's action at once. For this actor (seed 0) the 1e-2 step
    of other envs opens and closes contacts inside the Ant's differences (one of these 80 entries
    99% off); at the robot's 1e-3 (RobotConfig.weight_fd_step) all 80 agree within 0.2%. Not
    every actor passes at 1e-3 (docs/robots.md). Also: gradcheck's per-env rollout settings a task
    does not have (task.init_noise) are left out, and the CUDA driver warning is kept off (the
    robot file is read before the env is built)."""
    proc = run_harness("gradcheck", "+env=ant", "task=policy", "env.horizon=8", "gradcheck.samples=80",
                       "hydra.run.dir=gc", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "out.weight[" in proc.stdout and ": ok" in proc.stdout, proc.stdout
    assert "CUDA driver" not in proc.stderr, proc.stderr


def test_gradcheck_of_a_task_with_two_parameter_groups_is_refused_in_one_line(tmp_path):
    proc = run_harness("gradcheck", "+env=ant", "task=shac", "env.horizon=8", cwd=tmp_path)
    assert_clean_rejection(proc, "task: gradcheck checks a task that trains one parameter group", "task=policy",
                           tmp_path)  # fmt: skip


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_the_quadruped_urdf_passes_its_gradcheck_and_trains_a_few_shac_iterations(tmp_path):
    """Newton's bundled quadruped.urdf (the URDF importer) as +env=quadruped: gradcheck's own
    rollout for it (configs/gradcheck.yaml) passes from the command line, and SHAC trains."""
    check = run_harness("gradcheck", "+env=quadruped", "gradcheck.samples=8", "hydra.run.dir=gc", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "contact phase" in check.stdout and ": ok" in check.stdout
    args = ["+env=quadruped", "task=shac", "env.world_count=2", "task.window=4", "task.critic_minibatches=2",
            "task.critic_epochs=2", "iterations=3", "log_every=1", "plot_every=null", "env.horizon=20",
            "hydra.run.dir=run"]  # fmt: skip
    proc = train(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and np.isfinite(summary["final_loss"])
    # scripts/plot_gait.py on the run: one held-out world's feet, counted and drawn
    gait = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_gait.py"), "run", "--start", "0.5", "--seconds", "0.3",
         "--out", "gait"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert gait.returncode == 0, gait.stderr
    figures = json.loads((tmp_path / "gait.json").read_text())
    assert sorted(figures["feet"]) == ["LF_SHANK", "LH_SHANK", "RF_SHANK", "RH_SHANK"]
    assert all(foot["duty_factor"] > 0.5 for foot in figures["feet"].values()), figures  # barely trained: it stands
    assert 20.0 < figures["mass_kg"] < 40.0 and (tmp_path / "gait.png").stat().st_size > 10_000


def test_position_control_drives_to_start_pose_plus_scaled_action_and_holds_the_quadruped_up():
    """control=position writes start + target_scale x clip(action) into the step's drive targets;
    the env's drive holds Newton's quadruped standing where, given torques, it folds onto the
    ground (docs/robots.md, "The quadruped")."""
    quiet = ("env.world_count=2", "env.horizon=60", "env.settle_time=0", "env.noise_position=0", "env.noise_rotation=0",
             "env.noise_joint_q=0", "env.noise_joint_qd=0")  # fmt: skip
    heights = {}
    for control in ("position", "torque"):
        env = robot("quadruped", *quiet, f"env.control={control}", "env.torque=[40]")
        rng = np.random.default_rng(0)
        actions = np.zeros((60, 2, 12), dtype=np.float32)
        actions[0] = rng.uniform(-1.5, 1.5, (2, 12))  # the first step's: some beyond [-1, 1]
        actions = wp.array(actions, dtype=wp.float32)
        env.reset()
        for t in range(60):
            env.act(t, actions)
            if t == 0 and control == "position":
                layout, coords = env.layout, list(env.layout.target_coords)
                target = env.joint_target_q.numpy()[0].reshape(2, layout.coord_count)[:, coords]
                expected = env.base_q[coords] + 0.5 * np.clip(actions.numpy()[0], -1.0, 1.0)
                np.testing.assert_allclose(target, expected, rtol=1e-6, atol=1e-6)
            env.step(t)
        heights[control] = env.state(60).body_q.numpy().reshape(2, -1, 7)[:, layout.root_body, 2]
    assert (heights["position"] > 0.4).all(), heights  # standing: the base at about 0.45 m
    assert (heights["torque"] < 0.2).all(), heights  # folded: the base on the ground


def _drive_torques(q, qd, target, *, ke=100.0, kd=2.0, effort=80.0, speed=20.0, lower=-1.0, upper=1.0):
    """kernels.drive on one world with one dof per (q, qd, target) triple; the torques and their
    gradients with respect to the targets (a tape through the kernel)."""
    from envs.robot import kernels

    n = len(q)
    d = kernels.Drive()
    ints = lambda v: wp.array(np.asarray(v, np.int32), dtype=wp.int32)  # noqa: E731
    floats = lambda v: wp.array(np.asarray(v, np.float32), dtype=wp.float32)  # noqa: E731
    d.coords, d.dofs = ints(range(n)), ints(range(n))
    d.ke, d.kd, d.lower, d.upper = floats([ke] * n), floats([kd] * n), floats([lower] * n), floats([upper] * n)
    d.effort, d.speed = floats([effort] * n), floats([speed] * n)
    d.coord_count, d.dof_count = n, n
    targets = wp.array(np.asarray(target, np.float32), dtype=wp.float32, requires_grad=True)
    out = wp.zeros(n, dtype=wp.float32, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(kernels.drive, dim=(1, n), inputs=[floats(q), floats(qd), targets, d], outputs=[out])
    tape.backward(grads={out: wp.ones(n, dtype=wp.float32)})
    return out.numpy(), targets.grad.numpy()


def test_the_drive_keeps_its_effort_limit_and_a_dc_motors_torque_speed_line():
    """control=position's drive (kernels.drive): the PD torque ke (target - q) - kd qd inside
    [-effort, effort] at rest, both ways; in the direction of motion the bound falls linearly to
    0 at the speed limit, against it the full effort brakes; past either joint limit the drive is
    cut (as Newton's); on a bound the torque has no gradient with respect to the target."""
    q = [0.0, 0.0, 0.0, 0.0, 0.0, 1.5, 0.0, 0.0, -1.5, 0.0]
    qd = [0.0, 0.0, 10.0, -10.0, 30.0, 0.0, 0.0, -10.0, 0.0, 1.0]
    target = [0.3, 2.0, 2.0, 2.0, 2.0, 0.0, -2.0, -2.0, 0.0, 0.1]
    tau, grad = _drive_torques(q, qd, target)
    expected = [
        30.0,  # 100 x 0.3: inside every bound
        80.0,  # 200 at rest: the effort limit
        40.0,  # 200 - 20 moving at half the speed limit toward the target: 80 x (1 - 10/20)
        80.0,  # 200 + 20 moving away from it (braking is not limited by speed): 80
        0.0,  # past the speed limit in the direction of motion: nothing more
        0.0,  # past the joint's upper limit (1.0): the drive is cut
        -80.0,  # -200 at rest: the effort limit the other way
        -40.0,  # -200 + 20 moving toward the target the negative way at half the speed limit
        0.0,  # past the joint's lower limit (-1.0): cut
        8.0,  # 100 x 0.1 - 2 x 1: inside every bound, the damping counts
    ]
    np.testing.assert_allclose(tau, expected, rtol=1e-6, atol=1e-5)
    # d tau / d target: ke inside, 0 on the effort bound, past a speed limit and past a joint limit
    np.testing.assert_allclose(grad, [100.0, 0, 0, 0, 0, 0, 0, 0, 0, 100.0], rtol=1e-6)
    # no limits: Newton's PD law itself
    tau, grad = _drive_torques(q[:5], qd[:5], target[:5], effort=1.0e30, speed=1.0e30)
    np.testing.assert_allclose(tau, [30.0, 200.0, 180.0, 220.0, 140.0], rtol=1e-6)
    np.testing.assert_allclose(grad, [100.0] * 5, rtol=1e-6)


def _drive_rollout(env: RobotEnv, actions: wp.array) -> np.ndarray:
    """Roll ``env`` out under ``actions`` (observables recorded); the last joint coordinates."""
    steps = actions.shape[0]
    env.request({"reward": "all"})
    env.reset()
    for t in range(steps):
        env.act(t, actions)
        env.step(t)
        env.write_observables(t)
    return env.state(steps).joint_q.numpy()


def test_the_quadruped_drive_reads_the_urdfs_limits_and_holds_them_on_every_substep():
    """The URDF's <limit effort="80" velocity="20"> is the drive's when the YAML gives none (null),
    and the preset's; every substep's torque stays within 80 N m, and the step's figures say how
    often it is there."""
    file_only = RobotConfig(asset="newton:quadruped.urdf", control="position", target_ke=(150.0,)).layout()
    assert file_only.effort_limit == (80.0,) * 12 and file_only.velocity_limit == (20.0,) * 12
    env = robot("quadruped", "env.world_count=2", "env.horizon=12", "env.settle_time=0")
    assert env.layout.effort_limit == (80.0,) * 12 and env.layout.velocity_limit == (20.0,) * 12
    rng = np.random.default_rng(0)
    _drive_rollout(env, wp.array(rng.uniform(-1.0, 1.0, (12, 2, 12)).astype(np.float32)))
    assert np.abs(env._drive_f.numpy()).max() <= 80.0 + 1e-4
    figures = env.describe(dict(env.observed))
    assert figures["drive_peak_fraction"] == pytest.approx(1.0, abs=1e-5)  # random targets 1 rad apart: at 80
    assert 0.0 < figures["drive_saturated_fraction"] <= 1.0 and figures["drive_torque_peak"] <= 80.0 + 1e-4


@pytest.mark.parametrize(
    ("preset", "gains", "asked"),
    [("quadruped", (), 80.0), ("ant", ("env.control=position", "env.target_ke=[60]", "env.target_kd=[2]"), 20.0)],
    ids=["quadruped", "ant_with_joint_limits"],
)
def test_the_drive_without_limits_rolls_out_as_featherstones_own_joint_drive(preset, gains, asked):
    """With both limits off (inf) the env's drive is Newton's joint drive moved from Featherstone's
    drive term into joint_f: the same rollout to float32 rounding, on the quadruped (no joint
    limits) and on the Ant (joint ranges, its ankles starting on theirs: the drive's cut past a
    limit is exercised), under random targets that ask for more than any limit."""
    quiet = ("env.world_count=2", "env.horizon=12", "env.settle_time=0", *gains, "env.effort_limit=[inf]",
             "env.velocity_limit=[inf]")  # fmt: skip
    ours = robot(preset, *quiet)
    count = len(ours.layout.actuated_dofs)
    actions = wp.array(np.random.default_rng(0).uniform(-1.0, 1.0, (12, 2, count)).astype(np.float32))
    end = _drive_rollout(ours, actions)
    assert np.abs(ours._drive_f.numpy()).max() > asked  # the quadruped's: more than its URDF's 80 N m
    theirs = robot(preset, *quiet)
    ke, kd = theirs.model.joint_target_ke.numpy(), theirs.model.joint_target_kd.numpy()
    for w in range(2):
        for i, d in enumerate(theirs.layout.actuated_dofs):
            ke[w * theirs.layout.dof_count + d] = theirs.layout.target_ke[i]
            kd[w * theirs.layout.dof_count + d] = theirs.layout.target_kd[i]
    theirs.model.joint_target_ke.assign(ke)
    theirs.model.joint_target_kd.assign(kd)
    theirs._drive_f = None  # Featherstone's drive term instead of the env's kernel
    np.testing.assert_allclose(_drive_rollout(theirs, actions), end, rtol=1e-4, atol=1e-4)


def test_the_tape_through_a_drive_on_its_limit_matches_central_differences():
    """Gradients through the drive where it sits on its effort bound (10 N m, under the torques
    the targets ask for) and through contact, against central differences of the same rollout."""
    env = robot("quadruped", "env.world_count=1", "env.horizon=8", "env.settle_time=0", "env.effort_limit=[10]")
    found, _ = check_gradients(
        env, WeightedLoss(REWARD), samples=8, tolerance=env.config.gradcheck_tolerance(), seed=0, device="cpu",
        task=OpenLoop(init_noise=0.5, seed=0),
    )  # fmt: skip
    saturated = np.isclose(np.abs(env._drive_f.numpy()), 10.0, atol=1e-4).mean()
    assert saturated > 0.1, saturated  # the bound is where the check runs (0.17 of the dof-substeps)
    assert found.passed, found.table


def test_flat_cylinder_ends_part_the_tape_from_differences_and_capsules_do_not():
    """Why the quadruped rounds its cylinders (docs/robots.md): with the URDF's flat-ended legs the
    tape and central differences disagree through touchdowns within 10 steps; the same legs
    collided as capsules agree. Fails once Newton's cylinder contacts move smoothly."""
    found = {}
    for rounded in ("false", "true"):
        env = robot("quadruped", "env.world_count=1", "env.horizon=10", "env.settle_time=0",
                    "env.control=torque", "env.torque=[40]", f"env.round_cylinders={rounded}")  # fmt: skip
        found[rounded], _ = check_gradients(
            env, WeightedLoss(REWARD), samples=8, tolerance=env.config.gradcheck_tolerance(), seed=0, device="cpu",
            task=OpenLoop(init_noise=0.5, seed=0),
        )  # fmt: skip
    assert "touchdown" in "+".join(found["true"].phases)
    assert found["true"].passed, found["true"].table
    assert not found["false"].passed, found["false"].table


def test_a_checkpoint_from_before_the_drive_settings_resumes_where_they_change_nothing(tmp_path):
    """Checkpoints written before env.control, env.target_* and env.round_cylinders existed resume
    with their defaults (a torque-driven robot with cylinders as cylinders), and not otherwise."""
    for preset, refused in (("ant", None), ("quadruped", "env.control")):
        cfg, _ = config.compose_config("train", [f"+env={preset}"])
        saved = OmegaConf.to_container(cfg, resolve=True)
        for key in (
            "control",
            "target_scale",
            "target_ke",
            "target_kd",
            "effort_limit",
            "velocity_limit",
            "round_cylinders",
        ):
            saved["env"].pop(key)
        if preset == "quadruped":
            saved["env"]["torque"] = [40.0]  # what the preset was: torques, cylinders
        check_resume(saved, cfg, refused, tmp_path)


def check_resume(saved: dict, cfg, refused: str | None, tmp_path) -> None:
    """Resume a checkpoint whose config was ``saved`` under ``cfg``: it passes, or it is refused
    naming ``refused`` (a regular expression)."""
    import types

    checkpoint_meta = types.SimpleNamespace(meta={"config": yaml.safe_dump(saved)})
    if refused is None:
        config.check_saved_config(checkpoint_meta, cfg, tmp_path)
    else:
        with pytest.raises(config.ConfigError, match=refused):
            config.check_saved_config(checkpoint_meta, cfg, tmp_path)


@pytest.mark.parametrize(
    ("preset", "refused"),
    [(["+env=hopper", "env.limit_kd_everywhere=false"], None), (["+env=hopper"], "env.limit_kd_everywhere"),
     (["+env=ant", "env.limit_kd_everywhere=false"], None), (["+env=ant"], "env.limit_kd_everywhere"),
     (["+env=humanoid"], "env.limit_kd_everywhere|env.height_scale"),
     (["+env=hopper", "env.limit_kd_everywhere=false", "env.height_scale=10"], "env.height_scale"),
     (["+env=hopper", "env.limit_kd_everywhere=false", "env.height_scale=1"], None),
     (["+env=ant", "env.joint_stiffness=5"], "env.joint_stiffness")],
    ids=["hopper_newton_law", "hopper", "ant_newton_law", "ant", "humanoid", "height_scale", "height_scale_1",
         "joint_stiffness"],
)  # fmt: skip
def test_a_checkpoint_from_before_the_humanoids_fields_resumes_where_they_change_nothing(tmp_path, preset, refused):
    """Checkpoints written before env.joint_stiffness, env.limit_kd_everywhere and env.height_scale
    existed (the Hopper's and the Ant's trainings) resume with their defaults, and not otherwise (the Hopper's
    and the Ant's presets now damp as dflex does: their earlier runs resume with env.limit_kd_everywhere=false)."""
    cfg, _ = config.compose_config("train", preset)
    saved = OmegaConf.to_container(cfg, resolve=True)
    for key in ("joint_stiffness", "limit_kd_everywhere", "height_scale"):
        saved["env"].pop(key)
    check_resume(saved, cfg, refused, tmp_path)


def test_a_position_driven_checkpoint_from_before_drive_limits_is_refused_unless_the_limits_are_off(tmp_path):
    """A position-controlled run written before env.effort_limit and env.velocity_limit existed had
    an unlimited drive: resumed under a limit (the preset's, or a file's through null) it is refused
    in one line naming the key and the value that resumes it as it ran ([inf]); with that it resumes."""
    import types

    for preset in (["+env=quadruped"], ["+env=robot", "env.asset=newton:quadruped.urdf", "env.control=position",
                                        "env.target_ke=[150]"]):  # fmt: skip
        cfg, _ = config.compose_config("train", preset)
        saved = OmegaConf.to_container(cfg, resolve=True)
        saved["env"].pop("effort_limit")
        saved["env"].pop("velocity_limit")
        checkpoint_meta = types.SimpleNamespace(meta={"config": yaml.safe_dump(saved)})
        with pytest.raises(config.ConfigError, match=r"before env.effort_limit existed.*env.effort_limit=\[inf\]"):
            config.check_saved_config(checkpoint_meta, cfg, tmp_path)
        unlimited, _ = config.compose_config("train", [*preset, "env.effort_limit=[inf]", "env.velocity_limit=[inf]"])
        config.check_saved_config(checkpoint_meta, unlimited, tmp_path)


MY_ANT = """\
defaults:
  - robot
  - _self_

asset: newton:nv_ant.xml
actuated: [hip_1, ankle_1, hip_3, ankle_3]
torque: [15.0, 10.0, 15.0, 10.0]
root: torso
observation: [root_height, up, joint_q, joint_qd, previous_action]
observation_scale: {joint_qd: 0.1}
reward: {forward_velocity: 1.0, action_cost: 0.01}
termination_height: 0.2
world_count: 2
horizon: 12
"""


def test_a_robot_yaml_in_the_users_own_folder_trains_with_no_python(tmp_path):
    """docs/envs.md's promise: a YAML of one's own (here four of the Ant's eight joints, its own
    torques, observation pieces and reward terms) in a folder outside the repository trains."""
    (tmp_path / "my_configs" / "env").mkdir(parents=True)
    (tmp_path / "my_configs" / "env" / "my_ant.yaml").write_text(MY_ANT)
    args = ["train", "+env=my_ant", "task=shac", "task.window=3", "task.critic_minibatches=2", "task.critic_epochs=2",
            "iterations=3", "log_every=1", "plot_every=null", "env.settle_time=0", "hydra.run.dir=run"]  # fmt: skip
    proc = run_harness(*args, cwd=tmp_path, env={"HARNESS_CONFIG_PATH": str(tmp_path / "my_configs")})
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env"] == "robot"  # the env class; the file is the preset
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["env"]
    assert saved["actuated"] == ["hip_1", "ankle_1", "hip_3", "ankle_3"] and saved["torque"] == [15.0, 10.0, 15.0, 10.0]
    _, mine = build.check_env_fields(OmegaConf.create({"env": saved}))
    # height, up, the 8 hinges' q and qd (every joint is observed, 4 are actuated), the 4 previous actions
    assert mine.action_dim() == 4 and mine.observation_dim() == 1 + 1 + 8 + 8 + 4


def test_an_ant_too_big_for_the_machine_is_refused_before_anything_is_written(tmp_path):
    """docs/reliability.md's size promise for the robots: the memory estimate refuses, one line."""
    proc = run_harness("train", "+env=ant", "task=shac", "env.world_count=100000", cwd=tmp_path)
    assert_clean_rejection(proc, "env.world_count=100000", "accepted: fewer worlds", tmp_path)
