"""The clip, optimizer and schedule features as the trainer runs them on the real cartpole,
read back from the TensorBoard files with TensorBoard's own reader."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import checkpoint
from harness.clip import clip_by_global_norm, no_clip, skip_if_nonfinite
from harness.optim import adamw_schedulefree, sgd
from harness.schedules import constant, linear_warmup
from harness.tasks import rollout
from harness.training import Trainer
from tests.helpers import make_trainer

trainer = functools.partial(make_trainer, world_count=1, iterations=6, log_every=3)
"""One world, six iterations, a log read-back every third."""


def read(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    return acc


def values(acc: EventAccumulator, tag: str) -> list[float]:
    return [e.value for e in acc.Scalars(tag)]


FINAL = {
    "final_pose": {"source": "joint_q", "steps": "last"},
    "final_velocity": {"source": "joint_qd", "steps": "last"},
}


def test_adjoint_profile_is_logged_as_histogram_image_and_scalars_at_log_steps(tmp_path):
    t = trainer(horizon=60, clip=clip_by_global_norm(1.0), adjoint={"max_norm": 1e-3}, loss_terms=FINAL)
    t.fit(tmp_path)
    acc = read(tmp_path)
    assert [e.step for e in acc.Histograms("through_time/log10_norm_pre")] == [3, 6]
    images = acc.Images("through_time/profile")
    assert [e.step for e in images] == [3, 6]
    assert images[0].width > 200 and images[0].height > 100 and images[0].encoded_image_string[:4] == b"\x89PNG"
    assert [e.step for e in acc.Scalars("through_time/norm_max")] == [3, 6]
    # The threshold is far below this rollout's adjoint norms, so the clip acts at most steps.
    assert values(acc, "through_time/clipped_fraction")[-1] > 0.5
    assert t.step.timing["adjoint_clip"] > 0


@pytest.mark.parametrize(("max_norm", "expected"), [(1e-3, 1.0), (1e6, 0.0)])
def test_iterations_whose_adjoint_was_clipped_are_counted(tmp_path, max_norm, expected):
    """`through_time/clipped` is 1 in every iteration whose backward rescaled any step's adjoint
    (a threshold far below this rollout's adjoint norms) and 0 when none was (far above);
    summary.json counts them apart from the global clip's `clipped_steps`."""
    t = trainer(horizon=60, clip=clip_by_global_norm(1e9), adjoint={"max_norm": max_norm}, loss_terms=FINAL)
    summary = t.fit(tmp_path)
    assert values(read(tmp_path), "through_time/clipped") == [expected] * 6
    assert summary["adjoint_clipped_steps"] == int(6 * expected)
    assert summary["clipped_steps"] == 0


def test_summary_records_the_device_and_the_versions(tmp_path):
    import warp as wp

    summary = trainer(horizon=10).fit(tmp_path)
    assert summary["device"] == "cpu"
    assert summary["versions"]["warp-lang"] == wp.config.version
    assert set(summary["versions"]) == {"python", "harness", "warp-lang", "newton", "numpy"}
    assert (
        "max_abs_pole_angle_rad" in summary["before_training"] and "max_abs_pole_angle_rad" in summary["after_training"]
    )


def test_infinite_adjoint_threshold_gives_the_unclipped_gradient_bit_for_bit():
    plain = trainer(horizon=120, loss_terms=FINAL)
    plain.step.forward_backward()
    measured = trainer(horizon=120, loss_terms=FINAL, clip=clip_by_global_norm(1.0), adjoint={"max_norm": float("inf")})
    measured.step.forward_backward()
    np.testing.assert_array_equal(plain.params.grad.numpy(), measured.params.grad.numpy())
    assert measured.step.adjoint.profile().max() > 0  # it did measure


def test_adjoint_clip_bounds_the_gradient_the_loop_sees():
    plain = trainer(horizon=400, loss_terms=FINAL)
    plain.step.forward_backward()
    clipped = trainer(horizon=400, loss_terms=FINAL, clip=clip_by_global_norm(1e6), adjoint={"max_norm": 0.1})
    clipped.step.forward_backward()
    g_plain = np.linalg.norm(plain.params.grad.numpy())
    g_clipped = np.linalg.norm(clipped.params.grad.numpy())
    assert np.isfinite(g_clipped) and g_clipped < 0.5 * g_plain


def test_linear_warmup_schedule_drives_the_logged_learning_rate(tmp_path):
    t = trainer(iterations=6, log_every=2, schedule=linear_warmup(4, start_factor=0.25))
    t.fit(tmp_path)
    lr = values(read(tmp_path), "optim/lr")
    # torch LinearLR: factor goes 0.25 -> 1 over 4 steps, then stays.
    np.testing.assert_allclose(lr, 0.5 * np.array([0.25, 0.4375, 0.625, 0.8125, 1.0, 1.0]), rtol=1e-6)


def test_clip_aware_rule_lowers_the_rate_and_says_so(tmp_path, capsys):
    schedule = constant(clip_aware=True, clip_window=3, clip_fraction=0.5, clip_factor=0.5)
    t = trainer(iterations=6, log_every=2, clip=clip_by_global_norm(1e-9), schedule=schedule)
    summary = t.fit(tmp_path)
    acc = read(tmp_path)
    assert summary["clipped_steps"] == 6
    assert summary["lr_reductions"] >= 1
    assert "lr scale lowered" in capsys.readouterr().out
    assert values(acc, "optim/lr_reductions")[-1] == summary["lr_reductions"]
    lr = values(acc, "optim/lr")
    assert lr[0] == pytest.approx(0.5) and lr[-1] < lr[0]


def loss_at(t: Trainer, flat: np.ndarray) -> float:
    """The loss of one rollout with the flat parameters set to ``flat`` (restored after)."""
    kept = t.params.data.numpy().copy()
    t.params.data.assign(flat)
    t.loss.zero()
    value = float(t.loss(rollout(t.env, t.task, t.params)).numpy()[0])
    t.params.data.assign(kept)
    return value


def test_schedulefree_is_evaluated_and_saved_at_the_average_x(tmp_path):
    t = trainer(iterations=5, log_every=5, optimizer=adamw_schedulefree(1.0, warmup_steps=2), clip=no_clip())
    summary = t.fit(tmp_path)
    x = t.step.eval_params().numpy().copy()
    y = t.params.data.numpy().copy()
    assert not np.array_equal(x, y)
    at_x, at_y = loss_at(t, x), loss_at(t, y)
    assert at_x != at_y
    assert summary["final_loss"] == at_x
    np.testing.assert_array_equal(t.params.data.numpy(), y)  # evaluating x put the training point y back
    saved = checkpoint.load(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(tmp_path))[-1])
    np.testing.assert_array_equal(saved.arrays["optim/x"], x)  # the average is saved with the state
    np.testing.assert_array_equal(saved.arrays["params/data"], y)
    assert "optim/avg_weight" in read(tmp_path).Tags()["scalars"]


