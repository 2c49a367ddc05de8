"""SHAC's cart-pole swing-up (envs/cartpole_swingup.py): the dynamics against the analytic
equations of motion, tape gradients against central differences, capture, observations,
the initial-state draws, SHAC's reward, segments and the command line.

Measured on this project's 2-core CPU: over 60 control steps (240 substeps) from four starts
(free swing, forces clipped at +-1, the cart driven past its soft limit, near upright) Newton
stays within 1e-5 of the float64 analytic solution, about as far as the same equations stepped
in float32 (ratio below 3); the tolerance is 10x the float32 run's distance.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import warp as wp
import yaml

from envs.cartpole_swingup import (
    CART_DOF,
    POLE_DOF,
    POLE_LIMIT,
    UPRIGHT_ANGLE,
    CartpoleSwingupEnv,
    SwingupConfig,
    step_rewards,
    upright_fraction,
    wrap_angle,
)
from harness.config import CONFIG_DIR
from harness.gradcheck import check_gradients
from harness.losses import WeightedLoss
from harness.memory import SegmentGraphs, segmented_forward_backward
from harness.tasks import OpenLoop, Policy, prepare, rollout
from harness.training.step import check_capture, taped_rollout, zero_grads
from tests.helpers import run_harness

LOSS_TERMS = yaml.safe_load((CONFIG_DIR / "loss" / "cartpole_swingup.yaml").read_text())["terms"]

NEAR_UPRIGHT = {"start_angle": 0.0, "angle_offset": 0.3, "position_offset": 0.3}
"""Starts whose pole never passes the bottom within a short horizon: a loss without kinks."""


def analytic_rollout(
    config: SwingupConfig, q0: np.ndarray, qd0: np.ndarray, actions: np.ndarray, dtype: type = np.float64
) -> tuple[np.ndarray, np.ndarray]:
    """The cart-pole's Lagrangian equations of motion with the env's constants, stepped as
    Featherstone steps them (semi-implicit Euler on the joint coordinates, ``substeps`` per
    control step, the mass matrix built every ``mass_matrix_every`` substeps); positions and
    rates after every control step, ``(steps + 1, worlds, 2)``.

    With cart mass M, pole mass m, hinge-to-centre c, centre inertia I, armature a, damping b::

        [M + m + a     m c cos(th)  ] [x'' ]   [F - b x' + m c sin(th) th'^2 + limit(x)]
        [m c cos(th)   I + m c^2 + a] [th'']  = [-b th' + m g c sin(th) + limit(th)     ]
    """
    cast = dtype
    big_m, m, c, inertia = (
        cast(config.cart_mass),
        cast(config.pole_mass),
        cast(config.pole_com),
        cast(config.pole_inertia),
    )
    a, b, ke, g = cast(config.armature), cast(config.joint_damping), cast(config.limit_ke), cast(9.81)
    h = cast(config.dt / config.substeps)
    upper = np.array([config.cart_limit, POLE_LIMIT], dtype)
    q, qd = q0.astype(dtype), qd0.astype(dtype)
    qs, qds = [q], [qd]
    for step_actions in actions:
        force = np.clip(step_actions.astype(dtype), -1.0, 1.0) * cast(config.action_strength)
        for k in range(config.substeps):
            if k % config.mass_matrix_every == 0:
                h00, h01, h11 = big_m + m + a, m * c * np.cos(q[:, POLE_DOF]), inertia + m * c * c + a
            sin = np.sin(q[:, POLE_DOF])
            limit = np.where(q < -upper, ke * (-upper - q), np.where(q > upper, ke * (upper - q), cast(0.0)))
            tau0 = force - b * qd[:, CART_DOF] + m * c * sin * qd[:, POLE_DOF] ** 2 + limit[:, CART_DOF]
            tau1 = -b * qd[:, POLE_DOF] + m * g * c * sin + limit[:, POLE_DOF]
            det = h00 * h11 - h01 * h01
            qdd = np.stack([(h11 * tau0 - h01 * tau1) / det, (h00 * tau1 - h01 * tau0) / det], axis=1).astype(dtype)
            qd = (qd + qdd * h).astype(dtype)
            q = (q + qd * h).astype(dtype)
        qs.append(q)
        qds.append(qd)
    return np.stack(qs), np.stack(qds)


def starts_and_actions(steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four worlds: a free swing from near the bottom, forces beyond +-1 (clipped), a push that
    drives the cart past its soft limit, and a near-upright pole fed small forces."""
    q0 = np.array([[0.3, -math.pi + 0.4], [-1.0, -math.pi - 1.2], [0.5, -2.0], [0.0, 0.1]], np.float32)
    qd0 = np.array([[0.0, 0.2], [0.1, -0.25], [-0.2, 0.0], [0.0, 0.0]], np.float32)
    t = np.arange(steps, dtype=np.float64)
    actions = np.stack([0.0 * t, 1.5 * np.sin(t / 7.0), 1.2 + 0.0 * t, 0.3 * np.cos(t / 5.0)], axis=1)
    return q0, qd0, actions.astype(np.float32)


def newton_rollout(env: CartpoleSwingupEnv, q0, qd0, actions) -> tuple[np.ndarray, np.ndarray]:
    worlds = env.world_count
    env.initial["joint_q"].assign(q0.ravel())
    env.initial["joint_qd"].assign(qd0.ravel())
    device_actions = wp.array(actions[:, :, None], dtype=wp.float32, device="cpu")
    env.reset()
    for t in range(env.horizon):
        env.act(t, device_actions)
        env.step(t)
    qs = [env.state(t).joint_q.numpy().reshape(worlds, 2) for t in range(env.horizon + 1)]
    qds = [env.state(t).joint_qd.numpy().reshape(worlds, 2) for t in range(env.horizon + 1)]
    return np.stack(qs).astype(np.float64), np.stack(qds).astype(np.float64)


@pytest.mark.parametrize("every", [1, 4])
def test_newton_follows_the_analytic_equations_of_motion(every):
    steps = 60
    env = CartpoleSwingupEnv(horizon=steps, world_count=4, device="cpu", mass_matrix_every=every)
    q0, qd0, actions = starts_and_actions(steps)
    newton_q, newton_qd = newton_rollout(env, q0, qd0, actions)
    exact_q, exact_qd = analytic_rollout(env.config, q0, qd0, actions)
    single_q, single_qd = analytic_rollout(env.config, q0, qd0, actions, np.float32)
    assert np.abs(exact_q[:, 2, CART_DOF]).max() > env.config.cart_limit + 1.0  # the limit force acts
    for name, newton, exact, single in (("q", newton_q, exact_q, single_q), ("qd", newton_qd, exact_qd, single_qd)):
        # float32 rounding alone moves the same equations this far: allow 10x that
        tolerance = 10.0 * np.abs(single - exact).max() + 1e-6
        error = np.abs(newton - exact).max()
        assert error <= tolerance, (
            f"{name}: Newton is {error:.2e} from the analytic solution (tolerance {tolerance:.2e})"
        )
        assert tolerance < 1e-4
    # the check tells the mass-matrix schedules apart (they differ by up to about 0.1 rad here)
    other = dataclasses.replace(env.config, mass_matrix_every=5 - every)
    other_q, _ = analytic_rollout(other, q0, qd0, actions)
    assert np.abs(other_q - exact_q).max() > 100.0 * (10.0 * np.abs(single_q - exact_q).max() + 1e-6)


def gradcheck(**fields):
    env = CartpoleSwingupEnv(horizon=60, world_count=2, device="cpu", **{**NEAR_UPRIGHT, **fields})
    result, _ = check_gradients(env, WeightedLoss(LOSS_TERMS), samples=12, tolerance=1e-2, seed=0, device="cpu")
    angles = env.trajectory()["joint_q"].numpy()[:, :, POLE_DOF]
    assert np.abs(angles).max() < 3.0  # far from the wrap at +-pi: the loss is smooth in the actions
    return result


@pytest.mark.parametrize("every", [1, 4])
def test_tape_gradients_match_central_differences(every):
    """60 steps (240 substeps), eps = 0.01 (10 N); measured worst error 8.6e-4 (every=1)."""
    result = gradcheck(mass_matrix_every=every)
    assert result.passed, f"worst relative error {result.worst:.3e}"
    assert (np.abs(result.tape) > 0).all()


def test_gradient_check_fails_when_the_substeps_share_one_scratch_set():
    result = gradcheck(per_step_scratch=False)  # measured: 0.38
    assert not result.passed and result.worst > 5e-2


@pytest.mark.parametrize("task", ["open_loop", "policy"])
def test_captured_rollout_equals_the_eager_one_bit_for_bit(task):
    if task == "policy":  # observations through an MLP, fresh starts drawn on the device
        policy = Policy(hidden=[8, 8], action_scale=1.0, random_starts=True)
        env = CartpoleSwingupEnv(policy.training_config(SwingupConfig(horizon=8, world_count=2)), device="cpu")
        check_capture(env, WeightedLoss(LOSS_TERMS), policy, device="cpu")
    else:
        env = CartpoleSwingupEnv(horizon=8, world_count=2, device="cpu", mass_matrix_every=2)
        check_capture(env, WeightedLoss(LOSS_TERMS), device="cpu")


@pytest.mark.parametrize("name", ["M", "J", "P", "H", "L", "_step", "update_mass_matrix_interval"])
def test_featherstone_still_has_the_attributes_the_env_sets(name):
    """Guards a newton upgrade: the per-substep scratch and the mass-matrix schedule rely on
    these private solver attributes (newton 1.8)."""
    env = CartpoleSwingupEnv(horizon=1, world_count=1, device="cpu")
    assert hasattr(env.solver, name)


def test_observations_and_observables_match_the_state():
    steps, worlds = 5, 3
    env = CartpoleSwingupEnv(horizon=steps, world_count=worlds, device="cpu")
    env.request({"joint_q": "all", "joint_qd": "all", "controls": "all"})
    q0 = np.array([[0.5, -math.pi - 1.2], [-0.3, 2 * math.pi + 0.4], [0.0, -math.pi + 0.1]], np.float32)
    env.initial["joint_q"].assign(q0.ravel())
    actions = np.array([[[1.7], [-0.4], [-3.0]]] * steps, np.float32)
    device_actions = wp.array(actions, dtype=wp.float32, device="cpu")
    out = wp.zeros((worlds, 5), dtype=wp.float32, device="cpu")
    env.reset()
    for t in range(steps):
        env.observe(t, out)
        q = env.state(t).joint_q.numpy().reshape(worlds, 2)
        qd = env.state(t).joint_qd.numpy().reshape(worlds, 2)
        theta = q[:, POLE_DOF]
        expected = np.stack([q[:, 0], qd[:, 0], np.sin(theta), np.cos(theta), qd[:, 1]], axis=1)
        np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-6)
        env.act(t, device_actions)
        env.step(t)
        env.write_observables(t)
    trajectory = env.trajectory()
    for t in range(steps):
        q = env.state(t + 1).joint_q.numpy().reshape(worlds, 2).astype(np.float64)
        qd = env.state(t + 1).joint_qd.numpy().reshape(worlds, 2)
        recorded = trajectory["joint_q"].numpy()[t]
        np.testing.assert_allclose(recorded[:, CART_DOF], q[:, CART_DOF], rtol=0, atol=0)
        np.testing.assert_allclose(recorded[:, POLE_DOF], wrap_angle(q[:, POLE_DOF]), rtol=0, atol=2e-6)
        np.testing.assert_array_equal(trajectory["joint_qd"].numpy()[t], qd)
    assert np.abs(trajectory["joint_q"].numpy()[:, :, POLE_DOF]).max() <= math.pi
    np.testing.assert_array_equal(trajectory["controls"].numpy(), np.clip(actions, -1.0, 1.0))
    # the unwrapped start angles are far outside [-pi, pi]; the observable is not
    assert abs(q0[1, 1]) > 2 * math.pi and abs(trajectory["joint_q"].numpy()[0, 1, POLE_DOF]) < 1.0


