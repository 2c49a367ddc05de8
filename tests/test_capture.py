"""One captured graph per iteration: bit-identical to eager on the CPU for every clip policy,
optimizer, schedule, adjoint setting and non-finite policy; auto/true/false; the env contract."""

from __future__ import annotations

import json

import numpy as np
import pytest
import warp as wp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envs.cartpole import CartpoleEnv
from harness import clip as clips
from harness import optim, schedules
from harness.clip import NonFiniteGradientError
from harness.losses import WeightedLoss
from harness.training import CaptureError, Trainer, TrainingDiverged, TrainSettings
from harness.training.step import check_capture
from tests.helpers import DEVICES, UPRIGHT_TERMS, EagerOnlyCartpole, exact_on, make_trainer, run_harness

TIMING_FREE = ("wall_time_s", "timing_s")
"""summary.json entries that measure time, so differ between any two runs."""


def scalars(run_dir) -> dict[str, list[tuple[int, bytes]]]:
    """Every scalar curve except the perf/* timings, as (step, bit pattern of the value) pairs."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        tag: [(e.step, np.float64(e.value).tobytes()) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
        if not tag.startswith("perf/")
    }


def fit(tmp_path, name: str, capture: bool, **kw) -> tuple[Trainer, dict, Exception | None]:
    """A 7-iteration run (log every 3) of the 8-step, 2-world cartpole; returns trainer, summary
    (also that of a diverged run), error."""
    kw.setdefault("horizon", 8)
    trainer = make_trainer(iterations=7, log_every=3, capture=capture, **kw)
    try:
        summary = trainer.fit(tmp_path / name)
        error = None
    except NonFiniteGradientError as exc:
        summary, error = None, exc
    except TrainingDiverged as exc:
        summary, error = exc.summary, exc
    return trainer, summary, error


def assert_same_run(tmp_path, *, rtol: float = 0.0, **kw) -> tuple[Trainer, dict]:
    """Capture off and on give the same parameters, state, TensorBoard scalars and summary:
    bit for bit (``rtol=0``), or within ``rtol`` where float atomics may sum in any order."""
    eager, summary_e, error_e = fit(tmp_path, "eager", False, **kw)
    graph, summary_g, error_g = fit(tmp_path, "graph", True, **kw)
    assert eager.step.graph is None and graph.step.graph is not None
    assert graph.step.timing["graph"] > 0.0  # later iterations really were replays
    for key, array in eager.state.arrays().items():  # parameters and every transformation's state
        if rtol:
            np.testing.assert_allclose(array.numpy(), graph.state.arrays()[key].numpy(), rtol=rtol, err_msg=key)
        else:
            np.testing.assert_array_equal(array.numpy(), graph.state.arrays()[key].numpy(), err_msg=key)
    if rtol:
        return graph, summary_g
    assert scalars(tmp_path / "eager") == scalars(tmp_path / "graph")
    assert str(error_e) == str(error_g)
    if summary_e is not None:
        for key in TIMING_FREE:
            summary_e.pop(key), summary_g.pop(key)
        assert json.dumps(summary_e, sort_keys=True) == json.dumps(summary_g, sort_keys=True)
    return graph, summary_g


TIGHT = 1e-5
"""A threshold far below the 8-step rollout's gradient norm, so every policy clips."""

CLIPS = {
    "none": lambda: clips.no_clip(),
    "value": lambda: clips.clip_by_value(1e-7),
    "norm": lambda: clips.clip_by_global_norm(TIGHT),
    "norm_inf": lambda: clips.clip_by_global_norm(1e-7, norm_type="inf"),
    "norm_per_param": lambda: clips.clip_by_norm_per_param(TIGHT, norm_type=1.0),
    "agc": lambda: clips.adaptive_grad_clip(1e-3),
    "autoclip": lambda: clips.autoclip(10.0, history=4),
    "zclip": lambda: clips.zclip(warmup=2, z_thresh=0.1, max_norm=1e-3),
    "chain": lambda: clips.chain_clips([clips.clip_by_value(1e-6), clips.clip_by_global_norm(TIGHT)]),
}


@pytest.mark.parametrize("name", list(CLIPS))
def test_captured_run_matches_eager_for_every_clip_policy(tmp_path, name):
    _, summary = assert_same_run(tmp_path, clip=CLIPS[name]())
    if name != "none":
        assert summary["clipped_steps"] > 0  # the policy acted, so the comparison covers its state


