"""The Newton diffsim ports (envs/ball.py, cloth.py, spring_cage.py, soft_body.py).

Newton's own example classes are the oracle: built with ``ViewerNull`` and stepped with
``step()``, their ``loss_history`` is compared with the harness's ``loss/total`` curve,
read back from the run's TensorBoard events, with the example's optimiser given on the
command line (``optim=sgd optim.lr=<the example's> optim.momentum=0 clip=none``). The
default run shortens cloth, soft_body and ball to a few frames (the example's states list
is cut to match); the ``slow`` tests run every example at its own size.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import warp as wp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import checkpoint, config
from harness.build import Run, build_run
from harness.gradcheck import check_gradients
from harness.tasks.base import prepare, rollout
from harness.training.step import check_capture
from tests.helpers import compose_run, run_harness

# name: (the example's learning rate, its substeps per frame, frames in the default run)
PORTS = {
    "ball": (0.02, 8, 36),
    "cloth": (5.0, 16, 4),
    "spring_cage": (0.5, 1, 30),
    "soft_body": (1.0e7, 16, 10),
}
ITERATIONS = 20


def build(*overrides: str) -> Run:
    return build_run(*compose_run(*overrides, "device=cpu"))


def example_loss_history(name: str, iterations: int, frames: int | None, monkeypatch) -> np.ndarray:
    """``loss_history`` of Newton's example after ``iterations`` calls of ``step()``; at
    ``frames`` frames when given (the example's own graph is then not captured, so its
    shortened states list is the one stepped)."""
    import newton.viewer

    module = importlib.import_module(f"newton.examples.diffsim.example_diffsim_{name}")
    args = module.Example.create_parser().parse_args(["--viewer", "null", "--device", "cpu"])
    if frames is not None:
        monkeypatch.setattr(module.Example, "capture", lambda self: setattr(self, "graph", None))
    with wp.ScopedDevice("cpu"):
        example = module.Example(newton.viewer.ViewerNull(num_frames=10**9), args)
        if frames is not None:
            example.sim_steps = frames
            example.states = example.states[: frames * example.sim_substeps + 1]
        for _ in range(iterations):
            example.step()
    return np.asarray(example.loss_history, dtype=np.float64)


def harness_loss_curve(name: str, iterations: int, horizon: int | None, tmp_path) -> np.ndarray:
    lr = PORTS[name][0]
    overrides = [f"+env={name}", "optim=sgd", f"optim.lr={lr}", "optim.momentum=0", "clip=none"]
    overrides += [f"iterations={iterations}", f"log_every={iterations}"]
    if horizon is not None:
        overrides.append(f"env.horizon={horizon}")
    build(*overrides).trainer().fit(tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    return np.asarray([e.value for e in events.Scalars("loss/total")], dtype=np.float64)


def assert_same_curve(ours: np.ndarray, reference: np.ndarray) -> None:
    assert len(ours) == len(reference) == ITERATIONS
    assert reference[-1] < reference[0], "the example's own loss did not fall: nothing is compared"
    np.testing.assert_allclose(ours, reference, rtol=1e-2)


def ports(*slow: str) -> list:
    """The ports as parameters, the ``slow`` ones marked so (default suite time: make test-slow runs them)."""
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name for name in sorted(PORTS)]


@pytest.mark.parametrize("name", ports("soft_body"))
def test_loss_curve_matches_newtons_example(name, tmp_path, monkeypatch):
    _, substeps, frames = PORTS[name]
    reference = example_loss_history(name, ITERATIONS, frames, monkeypatch)
    ours = harness_loss_curve(name, ITERATIONS, frames * substeps, tmp_path)
    assert_same_curve(ours, reference)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PORTS))
def test_loss_curve_matches_newtons_example_at_its_own_size(name, tmp_path, monkeypatch):
    reference = example_loss_history(name, ITERATIONS, None, monkeypatch)
    ours = harness_loss_curve(name, ITERATIONS, None, tmp_path)
    assert_same_curve(ours, reference)


# Gradient checks at short horizons (the default horizons are checked by the slow test and
# in docs/envs.md), with each env's own finite-difference step and tolerance.
SHORT = {"ball": 288, "cloth": 128, "spring_cage": 30, "soft_body": 240}
BROKEN = {
    "ball": ["env.per_step_states=false"],
    "cloth": ["env.per_step_states=false"],
    "spring_cage": ["env.per_step_states=false"],
    "soft_body": ["env.per_step_contacts=false"],
}


def gradcheck(name: str, *overrides: str, horizon: int | None):
    cfg, choices = config.compose_config("gradcheck", [f"+env={name}", "device=cpu", *overrides])
    if horizon is not None:
        cfg.env.horizon = horizon
    run = build_run(cfg, choices)
    tolerance = run.env.config.gradcheck_tolerance()
    result, _ = check_gradients(run.env, run.loss, samples=8, tolerance=tolerance, device="cpu", task=run.task)
    return result


@pytest.mark.parametrize("name", sorted(PORTS))
def test_tape_gradient_matches_central_differences(name):
    result = gradcheck(name, horizon=SHORT[name])
    assert result.passed, f"{name}: worst relative error {result.worst:.3g}"


@pytest.mark.parametrize("name", ports("soft_body"))
def test_gradient_check_fails_when_a_per_step_buffer_is_shared(name):
    result = gradcheck(name, *BROKEN[name], horizon=SHORT[name])
    assert not result.passed, f"{name}: shared buffers went unnoticed (worst {result.worst:.3g})"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PORTS))
def test_gradient_check_passes_at_the_default_horizon(name):
    result = gradcheck(name, horizon=None)
    assert result.passed, f"{name}: worst relative error {result.worst:.3g}"


@pytest.mark.parametrize("name", sorted(PORTS))
def test_rollout_is_capturable(name):
    run = build(f"+env={name}", f"env.horizon={SHORT[name]}", "env.world_count=2")
    check_capture(run.env, run.loss, run.task, device="cpu")


def final_positions(name: str, world_count: int, horizon: int) -> np.ndarray:
    """Every world's particle positions after an untrained rollout, ``(world_count, particles, 3)``."""
    run = build(f"+env={name}", f"env.world_count={world_count}", f"env.horizon={horizon}")
    params = prepare(run.env, run.task, run.loss)
    rollout(run.env, run.task, params)
    return run.env.state(horizon).particle_q.numpy().reshape(world_count, -1, 3)


