"""clip_grad_norm_ / clip_grad_value_ and the flat-buffer policies against PyTorch on the same data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp

from harness.clip import clip_by_global_norm, clip_grad_norm_, clip_grad_value_
from harness.params import ParamSet, ParamSpec
from harness.stats import FlatStats
from harness.transform import Shared

NORM_TYPES = [1.0, 2.0, float("inf"), 3.0]

# (Warp dtype, shape): float32 scalars, vec3 and spatial vectors as Newton stores them, tiny arrays.
LAYOUT = [
    (wp.float32, (300,)),
    (wp.vec3, (40,)),
    (wp.spatial_vector, (7,)),
    (wp.float32, (1,)),
    (wp.float32, (0,)),
    (wp.transform, (3,)),
]


def make_grads(kind: str, seed: int = 0, layout=LAYOUT) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    grads = []
    for dtype, shape in layout:
        inner = () if dtype is wp.float32 else tuple(dtype._shape_)
        grads.append((rng.normal(size=shape + inner) * 3.0).astype(np.float32))
    if kind == "zero":
        grads = [np.zeros_like(g) for g in grads]
    elif kind == "inf":
        grads[1][5, 1] = np.inf
    elif kind == "neg_inf":
        grads[0][7] = -np.inf
    elif kind == "nan":
        grads[2][3, 4] = np.nan
    elif kind == "nan_and_inf":
        grads[0][0] = np.inf
        grads[1][0, 0] = np.nan
    elif kind == "large":
        grads = [g * np.float32(1e18) for g in grads]  # squares overflow float32
    return grads


def to_warp(grads: list[np.ndarray], layout=LAYOUT) -> list[wp.array]:
    return [wp.array(g, dtype=dtype, device="cpu") for g, (dtype, _) in zip(grads, layout, strict=True)]


def torch_params(grads: list[np.ndarray]) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.from_numpy(g).dtype)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = torch.from_numpy(g.copy())
    return params


def torch_clip(grads: list[np.ndarray], max_norm: float, norm_type: float) -> tuple[list[np.ndarray], float]:
    params = torch_params(grads)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type, foreach=True)
    return [p.grad.numpy() for p in params], float(total)


def assert_same(got: list[np.ndarray], want: list[np.ndarray], *, rtol: float) -> None:
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=0.0, equal_nan=True)


def warp_values(arrays: list[wp.array]) -> list[np.ndarray]:
    return [a.numpy() for a in arrays]


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize(
    ("kind", "max_norm"),
    [
        ("random", 1.0),  # clipped
        ("random", 1e6),  # under the limit: unchanged
        ("random", 0.0),  # max_norm = 0: zeroed
        ("zero", 1.0),  # zero norm: unchanged
        ("inf", 1.0),
        ("neg_inf", 1.0),
        ("nan", 1.0),
        ("nan_and_inf", 1.0),
    ],
)
def test_clip_grad_norm_matches_torch(kind, max_norm, norm_type):
    layout = LAYOUT
    if norm_type == float("inf"):
        # torch refuses the inf-norm of an empty tensor (test below); leave the empty array out.
        layout = [entry for entry in LAYOUT if entry[1] != (0,)]
    grads = make_grads(kind, layout=layout)
    arrays = to_warp(grads, layout)
    total = clip_grad_norm_(arrays, max_norm, norm_type=norm_type)
    want, want_total = torch_clip(grads, max_norm, norm_type)
    got_total = float(total.numpy()[0])
    assert total.dtype == wp.float32 and total.shape == (1,)
    if np.isnan(want_total):
        assert np.isnan(got_total)
    else:
        assert got_total == pytest.approx(want_total, rel=2e-6)
    assert_same(warp_values(arrays), want, rtol=4e-6)


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_clip_grad_norm_matches_torch_on_float64(norm_type):
    layout = [(wp.float64, (50,)), (wp.vec3d, (9,))]
    rng = np.random.default_rng(4)
    grads = [rng.normal(size=(50,)), rng.normal(size=(9, 3))]
    arrays = [wp.array(g, dtype=d, device="cpu") for g, (d, _) in zip(grads, layout, strict=True)]
    total = clip_grad_norm_(arrays, 0.5, norm_type=norm_type)
    want, want_total = torch_clip(grads, 0.5, norm_type)
    assert total.dtype == wp.float64
    assert float(total.numpy()[0]) == pytest.approx(want_total, rel=1e-13)
    assert_same(warp_values(arrays), want, rtol=1e-13)


@pytest.mark.parametrize("seed", range(5))
def test_clip_grad_norm_matches_torch_on_random_layouts(seed):
    rng = np.random.default_rng(seed)
    layout = [(wp.float32, (int(n),)) for n in rng.integers(1, 3000, size=16)]
    grads = [(rng.normal(size=shape) * rng.uniform(0.01, 100)).astype(np.float32) for _, shape in layout]
    norm_type = NORM_TYPES[seed % 4]
    arrays = to_warp(grads, layout)
    total = clip_grad_norm_(arrays, 2.0, norm_type=norm_type)
    want, want_total = torch_clip(grads, 2.0, norm_type)
    assert float(total.numpy()[0]) == pytest.approx(want_total, rel=2e-6)
    assert_same(warp_values(arrays), want, rtol=4e-6)


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_norms_beyond_torchs_float32_accumulation_are_exact(norm_type):
    """Deliberate difference: torch's CPU norm overflows to inf here (sum of squares > 3.4e38),
    the float64 sums here do not, so the clip still rescales to max_norm instead of zeroing."""
    layout = [(wp.float32, (300,)), (wp.vec3, (40,))]
    grads = [g * np.float32(1e18) for g in make_grads("random", layout=layout)]
    arrays = to_warp(grads, layout)
    total = clip_grad_norm_(arrays, 1.0, norm_type=norm_type)
    flat = np.concatenate([g.ravel() for g in grads]).astype(np.float64)
    assert float(total.numpy()[0]) == pytest.approx(np.linalg.norm(flat, ord=norm_type), rel=2e-6)
    clipped = np.concatenate([g.ravel() for g in warp_values(arrays)]).astype(np.float64)
    assert np.linalg.norm(clipped, ord=norm_type) == pytest.approx(1.0, rel=1e-5)


def test_empty_arrays_count_as_zero_even_for_the_inf_norm():
    """Deliberate difference: torch raises for the inf-norm of an empty tensor; here it adds nothing."""
    grads = [np.zeros(0, np.float32), np.array([3.0, -4.0], np.float32)]
    with pytest.raises(RuntimeError, match="empty tensor"):
        torch.nn.utils.clip_grad_norm_(torch_params(grads), 1.0, norm_type="inf")
    arrays = [wp.array(g, dtype=wp.float32, device="cpu") for g in grads]
    assert float(clip_grad_norm_(arrays, 1.0, norm_type="inf").numpy()[0]) == 4.0


def test_clip_grad_norm_of_an_empty_list_is_zero_like_torch():
    assert float(torch.nn.utils.clip_grad_norm_([], 1.0)) == 0.0
    total = clip_grad_norm_([], 1.0, device="cpu")
    assert total.numpy().tolist() == [0.0]


def test_error_if_nonfinite_raises_like_torch_and_leaves_the_gradients():
    grads = make_grads("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(torch_params(grads), 1.0, error_if_nonfinite=True)
    arrays = to_warp(grads)
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(arrays, 1.0, error_if_nonfinite=True)
    assert_same(warp_values(arrays), grads, rtol=0.0)


@pytest.mark.parametrize("clip_value", [0.0, 0.5, 100.0])
@pytest.mark.parametrize("kind", ["random", "nan_and_inf", "zero"])
def test_clip_grad_value_matches_torch(kind, clip_value):
    grads = make_grads(kind)
    arrays = to_warp(grads)
    clip_grad_value_(arrays, clip_value)
    params = torch_params(grads)
    torch.nn.utils.clip_grad_value_(params, clip_value, foreach=True)
    assert_same(warp_values(arrays), [p.grad.numpy() for p in params], rtol=0.0)
    clip_grad_value_([], clip_value)  # an empty list is a no-op, as in torch


def test_clip_grad_norm_is_four_launches_whatever_the_number_of_arrays(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("host round trip")

    counts = []
    launches = []
    real_launch = wp.launch
    for n in (1, 16, 64):
        arrays = [wp.ones(10 + i, dtype=wp.float32, device="cpu") for i in range(n)]
        clip_grad_norm_(arrays, 1.0)  # builds and caches the plan (host work, once)
        launches.clear()
        with monkeypatch.context() as m:
            m.setattr(wp, "launch", lambda *a, **k: (launches.append(1), real_launch(*a, **k)))
            m.setattr(wp.array, "numpy", forbidden)
            m.setattr(wp, "synchronize", forbidden)
            clip_grad_norm_(arrays, 1.0)
            clip_grad_value_(arrays, 1.0)
        counts.append(len(launches))
    assert counts == [5, 5, 5]  # norm: zero, reduce, finalize, scale; value: one clamp


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_global_norm_policy_on_the_flat_buffer_matches_torch(norm_type):
    specs = [ParamSpec("a", (300,)), ParamSpec("v", (40,), wp.vec3), ParamSpec("s", (7,), wp.spatial_vector)]
    params = ParamSet(specs, device="cpu")
    grads = make_grads("random", layout=[(s.dtype, s.shape) for s in specs])
    params.grad.assign(np.concatenate([g.ravel() for g in grads]))
    policy = clip_by_global_norm(1.0, norm_type=norm_type)
    state = policy.init(params)
    stats = FlatStats(params)
    stats.compute(params.grad)
    policy.update(params, state, Shared(stats))
    want, want_total = torch_clip(grads, 1.0, norm_type)
    np.testing.assert_allclose(params.grad.numpy(), np.concatenate([w.ravel() for w in want]), rtol=4e-6)
    assert state["coef"].numpy()[0] == pytest.approx(1.0 / (want_total + 1e-6), rel=2e-6)


def test_norm_after_clipping_equals_max_norm_for_every_p():
    for norm_type in NORM_TYPES:
        grads = make_grads("random", seed=7)
        arrays = to_warp(grads)
        clip_grad_norm_(arrays, 1.5, norm_type=norm_type)
        flat = np.concatenate([g.ravel() for g in warp_values(arrays)]).astype(np.float64)
        assert np.linalg.norm(flat, ord=norm_type) == pytest.approx(1.5, rel=2e-6)