def test_an_iteration_with_a_nan_gradient_leaves_parameters_optimizer_and_schedule_state_bit_identical():
    """A step size of 1e30 blows the simulation up after the first update: every later
    gradient is nan. Under clip.nonfinite=skip those iterations change nothing."""
    t = trainer(
        iterations=4,
        log_every=4,
        optimizer=sgd(1e30),
        clip=skip_if_nonfinite(no_clip()),
        schedule=linear_warmup(10, start_factor=0.1),
    )
    t.step.run()
    states = (t.state.optim, t.state.schedule)
    before = [t.params.data.numpy().copy(), *({k: v.numpy().copy() for k, v in s.items()} for s in states)]
    for _it in (1, 2):
        t.step.run()
        assert int(t.step.stats_pre.nonfinite.numpy()[0]) > 0
    assert int(t.state.nonfinite["skipped"].numpy()[0]) == 2
    np.testing.assert_array_equal(t.params.data.numpy(), before[0])
    for state, saved in zip(states, before[1:], strict=True):
        for key, value in state.items():
            np.testing.assert_array_equal(value.numpy(), saved[key], err_msg=key)
    row = dict(zip(t.step.columns, t.step.history.numpy()[2], strict=True))
    assert row["optim/skipped"] == 1.0 and row["optim/nonfinite"] > 0
