"""Tape gradients through Featherstone match central finite differences at 120 steps.

Tolerance 1e-2 relative (eps = 1 N on one cart force). Measured on this CPU at 120 steps,
12 sampled entries: worst error 1.5e-3 with per-step scratch buffers, 8.9e-2 without
(`python -m harness gradcheck +env=cartpole env.horizon=120 [env.per_step_scratch=false]`).
The check must run at >= 100 steps: at 20 steps the broken solver is only a few percent off.
"""

from __future__ import annotations

import pytest

from envs.cartpole import CartpoleEnv
from harness.gradcheck import check_gradients
from harness.losses import WeightedLoss
from tests.helpers import DEVICES, UPRIGHT_TERMS

HORIZON = 120


def run_gradcheck(per_step_scratch: bool, device: str = "cpu"):
    env = CartpoleEnv(horizon=HORIZON, world_count=2, per_step_scratch=per_step_scratch, device=device)
    loss = WeightedLoss(UPRIGHT_TERMS)
    result, _ = check_gradients(env, loss, samples=12, eps=1.0, tolerance=1e-2, seed=0, device=device)
    return result


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_passes_at_120_steps_with_per_step_featherstone_scratch(device):
    result = run_gradcheck(per_step_scratch=True, device=device)
    assert result.passed, f"worst relative error {result.worst:.3e}"
    assert (abs(result.tape) > 0).all()


def test_gradcheck_fails_at_120_steps_when_the_solver_reuses_its_scratch():
    result = run_gradcheck(per_step_scratch=False)
    assert not result.passed
    assert result.worst > 2e-2


@pytest.mark.parametrize("field", ["M", "J", "P", "H", "L"])
def test_featherstone_still_has_the_scratch_attributes_the_env_swaps(field):
    """Guards a newton upgrade: the per-step copies rely on these private solver arrays."""
    env = CartpoleEnv(horizon=2, world_count=1, device="cpu")
    assert getattr(env.solver, field).size > 0