def test_the_loss_cost_of_a_step_is_shacs_negative_reward():
    steps, worlds = 6, 4
    env = CartpoleSwingupEnv(horizon=steps, world_count=worlds, device="cpu")
    loss, task = WeightedLoss(LOSS_TERMS), OpenLoop()
    params = prepare(env, task, loss, device="cpu")
    params.data.assign(np.random.default_rng(1).uniform(-1, 1, params.data.shape).astype(np.float32))
    trajectory = rollout(env, task, params)
    cost = wp.zeros((steps, worlds), dtype=wp.float32, device="cpu")
    loss.step_costs(trajectory, cost)
    q, qd = (trajectory[name].numpy().astype(np.float64) for name in ("joint_q", "joint_qd"))
    rewards = step_rewards(q, qd)
    np.testing.assert_allclose(cost.numpy(), -rewards, rtol=1e-5)
    report = env.describe(trajectory)
    assert report["episode_return"] == pytest.approx(rewards.sum(axis=0).mean())
    loss.zero()
    assert float(loss(trajectory).numpy()[0]) == pytest.approx(-rewards.mean(), rel=1e-5)  # steps x worlds


def test_upright_fraction_reads_the_last_quarter():
    q = np.zeros((8, 3, 2))
    q[:, 1, POLE_DOF] = math.pi  # hanging: never upright
    q[:5, 2, POLE_DOF] = 1.0  # upright only from step 5 on: the last quarter (steps 6, 7) is upright
    q[6, 0, POLE_DOF] = UPRIGHT_ANGLE + 1e-3  # one step of the last quarter off
    assert upright_fraction(q) == pytest.approx(1 / 3)


