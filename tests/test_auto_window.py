"""``task.window=auto`` (harness.auto_window): the cuts' marks against a numpy model, no gradient
across a cut on the real cartpole, the rule on a scripted trust and on a linear system whose
trusted horizon is known in closed form (tests/test_diagnose.py), a window moved between captured
iterations equal to eager, a SIGKILLed run resuming bit for bit, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import config
from harness.auto_window import AutoWindow, next_window, windows
from harness.config import DiagnoseSettings
from harness.tasks import TrainQuantities
from harness.tasks import shac_kernels as k
from harness.training import Callback
from tests.helpers import refused_train
from tests.test_checkpoint import (
    assert_killed_run_resumes_bit_for_bit,
    final_checkpoint,
    train,
)
from tests.test_diagnose import WORLDS, linear_loss, make_linear
from tests.test_errors import assert_clean_rejection
from tests.test_robot import check_resume
from tests.test_shac import SMALL, trainer

AUTO = ["task.window=auto", "task.auto.floor=2", "task.auto.ceiling=8", "task.auto.every=2", "diagnose.samples=4"]
"""SHAC's small cartpole with rollouts of 8 steps and gradient windows of 2, 4 or 8."""


def marks(episode_step, cut, ended_at, *, length, gamma):
    """numpy model of the actor's weights: a sub-trajectory ends at an episode's end, a cut or the
    rollout's last step; world ``w`` ends early after step ``ended_at[w]`` (-1: never), valued 0,
    and a new episode starts."""
    steps, worlds = cut.shape
    cw, vw = np.zeros((steps, worlds)), np.zeros((steps, worlds))
    for w in range(worlds):
        discount, since = 1.0, episode_step[w]
        for t in range(steps):
            since += 1
            early = t == ended_at[w]
            done = since % length == 0 or early
            cw[t, w] = discount
            last = done or cut[t, w] or t == steps - 1
            vw[t, w] = 0.0 if early else (gamma * discount if last else 0.0)
            if early:
                since = 0
            discount = 1.0 if (done or cut[t, w]) else discount * gamma
    return cw, vw


def test_cuts_end_the_actors_windows_and_leave_the_critics_returns_whole():
    steps, worlds, gamma, length = 8, 4, 0.9, 6
    window = wp.array([3], dtype=wp.int32)
    cut = wp.zeros((steps, worlds), dtype=wp.int32)
    wp.launch(k.cut_every, dim=(steps, worlds), inputs=[window, steps], outputs=[cut])
    np.testing.assert_array_equal(cut.numpy()[:, 0], [0, 0, 1, 0, 0, 1, 0, 0])  # not after the last step
    done, ends, terminal = (wp.zeros((steps, worlds), dtype=wp.int32) for _ in range(3))
    cost_weight, value_weight = (wp.zeros((steps, worlds), dtype=wp.float32) for _ in range(2))
    episode_step = np.array([0, 4, 1, 0], np.int32)  # world 1's episode reaches its limit after step 1
    wp.launch(k.episode_marks, dim=worlds, inputs=[wp.array(episode_step), length, steps, cut],
              outputs=[done, ends, cost_weight, value_weight, gamma])  # fmt: skip
    # world 3 falls after step 2, where a cut is; world 2 after step 3, between two cuts (in step order)
    ended_at = np.array([-1, -1, 3, 2])
    for t in (2, 3):
        ended = wp.array((ended_at == t).astype(np.int32))
        wp.launch(k.mark_terminations, dim=worlds, inputs=[ended, t, steps, length, gamma, cut],
                  outputs=[done, ends, terminal, cost_weight, value_weight])  # fmt: skip
    cw, vw = marks(episode_step, cut.numpy(), ended_at, length=length, gamma=gamma)
    np.testing.assert_allclose(cost_weight.numpy(), cw, rtol=1e-6)
    np.testing.assert_allclose(value_weight.numpy(), vw, rtol=1e-6)
    assert vw[2, 3] == 0.0 and terminal.numpy()[2, 3] == 1  # a fall at a cut: valued 0, not bootstrapped
    # the critic's returns end where episodes and the rollout end, never at a cut
    e = ends.numpy()
    np.testing.assert_array_equal(e[:, 0], [0, 0, 0, 0, 0, 1, 0, 1])  # world 0: its limit after step 5
    np.testing.assert_array_equal(e[:, 2], [0, 0, 0, 1, 0, 0, 0, 1])
    assert vw[2, 0] > 0 and cw[3, 0] == 1.0  # the cut after step 2 bootstraps and restarts the discount


