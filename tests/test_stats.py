"""FlatStats and GroupNorms: per-parameter and global statistics, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

from harness.chunks import CHUNK
from harness.params import ParamSet, ParamSpec
from harness.stats import FlatStats, GroupNorms, norm_kind


def make_params(extra: int = 0) -> ParamSet:
    """Scalars, a vec3 parameter, one larger than a chunk, a single scalar, plus ``extra`` small ones."""
    specs = [
        ParamSpec("a", (3,)),
        ParamSpec("v", (50,), wp.vec3),
        ParamSpec("big", (CHUNK * 2 + 17,)),
        ParamSpec("one", (1,)),
    ]
    specs += [ParamSpec(f"x{i}", (5,)) for i in range(extra)]
    return ParamSet(specs, device="cpu")


def put(params: ParamSet, flat: np.ndarray) -> wp.array:
    arr = wp.zeros(params.size, dtype=wp.float32, device=params.device)
    arr.assign(np.asarray(flat, dtype=np.float32))
    return arr


def segment_slices(params: ParamSet) -> list[slice]:
    return [slice(s.offset, s.offset + s.length) for s in params.segments]


def test_norms_and_max_abs_match_numpy_per_parameter_and_globally():
    params = make_params()
    x = np.random.default_rng(0).normal(scale=3.0, size=params.size).astype(np.float32)
    stats = FlatStats(params)
    stats.compute(put(params, x))

    x64 = x.astype(np.float64)
    expected = np.array([np.sum(x64[s] ** 2) for s in segment_slices(params)])
    np.testing.assert_allclose(stats.segment_sumsq.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(stats.segment_norm.numpy(), np.sqrt(expected), rtol=1e-6)
    np.testing.assert_allclose(stats.sumsq.numpy(), [np.sum(x64**2)], rtol=1e-6)
    np.testing.assert_allclose(stats.norm.numpy(), [np.linalg.norm(x64)], rtol=1e-6)
    assert stats.max_abs.numpy()[0] == np.abs(x).max()
    assert stats.nonfinite.numpy()[0] == 0
    assert stats.segment_norm.shape == (params.segment_count,)


def test_statistics_of_a_difference_match_numpy():
    params = make_params()
    rng = np.random.default_rng(1)
    a = rng.normal(size=params.size).astype(np.float32)
    b = rng.normal(size=params.size).astype(np.float32)
    stats = FlatStats(params)
    stats.compute(put(params, a), minus=put(params, b))

    d = (a - b).astype(np.float64)
    expected = [np.linalg.norm(d[s]) for s in segment_slices(params)]
    np.testing.assert_allclose(stats.segment_norm.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(stats.norm.numpy(), [np.linalg.norm(d)], rtol=1e-6)
    assert stats.max_abs.numpy()[0] == np.abs(a - b).max()


def test_recomputing_overwrites_previous_results():
    params = make_params()
    stats = FlatStats(params)
    stats.compute(put(params, np.full(params.size, 100.0)))
    x = np.random.default_rng(2).normal(size=params.size).astype(np.float32)
    stats.compute(put(params, x))
    np.testing.assert_allclose(stats.norm.numpy(), [np.linalg.norm(x.astype(np.float64))], rtol=1e-6)
    assert stats.max_abs.numpy()[0] == np.abs(x).max()


def test_nonfinite_entries_are_counted_and_nan_propagates_into_the_norm():
    params = make_params()
    x = np.ones(params.size, dtype=np.float32)
    big = params.segments[2]
    x[big.offset + CHUNK + 3] = np.nan  # second chunk of "big"
    x[0] = -np.inf  # parameter "a"
    x[5] = -7.0
    stats = FlatStats(params)
    stats.compute(put(params, x))

    seg = stats.segment_norm.numpy()
    assert np.isinf(seg[0])
    assert np.isfinite(seg[1])
    assert np.isnan(seg[2])
    assert np.isnan(stats.norm.numpy()[0])
    assert stats.nonfinite.numpy()[0] == 2
    # max_abs is the largest *finite* magnitude.
    assert stats.max_abs.numpy()[0] == 7.0


def test_inf_entries_give_an_inf_norm():
    params = make_params()
    x = np.ones(params.size, dtype=np.float32)
    x[-1] = np.inf
    stats = FlatStats(params)
    stats.compute(put(params, x))
    assert stats.norm.numpy()[0] == np.inf
    assert stats.nonfinite.numpy()[0] == 1
    assert stats.max_abs.numpy()[0] == 1.0


def test_large_finite_entries_do_not_overflow_the_norm():
    params = make_params()
    x = np.full(params.size, 1e30, dtype=np.float32)  # x**2 overflows float32
    stats = FlatStats(params)
    stats.compute(put(params, x))
    np.testing.assert_allclose(stats.norm.numpy(), [1e30 * np.sqrt(params.size)], rtol=1e-6)
    assert stats.nonfinite.numpy()[0] == 0


def test_launch_count_is_independent_of_parameter_count(monkeypatch):
    launches = []
    real_launch = wp.launch
    monkeypatch.setattr(wp, "launch", lambda *a, **k: (launches.append(1), real_launch(*a, **k)))
    counts = []
    for extra in (0, 20):
        params = make_params(extra)
        stats = FlatStats(params)
        launches.clear()
        stats.compute(params.grad)
        stats.compute(params.data, minus=params.grad)
        counts.append(len(launches))
    assert counts == [6, 6]


def test_compute_makes_no_host_round_trip(monkeypatch):
    params = make_params()
    stats = FlatStats(params)

    def forbidden(*args, **kwargs):
        raise AssertionError("host round trip")

    monkeypatch.setattr(wp.array, "numpy", forbidden)
    monkeypatch.setattr(wp, "synchronize", forbidden)
    stats.compute(params.data, minus=params.grad)


def test_arrays_with_another_layout_are_rejected():
    params = make_params()
    stats = FlatStats(params)
    with pytest.raises(ValueError, match="flat float32 array"):
        stats.compute(wp.zeros(params.size + 1, dtype=wp.float32, device="cpu"))
    with pytest.raises(ValueError, match="minus"):
        stats.compute(params.data, minus=wp.zeros(3, dtype=wp.float32, device="cpu"))


def test_nonfinite_entries_are_counted_per_parameter():
    params = make_params()
    x = np.ones(params.size, dtype=np.float32)
    big = params.segments[2]
    x[big.offset + 1] = np.nan
    x[big.offset + CHUNK + 5] = np.inf  # a second chunk of the same parameter
    x[params.segments[3].offset] = -np.inf
    stats = FlatStats(params)
    stats.compute(put(params, x))
    assert stats.segment_nonfinite.numpy().tolist() == [0, 0, 2, 1]
    stats.compute(put(params, np.ones(params.size)))
    assert stats.segment_nonfinite.numpy().tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("norm_type", [1.0, 2.0, float("inf"), 3.0, 0.5])
def test_group_norms_match_numpy_per_group_and_in_total(norm_type):
    params = make_params()
    x = np.random.default_rng(5).normal(scale=2.0, size=params.size).astype(np.float32)
    data = put(params, x)
    norms = GroupNorms(params.chunks, norm_type=norm_type, device="cpu")
    norms.compute(data.ptr)
    x64 = x.astype(np.float64)
    expected = [np.linalg.norm(x64[s], ord=norm_type) for s in segment_slices(params)]
    np.testing.assert_allclose(norms.group_norm.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(norms.total.numpy(), [np.linalg.norm(x64, ord=norm_type)], rtol=1e-12)


def test_group_norms_propagate_nan_and_inf_like_torch():
    params = make_params()
    x = np.ones(params.size, dtype=np.float32)
    x[0] = np.inf
    x[params.segments[2].offset] = np.nan
    data = put(params, x)
    for norm_type in (2.0, float("inf")):
        norms = GroupNorms(params.chunks, norm_type=norm_type, device="cpu")
        norms.compute(data.ptr)
        g = norms.group_norm.numpy()
        assert np.isinf(g[0]) and np.isfinite(g[1]) and np.isnan(g[2])
        assert np.isnan(norms.total.numpy()[0])


@pytest.mark.parametrize("bad", [0.0, -1.0, "two"])
def test_bad_norm_types_are_rejected(bad):
    with pytest.raises(ValueError, match="norm_type"):
        norm_kind(bad)