def test_draw_initial_gives_the_documented_distribution_and_is_reproducible():
    worlds = 4096
    cfg = SwingupConfig()
    env = CartpoleSwingupEnv(horizon=1, world_count=worlds, device="cpu")
    built = {name: env.initial[name].numpy().copy() for name in ("joint_q", "joint_qd")}

    def draw(target: CartpoleSwingupEnv, key: int) -> np.ndarray:
        target.draw_initial(wp.array([key], dtype=wp.int32, device="cpu"))
        q = target.initial["joint_q"].numpy().reshape(-1, 2)
        qd = target.initial["joint_qd"].numpy().reshape(-1, 2)
        return np.concatenate([q, qd], axis=1).astype(np.float64)  # x, theta, x_dot, theta_dot

    first = draw(env, 3)
    centres = np.array([0.0, cfg.start_angle, 0.0, 0.0])
    halves = np.array([cfg.position_offset, cfg.angle_offset, cfg.rate_offset, cfg.rate_offset])
    u = (first - centres) / halves  # U(-1, 1) per column, if as documented
    assert np.all(np.abs(u) <= 1.0 + 1e-6)
    n = u.shape[0]
    np.testing.assert_allclose(u.mean(axis=0), 0.0, atol=5 * math.sqrt(1 / 3 / n))  # 5 sigma
    np.testing.assert_allclose(u.var(axis=0), 1 / 3, atol=5 * math.sqrt(4 / 45 / n))
    assert np.all(u.min(axis=0) < -0.99) and np.all(u.max(axis=0) > 0.99)
    assert np.abs(np.corrcoef(u.T) - np.eye(4)).max() < 0.1  # four independent draws

    np.testing.assert_array_equal(draw(env, 3), first)  # the same key draws the same starts
    assert not np.array_equal(draw(env, 4), first)
    twin = CartpoleSwingupEnv(horizon=1, world_count=worlds, device="cpu")
    np.testing.assert_array_equal(draw(twin, 3), first)
    other_seed = CartpoleSwingupEnv(horizon=1, world_count=worlds, device="cpu", seed=1)
    assert not np.array_equal(draw(other_seed, 3), first)

    env.restore_initial()  # the host draw the env was built with
    for name, value in built.items():
        np.testing.assert_array_equal(env.initial[name].numpy(), value)
    host = np.concatenate([built["joint_q"].reshape(-1, 2), built["joint_qd"].reshape(-1, 2)], axis=1)
    assert np.all(np.abs((host - centres) / halves) <= 1.0 + 1e-6)
    assert not np.array_equal(host, first)  # another stream than the device draws
    rebuilt = CartpoleSwingupEnv(horizon=1, world_count=worlds, device="cpu")  # the same seed: the same host draw
    for name, value in built.items():
        np.testing.assert_array_equal(rebuilt.initial[name].numpy(), value)


