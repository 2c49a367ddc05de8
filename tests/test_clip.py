"""Clip policies on the flat gradient: each rule against its reference definition, the non-finite policy, cost."""

from __future__ import annotations

import hydra.utils
import numpy as np
import pytest
import warp as wp

from harness import build, config
from harness.adjoint import AdjointSettings
from harness.chunks import CHUNK
from harness.clip import (
    NonFiniteGradientError,
    adaptive_grad_clip,
    agc_units,
    autoclip,
    chain_clips,
    clip_by_global_norm,
    clip_by_norm_per_param,
    clip_by_value,
    error_if_nonfinite,
    no_clip,
    skip_if_nonfinite,
    zclip,
    zero_nonfinite,
)
from harness.clip.nonfinite import OWN
from harness.params import ParamSet, ParamSpec
from harness.stats import FlatStats
from harness.transform import Shared
from tests.helpers import compose_run, make_trainer


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
    policy.update(params, state, Shared(stats))
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


@pytest.mark.parametrize(("wrap", "launches"), [(lambda p: p, 1), (skip_if_nonfinite, 3)], ids=["bare", "skip"])
def test_global_norm_update_is_one_launch_without_host_round_trip(monkeypatch, wrap, launches):
    """One scale over the flat gradient; wrapped in skip_if_nonfinite, plus the non-finite
    stage and the guard's restore (its save is memory copies, not launches); nothing read back."""
    expected = launches
    params = make_params()
    policy = wrap(clip_by_global_norm(max_norm=1.0))
    state = policy.init(params)
    stats = FlatStats(params)
    stats.compute(params.grad)
    launches = []
    real_launch = wp.launch

    def forbidden(*args, **kwargs):
        raise AssertionError("host round trip")

    monkeypatch.setattr(wp, "launch", lambda *a, **k: (launches.append(1), real_launch(*a, **k)))
    monkeypatch.setattr(wp.array, "numpy", forbidden)
    monkeypatch.setattr(wp, "synchronize", forbidden)
    policy.update(params, state, Shared(stats))
    assert len(launches) == expected


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_invalid_max_norm_is_rejected(bad):
    with pytest.raises(ValueError, match=r"clip\.max_norm"):
        clip_by_global_norm(max_norm=bad)


def test_policies_instantiate_from_hydra_style_configs():
    policy = hydra.utils.instantiate({"_target_": "harness.clip.clip_by_global_norm", "max_norm": 1.0})
    assert policy.name == "global_norm"
    assert hydra.utils.instantiate({"_target_": "harness.clip.no_clip"}).name == "none"


# --------------------------------------------------------------------------- every policy


def make_policy(name: str, **kw):
    builders = {
        "none": lambda: no_clip(**kw),
        "value": lambda: clip_by_value(0.5, **kw),
        "norm": lambda: clip_by_global_norm(1.0, **kw),
        "norm_p3": lambda: clip_by_global_norm(1.0, norm_type=3, **kw),
        "norm_inf": lambda: clip_by_global_norm(1.0, norm_type="inf", **kw),
        "norm_per_param": lambda: clip_by_norm_per_param(1.0, **kw),
        "agc": lambda: adaptive_grad_clip(0.01, **kw),
        "autoclip": lambda: autoclip(10.0, history=4, **kw),
        "zclip": lambda: zclip(warmup=2, **kw),
        "chain": lambda: chain_clips([clip_by_value(0.5), clip_by_global_norm(1.0)], **kw),
    }
    return builders[name]()


POLICIES = ["none", "value", "norm", "norm_p3", "norm_inf", "norm_per_param", "agc", "autoclip", "zclip", "chain"]


