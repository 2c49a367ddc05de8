"""The training loop on the real Newton cartpole: gradients, learning, TensorBoard output."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
import warp as wp
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness.training import FIXED_COLUMNS
from harness.training.callbacks import iteration_series
from harness.training.loop import Callback
from harness.transform import Shared
from tests.helpers import DEVICES, exact_on, make_trainer


def every_gradient(trainer) -> dict[str, np.ndarray]:
    """Host copies of every gradient buffer reachable from the env: model, solver, states, controls."""
    env = trainer.env
    owners = {"model": env.model, "solver": env.solver, **{f"state{i}": s for i, s in enumerate(env.states)}}
    found = {}
    for owner_name, owner in owners.items():
        for name, value in vars(owner).items():
            if isinstance(value, wp.array) and value.grad is not None:
                found[f"{owner_name}.{name}"] = value.grad.numpy().copy()
    found["joint_f"] = env.joint_f.grad.numpy().copy()
    return found


@pytest.mark.parametrize("device", DEVICES)
def test_two_iterations_from_identical_parameters_give_bit_identical_gradients(device):
    """Bit for bit where runs are reproducible (exact_on); on CUDA without determinism the
    float atomics may sum in another order, so there within 1e-5 (accumulation would be 2x)."""
    same = np.testing.assert_array_equal if exact_on(device) else _close
    trainer = make_trainer(horizon=40, device=device)
    trainer.step.forward_backward()
    first = trainer.params.grad.numpy().copy()
    everywhere = every_gradient(trainer)
    assert np.abs(first).max() > 0.0
    # Same parameters again: every buffer must have been reset, nothing may accumulate.
    trainer.step.forward_backward()
    second = trainer.params.grad.numpy()
    same(first, second)
    for name, grad in every_gradient(trainer).items():  # model and solver arrays included
        same(grad, everywhere[name], err_msg=name)


def _close(actual, desired, err_msg=""):
    np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-12, err_msg=err_msg)


def test_gradients_accumulate_without_the_trainers_zeroing(monkeypatch):
    """The failure the zeroing prevents: skipping it makes the second gradient differ."""
    trainer = make_trainer(horizon=40)
    trainer.step.forward_backward()
    first = trainer.params.grad.numpy().copy()
    monkeypatch.setattr("harness.training.step.zero_grads", lambda *args: None)
    trainer.step.forward_backward()
    assert not np.array_equal(first, trainer.params.grad.numpy())


def test_optimizer_step_does_not_touch_the_gradient_buffer():
    trainer = make_trainer(horizon=20)
    trainer.step.forward_backward()
    trainer.step.stats_pre.compute(trainer.params.grad)
    trainer.state.primary.rule.clip.update(trainer.params, trainer.state.clip, Shared(trainer.step.stats_pre))
    clipped = trainer.params.grad.numpy().copy()
    before = trainer.params.data.numpy().copy()
    trainer.state.primary.rule.optimizer.step(trainer.params, trainer.params.grad, trainer.state.optim)
    np.testing.assert_array_equal(trainer.params.grad.numpy(), clipped)
    assert not np.array_equal(trainer.params.data.numpy(), before)


def test_pre_clip_norm_is_measured_before_clipping_and_post_clip_after():
    max_norm = 1e-5  # well below this rollout's gradient norm, so the clip is active
    trainer = make_trainer(horizon=30, iterations=1, log_every=1, max_norm=max_norm)
    trainer.step.forward_backward()
    raw = np.linalg.norm(trainer.params.grad.numpy().astype(np.float64))
    assert raw > 10 * max_norm
    trainer.step.run()
    row = dict(zip(trainer.step.columns, trainer.step.history.numpy()[0], strict=True))
    assert row["optim/grad_norm_pre"] == pytest.approx(raw, rel=1e-5)
    coef = max_norm / (raw + 1e-6)  # clip_grad_norm_'s rule, with its 1e-6
    assert row["optim/clip_coef"] == pytest.approx(coef, rel=1e-5)
    assert row["optim/grad_norm_post"] == pytest.approx(raw * coef, rel=1e-5)
    assert row["optim/clipped"] == 1.0


def test_short_training_run_lowers_the_loss_and_logs_every_tag(tmp_path):
    iterations, log_every = 12, 4
    trainer = make_trainer(horizon=90, world_count=2, iterations=iterations, log_every=log_every)
    summary = trainer.fit(tmp_path)

    assert summary["final_loss"] < 0.8 * summary["initial_loss"]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in ("final_loss", "best_loss", "iterations", "wall_time_s", "clipped_steps", "nonfinite_steps"):
        assert key in on_disk
    assert on_disk["iterations"] == iterations

    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    per_iteration = [
        *FIXED_COLUMNS,
        "optim/lr",
        "optim/lr_scale",
        "optim/clip_threshold",
        "loss/pose",
        "loss/velocity",
        "loss/effort",
        "optim/grad_norm_pre/controls",
    ]
    for tag in per_iteration:
        assert tag in tags["scalars"], tag
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps == list(range(1, iterations + 1)), tag  # TensorBoard counts iterations from 1, as the console
    log_steps = list(range(log_every, iterations + 1, log_every))
    for tag in ("perf/iter_ms", "perf/env_steps_per_s", "optim/param_norm", "optim/update_ratio"):
        assert [e.step for e in acc.Scalars(tag)] == log_steps, tag
    assert [e.step for e in acc.Histograms("optim/grad_hist/controls")] == log_steps

    # The logged loss curve is the loss the trainer saw, iteration by iteration.
    losses = [e.value for e in acc.Scalars("loss/total")]
    assert losses[0] == pytest.approx(summary["initial_loss"])
    assert losses[-1] < losses[0]
    assert summary["best_loss"] == pytest.approx(min([*losses, summary["final_loss"]]))
    # Per-parameter norm of the only parameter equals the global pre-clip norm.
    glob = [e.value for e in acc.Scalars("optim/grad_norm_pre")]
    per = [e.value for e in acc.Scalars("optim/grad_norm_pre/controls")]
    np.testing.assert_allclose(per, glob, rtol=1e-6)
    # The running curves: the best loss so far and the share of clipped iterations so far.
    np.testing.assert_allclose([e.value for e in acc.Scalars("loss/best")], np.minimum.accumulate(losses))
    clipped = np.cumsum([e.value for e in acc.Scalars("optim/clipped")])
    np.testing.assert_allclose(
        [e.value for e in acc.Scalars("optim/clipped_fraction")], clipped / np.arange(1, iterations + 1)
    )
    # TensorBoard's Time Series groups tags by their first path segment, orders the groups
    # by name and opens the first two: the loss first, then the gradient and clip curves.
    groups = sorted({tag.split("/", 1)[0] for kind in ("scalars", "histograms", "images") for tag in tags[kind]})
    assert groups[:2] == ["loss", "optim"], groups
    assert "loss/rollout" not in tags["images"]  # plot_every=None: no rollout images


class Busy(Callback):
    """Spends ``seconds`` of host time after every iteration, as an episode evaluation does;
    reports it with ``Loop.set_aside`` when ``aside``."""

    def __init__(self, seconds: float, aside: bool):
        self.seconds, self.aside = seconds, aside

    def on_iteration(self, loop, iteration):
        start = loop.clock()
        while loop.clock() - start < self.seconds:
            pass
        if self.aside:
            loop.set_aside(loop.clock() - start)


def test_time_a_callback_sets_aside_is_left_out_of_perf_iter_ms_but_kept_in_the_summary(tmp_path):
    """A short run evaluating whole episodes at every log step once read the evaluation as the
    iteration's cost (the Ant's 9 s iteration as 30 s): what a callback sets aside is not an
    iteration. Without set_aside the same busy time shows in perf/iter_ms (the control)."""
    busy, iterations, log_every = 0.25, 6, 2
    found = {}
    for aside in (False, True):
        trainer = make_trainer(horizon=30, world_count=2, iterations=iterations, log_every=log_every)
        summary = trainer.fit(tmp_path / str(aside), callbacks=[Busy(busy, aside)])
        acc = EventAccumulator(str(tmp_path / str(aside)), size_guidance={"scalars": 0})
        acc.Reload()
        found[aside] = [e.value for e in acc.Scalars("perf/iter_ms")], summary
    shown, summary = found[False]
    # every interval after the first held the busy time of each of its iterations (the first one's
    # read-back comes before its second iteration's busy time)
    assert min(shown[1:]) >= 1e3 * busy, shown
    assert summary["timing_s"]["aside"] == 0.0
    kept, summary = found[True]
    assert max(kept[1:]) < 0.4 * 1e3 * busy, kept  # the intervals after the warm-up: the iterations alone
    assert iterations * busy <= summary["timing_s"]["aside"] < iterations * busy + 0.5
    assert summary["wall_time_s"] >= iterations * busy  # the run's wall time keeps it


def test_the_time_set_aside_is_checkpointed_and_a_resumed_run_adds_to_it(tmp_path):
    """``timing_s.aside`` covers the whole run, as ``wall_time_s`` does: a run of 4 resumed to 6
    reports what the first process set aside (iterations 1 to 4: its last checkpoint is written
    at the end) and what the second did (5 and 6); the second's alone would be a third of it."""
    busy = 0.1
    first = make_trainer(horizon=30, world_count=2, iterations=4, log_every=2)
    first.fit(tmp_path, callbacks=[Busy(busy, aside=True)])
    second = make_trainer(horizon=30, world_count=2, iterations=6, log_every=2)
    second.settings = dataclasses.replace(second.settings, resume="auto")
    summary = second.fit(tmp_path, callbacks=[Busy(busy, aside=True)])
    assert summary["iterations_done"] == 6
    assert 6 * busy <= summary["timing_s"]["aside"] < 7 * busy


