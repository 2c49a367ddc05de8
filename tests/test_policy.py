"""task=policy: an MLP policy through the cartpole, trained over drawn starts and in windows.

Gradients against finite differences, capture bit for bit (draws and carried windows
included), the draws (reproducible, fresh per episode, the env's own outside training),
windows that continue the episode, resume mid-episode bit for bit, TensorBoard tags, and
the one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envs.cartpole import CartpoleConfig, CartpoleEnv, upright_fraction
from harness.clip import clip_by_global_norm
from harness.gradcheck import check_gradients
from harness.losses import WeightedLoss
from harness.optim import adam
from harness.tasks import Policy, prepare, rollout
from harness.training import Trainer, TrainSettings
from harness.training.step import check_capture
from tests.helpers import UPRIGHT_TERMS, run_harness


def small_policy(**kw) -> Policy:
    kw.setdefault("hidden", [8, 8])
    kw.setdefault("action_scale", 20.0)
    kw.setdefault("init_scale", 1.0)
    return Policy(**kw)


def env_for(task: Policy, **fields) -> CartpoleEnv:
    """The env a training run builds for ``task`` (windows shorten its rollouts)."""
    fields.setdefault("world_count", 2)
    return CartpoleEnv(task.training_config(CartpoleConfig(**fields)), device="cpu")


def trainer(task: Policy, *, iterations: int = 6, capture: bool = True, resume: str | None = None, **fields) -> Trainer:
    return Trainer(
        env=env_for(task, **fields),
        loss=WeightedLoss(UPRIGHT_TERMS),
        optimizer=adam(1e-2),
        clip=clip_by_global_norm(1.0),
        settings=TrainSettings(
            iterations=iterations,
            log_every=3,
            seed=0,
            device="cpu",
            capture=capture,
            checkpoint_every=3,
            resume=resume,
        ),
        task=task,
    )


def test_policy_gradients_match_finite_differences():
    task = small_policy(activation="elu")
    env = env_for(task, horizon=12, world_count=2, tilt=0.1)
    result, params = check_gradients(env, WeightedLoss(UPRIGHT_TERMS), samples=12, seed=1, device="cpu", task=task)
    assert result.passed, result.table(params)


def test_each_step_acts_on_its_own_observation_rows():
    """Every step writes its own rows (backward replays each step's layers from them): after a
    rollout every step's action is the MLP of that step's observation, and the rows differ."""
    task = small_policy()
    env = env_for(task, horizon=6, tilt=0.2)
    loss = WeightedLoss(UPRIGHT_TERMS)
    params = prepare(env, task, loss)
    rollout(env, task, params)
    buffers = task.buffers(env)
    observations = buffers.observations.numpy()
    assert all(not np.array_equal(observations[t], observations[t + 1]) for t in range(5))
    again = wp.zeros((6 * 2, 1), dtype=wp.float32, device="cpu")
    task.mlp(env.config).forward(params, buffers.observations.reshape((12, 6)), again)
    np.testing.assert_array_equal(again.numpy().reshape(6, 2, 1), buffers.actions.numpy())


def test_captured_policy_rollout_matches_eager_bit_for_bit():
    task = small_policy()
    env = env_for(task, horizon=8)
    check_capture(env, WeightedLoss(UPRIGHT_TERMS), task, device="cpu")


def test_captured_training_with_draws_and_windows_matches_eager_bit_for_bit(tmp_path):
    """Fresh draws per episode and carried windows read the device counter: a replayed graph
    trains exactly as eager iterations do."""
    runs = {}
    for capture in (False, True):
        t = trainer(small_policy(window=4), iterations=7, capture=capture, horizon=12)
        t.fit(tmp_path / str(capture))
        assert (t.step.graph is not None) == capture
        runs[capture] = {k: v.numpy() for k, v in t.state.arrays().items()}
    assert "task/joint_q" in runs[True]  # the carried state is part of the training state
    for key, value in runs[False].items():
        np.testing.assert_array_equal(value, runs[True][key], err_msg=key)


def test_draws_are_reproducible_fresh_per_key_and_outside_training_the_env_own():
    task = small_policy()
    env = env_for(task, horizon=4, world_count=5, tilt=0.2, seed=3)
    own = env.initial_state()["joint_q"].numpy().copy()
    key = wp.zeros(1, dtype=wp.int32, device="cpu")
    drawn = []
    for k in (0, 1, 0):
        key.fill_(k)
        env.draw_initial(key)
        drawn.append(env.initial_state()["joint_q"].numpy().reshape(5, 3).copy())
    np.testing.assert_array_equal(drawn[0], drawn[2])  # same seed and key: same states
    assert not np.array_equal(drawn[0], drawn[1])
    assert np.all(drawn[0][:, 0] == 0.0) and np.all(np.abs(drawn[0][:, 1:]) <= 0.2)
    assert len(np.unique(drawn[0][:, 1])) == 5  # every world its own tilt
    env.restore_initial()
    np.testing.assert_array_equal(env.initial_state()["joint_q"].numpy(), own)


def test_draws_spread_the_cart_and_the_rates_when_asked_and_keep_the_tilts():
    task = small_policy()
    key = wp.zeros(1, dtype=wp.int32, device="cpu")
    draws = {}
    for cart, rate in ((0.0, 0.0), (0.5, 0.1)):
        env = env_for(task, horizon=4, world_count=64, tilt=0.2, seed=3, draw_cart=cart, draw_rate=rate)
        own = env.initial_state()["joint_q"].numpy().copy()
        env.draw_initial(key)
        state = env.initial_state()
        draws[cart] = (state["joint_q"].numpy().reshape(64, 3).copy(), state["joint_qd"].numpy().reshape(64, 3).copy())
        env.restore_initial()  # the env's own starts stay tilts only
        np.testing.assert_array_equal(env.initial_state()["joint_q"].numpy(), own)
        assert np.all(own.reshape(64, 3)[:, 0] == 0.0)
    (q0, qd0), (q, qd) = draws[0.0], draws[0.5]
    assert np.all(q0[:, 0] == 0.0) and np.all(qd0 == 0.0)
    np.testing.assert_array_equal(q[:, 1:], q0[:, 1:])  # the same tilts whatever the spreads
    assert np.all(np.abs(q[:, 0]) <= 0.5) and np.ptp(q[:, 0]) > 0.5  # spread over the range
    assert np.all(np.abs(qd) <= 0.1) and np.all(np.ptp(qd, axis=0) > 0.1)


def test_windows_continue_the_episode_and_a_new_episode_starts_fresh():
    """horizon 12, window 4: iterations 1 and 2 start where the previous window ended,
    iteration 3 starts a new episode from a fresh draw."""
    t = trainer(small_policy(window=4), iterations=1, capture=False, horizon=12)
    env, step = t.env, t.step
    assert env.horizon == 4
    starts, ends = [], []
    for it in range(4):
        step.set_iteration(it)
        step.iteration()
        starts.append(env.state(0).joint_q.numpy().copy())
        ends.append(env.state(4).joint_q.numpy().copy())
    np.testing.assert_array_equal(starts[1], ends[0])
    np.testing.assert_array_equal(starts[2], ends[1])
    assert not np.array_equal(starts[3], ends[2])
    assert np.all(starts[3].reshape(2, 3)[:, 0] == 0.0)  # a drawn start: the cart at the centre


@pytest.mark.parametrize("capture", [False, True])
def test_before_carry_from_every_window_starts_fresh_then_windows_carry(capture):
    """horizon 12, window 4, carry_from 4: iterations 0 to 3 each start from a fresh draw
    (the iteration's own), iteration 4 continues where iteration 3 ended, iteration 6 (a
    multiple of the 3 windows per episode) starts fresh again; eager and captured alike."""
    t = trainer(small_policy(window=4, carry_from=4), iterations=1, capture=capture, horizon=12)
    env, step = t.env, t.step
    key = wp.zeros(1, dtype=wp.int32, device="cpu")
    starts, ends, draws = [], [], []
    for it in range(7):
        step.set_iteration(it)
        step.iteration()
        starts.append(env.state(0).joint_q.numpy().copy())
        ends.append(env.state(4).joint_q.numpy().copy())
    for it in range(7):  # what iteration `it` draws, drawn again outside training
        key.fill_(it)
        env.draw_initial(key)
        draws.append(env.initial_state()["joint_q"].numpy().copy())
    env.restore_initial()
    for it in (0, 1, 2, 3, 6):
        np.testing.assert_array_equal(starts[it], draws[it], err_msg=f"iteration {it}")
    np.testing.assert_array_equal(starts[4], ends[3])
    np.testing.assert_array_equal(starts[5], ends[4])
    assert not np.array_equal(starts[4], draws[4])


@pytest.mark.parametrize("capture", [False, True])
def test_a_carried_world_whose_pole_fell_starts_anew_and_the_others_carry_on(capture):
    """env.fall_angle: at a carried window's start, a world whose kept state has a pole beyond
    the angle starts from the iteration's fresh draw; the others continue where they ended."""
    t = trainer(small_policy(window=4), iterations=1, capture=capture, horizon=12, world_count=8, fall_angle=0.1)
    env, step = t.env, t.step
    key = wp.zeros(1, dtype=wp.int32, device="cpu")
    starts, ends = [], []
    for it in range(3):
        step.set_iteration(it)
        step.iteration()
        starts.append(env.state(0).joint_q.numpy().reshape(8, 3).copy())
        ends.append(env.state(4).joint_q.numpy().reshape(8, 3).copy())
    mixed = 0
    for it in (1, 2):  # windows 2 and 3 of the episode carry
        key.fill_(it)
        env.draw_initial(key)
        drawn = env.initial_state()["joint_q"].numpy().reshape(8, 3)
        fell = np.any(np.abs(ends[it - 1][:, 1:]) > 0.1, axis=1)
        np.testing.assert_array_equal(starts[it][fell], drawn[fell])
        np.testing.assert_array_equal(starts[it][~fell], ends[it - 1][~fell])
        mixed += int(fell.any() and not fell.all())
    assert mixed  # both kinds of world were met
    env.restore_initial()
    assert not CartpoleEnv(CartpoleConfig(world_count=2), device="cpu").ended_worlds(wp.zeros(2, dtype=wp.int32))


def test_evaluation_rollouts_start_from_the_env_own_states_and_do_not_disturb_training(tmp_path):
    t = trainer(small_policy(window=4), iterations=2, capture=False, horizon=12)
    env = t.env
    built = env.initial_state()["joint_q"].numpy().copy()
    t.fit(tmp_path / "run")
    carried = env.carried()["joint_q"].numpy().copy()
    t.step.evaluate()
    np.testing.assert_array_equal(env.state(0).joint_q.numpy(), built)
    np.testing.assert_array_equal(env.carried()["joint_q"].numpy(), carried)


@pytest.mark.parametrize("fall_angle", [None, 0.1])
def test_resume_mid_episode_matches_an_uninterrupted_run_bit_for_bit(tmp_path, fall_angle):
    """The checkpoint holds the carried state: 3 iterations, stop, resume to 7 equals 7 in one go
    (window 4 of a 12-step episode: iteration 3 is mid-episode); with env.fall_angle too (which
    worlds start anew is read from the carried state)."""
    whole = trainer(small_policy(window=4), iterations=7, horizon=12, fall_angle=fall_angle)
    whole.fit(tmp_path / "whole")
    first = trainer(small_policy(window=4), iterations=4, horizon=12, fall_angle=fall_angle)
    first.fit(tmp_path / "split")
    resumed = trainer(small_policy(window=4), iterations=7, horizon=12, resume="auto", fall_angle=fall_angle)
    resumed.fit(tmp_path / "split")
    for key, value in whole.state.arrays().items():
        np.testing.assert_array_equal(value.numpy(), resumed.state.arrays()[key].numpy(), err_msg=key)


def test_tensorboard_shows_window_cost_actions_and_per_layer_gradient_norms(tmp_path):
    t = trainer(small_policy(), iterations=3, horizon=6)
    t.fit(tmp_path / "run")
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    scalars, histograms = set(acc.Tags()["scalars"]), set(acc.Tags()["histograms"])
    assert {"policy/window_cost", "policy/action_abs_mean", "policy/saturated_fraction"} <= scalars
    assert {"optim/grad_norm_pre/l1.weight", "optim/grad_norm_pre/out.bias"} <= scalars
    assert "policy/actions" in histograms
    cost = [e.value for e in acc.Scalars("policy/window_cost")]
    total = [e.value for e in acc.Scalars("loss/total")]
    assert cost == total and len(cost) == 3
    actions = acc.Histograms("policy/actions")[-1].histogram_value
    assert actions.num == 6 * 2 and -20.0 <= actions.min <= actions.max <= 20.0


def test_upright_fraction_counts_worlds_upright_over_the_last_quarter():
    q = np.zeros((8, 4, 3))
    q[:, 1, 1] = 0.3  # world 1 tilted throughout
    q[7, 2, 2] = -0.25  # world 2 falls at the end
    q[:5, 3, 1] = 1.0  # world 3 recovers before the last quarter
    assert upright_fraction(q) == 0.5


@pytest.mark.parametrize(
    ("args", "field", "accepted"),
    [
        (["task.window=5"], "task.window", "divisor"),
        (["task.activation=gelu"], "task.activation", "tanh"),
        (["task.hidden=[0]"], "task.hidden", ">= 1"),
        (["task.action_scale=0"], "task.action_scale", "> 0"),
        (["task.carry_from=-1"], "task.carry_from", ">= 0"),
        (["+env=ball"], "task: policy needs an env with the role PolicyEnv", "env 'ball' does not have it"),
        (["task.window=4", "memory.segment_steps=2"], "memory.segment_steps: task.window=4", "task.window=null"),
    ],
    ids=[
        "window",
        "activation",
        "hidden",
        "action_scale",
        "carry_from",
        "env_without_observations",
        "window_with_segments",
    ],
)
def test_bad_policy_settings_are_refused_in_one_line(args, field, accepted):
    """Checked where every command validates its config (tests/test_errors.py covers the
    command line's exit 2 and that nothing is written, for this same ConfigError)."""
    from harness import build, config

    env = [a for a in args if a.startswith("+env=")] or ["+env=cartpole"]
    rest = [a for a in args if not a.startswith("+env=")]
    cfg, choices = config.compose_config("train", [*env, "task=policy", "env.horizon=12", *rest])
    with pytest.raises(config.ConfigError) as caught:
        build.validate(cfg, choices)
    line = str(caught.value)
    assert "\n" not in line and field in line and accepted in line, line


def test_a_bad_policy_setting_stops_the_command_with_exit_2_before_anything_is_written(tmp_path):
    proc = run_harness("train", "+env=cartpole", "task=policy", "task.window=5", "env.horizon=12", cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: task.window: 5 does not divide env.horizon=12")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("segment_steps", [3, 5])
def test_policy_gradients_in_segments_are_the_full_tapes_bit_for_bit(segment_steps):
    """memory.segment_steps with a policy (training mode: drawn starts) gives the full
    tape's gradient exactly."""
    from harness.memory import segmented_forward_backward
    from harness.training.step import taped_rollout, zero_grads

    found = {}
    for steps in (None, segment_steps):
        task = small_policy()
        kw = {} if steps is None else {"segment_steps": steps}
        env = CartpoleEnv(CartpoleConfig(horizon=12, world_count=2), device="cpu", **kw)
        loss = WeightedLoss(UPRIGHT_TERMS)
        params = prepare(env, task, loss, device="cpu")
        key = wp.array([5], dtype=wp.int32, device="cpu")
        zero_grads(env, loss, params, task)
        with task.training(key):
            if steps is None:
                tape, _, total = taped_rollout(env, task, loss, params)
                tape.backward(total)
            else:
                _, _, total = segmented_forward_backward(env, task, loss, params)
        found[steps] = (total.numpy().copy(), params.grad.numpy().copy())
    np.testing.assert_array_equal(found[None][0], found[segment_steps][0])
    np.testing.assert_array_equal(found[None][1], found[segment_steps][1])
    assert np.abs(found[None][1]).max() > 0


def test_task_settings_per_env_apply_under_the_command_line():
    """task/policy.yaml's per_env block sets the cartpole's training settings; a value on
    the command line still wins, and other tasks are untouched."""
    from harness import config

    cfg, _ = config.compose_config("train", ["+env=cartpole", "task=policy"])
    assert (cfg.env.horizon, cfg.task.window, cfg.env.tilt, cfg.env.world_count) == (960, 480, 0.1, 32)
    assert (cfg.iterations, cfg.task.carry_from) == (1200, 300)
    assert "per_env" not in cfg.task  # consumed: the task is built without it
    cfg, _ = config.compose_config("train", ["+env=cartpole", "task=policy", "env.horizon=240", "iterations=7"])
    assert (cfg.env.horizon, cfg.task.window, cfg.env.tilt, cfg.iterations) == (240, 120, 0.1, 7)  # half, still
    cfg, _ = config.compose_config("train", ["+env=cartpole", "task=policy", "task.window=null"])
    assert (cfg.env.horizon, cfg.task.window) == (960, None)
    cfg, _ = config.compose_config("train", ["+env=cartpole"])
    assert (cfg.env.horizon, cfg.env.tilt, cfg.env.world_count, cfg.iterations) == (240, 0.2, 4, 100)


@pytest.mark.slow
def test_a_windowed_policy_run_renders_despite_the_carried_state_in_its_checkpoint(tmp_path):
    """The checkpoint holds the state training carried between windows; render, which rolls
    whole episodes from the env's own starts, loads it without that state."""
    args = ["task.hidden=[8]", "env.horizon=24", "task.window=8", "env.world_count=2", "iterations=3"]
    proc = run_harness("train", "+env=cartpole", "task=policy", *args, "hydra.run.dir=run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_harness("render", "run", "frames=4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "render" / "rollout.png").is_file() and "4 frames" in proc.stdout
