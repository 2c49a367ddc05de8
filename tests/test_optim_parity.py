"""Parity with the reference implementations on identical gradient sequences.

Each case runs 200 steps of ``harness.optim.build(name, ...)`` over a list of three Warp
arrays (float32 ``(7,)``, float32 ``(3, 4)``, vec3 ``(5,)``) and of the reference over
float32 CPU tensors of the same values, feeding both the same float32 gradients drawn from
a normal distribution, and compares the parameters after every step (the ScheduleFree
training point ``y``), then the evaluation parameters (ScheduleFree ``x``, read from the
reference after ``.eval()``). References: ``torch.optim.SGD``, ``Adam``, ``AdamW`` (torch
2.13 CPU, single-tensor path) and ``schedulefree.SGDScheduleFreeReference``,
``AdamWScheduleFreeReference``.

Tolerance: ``|warp - reference| <= ATOL = 1e-5`` at every step, for parameters of magnitude
up to about 4. Both sides compute in float32 (unit roundoff u = 6e-8) but in different
orders (torch rounds after each in-place op, Warp's compiled kernel may fuse a multiply-add;
torch's scalar step sizes are float64 on the host, ours are float64 on the device rounded
once to float32), so a step's new parameter can differ by about one ulp of ``|p|`` (at most
4.8e-7 at ``|p| = 4``). These differences do not grow (the gradients do not depend on the
parameters, and weight decay contracts), so they add up like a random walk: about
``sqrt(200) * 4.8e-7 = 7e-6`` after 200 steps; the worst measured is 2.8e-6 (Adam with
AMSGrad and L2 decay; the SGD family stays at or under 1.1e-6). A wrong formula is caught by
orders of magnitude: the first step of SGD blending the zero buffer with dampening instead
of copying the gradient differs by 0.026, and ScheduleFree weights from the current rate
instead of the largest rate seen differ by 0.58 (SGD) and 0.062 (AdamW) after the rate drop.
"""

from __future__ import annotations

import numpy as np
import pytest
import schedulefree
import torch
import warp as wp

from harness.optim import build

STEPS = 200
ATOL = 1e-5
SHAPES = [((7,), wp.float32), ((3, 4), wp.float32), ((5,), wp.vec3)]


def full_shape(shape, dtype):
    return (*shape, 3) if dtype is wp.vec3 else shape


def initial_values() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=full_shape(s, d)).astype(np.float32) for s, d in SHAPES]


def gradient_sequence() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(1)
    return [[rng.normal(size=full_shape(s, d)).astype(np.float32) for s, d in SHAPES] for _ in range(STEPS)]


def warp_arrays(values: list[np.ndarray]) -> list[wp.array]:
    return [wp.array(v, dtype=d, device="cpu") for v, (_, d) in zip(values, SHAPES, strict=True)]


def max_error(arrays: list[wp.array], tensors: list[torch.Tensor]) -> float:
    return max(
        float(np.abs(a.numpy().reshape(t.shape) - t.detach().numpy()).max())
        for a, t in zip(arrays, tensors, strict=True)
    )


def run_parity(name: str, hyperparameters: dict, reference: type, *, schedulefree_ref: bool = False) -> None:
    """Compare every step; an ``lr_drop`` entry ``(step, lr)`` lowers the rate mid-run on both sides."""
    hyperparameters = dict(hyperparameters)
    drop_step, drop_lr = hyperparameters.pop("lr_drop", (-1, 0.0))
    params = warp_arrays(initial_values())
    grads = warp_arrays([np.zeros_like(v) for v in initial_values()])
    opt = build(name, **hyperparameters)
    state = opt.init(params)
    tensors = [torch.tensor(v, requires_grad=True) for v in initial_values()]
    ref = reference(tensors, **hyperparameters)
    if schedulefree_ref:
        ref.train()
    worst = 0.0
    for k, step_grads in enumerate(gradient_sequence()):
        if k == drop_step:
            state["lr"].fill_(drop_lr)  # what a schedule does on the device
            ref.param_groups[0]["lr"] = drop_lr
        for array, g in zip(grads, step_grads, strict=True):
            array.assign(g)
        state = opt.step(params, grads, state)
        for tensor, g in zip(tensors, step_grads, strict=True):
            tensor.grad = torch.tensor(g)  # a fresh tensor: the SGD reference adds its decay into it
        ref.step()
        worst = max(worst, max_error(params, tensors))
    moved = max_error(params, [torch.tensor(v) for v in initial_values()])
    assert moved > 100 * ATOL, "the case must move the parameters well beyond the tolerance"
    assert worst <= ATOL, f"largest difference over {STEPS} steps: {worst:.3g}"
    if schedulefree_ref:
        ref.eval()
    assert max_error(opt.eval_params(params, state), tensors) <= ATOL