def make_params_with(extra: int) -> ParamSet:
    specs = [ParamSpec("a", (7,)), ParamSpec("m", (5, 4)), ParamSpec("v", (20,), wp.vec3)]
    specs += [ParamSpec(f"x{i}", (3,)) for i in range(extra)]
    return ParamSet(specs, device="cpu")


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_is_a_fixed_number_of_launches_without_host_round_trip(monkeypatch, name):
    """From the first update after init on: no read-back, no allocation (init built every
    table and reducer, so an update can be captured right away), the same launches however
    many parameters."""
    from harness.chunks import ChunkTable
    from harness.stats import GroupNorms

    counts = []
    real_launch = wp.launch
    launches = []

    def forbidden(*args, **kwargs):
        raise AssertionError("host round trip or allocation inside an update")

    for extra in (0, 30):
        params = make_params_with(extra)
        params.grad.assign(random_grad(params.size, 10.0))
        policy = make_policy(name)
        state = policy.init(params)
        stats = FlatStats(params)
        stats.compute(params.grad)
        with monkeypatch.context() as m:
            m.setattr(wp, "launch", lambda *a, **k: (launches.append(1), real_launch(*a, **k)))
            m.setattr(wp.array, "numpy", forbidden)
            m.setattr(wp, "synchronize", forbidden)
            for allocate in ("zeros", "ones", "full", "empty", "clone", "zeros_like"):
                m.setattr(wp, allocate, forbidden)
            for cls in (FlatStats, GroupNorms):
                m.setattr(cls, "__init__", forbidden)
            m.setattr(ChunkTable, "build", forbidden)
            launches.clear()
            policy.update(params, state, Shared(stats))
        counts.append(len(launches))
    assert counts[0] == counts[1] <= 12


@pytest.mark.parametrize("name", ["value", "norm", "norm_p3", "norm_inf", "norm_per_param", "chain"])
def test_clipping_twice_changes_nothing_for_every_stateless_policy(name):
    params = make_params()
    once, _ = clip(params, make_policy(name), random_grad(params.size, 10.0))
    twice, _ = clip(params, make_policy(name), once)
    np.testing.assert_allclose(twice, once, rtol=3e-6, atol=0.0)


def test_value_policy_clamps_passes_nan_and_reports_the_smallest_factor():
    params = make_params()
    grad = random_grad(params.size, 1.0)
    grad[0], grad[1], grad[2], grad[3] = np.nan, np.inf, -np.inf, 4.0
    got, state = clip(params, zero_nonfinite(clip_by_value(0.5)), grad)
    # the zero_nonfinite wrapper runs before the rule: nan/inf became 0.
    assert got[0] == got[1] == got[2] == 0.0
    got, state = clip(params, clip_by_value(0.5), grad)
    want = np.where(np.isnan(grad), grad, np.clip(grad, -0.5, 0.5))
    np.testing.assert_array_equal(got, want)
    assert state["coef"].numpy()[0] == 0.0  # the inf entries: 0.5 / inf
    finite = grad[4:]
    _, state = clip(params, clip_by_value(0.5), np.concatenate([np.zeros(4, np.float32), finite]))
    assert state["coef"].numpy()[0] == pytest.approx(0.5 / np.abs(finite).max(), rel=1e-6)
    assert state["clipped"].numpy()[0] == 1


def test_norm_per_param_gives_each_parameter_the_global_rule():
    params = make_params()
    grad = random_grad(params.size, 10.0)
    grad[:7] *= 1e-3  # parameter "a" stays below the limit
    got, state = clip(params, clip_by_norm_per_param(1.0), grad)
    for k, seg in enumerate(params.segments):
        part = grad[seg.offset : seg.offset + seg.length]
        want, coef = torch_clip_reference(part, 1.0)
        np.testing.assert_allclose(got[seg.offset : seg.offset + seg.length], want, rtol=1e-6)
        assert state["segment_coef"].numpy()[k] == pytest.approx(coef, rel=1e-6)
    assert state["segment_coef"].numpy()[0] == 1.0
    assert state["coef"].numpy()[0] == pytest.approx(state["segment_coef"].numpy().min())


