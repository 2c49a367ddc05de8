"""Learning-rate schedules against torch.optim.lr_scheduler, and the clip-aware rule.

Tolerance of the torch comparisons: relative 1e-6. Both sides evaluate the same closed
forms in float64 (torch partly recursively, a relative drift near 1e-15), then ours is
stored as the float32 device rate: a relative rounding of at most 6e-8.
"""

from __future__ import annotations

import hydra.utils
import numpy as np
import pytest
import torch
import warp as wp
from hydra import compose, initialize_config_dir

from harness import config
from harness.clip import clip_by_global_norm
from harness.optim import build, load_state, save_state
from harness.params import ParamSet, ParamSpec
from harness.schedules import SCHEDULES, Schedule, constant, cosine_decay, linear_decay, linear_warmup, step_decay
from harness.stats import FlatStats
from harness.transform import Shared
from tests.test_optim import LaunchRecorder

BASE_LR = 0.5


def shared_of(opt_state: dict, clipped=None) -> Shared:
    """What a schedule reads and writes in the trainer's chain: the optimizer's ``lr`` and
    ``step`` and, when given, the clip policy's ``clipped`` flag."""
    arrays = {"lr": opt_state["lr"], "step": opt_state["step"]}
    if clipped is not None:
        arrays["clipped"] = clipped
    return Shared(**arrays)


def device_rates(schedule: Schedule, steps: int, clipped_flags: list[int] | None = None) -> list[float]:
    """The rate each optimizer step used, read back after the step."""
    params = [wp.zeros(3, dtype=wp.float32, device="cpu")]
    grads = [wp.zeros(3, dtype=wp.float32, device="cpu")]
    opt = build("sgd", lr=BASE_LR)
    opt_state = opt.init(params)
    state = schedule.init(None, shared_of(opt_state))
    clipped = wp.zeros(1, dtype=wp.int32, device="cpu")
    rates = []
    for k in range(steps):
        if clipped_flags is not None:
            clipped.fill_(clipped_flags[k])
        schedule.update(None, state, shared_of(opt_state, clipped if clipped_flags is not None else None))
        opt.step(params, grads, opt_state)
        rates.append(float(opt_state["lr"].numpy()[0]))
    return rates


def torch_rates(make_scheduler, steps: int) -> list[float]:
    tensor = torch.zeros(3, requires_grad=True)
    opt = torch.optim.SGD([tensor], lr=BASE_LR)
    scheduler = make_scheduler(opt)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        tensor.grad = torch.zeros(3)
        opt.step()
        scheduler.step()
    return rates


lr_scheduler = torch.optim.lr_scheduler


@pytest.mark.parametrize(
    ("schedule", "make_scheduler", "steps"),
    [
        (constant(), lambda o: lr_scheduler.ConstantLR(o, factor=1.0), 30),
        (linear_warmup(10, start_factor=0.1), lambda o: lr_scheduler.LinearLR(o, 0.1, 1.0, total_iters=10), 30),
        (cosine_decay(50, min_factor=0.1), lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=50, eta_min=0.05), 51),
        (step_decay(7, gamma=0.5), lambda o: lr_scheduler.StepLR(o, step_size=7, gamma=0.5), 40),
        (linear_decay(30, min_factor=0.01), lambda o: lr_scheduler.LinearLR(o, 1.0, 0.01, total_iters=30), 40),
        (
            cosine_decay(40, warmup_steps=10, start_factor=0.2),
            lambda o: lr_scheduler.SequentialLR(
                o,
                [lr_scheduler.LinearLR(o, 0.2, 1.0, total_iters=10), lr_scheduler.CosineAnnealingLR(o, T_max=40)],
                milestones=[10],
            ),
            50,
        ),
        (
            step_decay(5, gamma=0.1, warmup_steps=4, start_factor=0.5),
            lambda o: lr_scheduler.SequentialLR(
                o,
                [lr_scheduler.LinearLR(o, 0.5, 1.0, total_iters=4), lr_scheduler.StepLR(o, step_size=5, gamma=0.1)],
                milestones=[4],
            ),
            20,
        ),
    ],
    ids=["constant", "linear_warmup", "cosine", "step", "linear_decay", "warmup_cosine", "warmup_step"],
)
def test_schedule_matches_torch_lr_scheduler(schedule, make_scheduler, steps):
    np.testing.assert_allclose(device_rates(schedule, steps), torch_rates(make_scheduler, steps), rtol=1e-6)


