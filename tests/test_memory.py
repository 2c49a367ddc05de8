"""Segments (memory.segment_steps): a rollout's backward recomputed segment by segment gives
the full tape's gradients bit for bit on the CPU, with the in-backward adjoint clip, with
graph capture, and from the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envs.cartpole import CartpoleEnv
from harness import build, config
from harness.adjoint import AdjointClipper
from harness.config import auto_segment_steps, resolve_segment_steps
from harness.losses import WeightedLoss
from harness.memory import SegmentGraphs, segmented_forward_backward
from harness.tasks import OpenLoop, prepare, segment_bounds
from harness.training.step import taped_rollout, zero_grads
from tests.helpers import UPRIGHT_TERMS, make_trainer, rollout_results, run_harness

HORIZON = 300


def gradients(segment_steps: int | None, *, max_norm: float | None = None, horizon: int = HORIZON) -> dict:
    """Loss, trajectory, parameter and model gradients (and the adjoint profile) of one
    forward + backward at fixed random actions, with the full tape or in segments."""
    kw = {} if segment_steps is None else {"segment_steps": segment_steps}
    env = CartpoleEnv(horizon=horizon, world_count=2, device="cpu", **kw)
    loss, task = WeightedLoss(UPRIGHT_TERMS), OpenLoop()
    params = prepare(env, task, loss, device="cpu")
    params.data.assign(np.random.default_rng(0).normal(size=params.data.shape).astype(np.float32))
    clipper = (
        AdjointClipper(horizon=horizon, world_count=2, max_norm=max_norm, device="cpu")
        if max_norm is not None
        else None
    )
    if segment_steps is None:
        tape, trajectory, total = taped_rollout(env, task, loss, params, adjoint=clipper)
        tape.backward(total)
    else:
        zero_grads(env, loss, params)
        _, trajectory, total = segmented_forward_backward(env, task, loss, params, adjoint=clipper)
    found = rollout_results(env, params, trajectory, total)
    if clipper is not None:
        found["adjoint profile"] = clipper.sumsq.numpy().copy()
        found["adjoint rescaled"] = clipper.rescaled.numpy().copy()
    return found


def assert_same(expected: dict, got: dict) -> None:
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.fixture(scope="module")
def full_tape() -> dict:
    return gradients(None)


@pytest.mark.parametrize("segment_steps", [7, 64, 299, HORIZON])
def test_segmented_gradients_are_the_full_tapes_bit_for_bit(full_tape, segment_steps):
    """Segments that do not divide the horizon (7, 64, 299) and one segment for all of it."""
    assert np.abs(full_tape["parameter gradient"]).max() > 0
    assert_same(full_tape, gradients(segment_steps))


def test_adjoint_clip_and_profile_across_segment_boundaries_match_the_full_tape():
    """The in-backward clip acts at most steps (a threshold far below the adjoint norms):
    the rescaled gradient and the per-step profile are the full tape's, also at the steps
    on either side of a segment boundary."""
    expected = gradients(None, max_norm=1e-3, horizon=200)
    assert expected["adjoint rescaled"][0] == 1.0
    assert_same(expected, gradients(30, max_norm=1e-3, horizon=200))
    unclipped = gradients(None, horizon=200)["parameter gradient"]
    assert not np.array_equal(unclipped, expected["parameter gradient"])  # the clip did change the gradient


def test_captured_segmented_training_matches_eager_full_tape_training():
    """Four iterations: segments of 9 steps replayed from one captured graph against the
    full tape run eagerly; every logged loss and the final parameters are equal."""
    runs = {}
    for name, kw in (("full", {"capture": False}), ("segments", {"capture": True, "segment_steps": 9})):
        trainer = make_trainer(horizon=40, world_count=2, iterations=4, log_every=4, **kw)
        trainer.step.set_iteration(0)
        for it in range(4):
            if name == "segments" and it == 1:
                trainer.step.capture()
            trainer.step.run()
        assert (trainer.step.graph is not None) == (name == "segments")
        runs[name] = (trainer.step.read_rows(0, 3), trainer.params.data.numpy().copy())
    np.testing.assert_array_equal(runs["segments"][0], runs["full"][0])
    np.testing.assert_array_equal(runs["segments"][1], runs["full"][1])


def test_segment_bounds_and_auto():
    assert segment_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert segment_bounds(10, None) == [(0, 10)]
    assert auto_segment_steps(10_000) == 100 and auto_segment_steps(1) == 1
    assert resolve_segment_steps("auto", 300) == 17 and resolve_segment_steps(None, 300) is None
    for bad in (0, -3, 301, "often", 2.5, True):
        with pytest.raises(ValueError, match=r"^memory\.segment_steps: "):
            resolve_segment_steps(bad, 300)


def test_a_state_outside_the_current_segment_is_refused():
    env = CartpoleEnv(horizon=10, world_count=1, device="cpu", segment_steps=4)
    env.begin_segment(4, restore=False)
    assert env.state(8) is env.states[4]
    with pytest.raises(IndexError, match="outside the current segment"):
        env.state(3)
    # One tape over a segmented rollout would read States overwritten by later segments.
    loss, task = WeightedLoss(UPRIGHT_TERMS), OpenLoop()
    params = prepare(env, task, loss, device="cpu")
    with pytest.raises(ValueError, match="runs in segments of 4 steps"):
        taped_rollout(env, task, loss, params)


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_command_line_training_with_segments_logs_the_same_losses(tmp_path):
    """`memory.segment_steps=auto` from the command line: the same summary losses as the full tape."""
    common = ["+env=cartpole", "env.horizon=30", "env.world_count=1", "iterations=3", "log_every=3", "device=cpu"]
    found = {}
    for name, extra in (("full", []), ("auto", ["memory.segment_steps=auto"])):
        proc = run_harness("train", *common, *extra, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        found[name] = json.loads((tmp_path / name / "summary.json").read_text())
    for key in ("initial_loss", "final_loss", "best_loss"):
        assert found["auto"][key] == found["full"][key], key
    assert found["auto"]["segment_steps"] == 5 and found["full"]["segment_steps"] is None  # round(sqrt(30))


def test_model_gradients_accumulate_over_segments_like_the_full_tape():
    """The cartpole's model arrays that carry a gradient (masses, inertias, joint
    properties) receive it from every step: compared above key by key; here: some are non-zero."""
    got = gradients(17, horizon=60)
    model = [k for k in got if k.startswith("model.")]
    assert model and any(got[k].size and np.abs(got[k]).max() > 0 for k in model), model


def port_gradients(name: str, extra: list[str], horizon: int) -> list[dict]:
    """One forward + backward of a Newton port at its defaults (short horizon), through the
    config as the command line builds it; full tape or segments (``extra``). In segments, also
    the same replayed twice from the segment graphs (captured after the eager pass)."""
    cfg, choices = config.compose_config("train", [f"+env={name}", f"env.horizon={horizon}", "device=cpu", *extra])
    run = build.build_run(cfg, choices)
    env, task, loss = run.env, run.task, run.loss
    params = prepare(env, task, loss, device="cpu")

    def results(trajectory, total) -> dict:
        found = {"loss": total.numpy(), "parameter gradient": params.grad.numpy()}
        found.update({f"observable {k}": v.numpy() for k, v in trajectory.items()})
        return {k: np.array(v, copy=True) for k, v in found.items()}

    if env.segment_steps is None:
        tape, trajectory, total = taped_rollout(env, task, loss, params)
        tape.backward(total)
        return [results(trajectory, total)]
    zero_grads(env, loss, params, task)
    _, trajectory, total = segmented_forward_backward(env, task, loss, params)
    found = [results(trajectory, total)]
    graphs = SegmentGraphs(env, task, loss, params)
    assert len(graphs.graphs) == 6  # the env reads the step from the device: one graph per kind of segment
    for _ in range(2):
        zero_grads(env, loss, params, task)
        graphs.launch()
    return [*found, results(graphs.trajectory, graphs.total)]


@pytest.mark.parametrize(
    ("name", "horizon", "segment_steps"),
    # horizons long enough for a non-zero gradient (the soft body reaches the wall late)
    [
        ("ball", 20, 6),
        ("cloth", 20, 6),
        ("spring_cage", 30, 7),
        pytest.param("soft_body", 300, 70, marks=pytest.mark.slow),
    ],
)
def test_newton_ports_give_the_full_tapes_gradients_in_segments_and_segment_graphs(name, horizon, segment_steps):
    (expected,) = port_gradients(name, [], horizon)
    assert np.abs(expected["parameter gradient"]).max() > 0
    eager, graphs = port_gradients(name, [f"memory.segment_steps={segment_steps}"], horizon)
    assert_same(expected, eager)
    assert_same(expected, graphs)