def test_agc_units_follow_the_documented_definition():
    params = ParamSet(
        [ParamSpec("b", (6,)), ParamSpec("w", (3, 4)), ParamSpec("p", (5,), wp.vec3), ParamSpec("s", (1,))],
        device="cpu",
    )
    units = agc_units(params)
    # (6,) -> one unit; (3, 4) -> 3 rows; vec3 (5,) -> 5 vectors; (1,) -> one unit.
    assert [length for _, length in units] == [6, 4, 4, 4, 3, 3, 3, 3, 3, 1]
    starts = [offset for offset, _ in units]
    assert starts == [0, 6, 10, 14, 18, 21, 24, 27, 30, 33]


def test_agc_clips_each_unit_against_its_parameter_norm():
    params = ParamSet([ParamSpec("w", (8, 16)), ParamSpec("b", (8,))], device="cpu")
    rng = np.random.default_rng(3)
    data = rng.normal(size=params.size).astype(np.float32)
    data[16:32] = 0.0  # a zero unit: the eps floor applies
    params.data.assign(data)
    grad = rng.normal(size=params.size).astype(np.float32)
    grad[:64] *= 1e-4  # the first four rows of "w" stay under their limit
    got, state = clip(params, adaptive_grad_clip(0.05, eps=1e-3), grad)
    factors = []
    for offset, length in agc_units(params):
        g = grad[offset : offset + length].astype(np.float64)
        w = data[offset : offset + length].astype(np.float64)
        limit = 0.05 * max(np.linalg.norm(w), 1e-3)
        gn = np.linalg.norm(g)
        factor = limit / max(gn, 1e-6) if gn > limit else 1.0
        factors.append(factor)
        np.testing.assert_allclose(got[offset : offset + length], g * factor, rtol=2e-6, atol=1e-12)
    assert min(factors) < 1.0 and max(factors) == 1.0  # some units clipped, some not
    assert state["coef"].numpy()[0] == pytest.approx(min(factors), rel=1e-6)


def run_scripted_norms(policy, norms: list[float]) -> tuple[list[float], list[float]]:
    """Feed a gradient of each scripted L2 norm; return the post-clip norms and thresholds."""
    params = make_params()
    direction = random_grad(params.size, 1.0)
    direction /= np.linalg.norm(direction.astype(np.float64))
    state = policy.init(params)
    stats = FlatStats(params)
    post, thresholds = [], []
    for n in norms:
        params.grad.assign((direction * n).astype(np.float32))
        stats.compute(params.grad)
        pre = float(stats.norm.numpy()[0])
        policy.update(params, state, Shared(stats))
        post.append(float(np.linalg.norm(params.grad.numpy().astype(np.float64))))
        thresholds.append(float(state["threshold"].numpy()[0]))
        assert pre == pytest.approx(n, rel=1e-5)
    return post, thresholds


SCRIPTED = [1.0, 1.2, 0.9, 1.1, 50.0, 1.0, 0.95, 30.0, 1.05, 1.0, 0.8, 200.0, 1.0]


@pytest.mark.parametrize(("percentile", "history"), [(10.0, 100), (50.0, 100), (90.0, 5)])
def test_autoclip_follows_the_reference_definition(percentile, history):
    post, thresholds = run_scripted_norms(autoclip(percentile, history=history), SCRIPTED)
    # Seetharaman et al. 2020: append the norm, threshold = percentile of the (kept) history,
    # then clip_grad_norm_ with that threshold.
    seen: list[float] = []
    for n, got_post, got_threshold in zip(SCRIPTED, post, thresholds, strict=True):
        seen = [*seen, n][-history:]
        threshold = float(np.percentile(seen, percentile))
        assert got_threshold == pytest.approx(threshold, rel=1e-5)
        assert got_post == pytest.approx(n * min(1.0, threshold / (n + 1e-6)), rel=1e-5)