def test_cosine_holds_its_final_rate_after_decay_steps():
    rates = device_rates(cosine_decay(10, min_factor=0.2), 25)
    assert rates[10] == pytest.approx(0.2 * BASE_LR, rel=1e-6)
    assert rates[10:] == [rates[10]] * 15


def test_clip_aware_rule_fires_only_above_the_fraction_of_a_full_window():
    schedule = constant(clip_aware=True, clip_window=4, clip_fraction=0.5, clip_factor=0.5, clip_min_scale=0.3)
    # Steps 0-3 fill the window with 2 of 4 clipped (not more than half); steps 4, 5 replace
    # a clipped step by a clipped one; step 6 makes it 3 of 4: fire, empty the window.
    # Steps 7-9 cannot fire (window not full), step 10 fills it with 4 of 4: fire again,
    # 0.5 * 0.5 = 0.25 is held at the floor 0.3.
    flags = [1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0]
    rates = device_rates(schedule, len(flags), flags)
    expected_scale = [1.0] * 6 + [0.5] * 4 + [0.3] * 2
    np.testing.assert_allclose(rates, [BASE_LR * s for s in expected_scale], rtol=1e-6)


def test_clip_aware_rule_reports_its_firings_for_the_log():
    schedule = constant(clip_aware=True, clip_window=3, clip_fraction=0.5)
    params = [wp.zeros(2, dtype=wp.float32, device="cpu")]
    opt = build("adam", lr=0.1)
    opt_state = opt.init(params)
    state = schedule.init(None, shared_of(opt_state))
    assert schedule.read_reductions(state) == (0, None)
    always = wp.ones(1, dtype=wp.int32, device="cpu")
    for _ in range(7):
        schedule.update(None, state, shared_of(opt_state, always))
        opt.step(params, [wp.zeros(2, dtype=wp.float32, device="cpu")], opt_state)
    count, message = schedule.read_reductions(state)
    assert count == 2
    assert message == (
        "clip-aware schedule: lr scale lowered to 0.25 at step 5: 3 of the last 3 steps were clipped "
        "(more than 50%); 2 reduction(s) so far"
    )
    assert schedule.scalars(state)["optim/lr_scale"].numpy()[0] == 0.25


@pytest.mark.parametrize(("max_norm", "reductions"), [(1e-3, 1), (1e3, 0)])
def test_clip_aware_rule_follows_the_clip_policys_flag(max_norm, reductions):
    """The real chain: pre-clip statistics, clip, schedule, step, as the trainer runs it."""
    params = ParamSet([ParamSpec("w", (8,), init=np.ones(8))], device="cpu")
    stats, clip = FlatStats(params), clip_by_global_norm(max_norm)
    clip_state = clip.init(params)
    opt = build("sgd", lr=0.1)
    opt_state = opt.init(params)
    schedule = constant(clip_aware=True, clip_window=5, clip_fraction=0.8)
    state = schedule.init(None, shared_of(opt_state))
    for _ in range(5):
        params.grad.fill_(1.0)
        stats.compute(params.grad)
        clip.update(params, clip_state, Shared(stats))
        schedule.update(None, state, shared_of(opt_state, clip_state["clipped"]))
        opt.step(params, params.grad, opt_state)
    assert schedule.read_reductions(state)[0] == reductions
    assert opt_state["lr"].numpy()[0] == pytest.approx(0.1 * 0.5**reductions)


def test_clip_aware_rule_needs_the_clipped_flag():
    opt_state = build("sgd").init([wp.zeros(2, dtype=wp.float32, device="cpu")])
    schedule = constant(clip_aware=True)
    with pytest.raises(ValueError, match="needs the clip state's 'clipped' flag"):
        schedule.update(None, schedule.init(None, shared_of(opt_state)), shared_of(opt_state))


