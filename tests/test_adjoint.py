"""In-backward clipping of the cartpole's state adjoint (harness.adjoint) on real Newton rollouts."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

from envs.cartpole import CartpoleEnv
from harness.adjoint import AdjointClipper, profile_histogram_values, profile_image, profile_summary
from harness.losses import WeightedLoss
from harness.tasks import OpenLoop, prepare, rollout

TERMINAL = {
    "pose": {"source": "joint_q", "steps": "last"},
    "velocity": {"source": "joint_qd", "steps": "last", "weight": 0.1},
}
RUNNING = {"pose": {"source": "joint_q"}, "velocity": {"source": "joint_qd", "weight": 0.1}}


class Rollout:
    """A cartpole, its parameters and a loss, differentiated with a tape driven here."""

    def __init__(self, horizon: int, world_count: int, terms: dict):
        self.env = CartpoleEnv(horizon=horizon, world_count=world_count, device="cpu")
        self.task = OpenLoop()
        self.loss = WeightedLoss(terms)
        self.params = prepare(self.env, self.task, self.loss, device="cpu")

    def gradient(self, max_norm: float | None, *, hook: bool = True) -> tuple[np.ndarray, AdjointClipper]:
        self.params.zero_grad()
        self.env.zero_grad()
        self.loss.zero()
        clipper = AdjointClipper(
            horizon=self.env.horizon, world_count=self.env.world_count, max_norm=max_norm, device="cpu"
        )
        tape = wp.Tape()
        after_step = clipper.step_hook(tape) if hook else None
        with tape:
            total = self.loss(rollout(self.env, self.task, self.params, after_step=after_step))
        tape.backward(total)
        return self.params.grad.numpy().copy(), clipper


def test_infinite_threshold_is_bit_identical_to_no_adjoint_clipping():
    rollout = Rollout(120, 2, RUNNING)
    plain, _ = rollout.gradient(None, hook=False)
    measured, clipper = rollout.gradient(float("inf"))
    assert np.abs(plain).max() > 0.0
    assert plain.tobytes() == measured.tobytes()
    assert np.all(clipper.profile()[:-1] > 0.0)  # it did measure


def test_zero_threshold_cuts_every_path_through_time():
    """With a terminal loss, only the last control may keep a gradient once every state
    adjoint between steps is zeroed: no other array of the state carries adjoint into the
    previous step (body_q, body_qd are recomputed from joint_q, joint_qd each step)."""
    rollout = Rollout(60, 2, TERMINAL)
    grad, _ = rollout.gradient(0.0)
    per_step = np.abs(grad.reshape(60, 2)).max(axis=1)
    assert np.all(per_step[:-1] == 0.0)
    plain, _ = rollout.gradient(None, hook=False)
    assert np.all(np.abs(plain.reshape(60, 2)).max(axis=1)[:-1] > 0.0)


def test_clipped_steps_hold_at_most_max_norm_and_the_profile_is_pre_clip():
    rollout = Rollout(120, 2, RUNNING)
    _, free = rollout.gradient(float("inf"))
    _, clipped = rollout.gradient(1e-3)
    # The last step's adjoint has nothing downstream to be clipped by: identical profiles there.
    np.testing.assert_array_equal(free.profile()[-1], clipped.profile()[-1])
    assert np.all(free.profile()[:-1] > 1e-3)
    # Upstream, the clip shrank everything that flowed back, so the measured norms are smaller.
    assert np.all(clipped.profile()[:-2] < free.profile()[:-2])


def test_long_horizon_adjoint_clip_keeps_the_gradient_bounded_by_the_threshold():
    horizon = 800
    rollout = Rollout(horizon, 1, TERMINAL)
    plain, clipper = rollout.gradient(float("inf"))  # bit-identical to no clipping, and profiled
    big, _ = rollout.gradient(10.0)
    small, _ = rollout.gradient(1.0)
    norm = lambda g: float(np.linalg.norm(g.astype(np.float64)))  # noqa: E731
    assert clipper.profile().max() > 100.0  # the unclipped adjoint grows far beyond both thresholds
    assert np.isfinite(big).all() and np.isfinite(small).all()
    assert norm(small) < 0.05 * norm(plain)
    # Every clipped step scales linearly with the threshold: |g| is bounded by max_norm times a
    # horizon-independent constant, so a 10x lower threshold gives at most a 10x lower gradient.
    assert 5.0 * norm(small) < norm(big) <= 10.0 * (1 + 1e-3) * norm(small)


@pytest.mark.slow
def test_adjoint_clip_at_2000_steps_keeps_the_gradient_finite_and_small():
    horizon = 2000
    rollout = Rollout(horizon, 1, TERMINAL)
    plain, _ = rollout.gradient(None, hook=False)
    measured, clipper = rollout.gradient(float("inf"))
    clipped, _ = rollout.gradient(10.0)
    assert plain.tobytes() == measured.tobytes()
    assert clipper.profile().max() > 1e4
    assert np.linalg.norm(plain.astype(np.float64)) > 100.0
    assert np.isfinite(clipped).all()
    assert np.linalg.norm(clipped.astype(np.float64)) < 1.0


def test_profile_summary_image_and_histogram():
    profile = np.geomspace(1e4, 1.0, 200)[:, None] * np.array([[1.0, 2.0]])
    summary = profile_summary(profile, max_norm=100.0)
    assert summary["through_time/norm_max"] == pytest.approx(2e4)
    assert summary["through_time/norm_first"] == pytest.approx(2e4)
    assert summary["through_time/growth_per_100_steps"] == pytest.approx(4.0 * 100 / 199, rel=1e-6)
    assert 0.0 < summary["through_time/clipped_fraction"] < 1.0
    image = profile_image(profile, max_norm=100.0, dt=1 / 240)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.std() > 0  # something was drawn
    values = profile_histogram_values(profile)["through_time/log10_norm_pre"]
    assert values.size == 400 and values.max() == pytest.approx(np.log10(2e4))


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="max_norm"):
        AdjointClipper(horizon=2, world_count=1, max_norm=-1.0, device="cpu")