def test_rollout_plot_is_a_tensorboard_image_at_the_first_log_step_every_n_iterations_and_the_end(tmp_path):
    trainer = make_trainer(horizon=20, world_count=2, iterations=11, log_every=2, plot_every=4)
    trainer.fit(tmp_path)
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    acc.Reload()
    images = acc.Images("loss/rollout")
    assert [e.step for e in images] == [2, 4, 8, 11]
    for event in images:
        pixels = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)))
        assert pixels.shape[:2] == (event.height, event.width) and event.width > 500
    first, last = (np.asarray(Image.open(io.BytesIO(e.encoded_image_string))) for e in (images[0], images[-1]))
    assert not np.array_equal(first, last)  # the solid curves moved with training


def test_a_slow_rollout_plot_lets_the_loop_run_one_image_ahead_and_drops_none(tmp_path, monkeypatch):
    """Each image takes longer to draw than the iterations between log steps: the loop goes on
    past a log step with one image drawing and one waiting, never more, and every image is
    written, in order."""
    import time

    from harness.training import callbacks

    draw, waiting = callbacks.RolloutPlotLog._draw, []

    def slow_draw(self, done, *args):
        time.sleep(0.2)
        draw(self, done, *args)

    on_log = callbacks.RolloutPlotLog.on_log

    def counting_on_log(self, loop, iteration, values):
        on_log(self, loop, iteration, values)
        waiting.append(sum(not f.done() for f in self._pending))

    monkeypatch.setattr(callbacks.RolloutPlotLog, "_draw", slow_draw)
    monkeypatch.setattr(callbacks.RolloutPlotLog, "on_log", counting_on_log)
    trainer = make_trainer(horizon=20, world_count=2, iterations=5, log_every=1, plot_every=1)
    trainer.fit(tmp_path)
    assert max(waiting) == 2  # one drawn while one more waited: the loop ran ahead
    assert len(waiting) == 5
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    acc.Reload()
    assert [e.step for e in acc.Images("loss/rollout")] == [1, 2, 3, 4, 5]


def test_rollout_series_are_those_the_iteration_started_from():
    """The cartpole's `controls` observable is the action parameters themselves, already
    updated after an iteration; the plotted series take them from before the update, with
    the rollout the iteration ran."""
    trainer = make_trainer(horizon=20, world_count=2, iterations=1, log_every=1)
    step = trainer.step
    step.run()
    series = iteration_series(step)
    assert set(series) == {"joint_q", "joint_qd", "controls"}
    np.testing.assert_array_equal(series["controls"], np.zeros((20, 2, 1), np.float32))  # OpenLoop's init
    assert np.abs(step.trajectory["controls"].numpy()).max() > 0  # the live view holds the updated actions
    np.testing.assert_array_equal(series["joint_q"], step.trajectory["joint_q"].numpy())