def test_no_gradient_crosses_a_cut():
    """Only the second window's terms weighted: the state's adjoint before the cut (the per-step
    profile of ``clip.adjoint.profile``, read where it enters each step) is zero with the cut, and
    not without it (the same rollout with the gradient's window the whole rollout)."""
    profiles = {}
    for window in (4, 8):
        t = trainer(*AUTO, "task.auto.floor=4", "capture=false", "env.horizon=50", "env.tilt=0.3",
                    "clip.adjoint.profile=true")  # fmt: skip
        step, task, env = t.step, t.task, t.env
        task.state(env)["window"].fill_(window)

        def objective(trajectory, task=task, env=env, step=step):
            b = task.buffers(env)
            for weights in (b.cost_weight, b.value_weight):
                kept = weights.numpy()
                kept[:4] = 0.0
                weights.assign(kept)
            return task.objective(env, step.loss, trajectory)

        step.forward_backward(objective=objective)
        b = task.buffers(env)
        assert b.cut.numpy()[3].all() == (window == 4) and not b.done.numpy().any()
        profiles[window] = step.adjoint.profile()  # row t: the adjoint of the state after step t
        assert np.abs(t.state.groups["actor"].params.grad.numpy()).max() > 0
    np.testing.assert_array_equal(profiles[4][:4], 0.0)
    assert profiles[8][:4].min() > 0
    assert profiles[4][4:].min() > 0


def test_the_first_piece_of_a_cut_rollout_is_shacs_window_of_that_length():
    """Cut at 4 of 8 steps, only the first piece weighted: the actor's gradient is SHAC's at
    ``task.window=4`` (its value at the cut and that value's gradient included) times 4 / 8, the
    objective's normalisation by the rollout's steps."""
    grads = {}
    for name, overrides in (("cut", [*AUTO, "task.auto.floor=4"]), ("shac", ["task.window=4"])):
        t = trainer(*overrides, "capture=false", "env.horizon=50", "env.tilt=0.3")
        step, task, env = t.step, t.task, t.env
        task._target.data.assign(  # a target critic far from its near-zero start: the bootstrap counts
            (task._target.data.numpy() + 0.3 * np.random.default_rng(0).normal(size=task._target.size)).astype(
                np.float32
            )
        )
        if name == "cut":
            task.state(env)["window"].fill_(4)

        def objective(trajectory, task=task, env=env, step=step, name=name):
            b = task.buffers(env)
            if name == "cut":
                for weights in (b.cost_weight, b.value_weight):
                    kept = weights.numpy()
                    kept[4:] = 0.0
                    weights.assign(kept)
            return task.objective(env, step.loss, trajectory)

        step.forward_backward(objective=objective)
        grads[name] = t.state.groups["actor"].params.grad.numpy().astype(np.float64)
    assert np.abs(grads["shac"]).max() > 0
    np.testing.assert_allclose(grads["cut"], 0.5 * grads["shac"], rtol=1e-5, atol=1e-7 * np.abs(grads["shac"]).max())


def test_the_rule_halves_an_untrusted_window_and_doubles_to_a_trusted_one():
    for trusted_up_to in (1, 8, 16, 64, 1000):
        for first in windows(8, 64):
            n, seen = first, []
            for _ in range(6):
                n, measured = next_window(n, lambda h, top=trusted_up_to: h <= top, floor=8, ceiling=64)
                seen.append(n)
                assert 8 <= n <= 64 and len(measured) <= 2
            settled = min(64, max(8, max((h for h in windows(8, 64) if h <= trusted_up_to), default=8)))
            assert seen[-1] == seen[-2] == settled, (trusted_up_to, first, seen)
    assert next_window(16, lambda h: h <= 16, floor=8, ceiling=64) == (16, [16, 32])
    assert next_window(16, lambda h: False, floor=8, ceiling=64) == (8, [16])
    assert next_window(64, lambda h: True, floor=8, ceiling=64) == (64, [64])


def test_the_measured_rule_settles_at_the_linear_systems_trusted_horizon():
    """tests/test_diagnose.py: batches of 4 starts of ``x' = 2 x`` are trusted up to 16 steps of 32."""
    settings = DiagnoseSettings(samples=WORLDS, zo_pairs=6, fd_directions=2)
    window = wp.array([32], dtype=wp.int32)

    def make(worlds):
        return make_linear, TrainQuantities(), linear_loss()

    auto = AutoWindow(settings, make, floor=2, ceiling=32, every=1, worlds=WORLDS, training_worlds=4, window=window)
    values = auto.probe(2).params.data.numpy()
    path = [32]
    for _ in range(3):
        following, results = auto.decide(values, {}, 1)
        window.fill_(following)
        path.append(following)
    assert path == [32, 16, 16, 16]
    assert [r.trusted for r in results] == [True, False] and [r.steps for r in results] == [16, 32]
    window.fill_(2)
    path = [2]
    for _ in range(4):
        following, _ = auto.decide(values, {}, 1)
        window.fill_(following)
        path.append(following)
    assert path == [2, 4, 8, 16, 16]


class MoveWindow(Callback):
    """Moves the device window between iterations as the rule would."""

    def __init__(self, task, env):
        self.window = task.state(env)["window"]

    def on_iteration(self, loop, iteration):
        self.window.fill_({1: 2, 2: 4, 3: 8}.get(iteration, int(self.window.numpy()[0])))