@pytest.mark.parametrize("task", [OpenLoop(), Policy(hidden=[8])], ids=["open_loop", "policy"])
def test_segments_and_segment_graphs_give_the_full_tapes_gradients_bit_for_bit(task):
    """Eager segments of 3 over 10 steps, and the same replayed twice from the segment graphs
    (the env reads the step from the device: one graph per kind of segment)."""

    def gradients(segment_steps: int | None, graphs: bool = False) -> dict:
        kw = {} if segment_steps is None else {"segment_steps": segment_steps}
        env = CartpoleSwingupEnv(horizon=10, world_count=2, device="cpu", **kw)
        loss = WeightedLoss(LOSS_TERMS)
        params = prepare(env, task, loss, device="cpu")
        params.data.assign(np.random.default_rng(0).uniform(-1.2, 1.2, params.data.shape).astype(np.float32))
        if segment_steps is None:
            tape, trajectory, total = taped_rollout(env, task, loss, params)
            tape.backward(total)
        else:
            zero_grads(env, loss, params, task)
            _, trajectory, total = segmented_forward_backward(env, task, loss, params)
        if graphs:
            segments = SegmentGraphs(env, task, loss, params)
            assert len(segments.graphs) == 6
            for _ in range(2):  # nothing carries over between replays
                zero_grads(env, loss, params, task)
                segments.launch()
            trajectory, total = segments.trajectory, segments.total
        found = {"loss": total.numpy(), "gradient": params.grad.numpy()}
        found.update({name: value.numpy() for name, value in trajectory.items()})
        return {name: np.array(value, copy=True) for name, value in found.items()}

    full = gradients(None)
    assert np.abs(full["gradient"]).max() > 0
    for graphs in (False, True):
        got = gradients(3, graphs)
        assert got.keys() == full.keys()
        for name, value in got.items():
            np.testing.assert_array_equal(value, full[name], err_msg=f"{name} (graphs={graphs})")


def test_train_runs_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_harness(
        "train",
        "+env=cartpole_swingup",
        "iterations=2",
        "env.horizon=16",
        "device=cpu",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2
    before = summary["before_training"]
    assert before["upright_fraction"] == 0.0 and before["episode_return"] < 0
