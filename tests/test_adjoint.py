"""In-backward clipping of the cartpole's state adjoint (harness.adjoint) on real Newton rollouts."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

from envs.cartpole import CartpoleEnv
from harness.adjoint import AdjointClipper, profile_histogram_values, profile_image, profile_summary
from harness.adjoint_funcs import clamp_adjoint, clip_adjoint_norm
from harness.losses import WeightedLoss
from harness.tasks import OpenLoop, prepare, rollout

TERMINAL = {
    "pose": {"source": "joint_q", "steps": "last"},
    "velocity": {"source": "joint_qd", "steps": "last", "weight": 0.1},
}
RUNNING = {"pose": {"source": "joint_q"}, "velocity": {"source": "joint_qd", "weight": 0.1}}


class Rollout:
    """A cartpole, its parameters and a loss, differentiated with a tape driven here."""

    def __init__(self, horizon: int, world_count: int, terms: dict, **fields):
        self.env = CartpoleEnv(horizon=horizon, world_count=world_count, device="cpu", **fields)
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
        self.total = total.numpy().copy()
        self.trajectory = {name: array.numpy().copy() for name, array in self.env.trajectory().items()}
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


@pytest.mark.slow  # default suite time (make test-slow runs it)
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


# --- the third place: one point of one kernel (harness.adjoint_funcs) ---


@wp.kernel
def _through_points(
    x: wp.array(dtype=wp.float32),
    v: wp.array(dtype=wp.vec3),
    limit: float,
    y: wp.array(dtype=wp.float32),
    w: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    y[i] = 3.0 * clamp_adjoint(x[i] * x[i], limit)  # d y / d(x^2) = 3, clamped to limit
    w[i] = 2.0 * clip_adjoint_norm(v[i], limit)


def test_adjoint_funcs_are_the_identity_forward_and_clip_only_the_gradient_through_them():
    x = wp.array([0.5, -2.0, float("nan")], dtype=wp.float32, requires_grad=True, device="cpu")
    v = wp.array([[0.1, 0.2, 0.2], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0]], dtype=wp.vec3, requires_grad=True, device="cpu")
    y = wp.zeros(3, dtype=wp.float32, requires_grad=True, device="cpu")
    w = wp.zeros(3, dtype=wp.vec3, requires_grad=True, device="cpu")
    tape = wp.Tape()
    with tape:
        wp.launch(_through_points, dim=3, inputs=[x, v, 1.0], outputs=[y, w], device="cpu")
    tape.backward(
        grads={y: wp.ones(3, dtype=wp.float32, device="cpu"), w: wp.full(3, wp.vec3(1.0, 0.5, 0.0), device="cpu")}
    )
    np.testing.assert_array_equal(y.numpy()[:2], 3.0 * np.float32([0.25, 4.0]))  # forward: the identity
    np.testing.assert_array_equal(w.numpy(), 2.0 * v.numpy())
    # scalar: the upstream 3 clamped to 1, then the chain rule continues (d x^2 / dx = 2x)
    np.testing.assert_allclose(x.grad.numpy()[:2], [1.0, -4.0], rtol=1e-6)
    assert np.isnan(x.grad.numpy()[2])  # a NaN passes through for the non-finite handling to see
    # vector: upstream 2 * (1, 0.5, 0) has norm sqrt(5) > 1: scaled to norm 1, the same for every row
    expected = np.float32([2.0, 1.0, 0.0]) / np.sqrt(5.0)
    np.testing.assert_allclose(v.grad.numpy(), np.tile(expected, (3, 1)), rtol=1e-6)


def test_cartpole_force_clamp_leaves_the_rollout_and_clamps_each_force_gradient_exactly():
    """``env.force_adjoint_clamp``: the rollout and loss bit for bit as without it, and each
    action's gradient (the force's, one to one) the unclipped tape's clamped to the limit."""
    free = Rollout(60, 2, RUNNING)
    plain, _ = free.gradient(None, hook=False)
    limit = float(np.median(np.abs(plain)))  # about half the forces' gradients exceed it
    clamped = Rollout(60, 2, RUNNING, force_adjoint_clamp=limit)
    measured, _ = clamped.gradient(None, hook=False)
    assert free.total.tobytes() == clamped.total.tobytes()
    for name, values in free.trajectory.items():
        np.testing.assert_array_equal(values, clamped.trajectory[name], err_msg=name)
    np.testing.assert_array_equal(measured, np.clip(plain, -np.float32(limit), np.float32(limit)))
    assert 0.3 < np.mean(np.abs(plain) > limit) < 0.7  # the comparison covers clamped and untouched entries