def zclip_reference(norms, *, alpha=0.97, z_thresh=2.5, eps=1e-6, warmup=25):
    """Kumar et al. 2025 (z-score mode, adaptive scaling), as the authors' reference code behaves."""
    buffer, mean, var, out = [], None, None, []
    for g in norms:
        if mean is None:
            buffer.append(g)
            if len(buffer) >= warmup:
                mean = sum(buffer) / len(buffer)
                var = sum((x - mean) ** 2 for x in buffer) / len(buffer)
            out.append(g)
            continue
        std = var**0.5
        z = (g - mean) / (std + eps)
        clip_val = mean + z_thresh * std / (z / z_thresh) if z > z_thresh else None
        limit = clip_val if clip_val is not None else g
        out.append(g * (limit / (g + 1e-6)) if g > limit else g)
        seen = clip_val if clip_val is not None else g
        mean = alpha * mean + (1 - alpha) * seen
        var = alpha * var + (1 - alpha) * (seen - mean) ** 2
    return out


def test_zclip_follows_the_reference_definition():
    norms = [1.0 + 0.1 * np.sin(i) for i in range(30)] + [10.0, 1.0, 1.1, 40.0, 0.9, 1.0, 5.0, 1.0]
    post, _ = run_scripted_norms(zclip(alpha=0.97, z_thresh=2.5, warmup=25), norms)
    want = zclip_reference(norms, warmup=25)
    np.testing.assert_allclose(post, want, rtol=1e-5)
    # No clipping during warmup; the spikes after it are cut far below their size.
    np.testing.assert_allclose(post[:25], norms[:25], rtol=1e-5)
    assert post[30] < 2.0 and post[33] < 2.0


def test_zclip_ema_is_fed_the_clipped_value_not_the_spike():
    norms = [1.0, 1.2, 0.8, 1.0, 100.0]
    policy = zclip(warmup=4)
    params = make_params()
    state = policy.init(params)
    stats = FlatStats(params)
    direction = random_grad(params.size, 1.0)
    direction /= np.linalg.norm(direction.astype(np.float64))
    for n in norms:
        params.grad.assign((direction * n).astype(np.float32))
        stats.compute(params.grad)
        policy.update(params, state, Shared(stats))
    mean0, std0 = 1.0, np.sqrt(np.mean((np.array(norms[:4]) - 1.0) ** 2))
    z = (100.0 - mean0) / (std0 + 1e-6)
    clipped = mean0 + 2.5**2 * std0 / z
    assert state["threshold"].numpy()[0] == pytest.approx(clipped, rel=1e-5)
    assert state["zclip_mean"].numpy()[0] == pytest.approx(0.97 * mean0 + 0.03 * clipped, rel=1e-6)
    assert state["zclip_mean"].numpy()[0] < 1.1  # the spike itself would have moved it to ~4


def test_chain_applies_value_then_norm_in_order():
    params = make_params()
    grad = random_grad(params.size, 10.0)
    got, state = clip(params, chain_clips([clip_by_value(5.0), clip_by_global_norm(1.0)]), grad)
    clamped = np.clip(grad, -5.0, 5.0)
    want, coef = torch_clip_reference(clamped, 1.0)
    np.testing.assert_allclose(got, want, rtol=2e-6)
    assert state["1/coef"].numpy()[0] == pytest.approx(coef, rel=1e-6)
    assert state["coef"].numpy()[0] == pytest.approx(state["0/coef"].numpy()[0] * coef, rel=1e-6)
    assert state["clipped"].numpy()[0] == 1


# --------------------------------------------------------------------------- non-finite policy


def nan_grad(params: ParamSet) -> np.ndarray:
    grad = random_grad(params.size, 10.0)
    seg = params.segments[1]
    grad[seg.offset + 4] = np.nan
    grad[seg.offset + 9] = np.inf
    return grad


