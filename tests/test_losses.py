"""The loss's cost per step and world: what the loss averages, and what a reward per step is."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

from harness.losses import WeightedLoss


def test_step_costs_are_the_loss_before_its_average_over_steps_and_worlds():
    rng = np.random.default_rng(0)
    steps, worlds = 7, 3
    q = wp.array(rng.normal(size=(steps, worlds, 2)).astype(np.float32), device="cpu")
    u = wp.array(rng.normal(size=(steps, worlds, 1)).astype(np.float32), device="cpu")
    loss = WeightedLoss(
        {
            "pose": {"source": "q", "dim_weights": [1.0, 0.5], "target": [0.1, -0.2]},
            "effort": {"source": "u", "weight": 0.01},
            "final": {"source": "q", "steps": "last", "weight": 3.0},
        }
    )
    loss.bind({"q": 2, "u": 1}, device="cpu")
    loss.zero()
    total = float(loss({"q": q, "u": u}).numpy()[0])
    costs = loss.step_costs({"q": q, "u": u}, wp.zeros((steps, worlds), dtype=wp.float32, device="cpu")).numpy()
    qn, un = q.numpy().astype(np.float64), u.numpy().astype(np.float64)
    pose = ((qn - [0.1, -0.2]) ** 2 * [1.0, 0.5]).sum(-1)
    effort = 0.01 * (un**2).sum(-1)
    final = np.zeros((steps, worlds))
    final[-1] = 3.0 * (qn[-1] ** 2).sum(-1)
    np.testing.assert_allclose(costs, pose + effort + final, rtol=1e-5)
    # the loss averages each term over the steps it covers and the worlds
    expected = (pose.sum() + effort.sum()) / (steps * worlds) + final.sum() / worlds
    assert total == pytest.approx(expected, rel=1e-5)
