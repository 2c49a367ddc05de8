"""``env.recenter``: after every control step each world's floating base moves back toward the origin
by whole multiples of the setting, and every position a run reports, observes or renders adds the
offset back. On the real Ant: two worlds 32 m apart become the same world bit for bit (without it
they are not: float32 far out); moves at every step change the loss, the gradient and the reported
path by rounding only; the tape agrees with central differences and a captured rollout with the
eager one while worlds move; a render and ``evaluate``'s figures see the absolute positions; the
offsets are carried and checkpointed, and a checkpoint from before the field resumes with it on.
The Humanoid's preset has it; a robot without a floating base refuses it in one line."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from omegaconf import OmegaConf

from harness import build, config
from harness.gradcheck import check_gradients
from harness.losses import WeightedLoss
from harness.tasks import OpenLoop, rollout
from harness.training.step import check_capture, zero_grads
from harness.video import sample_frames
from tests.test_checkpoint import assert_killed_run_resumes_bit_for_bit, final_checkpoint, train
from tests.test_errors import assert_clean_rejection
from tests.test_robot import QUICK, check_resume

REWARD = {"reward": {"source": "reward", "kind": "reward"}}
HORIZON = 5
FINE = 2.0**-12  # a grid small enough that the Ant's worlds move at every step of a short rollout


def open_loop(*overrides: str):
    """Two Ant worlds under open-loop actions (one set per world), ``HORIZON`` steps."""
    cfg, choices = config.compose_config(
        "train",
        ["+env=ant", "env.world_count=2", f"env.horizon={HORIZON}", "capture=false", "plot_every=null", *QUICK,
         *overrides],
    )  # fmt: skip
    return build.build_run(cfg, choices).trainer()


def place(env, x: tuple[float, float]) -> None:
    """Both worlds start from world 0's start (position, joints, speeds), their roots at ``x``."""
    q = env.initial["joint_q"].numpy().reshape(2, -1)
    qd = env.initial["joint_qd"].numpy().reshape(2, -1)
    q[1], qd[1] = q[0], qd[0]
    q[:, 0] = x
    env.initial["joint_q"].assign(q.ravel())
    env.initial["joint_qd"].assign(qd.ravel())


def taped(*overrides: str, x: tuple[float, float], loss: WeightedLoss | None = None):
    """The actions' gradient ``(steps, worlds, actions)``, the trajectory (host copies) and the env,
    both worlds' actions the same (``loss``: the run's, the reward, by default)."""
    t = open_loop(*overrides)
    env, params = t.env, t.params
    if loss is None:
        loss = t.step.loss
    else:
        loss.bind(env.observables, device=env.device)
    place(env, x)
    actions = params.data.numpy().reshape(HORIZON, 2, -1)
    actions[:, 0] = actions[:, 1] = np.random.default_rng(0).uniform(-1, 1, actions[:, 0].shape)
    params.data.assign(actions.reshape(params.data.shape))
    zero_grads(env, loss, params, t.task)
    tape = wp.Tape()
    with tape:
        trajectory = rollout(env, t.task, params)
        total = loss(trajectory)
    tape.backward(total)
    grad = params.grad.numpy().reshape(HORIZON, 2, -1).copy()
    return grad, {name: array.numpy().copy() for name, array in trajectory.items()}, env


def test_two_worlds_32_m_apart_are_one_world_with_recenter_and_two_without():
    x = (0.25, 32.25)  # both exact in float32
    grad, path, env = taped("env.recenter=1", x=x)
    np.testing.assert_array_equal(grad[:, 0], grad[:, 1])
    assert np.abs(grad).max() > 0
    np.testing.assert_array_equal(path["reward"][:, 0], path["reward"][:, 1])
    for name in ("joint_q", "joint_qd", "body_q", "body_qd"):
        final = getattr(env.state(HORIZON), name).numpy().reshape(2, -1)
        np.testing.assert_array_equal(final[0], final[1], err_msg=name)
    np.testing.assert_array_equal(env.state(HORIZON).root_offset.numpy().reshape(2, 3), [[0, 0, 0], [32, 0, 0]])
    # the reported path is each world's own: 32 m apart (to float32's rounding at 32 m)
    position = path["root_position"]
    np.testing.assert_allclose(position[:, 1, 0] - position[:, 0, 0], 32.0, atol=4e-6)
    np.testing.assert_array_equal(position[:, 1, 1:], position[:, 0, 1:])
    # without it the far world rounds differently: another loss and another gradient
    far, far_path, _ = taped(x=x)
    assert not np.array_equal(far[:, 0], far[:, 1])
    assert not np.array_equal(far_path["reward"][:, 0], far_path["reward"][:, 1])
    np.testing.assert_array_equal(far[:, 0], grad[:, 0])  # the near world is the same either way