def test_zero_policy_replaces_nan_and_inf_by_zero_then_clips_the_rest():
    params = make_params()
    grad = nan_grad(params)
    got, state = clip(params, zero_nonfinite(clip_by_global_norm(1.0)), grad)
    cleaned = np.where(np.isfinite(grad), grad, 0.0).astype(np.float32)
    want, _ = torch_clip_reference(cleaned, 1.0)
    np.testing.assert_allclose(got, want, rtol=2e-6)
    assert state["nonfinite/skip"].numpy()[0] == 0


def test_error_policy_names_the_iteration_and_the_parameter():
    params = make_params()
    policy = error_if_nonfinite(clip_by_global_norm(1.0))
    state = policy.init(params)
    stats = FlatStats(params)
    for it in range(3):
        params.grad.assign(nan_grad(params) if it == 1 else random_grad(params.size, 1.0))
        stats.compute(params.grad)
        policy.update(params, state, Shared(stats))
    assert state["nonfinite/skip"].numpy()[0] == 1  # frozen after the bad iteration until the host stops
    with pytest.raises(NonFiniteGradientError, match=r"iteration 1 in parameter 'v'") as info:
        policy.check(params, state)
    assert (info.value.iteration, info.value.parameter) == (1, "v")


def test_skip_policy_keeps_the_nan_iteration_out_of_autoclip_history():
    params = make_params()
    policy = skip_if_nonfinite(autoclip(50.0, history=8))
    state = policy.init(params)
    stats = FlatStats(params)
    for grad in (random_grad(params.size, 1.0), nan_grad(params), random_grad(params.size, 2.0, seed=1)):
        params.grad.assign(grad)
        stats.compute(params.grad)
        policy.update(params, state, Shared(stats))
    assert state["history_count"].numpy()[0] == 2
    assert np.isfinite(state["threshold"].numpy()[0])


@pytest.mark.parametrize(
    ("factory", "kwargs", "field"),
    [
        (clip_by_value, {"clip_value": -1.0}, "clip_value"),
        (clip_by_global_norm, {"max_norm": 1.0, "norm_type": 0.0}, "norm_type"),
        (adaptive_grad_clip, {"clipping": 0.0}, "clipping"),
        (autoclip, {"percentile": 101.0}, "percentile"),
        (autoclip, {"history": 0}, "history"),
        (zclip, {"alpha": 1.0}, "alpha"),
        (zclip, {"warmup": 0}, "warmup"),
    ],
)
def test_bad_arguments_name_the_field(factory, kwargs, field):
    with pytest.raises(ValueError, match=field):
        factory(**kwargs)


def test_config_wraps_the_bare_policy_and_hands_the_adjoint_settings_to_the_trainer():
    run = build.validate(*compose_run("+env=cartpole", "clip=chain", "clip.nonfinite=zero", "clip.adjoint.max_norm=5"))
    assert run.nonfinite == "zero" and [r.name for r in run.clip.rules] == ["value", "global_norm"]
    assert run.adjoint == AdjointSettings(max_norm=5.0, profile=False) and run.adjoint.active
    assert build.validate(*compose_run("+env=cartpole")).adjoint == AdjointSettings()
    assert not AdjointSettings().active


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"nonfinite": "ignore"}, "clip.nonfinite must be one of skip, zero, error, got 'ignore'"),
        ({"adjoint": {"max_norm": -1.0}}, "clip.adjoint.max_norm must be null or >= 0"),
        ({"adjoint": {"profile": 3}}, "clip.adjoint.profile must be true or false"),
    ],
)
def test_bad_nonfinite_and_adjoint_settings_name_the_field(value, message):
    key, inner = next(iter(value.items()))
    overrides = [f"clip.{key}={inner}"] if key == "nonfinite" else [f"clip.adjoint.{k}={v}" for k, v in inner.items()]
    with pytest.raises(config.ConfigError, match=message):
        build.validate(*compose_run("+env=cartpole", *overrides))


