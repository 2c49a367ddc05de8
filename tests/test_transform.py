"""The transformation protocol (harness.transform): one chain over clip policy, schedule,
optimizer and bounds, the non-finite wrappers around it, on a ParamSet without an env."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

from harness import optim, schedules
from harness.clip import (
    ClipPolicy,
    chain_clips,
    clip_by_global_norm,
    clip_by_value,
    error_if_nonfinite,
    skip_if_nonfinite,
    zero_nonfinite,
)
from harness.clip.nonfinite import NonFiniteGradientError
from harness.params import ParamSet, ParamSpec
from harness.stats import FlatStats
from harness.training.step import training_update
from harness.transform import Chain, Shared, chain, project_to_bounds, substate


def make_params() -> ParamSet:
    specs = [ParamSpec("w", (40,), lower=-0.3, upper=0.3), ParamSpec("v", (5,), wp.vec3)]
    return ParamSet(specs, device="cpu")


def grads(size: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [(rng.standard_normal(size) * 4.0).astype(np.float32) for _ in range(count)]


def members():
    return (
        clip_by_global_norm(1.0),
        schedules.cosine_decay(decay_steps=4, warmup_steps=1, clip_aware=True, clip_window=2),
        optim.adam(0.05),
    )


def test_a_chain_prefixes_member_state_and_lets_the_schedule_start_from_the_optimizers_rate():
    params = make_params()
    clip, schedule, optimizer = members()
    update = chain(("clip", clip), ("schedule", schedule), ("optim", optimizer), ("bounds", project_to_bounds()))
    assert isinstance(update, Chain) and update.name == "chain(clip,schedule,optim,bounds)"
    shared = Shared()
    state = update.init(params, shared)
    assert {key.split("/")[0] for key in state} == {"clip", "schedule", "optim"}
    assert substate(state, "schedule")["base_lr"].numpy()[0] == np.float32(0.05)  # the optimizer's, published
    assert shared["clipped"] is state["clip/clipped"] and shared["lr"] is state["optim/lr"]
    with pytest.raises(KeyError, match="no member of this chain publishes 'skip'"):
        shared["skip"]
    with pytest.raises(ValueError, match="distinct"):
        chain(("a", clip), ("a", optimizer))


def test_a_chain_of_clip_policies_alone_is_one_clip_policy():
    policy = chain_clips([clip_by_value(10.0), clip_by_global_norm(1.0)])
    assert isinstance(policy, ClipPolicy) and [r.name for r in policy.rules] == ["value", "global_norm"]
    # the protocol's chain composes any transformations, clip policies too, each with its own state
    assert isinstance(chain(clip_by_value(10.0), ("norm", clip_by_global_norm(1.0))), Chain)


def test_the_chained_update_equals_its_members_applied_by_hand_bit_for_bit():
    """The chain adds nothing to its members: clip, schedule, optimizer and bounds applied one
    after another by hand, with the same shared arrays, give the same parameters and state."""
    runs = []
    for by_hand in (False, True):
        params = make_params()
        clip, schedule, optimizer = members()
        bounds = project_to_bounds()
        update = chain(("clip", clip), ("schedule", schedule), ("optim", optimizer), ("bounds", bounds))
        stats = FlatStats(params)
        shared = Shared(stats)
        if by_hand:
            opt_state = optimizer.init(params, shared)
            schedule_state = schedule.init(params, shared)
            clip_state = clip.init(params, shared)
        else:
            state = update.init(params, shared)
        for g in grads(params.size, 4):
            params.grad.assign(g)
            stats.compute(params.grad)
            if by_hand:
                clip.update(params, clip_state, shared)
                schedule.update(params, schedule_state, shared)
                optimizer.update(params, opt_state, shared)
                bounds.update(params, {}, shared)
            else:
                update.update(params, state, shared)
        if by_hand:
            state = {
                **{f"clip/{k}": v for k, v in clip_state.items()},
                **{f"schedule/{k}": v for k, v in schedule_state.items()},
                **{f"optim/{k}": v for k, v in opt_state.items()},
            }
        runs.append({"params": params.data.numpy(), **{k: v.numpy() for k, v in state.items()}})
    assert runs[0].keys() == runs[1].keys()
    for key in runs[0]:
        np.testing.assert_array_equal(runs[0][key], runs[1][key], err_msg=key)
    assert np.abs(runs[0]["params"][:40]).max() <= 0.3  # the bounds member ran
    assert runs[0]["schedule/reductions"][0] >= 1  # every step clipped: the clip-aware rule read the flag


def test_skip_if_nonfinite_around_the_chain_undoes_a_nan_iteration_for_every_member():
    """Parameters and every state array come back bit for bit, except the clip policy's
    reports of the last update (coef, clipped), which describe the skipped update: not
    clipped, so it does not count as a clipped step."""
    params = make_params()
    update = training_update(*members(), "skip")
    shared = Shared(FlatStats(params))
    state = update.init(params, shared)
    good, later = grads(params.size, 2)
    params.grad.assign(good)
    shared.stats.compute(params.grad)
    update.update(params, state, shared)
    before = {"params": params.data.numpy().copy(), **{k: v.numpy().copy() for k, v in state.items()}}
    bad = later.copy()
    bad[7] = np.nan
    params.grad.assign(bad)
    shared.stats.compute(params.grad)
    update.update(params, state, shared)
    assert state["nonfinite/skip"].numpy()[0] == 1 and state["nonfinite/skipped"].numpy()[0] == 1
    np.testing.assert_array_equal(params.data.numpy(), before["params"])
    assert before["clip/clipped"][0] == 1  # the good iteration was clipped ...
    assert state["clip/clipped"].numpy()[0] == 0  # ... the skipped one reads as not clipped (a report)
    for key, value in state.items():
        if not key.startswith("nonfinite/") and key not in ("clip/coef", "clip/clipped"):
            np.testing.assert_array_equal(value.numpy(), before[key], err_msg=key)
    params.grad.assign(later)
    shared.stats.compute(params.grad)
    update.update(params, state, shared)
    assert state["nonfinite/skip"].numpy()[0] == 0 and state["optim/step"].numpy()[0] == 2


def test_zero_and_error_wrap_any_transformation():
    params = make_params()
    g = grads(params.size, 1)[0]
    g[3], g[50] = np.inf, np.nan
    zeroed = zero_nonfinite(clip_by_value(100.0))
    shared = Shared(FlatStats(params))
    state = zeroed.init(params, shared)
    params.grad.assign(g)
    shared.stats.compute(params.grad)
    zeroed.update(params, state, shared)
    got = params.grad.numpy()
    assert got[3] == 0.0 and got[50] == 0.0 and np.array_equal(got[:3], g[:3])
    assert state["nonfinite/first_param"].numpy()[0] == 0 and state["nonfinite/skip"].numpy()[0] == 0

    stopped = error_if_nonfinite(chain(("optim", optim.sgd(0.1))))
    shared = Shared(FlatStats(params))
    state = stopped.init(params, shared)
    before = params.data.numpy().copy()
    params.grad.assign(g)
    shared.stats.compute(params.grad)
    stopped.update(params, state, shared)
    np.testing.assert_array_equal(params.data.numpy(), before)
    with pytest.raises(NonFiniteGradientError, match=r"iteration 0 in parameter 'w'"):
        stopped.check(params, state)
    with pytest.raises(ValueError, match="already handles non-finite gradients"):
        skip_if_nonfinite(stopped)