def test_update_is_one_single_thread_launch_with_the_same_arguments_every_step(monkeypatch):
    params = [wp.zeros(2, dtype=wp.float32, device="cpu")]
    opt_state = build("sgd").init(params)
    schedule = cosine_decay(10, warmup_steps=2, clip_aware=True)
    state = schedule.init(None, shared_of(opt_state))
    clipped = wp.zeros(1, dtype=wp.int32, device="cpu")
    recorder = LaunchRecorder(monkeypatch)
    per_step = []
    for _ in range(3):
        recorder.calls.clear()
        schedule.update(None, state, shared_of(opt_state, clipped))
        per_step.append(list(recorder.calls))
    assert [dim for _, dim, _ in per_step[0]] == [1]
    assert per_step[1] == per_step[0] == per_step[2]


def test_save_load_continue_with_a_schedule_gives_the_same_rates_as_never_stopping():
    schedule = cosine_decay(20, warmup_steps=3, clip_aware=True, clip_window=3)
    flags = [1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1]
    straight = device_rates(schedule, len(flags), flags)

    def run(opt_state, state, params, flags_part):
        clipped = wp.zeros(1, dtype=wp.int32, device="cpu")
        rates = []
        for flag in flags_part:
            clipped.fill_(flag)
            schedule.update(None, state, shared_of(opt_state, clipped))
            opt.step(params, [wp.zeros(3, dtype=wp.float32, device="cpu")], opt_state)
            rates.append(float(opt_state["lr"].numpy()[0]))
        return rates

    opt = build("sgd", lr=BASE_LR)
    params = [wp.zeros(3, dtype=wp.float32, device="cpu")]
    opt_state = opt.init(params)
    state = schedule.init(None, shared_of(opt_state))
    first = run(opt_state, state, params, flags[:8])
    saved = save_state(opt_state), save_state(state)

    fresh_opt_state = opt.init(params)
    fresh_state = schedule.init(None, shared_of(fresh_opt_state))
    load_state(fresh_opt_state, saved[0])
    load_state(fresh_state, saved[1])
    assert first + run(fresh_opt_state, fresh_state, params, flags[8:]) == straight


@pytest.mark.parametrize(
    ("factory", "kwargs", "field"),
    [
        (linear_warmup, {"warmup_steps": -1}, "warmup_steps"),
        (linear_warmup, {"start_factor": 1.5}, "start_factor"),
        (cosine_decay, {"decay_steps": 0}, "decay_steps"),
        (cosine_decay, {"decay_steps": 10, "min_factor": -0.1}, "min_factor"),
        (step_decay, {"step_size": 2.5}, "step_size"),
        (step_decay, {"step_size": 5, "gamma": 0.0}, "gamma"),
        (constant, {"clip_aware": "on"}, "clip_aware"),
        (constant, {"clip_window": 0}, "clip_window"),
        (constant, {"clip_fraction": 1.0}, "clip_fraction"),
        (constant, {"clip_factor": 0.0}, "clip_factor"),
        (constant, {"clip_min_scale": 2.0}, "clip_min_scale"),
        (constant, {"patience": 3}, "patience"),
    ],
)
def test_invalid_fields_are_rejected_naming_the_field(factory, kwargs, field):
    with pytest.raises(ValueError, match=rf"^schedule(\.{field}: must be|: unknown field .{field}.)"):
        factory(**kwargs)


def schedule_option(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(config.CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"schedule={name}", *overrides])
    return hydra.utils.instantiate(cfg.schedule, _convert_="all")


def test_schedule_options_are_exactly_the_factories():
    assert sorted(SCHEDULES) == config.available("schedule")


@pytest.mark.parametrize("name", config.available("schedule"))
def test_config_option_builds_the_schedule_of_that_name(name):
    schedule = schedule_option(name, "schedule.clip_aware=true")
    assert isinstance(schedule, Schedule)
    assert schedule.name == name
    assert schedule.clip_aware


def test_cosine_option_decays_over_the_runs_iterations():
    assert schedule_option("cosine_decay", "iterations=37").hyperparameters["decay_steps"] == 37