def test_a_window_moved_between_captured_iterations_is_the_same_as_eager(tmp_path):
    arrays = {}
    for capture in (False, True):
        t = trainer(*AUTO, f"capture={capture}", "iterations=5")
        t.fit(tmp_path / str(capture), callbacks=[MoveWindow(t.task, t.env)])
        arrays[capture] = {key: value.numpy().copy() for key, value in t.state.arrays().items()}
    assert arrays[True]["task/window"][0] == 8
    for key, value in arrays[False].items():
        np.testing.assert_array_equal(value, arrays[True][key], err_msg=key)


def test_a_run_logs_its_window_and_each_measurement(tmp_path):
    run = tmp_path / "run"
    proc = train([*SMALL, *AUTO, "diagnose.snr_min=3", "iterations=6", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "auto window at iteration 2: 8 steps NOT trusted" in proc.stdout and "window 8 -> 4" in proc.stdout
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    # measured after iterations 2 and 4 (every=2), each time not trusted: halved for the next iteration
    assert [e.value for e in acc.Scalars("shac/window")] == [8.0, 8.0, 4.0, 4.0, 2.0, 2.0]
    assert [e.step for e in acc.Scalars("auto_window/8/trusted")] == [2] and "auto_window/4/snr_batch" in acc.Tags()[
        "scalars"
    ]


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_run_resumed_at_a_measuring_iteration_takes_that_measurement(tmp_path):
    """A run that ended at iteration 3 (its checkpoint holds the window before the measurement at 3)
    and is resumed to 6 equals a run of 6: the resumed run measures at 3 first. The schedules decay
    over a fixed number of steps, so that both runs' agree whatever their iterations."""
    args = [*SMALL, *AUTO, "task.auto.every=3", "diagnose.snr_min=3", "schedule.decay_steps=100",
            "task.critic.schedule.decay_steps=100"]  # fmt: skip
    straight = train([*args, "iterations=6", f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    assert straight.returncode == 0, straight.stderr
    assert "auto window at iteration 3: 8 steps NOT trusted" in straight.stdout
    first = train([*args, "iterations=3", f"hydra.run.dir={tmp_path / 'resumed'}"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert "auto window" not in first.stdout  # the last iteration measures nothing
    assert final_checkpoint(tmp_path / "resumed").arrays["task/window"][0] == 8
    resumed = train([*args, "iterations=6", "resume=auto", f"hydra.run.dir={tmp_path / 'resumed'}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "auto window at iteration 3: 8 steps NOT trusted" in resumed.stdout
    a, b = final_checkpoint(tmp_path / "straight"), final_checkpoint(tmp_path / "resumed")
    assert a.iteration == b.iteration == 6 and a.arrays["task/window"][0] == 4
    for key, value in a.arrays.items():
        np.testing.assert_array_equal(value, b.arrays[key], err_msg=key)
    changed = [*args, "iterations=6", "resume=auto", "diagnose.snr_min=2", f"hydra.run.dir={tmp_path / 'resumed'}"]
    changed = train(changed, tmp_path)
    assert changed.returncode != 0 and "diagnose.snr_min=3" in changed.stderr


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_run_killed_with_sigkill_resumes_bit_for_bit_with_its_window(tmp_path):
    """Checkpoints at measuring iterations: the resumed run takes the measurement it missed."""
    args = [*SMALL, *AUTO, "task.auto.every=3", "diagnose.snr_min=3", "iterations=120", "checkpoint.every=3"]
    straight = assert_killed_run_resumes_bit_for_bit(args, tmp_path, iterations=120, kill_after=6)
    assert "window 8 -> 4" in straight.stdout


@pytest.mark.parametrize(
    ("args", "field", "accepted"),
    [
        (["task.window=often"], "task.window", "auto or null"),
        ([*AUTO, "task.auto.ceiling=12"], "task.auto.ceiling", "task.auto.floor (2) times a power of 2"),
        ([*AUTO, "task.auto.floor=16"], "task.auto.ceiling", "times a power of 2"),
        ([*AUTO, "task.auto.floor=8", "task.auto.ceiling=24"], "task.auto.ceiling", "task.auto.floor (8) times"),
        ([*AUTO, "task.auto.every=0"], "task.auto.every", ">= 1"),
    ],
    ids=["window", "ceiling", "floor_above_ceiling", "not_a_power_of_2", "every"],
)
def test_bad_auto_window_settings_are_refused_in_one_line(request, tmp_path, args, field, accepted):
    proc = refused_train(request, [*SMALL, *args, "iterations=1"], tmp_path)
    assert_clean_rejection(proc, field, accepted, tmp_path)


@pytest.mark.parametrize(("window", "refused"), [("32", None), ("auto", "task.auto")])
def test_a_shac_checkpoint_from_before_auto_resumes_with_its_window_fixed(tmp_path, window, refused):
    """Written before task.auto existed, a SHAC run resumes with a fixed window, not under auto."""
    cfg, _ = config.compose_config("train", ["+env=hopper", "task=shac", f"task.window={window}"])
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["task"].pop("auto")
    saved["task"]["window"] = 32
    check_resume(saved, cfg, refused, tmp_path)