@pytest.mark.parametrize("name", sorted(PORTS))
def test_every_world_steps_as_the_one_world_scene(name):
    one = final_positions(name, 1, SHORT[name])
    three = final_positions(name, 3, SHORT[name])
    assert np.isfinite(three).all()
    for world in range(3):
        np.testing.assert_allclose(three[world], one[0], rtol=1e-6, atol=1e-6)


def test_ball_solves_several_targets_at_once(tmp_path):
    """world_count=3 with target_spread: three targets, one ball each, trained together."""
    run = build("+env=ball", "env.world_count=3", "env.target_spread=0.5", "iterations=30")
    targets = run.env.targets.numpy()
    assert len({tuple(t) for t in targets.round(4)}) == 3
    summary = run.trainer().fit(tmp_path)
    before = np.asarray(summary["before_training"]["final_distance_to_target_m"])
    after = np.asarray(summary["after_training"]["final_distance_to_target_m"])
    assert before.shape == after.shape == (3,)
    assert np.all(after < 0.5 * before), (before, after)


def test_soft_body_materials_stay_within_the_examples_bounds(tmp_path):
    """A step far too large drives the Lame parameters to the bounds, never past them."""
    run = build("+env=soft_body", "env.horizon=240", "optim.lr=1e13", "iterations=2", "capture=false")
    trainer = run.trainer()
    trainer.fit(tmp_path)
    values = trainer.params.data.numpy()
    assert values.min() >= 500.0 and values.max() <= 4.0e6
    assert np.isclose(values, 500.0).any() or np.isclose(values, 4.0e6).any()


def test_bounds_are_checkpointed_and_a_resume_with_other_bounds_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", "+env=spring_cage", "iterations=2", "device=cpu", f"hydra.run.dir={run_dir}"]
    assert run_harness(*args, cwd=tmp_path).returncode == 0
    saved = checkpoint.load(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))[-1])
    [(name, shape, _dtype, lower, upper)] = saved.meta["layout"]
    assert (name, shape, lower, upper) == ("rest_length", [8], 1.0e-3, math.inf)
    before = sorted(p.name for p in run_dir.rglob("*"))
    refused = run_harness(*args[:-1], "iterations=4", "task.lower=0.01", f"resume={run_dir}", cwd=tmp_path)
    assert refused.returncode == 2 and "task.lower" in refused.stderr, refused.stderr
    assert sorted(p.name for p in run_dir.rglob("*")) == before