def test_a_policy_is_wrapped_once_and_a_chain_takes_bare_members():
    wrapped = skip_if_nonfinite(clip_by_value(1.0))
    with pytest.raises(ValueError, match="already handles non-finite gradients"):
        zero_nonfinite(wrapped)
    with pytest.raises(ValueError, match=r"clip.policies.1: 'value' is not a bare clip policy"):
        chain_clips([no_clip(), wrapped])
    bare = clip_by_value(1.0)
    assert set(bare.init(make_params())) == {"coef", "clipped"}
    assert set(wrapped.init(make_params())) == {f"nonfinite/{k}" for k in OWN} | {"coef", "clipped"}


def test_trainer_timing_breakdown_has_a_separate_entry_for_statistics_and_clipping():
    """The share itself is a benchmark (scripts/bench_iteration.py), not a timed test."""
    trainer = make_trainer(horizon=20, world_count=1)
    trainer.step.run()
    assert set(trainer.step.timing) >= {"forward", "backward", "grad_stats_clip", "optim"}
    assert all(trainer.step.timing[k] > 0 for k in ("forward", "backward", "grad_stats_clip", "optim"))


@pytest.mark.parametrize("norm_type", [2.0, 3.0, float("inf")])
def test_the_global_norm_policy_and_clip_grad_norm_scale_by_one_rule(norm_type):
    """The policy over the flat buffer and clip_grad_norm_ over the parameter views run one
    scale kernel and one coefficient rule: the same gradients, bit for bit where both reduce
    the same chunks in the same order (p = 3, inf), to float32 rounding for p = 2 (FlatStats
    and GroupNorms sum a chunk in different orders)."""
    from harness.clip import clip_grad_norm_

    params = make_params()
    grad = random_grad(params.size, 3.0, seed=4)
    by_policy, state = clip(params, clip_by_global_norm(0.5, norm_type=norm_type), grad)
    params.grad.assign(grad)
    clip_grad_norm_([params.views[name].grad for name in params.names], 0.5, norm_type)
    by_function = params.grad.numpy()
    assert state["clipped"].numpy()[0] == 1
    if norm_type == 2.0:
        np.testing.assert_allclose(by_policy, by_function, rtol=2e-7, atol=0.0)
    else:
        np.testing.assert_array_equal(by_policy, by_function)


def test_skip_guard_walks_parameters_and_mixed_state_as_one_chunk_table():
    """SkipGuard copies the parameters and int/float optimizer state as 32-bit words over one
    ChunkTable (harness.chunks): a restore under the skip flag brings every bit back, a
    restore without it keeps the step."""
    from harness.clip import SkipGuard

    params = make_params()
    params.data.assign(random_grad(params.size, 1.0, seed=1))
    state = {
        "step": wp.array([7], dtype=wp.int32, device="cpu"),
        "m": wp.array(random_grad(3 * CHUNK + 5, 1.0, seed=2), dtype=wp.float32, device="cpu"),
        "v64": wp.array(np.arange(5, dtype=np.float64) / 3.0, dtype=wp.float64, device="cpu"),
        "lr": 0.1,  # not an array: not covered
    }
    skip = wp.zeros(1, dtype=wp.int32, device="cpu")
    guard = SkipGuard(params, state, skip)
    arrays = [params.data, state["step"], state["m"], state["v64"]]
    assert guard.table.group_count == 4 and guard.table.scalar_count == params.size + 1 + 3 * CHUNK + 5 + 10
    before = [a.numpy().copy() for a in arrays]

    def step() -> None:
        guard.save()
        for a in arrays:
            a.assign(a.numpy() + 1)

    step()
    skip.fill_(1)
    guard.restore()
    for a, b in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(a.numpy(), b)
    step()
    skip.fill_(0)
    guard.restore()
    for a, b in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(a.numpy(), b + 1)
