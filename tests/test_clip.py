"""Clip policies: clip_by_global_norm against a numpy statement of PyTorch's clip_grad_norm_ rule."""

from __future__ import annotations

import hydra.utils
import numpy as np
import pytest
import warp as wp

from harness.clip import clip_by_global_norm, no_clip
from harness.params import CHUNK, ParamSet, ParamSpec
from harness.stats import FlatStats


def make_params() -> ParamSet:
    specs = [ParamSpec("a", (7,)), ParamSpec("v", (20,), wp.vec3), ParamSpec("big", (CHUNK + 40,))]
    return ParamSet(specs, device="cpu")


def torch_clip_reference(grad: np.ndarray, max_norm: float) -> tuple[np.ndarray, np.float32]:
    """torch.nn.utils.clip_grad_norm_: coef = clamp(max_norm / (total + 1e-6), max=1); grad *= coef."""
    total = np.float32(np.linalg.norm(grad.astype(np.float64)))
    with np.errstate(divide="ignore", invalid="ignore"):
        coef = np.float32(max_norm) / (total + np.float32(1e-6))
        coef = np.float32(np.minimum(coef, np.float32(1.0)))  # np.minimum propagates nan, like torch.clamp
        return grad * coef, coef


def clip(params: ParamSet, policy, grad: np.ndarray) -> tuple[np.ndarray, dict]:
    params.grad.assign(grad.astype(np.float32))
    state = policy.init(params)
    stats = FlatStats(params)
    stats.compute(params.grad)
    policy.update(params, state, stats)
    return params.grad.numpy(), state


def random_grad(size: int, scale: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=size) * scale).astype(np.float32)


def special_grad(size: int, kind: str) -> np.ndarray:
    g = random_grad(size, 1.0)
    if kind == "zero":
        g[:] = 0.0
    elif kind == "inf":
        g[3] = np.inf
    elif kind == "nan":
        g[-2] = np.nan
    return g


@pytest.mark.parametrize(
    ("kind", "max_norm"),
    [
        ("small", 1e3),  # below the limit: unchanged
        ("large", 1.0),  # above: rescaled
        ("zero", 1.0),  # total = 0: unchanged
        ("large", 0.0),  # max_norm = 0: zeroed
        ("inf", 1.0),  # total = inf: finite entries zeroed, the inf entry becomes nan
        ("nan", 1.0),  # total = nan: everything nan
    ],
)
def test_clip_by_global_norm_matches_torch_rule(kind, max_norm):
    params = make_params()
    if kind in ("small", "large"):
        grad = random_grad(params.size, 10.0)
    else:
        grad = special_grad(params.size, kind)
    got, state = clip(params, clip_by_global_norm(max_norm=max_norm), grad)
    want, coef = torch_clip_reference(grad, max_norm)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0.0, equal_nan=True)
    np.testing.assert_allclose(state["coef"].numpy(), [coef], rtol=1e-6, equal_nan=True)
    assert state["clipped"].numpy()[0] == int(coef < 1.0)


def test_norm_equals_max_norm_after_clipping_when_it_was_above():
    params = make_params()
    got, state = clip(params, clip_by_global_norm(max_norm=2.5), random_grad(params.size, 10.0))
    assert np.linalg.norm(got.astype(np.float64)) == pytest.approx(2.5, rel=1e-5)
    assert state["clipped"].numpy()[0] == 1


def test_gradients_below_the_limit_are_untouched():
    params = make_params()
    grad = random_grad(params.size, 0.01)
    got, state = clip(params, clip_by_global_norm(max_norm=1.0), grad)
    np.testing.assert_array_equal(got, grad)
    assert state["coef"].numpy()[0] == 1.0
    assert state["clipped"].numpy()[0] == 0


def test_clipping_twice_changes_nothing():
    params = make_params()
    policy = clip_by_global_norm(max_norm=1.0)
    once, _ = clip(params, policy, random_grad(params.size, 10.0))
    twice, _ = clip(params, policy, once)
    # The second pass may only shave off the 1e-6 epsilon of the rule.
    np.testing.assert_allclose(twice, once, rtol=2e-6, atol=0.0)


def test_no_clip_leaves_gradients_untouched():
    params = make_params()
    grad = random_grad(params.size, 1e3)
    got, state = clip(params, no_clip(), grad)
    np.testing.assert_array_equal(got, grad)
    assert state["coef"].numpy()[0] == 1.0
    assert state["clipped"].numpy()[0] == 0


def test_update_is_one_launch_without_host_round_trip(monkeypatch):
    params = make_params()
    policy = clip_by_global_norm(max_norm=1.0)
    state = policy.init(params)
    stats = FlatStats(params)
    stats.compute(params.grad)
    launches = []
    real_launch = wp.launch

    def forbidden(*args, **kwargs):
        raise AssertionError("host round trip")

    monkeypatch.setattr(wp, "launch", lambda *a, **k: (launches.append(1), real_launch(*a, **k)))
    monkeypatch.setattr(wp.array, "numpy", forbidden)
    policy.update(params, state, stats)
    assert len(launches) == 1


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_invalid_max_norm_is_rejected(bad):
    with pytest.raises(ValueError, match=r"clip\.max_norm"):
        clip_by_global_norm(max_norm=bad)


def test_policies_instantiate_from_hydra_style_configs():
    policy = hydra.utils.instantiate({"_target_": "harness.clip.clip_by_global_norm", "max_norm": 1.0})
    assert policy.name == "global_norm"
    assert hydra.utils.instantiate({"_target_": "harness.clip.no_clip"}).name == "none"
