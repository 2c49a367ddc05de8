"""Optimizers: several steps against a numpy re-statement of the torch.optim update equations."""

from __future__ import annotations

import hydra.utils
import numpy as np
import pytest
import warp as wp
from omegaconf import OmegaConf

from harness.optim import adam, sgd
from harness.params import ParamSet, ParamSpec

STEPS = 4


def make_params(seed: int = 0) -> ParamSet:
    rng = np.random.default_rng(seed)
    specs = [
        ParamSpec("a", (5,), init=rng.normal(size=5)),
        ParamSpec("v", (4,), wp.vec3, init=rng.normal(size=(4, 3))),
    ]
    return ParamSet(specs, device="cpu")


def grads(size: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=size).astype(np.float32) for _ in range(STEPS)]


def sgd_reference(p, gs, lr, momentum, weight_decay):
    """torch.optim.SGD, no dampening/nesterov: g += wd*p; buf = g (t=1) else mu*buf + g; p -= lr*buf."""
    p, buf = p.astype(np.float64), None
    for g in gs:
        g = g + weight_decay * p
        if momentum:
            buf = g if buf is None else momentum * buf + g
            g = buf
        p = p - lr * g
    return p


def adam_reference(p, gs, lr, b1, b2, eps, weight_decay, t0=0):
    """torch.optim.Adam (Kingma & Ba 2015): m, v moments; p -= lr * m_hat / (sqrt(v_hat) + eps)."""
    p, m, v = p.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(gs, start=t0 + 1):
        g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


def run(opt, params: ParamSet, gs: list[np.ndarray]) -> dict:
    state = opt.init(params)
    for g in gs:
        params.grad.assign(g)
        opt.step(params, state)
    return state


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.0), (0.9, 0.0), (0.0, 0.1), (0.5, 0.01)])
def test_sgd_matches_torch_update_equations(momentum, weight_decay):
    params = make_params()
    p0, gs = params.data.numpy().copy(), grads(params.size)
    run(sgd(lr=0.1, momentum=momentum, weight_decay=weight_decay), params, gs)
    want = sgd_reference(p0, gs, 0.1, momentum, weight_decay)
    np.testing.assert_allclose(params.data.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("betas", "weight_decay"), [((0.9, 0.999), 0.0), ((0.8, 0.99), 0.1), ((0.0, 0.5), 0.0)])
def test_adam_matches_torch_update_equations(betas, weight_decay):
    params = make_params()
    p0, gs = params.data.numpy().copy(), grads(params.size)
    run(adam(lr=0.01, betas=betas, eps=1e-8, weight_decay=weight_decay), params, gs)
    want = adam_reference(p0, gs, 0.01, *betas, 1e-8, weight_decay)
    np.testing.assert_allclose(params.data.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "opt", [sgd(lr=0.1), sgd(lr=0.1, momentum=0.9, weight_decay=0.1), adam(lr=0.1, weight_decay=0.1)]
)
def test_step_never_modifies_params_grad(opt):
    params = make_params()
    state = opt.init(params)
    g = grads(params.size)[0]
    params.grad.assign(g)
    for _ in range(3):
        opt.step(params, state)
    np.testing.assert_array_equal(params.grad.numpy(), g)


def test_step_counter_lives_on_the_device_and_drives_bias_correction():
    params = make_params()
    opt = adam(lr=0.01)
    state = opt.init(params)
    counter = state["step"]
    assert isinstance(counter, wp.array)
    assert (counter.device, counter.dtype, counter.shape) == (params.device, wp.int32, (1,))
    gs = grads(params.size)
    for g in gs[:3]:
        params.grad.assign(g)
        opt.step(params, state)
    assert state["step"] is counter
    assert counter.numpy()[0] == 3

    # Rewriting the device counter changes the bias correction of the next step.
    counter.assign(np.array([999], dtype=np.int32))
    state["exp_avg"].zero_()
    state["exp_avg_sq"].zero_()
    p0 = params.data.numpy().copy()
    params.grad.assign(gs[3])
    opt.step(params, state)
    want = adam_reference(p0, gs[3:], 0.01, 0.9, 0.999, 1e-8, 0.0, t0=999)
    np.testing.assert_allclose(params.data.numpy(), want, rtol=1e-5, atol=1e-7)
    assert counter.numpy()[0] == 1000


@pytest.mark.parametrize("opt", [sgd(lr=0.5, momentum=0.9), adam(lr=0.5)])
def test_learning_rate_is_read_from_the_device_array(opt):
    params = make_params()
    state = opt.init(params)
    params.grad.assign(grads(params.size)[0])
    state["lr"].zero_()
    p0 = params.data.numpy().copy()
    opt.step(params, state)
    np.testing.assert_array_equal(params.data.numpy(), p0)


@pytest.mark.parametrize("opt", [sgd(lr=0.1), sgd(lr=0.1, momentum=0.9), adam(lr=0.1)])
def test_step_is_one_flat_launch_plus_counter_without_host_round_trip(opt, monkeypatch):
    params = make_params()
    state = opt.init(params)
    launches = []
    real_launch = wp.launch

    def forbidden(*args, **kwargs):
        raise AssertionError("host round trip")

    monkeypatch.setattr(wp, "launch", lambda k, dim, *a, **kw: (launches.append(dim), real_launch(k, dim, *a, **kw)))
    monkeypatch.setattr(wp.array, "numpy", forbidden)
    opt.step(params, state)
    assert sorted(launches) == [1, params.size]


@pytest.mark.parametrize(
    ("factory", "kwargs", "field"),
    [
        (sgd, {"lr": -0.1}, "lr"),
        (sgd, {"lr": 0.1, "momentum": -0.5}, "momentum"),
        (sgd, {"lr": 0.1, "weight_decay": -1.0}, "weight_decay"),
        (adam, {"lr": float("nan")}, "lr"),
        (adam, {"lr": 0.1, "betas": (1.0, 0.999)}, "betas"),
        (adam, {"lr": 0.1, "betas": (0.9, -0.1)}, "betas"),
        (adam, {"lr": 0.1, "betas": (0.9,)}, "betas"),
        (adam, {"lr": 0.1, "eps": 0.0}, "eps"),
    ],
)
def test_invalid_hyperparameters_are_rejected_naming_the_field(factory, kwargs, field):
    with pytest.raises(ValueError, match=rf"optim\.{field}\b"):
        factory(**kwargs)


def test_zero_learning_rate_is_allowed():
    assert sgd(lr=0.0).name == "sgd"
    assert adam(lr=0).name == "adam"


def test_adam_accepts_betas_as_list_or_listconfig_from_hydra():
    cfg = OmegaConf.create({"_target_": "harness.optim.adam", "lr": 0.01, "betas": [0.8, 0.99]})
    from_hydra = hydra.utils.instantiate(cfg)
    from_list = adam(lr=0.01, betas=[0.8, 0.99])
    gs = grads(make_params().size)
    results = []
    for opt in (from_hydra, from_list, adam(lr=0.01, betas=(0.8, 0.99))):
        params = make_params()
        run(opt, params, gs)
        results.append(params.data.numpy())
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_array_equal(results[1], results[2])