OPTIMIZERS = {
    "sgd": lambda: optim.sgd(0.5, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda: optim.adam(0.5, amsgrad=True),
    "adamw": lambda: optim.adamw(0.5, weight_decay=0.1),
    "sgd_schedulefree": lambda: optim.sgd_schedulefree(300.0, warmup_steps=2),
    "adamw_schedulefree": lambda: optim.adamw_schedulefree(0.5, warmup_steps=2),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_captured_run_matches_eager_for_every_optimizer(tmp_path, name):
    assert_same_run(tmp_path, optimizer=OPTIMIZERS[name]())


SCHEDULES = {
    "linear_warmup": lambda: schedules.linear_warmup(3, start_factor=0.2),
    "cosine": lambda: schedules.cosine_decay(decay_steps=5, min_factor=0.1, warmup_steps=1),
    "step": lambda: schedules.step_decay(step_size=2, gamma=0.5),
    "clip_aware": lambda: schedules.constant(clip_aware=True, clip_window=2, clip_fraction=0.4),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_captured_run_matches_eager_for_every_schedule(tmp_path, name):
    _, summary = assert_same_run(tmp_path, schedule=SCHEDULES[name](), max_norm=TIGHT)
    if name == "clip_aware":
        assert summary["lr_reductions"] > 0  # the rule fired inside the graph


@pytest.mark.parametrize("adjoint", [{"max_norm": 1e-4}, {"max_norm": None, "profile": True}])
def test_captured_run_matches_eager_with_in_backward_adjoint_clipping(tmp_path, adjoint):
    graph, _ = assert_same_run(tmp_path, clip=clips.clip_by_global_norm(1.0), adjoint=adjoint)
    assert graph.step.adjoint.profile().max() > 0.0


@pytest.mark.parametrize("nonfinite", ["skip", "zero", "error"])
def test_captured_run_matches_eager_under_every_nonfinite_policy(tmp_path, nonfinite):
    """SGD at 1e30 blows the simulation up after the first update: later gradients are nan
    (and the run ends diverged, its final loss nan)."""
    _graph, summary = assert_same_run(
        tmp_path, optimizer=optim.sgd(1e30), clip=clips.with_nonfinite(clips.no_clip(), nonfinite)
    )
    if nonfinite == "error":
        assert summary is None  # both raised, naming the same iteration and parameter
    else:
        assert summary["nonfinite_steps"] > 0 and summary["status"] == "diverged"


def test_auto_runs_eagerly_and_says_why_when_the_env_is_not_capturable(tmp_path, capsys):
    env = EagerOnlyCartpole(horizon=8, world_count=1, device="cpu")
    settings = TrainSettings(iterations=3, log_every=3, device="cpu", capture="auto")
    trainer = Trainer(env, WeightedLoss(UPRIGHT_TERMS), optim.adam(0.1), clips.no_clip(), settings)
    trainer.fit(tmp_path)
    assert trainer.step.graph is None
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("capture:")]
    assert lines == [
        "capture: off, every iteration runs eagerly: env 'cartpole_eager' is not capturable: "
        "a test env that declares itself eager-only"
    ]


def test_true_refuses_an_env_that_is_not_capturable():
    env = EagerOnlyCartpole(horizon=8, world_count=1, device="cpu")
    settings = TrainSettings(iterations=3, log_every=3, device="cpu", capture=True)
    with pytest.raises(CaptureError, match="capture: cannot capture this run: env 'cartpole_eager'"):
        Trainer(env, WeightedLoss(UPRIGHT_TERMS), optim.adam(0.1), clips.no_clip(), settings)


def test_capture_true_on_the_command_line_refuses_in_one_line_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_harness(
        "train", "+env=cartpole", "env._target_=tests.helpers.EagerOnlyCartpole", "capture=true",
        f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: capture: env 'cartpole_eager' cannot be captured")
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()


def test_a_bad_capture_value_is_refused(tmp_path):
    proc = run_harness("train", "+env=cartpole", "capture=sometimes", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "capture: expected auto, true or false, got 'sometimes'" in proc.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_captured_run_matches_eager_on_every_device(tmp_path, device):
    assert_same_run(
        tmp_path,
        device=device,
        rtol=0.0 if exact_on(device) else 1e-4,
        clip=clips.clip_by_global_norm(TIGHT),
        adjoint={"max_norm": 1e-3},
        schedule=schedules.cosine_decay(decay_steps=7, warmup_steps=2),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_check_capture_passes_for_the_cartpole_rollout(device):
    env = CartpoleEnv(horizon=12, world_count=2, device=device)
    check_capture(env, WeightedLoss(UPRIGHT_TERMS), rtol=0.0 if exact_on(device) else 1e-5)


@wp.kernel
def _push_pole(joint_f: wp.array(dtype=wp.float32), push: float):
    joint_f[1] = push


class HostRead(CartpoleEnv):
    """Breaks the contract on purpose: reads the first action on the host and hands it to a
    kernel as a Python number, which a capture freezes at the value it had when recorded."""

    def act(self, t, actions):
        super().act(t, actions)
        if t == 0:
            push = float(actions.numpy()[0, 0, 0])
            wp.launch(_push_pole, dim=1, inputs=[self.joint_f[0], push], device=self.device)


def test_check_capture_catches_a_rollout_that_reads_the_host():
    env = HostRead(horizon=12, world_count=2, device="cpu")
    with pytest.raises(AssertionError, match="replayed graph differs from an eager run"):
        check_capture(env, WeightedLoss(UPRIGHT_TERMS))