def test_moves_at_every_step_change_the_loss_the_gradient_and_the_path_by_rounding_only():
    x = (0.25, 0.5)
    moved, moved_path, env = taped(f"env.recenter={FINE}", x=x)
    plain, plain_path, _ = taped(x=x)
    offsets = env.state(HORIZON).root_offset.numpy().reshape(2, 3)
    assert (np.abs(offsets[:, :2]) > 0).all() and (offsets[:, 2] == 0).all()  # moved along x and y, never up
    moves = [env.state(k + 1).root_offset.numpy() - env.state(k).root_offset.numpy() for k in range(HORIZON)]
    assert sum(bool(m.any()) for m in moves) >= HORIZON - 1  # the taped kernel moved them, step after step
    final_x = env.state(HORIZON).joint_q.numpy().reshape(2, -1)[:, 0]
    assert (np.abs(final_x) <= FINE / 2).all()  # each world ends within half a grid of the origin
    np.testing.assert_allclose(moved_path["root_position"], plain_path["root_position"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(moved_path["reward"], plain_path["reward"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(moved, plain, rtol=0, atol=1e-4 * np.abs(plain).max())
    assert np.abs(plain).max() > 0


def test_a_loss_on_the_reported_position_differentiates_the_simulated_one_only():
    """The offset a position adds carries no gradient: the actions' gradient of a loss on the
    ``root_position`` observable is the one without recentring (to rounding), and no State's offset
    holds an adjoint (SHAC's cut and adjoint clipping read the state's adjoint norms): none reaches
    the initial state's."""
    loss = WeightedLoss({"position": {"source": "root_position"}})
    moved, _, env = taped(f"env.recenter={FINE}", x=(0.25, 0.5), loss=loss)
    plain, _, _ = taped(x=(0.25, 0.5), loss=loss)
    np.testing.assert_allclose(moved, plain, rtol=0, atol=1e-4 * np.abs(plain).max())
    assert np.abs(plain).max() > 0
    # (an offset's adjoint would reach the initial state's through the moves and the reset's copy)
    assert not env.initial["root_offset"].grad.numpy().any()
    assert env.initial["joint_q"].grad.numpy().any()


def test_the_tape_matches_central_differences_while_the_worlds_move():
    cfg, _ = config.compose_config(
        "gradcheck", ["+env=ant", "device=cpu", "env.world_count=1", "env.horizon=8", f"env.recenter={FINE}", *QUICK]
    )  # fmt: skip
    env = build.build_env(cfg, "cpu", None, None)
    result, _ = check_gradients(
        env, WeightedLoss(REWARD), samples=8, tolerance=env.config.gradcheck_tolerance(), seed=0, device="cpu",
        task=OpenLoop(init_noise=0.5, seed=0), eps=cfg.gradcheck.eps,
    )  # fmt: skip
    assert not np.array_equal(env.state(8).root_offset.numpy(), env.state(0).root_offset.numpy())  # moved on the way
    assert result.passed, result.table


def test_a_captured_rollout_equals_the_eager_one_while_the_worlds_move():
    cfg, _ = config.compose_config(
        "train", ["+env=ant", "device=cpu", "env.world_count=2", "env.horizon=3", f"env.recenter={FINE}", *QUICK]
    )
    env = build.build_env(cfg, "cpu", None, None)
    place(env, (10.25, -3.5))
    check_capture(env, WeightedLoss(REWARD), OpenLoop(init_noise=0.5), device="cpu")
    assert np.abs(env.state(0).root_offset.numpy()).max() == 10.25  # moved at the reset
    assert not np.array_equal(env.state(3).root_offset.numpy(), env.state(0).root_offset.numpy())  # and on


def test_a_render_and_evaluations_figures_see_where_the_worlds_are():
    """An untaped rollout (evaluate's: two States in turn): the frames' root bodies and the reported
    path are where the worlds are, and the figures are those without recentring."""
    figures = {}
    for recenter in (FINE, 0.0):
        cfg, choices = config.compose_config(
            "train",
            ["+env=ant", "device=cpu", "env.world_count=2", f"env.horizon={HORIZON}", "env.per_step_states=false",
             f"env.recenter={recenter}", "capture=false", "plot_every=null", *QUICK],
        )  # fmt: skip
        t = build.build_run(cfg, choices).trainer()
        env = t.env
        place(env, (0.25, 0.5))
        frames, trajectory = sample_frames(env, t.task, t.params, list(range(HORIZON + 1)))
        root = frames.body_q[:, env.layout.root_body :: env.layout.body_count, :3]
        path = trajectory["root_position"].numpy()
        np.testing.assert_allclose(root[1:], path, rtol=0, atol=1e-6)  # frame k is the state after step k - 1
        np.testing.assert_allclose(root[0, :, 0], [0.25, 0.5], atol=1e-6)
        figures[recenter] = env.describe(trajectory)
        if recenter:
            assert np.abs(env.state(HORIZON).root_offset.numpy()).max() > 0
    for name in ("forward_speed", "episode_return", "fall_fraction"):
        assert figures[FINE][name] == pytest.approx(figures[0.0][name], rel=1e-5, abs=1e-6), name


SHAC_RUN = ["+env=ant", "task=shac", "env.world_count=2", "task.window=3", "task.critic_minibatches=2",
            "task.critic_epochs=1", "task.actor.hidden=[8]", "task.critic.hidden=[8]", "log_every=1",
            "plot_every=null", "env.horizon=30", f"env.recenter={FINE}", *QUICK]  # fmt: skip


def test_shac_carries_each_worlds_offset_into_its_checkpoint(tmp_path):
    proc = train([*SHAC_RUN, "iterations=8", "hydra.run.dir=run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    saved = final_checkpoint(tmp_path / "run").arrays
    offsets = saved["task/carried/root_offset"].reshape(2, 3)
    assert np.abs(offsets[:, :2]).max() > 0 and not offsets[:, 2].any()  # moved along the ground only
    # the carried state is near the origin and its offset holds the rest
    q = saved["task/carried/joint_q"].reshape(2, -1)
    assert (np.abs(q[:, :2]) <= FINE / 2).all()


@pytest.mark.slow  # three runs (make test-slow runs it)
def test_a_sigkilled_run_with_recenter_resumes_bit_for_bit(tmp_path):
    assert_killed_run_resumes_bit_for_bit(
        [*SHAC_RUN, "iterations=40", "checkpoint.every=5"], tmp_path, iterations=40, kill_after=10
    )


def test_a_checkpoint_from_before_recenter_resumes_with_it_on(tmp_path):
    cfg, _ = config.compose_config("train", ["+env=humanoid", "task=shac"])
    assert cfg.env.recenter == 1.0  # the Humanoid's preset moves its worlds by whole metres
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["env"].pop("recenter")
    check_resume(saved, cfg, None, tmp_path)
    # its arrays lack the carried offsets: they load as 0 (nothing moved yet); any other gap is refused
    tasks = {"task/carried/root_offset": ["task=shac", "task.window=3", "task.critic_minibatches=2"],
             "task/root_offset": ["task=policy", "task.window=3", "env.horizon=6"]}  # fmt: skip
    for key, task in tasks.items():
        run, choices = config.compose_config(
            "train", ["+env=ant", *task, "env.world_count=2", "env.recenter=1", "env.settle_time=0"]
        )
        state = build.build_run(run, choices).trainer().step.state
        arrays = state.to_numpy()
        assert key in arrays
        old = {name: value for name, value in arrays.items() if name != key}
        state.load(old)
        assert not state.arrays()[key].numpy().any()
        other = next(name for name in old if name.startswith("task/") and name != key)
        with pytest.raises(ValueError, match=other):
            state.load({name: value for name, value in old.items() if name != other})


def test_a_robot_without_a_floating_base_refuses_recenter_in_one_line(tmp_path):
    proc = train(["+env=hopper", "env.recenter=1", "iterations=1", "env.settle_time=0"], tmp_path)
    assert_clean_rejection(proc, "env.recenter", "accepted: 0", tmp_path)


@pytest.mark.parametrize(
    ("value", "accepted"), [("-1", ">= 0"), ("0.3", "a whole number of metres, or a power of two")],
    ids=["negative", "inexact"],
)  # fmt: skip
def test_a_bad_recenter_is_refused_in_one_line(tmp_path, value, accepted):
    proc = train(["+env=ant", f"env.recenter={value}", "iterations=1"], tmp_path)
    assert_clean_rejection(proc, "env.recenter", accepted, tmp_path)


def test_a_second_floating_body_is_refused():
    """A world with another floating body: recentring the root alone would move it against the rest."""
    import newton

    from envs.robot.layout import _recenter_blocker

    builder = newton.ModelBuilder()
    for _ in range(2):
        body = builder.add_body()
        builder.add_shape_sphere(body, radius=0.1)
    free = [j for j, kind in enumerate(builder.joint_type) if int(kind) == int(newton.JointType.FREE)]
    assert len(free) == 2
    assert "2 floating bodies" in _recenter_blocker(builder, free[0], True, free)
    assert "no floating base" in _recenter_blocker(builder, None, False, [])