@pytest.mark.parametrize(
    "hyperparameters",
    [
        {"lr": 0.01},
        {"lr": 0.01, "momentum": 0.9},
        {"lr": 0.01, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
        {"lr": 0.01, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1},
        {"lr": 0.01, "weight_decay": 0.1},
    ],
)
def test_sgd_matches_torch_sgd(hyperparameters):
    run_parity("sgd", hyperparameters, torch.optim.SGD)


@pytest.mark.parametrize(
    "hyperparameters",
    [
        {"lr": 0.01},
        {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True},
        {"lr": 0.01, "betas": (0.0, 0.5)},
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01},
        {"lr": 0.01, "lr_drop": (100, 0.002)},
    ],
)
def test_adam_matches_torch_adam(hyperparameters):
    run_parity("adam", hyperparameters, torch.optim.Adam)


@pytest.mark.parametrize(
    "hyperparameters",
    [
        {"lr": 0.01},
        {"lr": 0.01, "weight_decay": 0.1},
        {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True, "betas": (0.8, 0.99)},
    ],
)
def test_adamw_matches_torch_adamw(hyperparameters):
    run_parity("adamw", hyperparameters, torch.optim.AdamW)


@pytest.mark.parametrize(
    "hyperparameters",
    [
        {"lr": 0.1},
        {"lr": 0.1, "momentum": 0.5, "weight_decay": 0.01, "warmup_steps": 20},
        {"lr": 0.1, "weight_decay": 0.01, "warmup_steps": 20, "r": 0.5, "weight_lr_power": 1.0},
        # A lower rate after step 100: the averaging weight keeps using the largest rate seen.
        {"lr": 0.1, "lr_drop": (100, 0.02)},
    ],
)
def test_sgd_schedulefree_matches_the_reference_class(hyperparameters):
    run_parity("sgd_schedulefree", hyperparameters, schedulefree.SGDScheduleFreeReference, schedulefree_ref=True)


@pytest.mark.parametrize(
    "hyperparameters",
    [
        {"lr": 0.01},
        {"lr": 0.01, "weight_decay": 0.1, "warmup_steps": 20, "r": 1.0, "weight_lr_power": 0.0},
        {"lr": 0.01, "weight_decay": 0.1, "decay_at_z": True, "betas": (0.8, 0.99)},
        {"lr": 0.01, "warmup_steps": 10, "lr_drop": (100, 0.001)},
    ],
)
def test_adamw_schedulefree_matches_the_reference_class(hyperparameters):
    run_parity("adamw_schedulefree", hyperparameters, schedulefree.AdamWScheduleFreeReference, schedulefree_ref=True)


def test_adam_bias_correction_follows_a_rewritten_device_step_counter():
    """The counter is state like any other: torch with its step set to 999 gives the same update."""
    params = warp_arrays(initial_values())
    grads = warp_arrays(gradient_sequence()[0])
    opt = build("adam", lr=0.01)
    state = opt.init(params)
    state["step"].fill_(999)
    opt.step(params, grads, state)

    tensors = [torch.tensor(v, requires_grad=True) for v in initial_values()]
    ref = torch.optim.Adam(tensors, lr=0.01)
    for tensor, g in zip(tensors, gradient_sequence()[0], strict=True):
        ref.state[tensor] = {
            "step": torch.tensor(999.0),
            "exp_avg": torch.zeros_like(tensor),
            "exp_avg_sq": torch.zeros_like(tensor),
        }
        tensor.grad = torch.tensor(g)
    ref.step()
    assert state["step"].numpy()[0] == 1000
    # At t = 1000 the update is 0.1 / sqrt(0.001 / 0.632) = 2.5 times the first step's lr * sign(g).
    assert max_error(params, [torch.tensor(v) for v in initial_values()]) > 0.02
    assert max_error(params, tensors) <= ATOL
