"""Segments under graph capture (harness.memory.SegmentGraphs): one segment's graph serves every
segment, the number of graphs does not grow with the horizon, and the gradients are the eager
segments' bit for bit on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from envs.cartpole import CartpoleEnv
from harness import build, config
from harness.losses import WeightedLoss
from harness.memory import SegmentGraphs, segment_graph_blocker, segmented_forward_backward
from harness.tasks import OpenLoop, Policy, TrainQuantities, prepare
from harness.training.step import zero_grads
from tests.helpers import UPRIGHT_TERMS, make_trainer, rollout_results


def gradients(task, *, horizon: int, segment_steps: int, graphs: bool) -> dict:
    """Loss, observables, parameter and model gradients of two forward + backward passes at
    fixed random parameters, eagerly or replayed from the segment graphs (captured after an
    eager pass, as the trainer does)."""
    env = CartpoleEnv(horizon=horizon, world_count=2, device="cpu", segment_steps=segment_steps)
    loss = WeightedLoss(UPRIGHT_TERMS)
    params = prepare(env, task, loss, device="cpu")
    rng = np.random.default_rng(0)
    params.data.assign((params.data.numpy() * (1.0 + 0.1 * rng.random(params.data.shape))).astype(np.float32))
    if isinstance(task, OpenLoop):
        params.data.assign(rng.normal(size=params.data.shape).astype(np.float32))
    zero_grads(env, loss, params)
    _, trajectory, total = segmented_forward_backward(env, task, loss, params)
    count = None
    if graphs:
        segments = SegmentGraphs(env, task, loss, params)
        count = len(segments.graphs)
        for _ in range(2):  # replayed twice: nothing carries over between replays
            zero_grads(env, loss, params)
            segments.launch()
        trajectory, total = segments.trajectory, segments.total
    return {"graphs": count, **rollout_results(env, params, trajectory, total)}


def assert_same(expected: dict, got: dict) -> None:
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        if name != "graphs":
            assert np.array_equal(got[name], value), name


@pytest.mark.parametrize(
    ("task", "segment_steps"),
    [(OpenLoop(), 6), (TrainQuantities(kind="physical"), 4), (Policy(hidden=[8], action_scale=20.0), 6)],
    ids=["open_loop", "physical", "policy"],  # open loop and policy: a shorter last segment
)
def test_segment_graphs_give_the_eager_segments_gradients_bit_for_bit(task, segment_steps):
    expected = gradients(task, horizon=20, segment_steps=segment_steps, graphs=False)
    got = gradients(task, horizon=20, segment_steps=segment_steps, graphs=True)
    assert np.abs(expected["parameter gradient"]).max() > 0
    assert_same(expected, got)
    assert got["graphs"] == 6  # forward and backward of the first, a middle and the last segment


def captured_trainer(horizon: int, capture: bool, iterations: int = 3):
    trainer = make_trainer(
        horizon=horizon, world_count=2, iterations=iterations, log_every=iterations, capture=capture, segment_steps=5
    )
    step = trainer.step
    step.set_iteration(0)
    for it in range(iterations):
        if capture and it == 1:
            step.capture()
        step.run()
    return trainer


def test_one_segment_graph_serves_every_segment_and_training_matches_eager_segments():
    """Three training iterations, the last two replayed: every logged scalar, the final
    parameters and their last gradient equal eager segmented training bit for bit; 4 and 8
    segments are captured as the same number of graphs."""
    eager, graphs = captured_trainer(20, False), captured_trainer(20, True)
    assert eager.step.graph is None and graphs.step.segment_graphs is not None
    np.testing.assert_array_equal(graphs.step.read_rows(0, 2), eager.step.read_rows(0, 2))
    assert np.array_equal(graphs.params.data.numpy(), eager.params.data.numpy())
    assert np.array_equal(graphs.params.grad.numpy(), eager.params.grad.numpy())
    longer = captured_trainer(40, True, iterations=2)
    assert len(longer.step.segment_graphs.graphs) == len(graphs.step.segment_graphs.graphs) == 6
    assert len(longer.step.segment_graphs.steps) == 2 * 8 + 1  # 8 segments twice, and the loss


def test_what_falls_back_to_one_graph_of_all_segments():
    env = CartpoleEnv(horizon=12, world_count=1, device="cpu", segment_steps=4)
    assert segment_graph_blocker(env, OpenLoop()) is None
    assert "in segments" in segment_graph_blocker(CartpoleEnv(horizon=12, world_count=1, device="cpu"), OpenLoop())
    assert segment_graph_blocker(env, Policy(hidden=[4])) is None

    class OwnRows(OpenLoop):  # a task with its own per-step launches, not declared segment_graph
        def act(self, env, params, t):
            super().act(env, params, t)

    assert "host step" in segment_graph_blocker(env, OwnRows())
    env.segment_graph = False  # an env that does not read the step from the device
    assert "Segmentable.segment_graph" in segment_graph_blocker(env, OpenLoop())
    with pytest.raises(ValueError, match="SegmentGraphs: env 'cartpole'"):
        SegmentGraphs(env, OpenLoop(), WeightedLoss(UPRIGHT_TERMS), None)


@pytest.mark.parametrize("graphs", [True, False], ids=["segment_graphs", "one_graph"])
def test_the_adjoint_clip_in_captured_segments_matches_eager_segments(graphs):
    """The in-backward adjoint clip (a threshold that rescales, and its profile) under capture:
    its profile row is read from the env's device base, so one segment's graph serves every
    segment; with an env that does not read the step from the device the iteration is one
    graph of all segments. Either way the logged rows, the profile, the parameters and their
    gradient equal eager segmented training bit for bit."""
    runs = {}
    for capture in (False, True):
        trainer = make_trainer(
            horizon=20, world_count=2, iterations=3, log_every=3, capture=capture, segment_steps=6,
            adjoint={"max_norm": 1.0e-3},
        )  # fmt: skip
        trainer.env.segment_graph = graphs
        trainer.step.set_iteration(0)
        for it in range(3):
            if capture and it == 1:
                trainer.step.capture()
            trainer.step.run()
        runs[capture] = trainer
    eager, captured = runs[False], runs[True]
    assert (captured.step.segment_graphs is not None) == graphs
    if graphs:
        assert len(captured.step.segment_graphs.graphs) == 6
    profile = eager.step.adjoint.profile()
    assert np.all(profile[:-1] > 0) and np.isfinite(profile).all()  # every step's row was written
    assert eager.step.adjoint.rescaled.numpy()[0] == 1.0  # the threshold did rescale
    np.testing.assert_array_equal(captured.step.adjoint.profile(), profile)
    np.testing.assert_array_equal(captured.step.read_rows(0, 2), eager.step.read_rows(0, 2))
    assert np.array_equal(captured.params.data.numpy(), eager.params.data.numpy())
    assert np.array_equal(captured.params.grad.numpy(), eager.params.grad.numpy())


def test_command_line_training_with_auto_segments_and_capture_auto_takes_the_segment_graphs(tmp_path):
    """``+env=cartpole memory.segment_steps=auto`` (task=open_loop, capture=auto) as the command
    line composes it: the captured iterations replay the segment graphs."""
    cfg, choices = config.compose_config(
        "train",
        ["+env=cartpole", "env.horizon=16", "env.world_count=1", "memory.segment_steps=auto", "iterations=3",
         "log_every=3", "device=cpu"],
    )  # fmt: skip
    run = build.build_run(cfg, choices)
    assert run.settings.capture == "auto" and run.env.segment_steps == 4
    trainer = run.trainer()
    trainer.fit(tmp_path)
    assert trainer.step.graph is not None and trainer.step.segment_graphs is not None
    assert len(trainer.step.segment_graphs.graphs) == 6
