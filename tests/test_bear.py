"""``+env=bear`` (envs/bear.py) and ``optim=adam_warp``.

Newton's own bear example is the oracle: built with ``ViewerNull`` at ``--sim-steps N`` (its
own graph captured, as it runs) and stepped with ``step()``, its ``loss_history`` is compared
with the harness's ``loss/total`` curve read back from the run's TensorBoard events, bit for bit.
The default run compares 2 frames (160 steps); ``make test-slow`` compares 10.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest
import warp as wp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import optim
from harness.build import build_run
from harness.memory import SegmentGraphs, segmented_forward_backward
from harness.params import ParamSet, ParamSpec
from harness.tasks import prepare
from harness.training.step import taped_rollout, zero_grads
from tests.helpers import compose_run, harness_env, rollout_results, run_harness


def example_losses(frames: int, iterations: int) -> np.ndarray:
    """``loss_history`` of Newton's bear example at ``--sim-steps frames`` after ``iterations`` steps."""
    import newton.viewer

    module = importlib.import_module("newton.examples.diffsim.example_diffsim_bear")
    args = module.Example.create_parser().parse_args(
        ["--viewer", "null", "--device", "cpu", "--sim-steps", str(frames)]
    )
    with wp.ScopedDevice("cpu"):
        example = module.Example(newton.viewer.ViewerNull(num_frames=10**9), args)
        for _ in range(iterations):
            example.step()
    return np.asarray(example.loss_history, dtype=np.float32)


def harness_losses(tmp_path, frames: int, iterations: int, *overrides: str) -> np.ndarray:
    """``loss/total`` of a run of ``+env=bear`` trained in this process, read back from its events."""
    settings = [f"env.frames={frames}", f"iterations={iterations}", "log_every=1", "device=cpu", *overrides]
    build_run(*compose_run("+env=bear", *settings)).trainer().fit(tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    return np.asarray([e.value for e in events.Scalars("loss/total")], dtype=np.float32)


def assert_same_losses(tmp_path, frames: int, iterations: int) -> None:
    reference = example_losses(frames, iterations)
    assert reference[-1] < reference[0], "the example's loss did not fall: nothing is compared"
    # the env's defaults (the example's Adam, no clip, segments of about sqrt(horizon) steps, captured)
    np.testing.assert_array_equal(harness_losses(tmp_path, frames, iterations), reference)


def test_bear_losses_match_newtons_example_bit_for_bit(tmp_path):
    assert_same_losses(tmp_path, frames=2, iterations=3)


@pytest.mark.slow
def test_bear_losses_match_newtons_example_bit_for_bit_at_ten_frames(tmp_path):
    assert_same_losses(tmp_path, frames=10, iterations=4)


def bear_gradients(segment_steps: int | None, *, graphs: bool = False) -> dict:
    """Loss, observables, parameter and model gradients of one forward + backward at perturbed weights."""
    run = build_run(*compose_run("+env=bear", "env.frames=2", f"memory.segment_steps={segment_steps or 'null'}",
                                 "device=cpu"))  # fmt: skip
    env, task, loss = run.env, run.task, run.loss
    params = prepare(env, task, loss, device="cpu")
    rng = np.random.default_rng(0)
    params.data.assign((params.data.numpy() + 0.05 * rng.normal(size=params.data.shape)).astype(np.float32))
    zero_grads(env, loss, params, task)
    if segment_steps is None:
        tape, trajectory, total = taped_rollout(env, task, loss, params)
        tape.backward(total)
    else:
        _, trajectory, total = segmented_forward_backward(env, task, loss, params)
        if graphs:
            segments = SegmentGraphs(env, task, loss, params)
            for _ in range(2):  # replayed twice: nothing carries over between replays
                zero_grads(env, loss, params, task)
                segments.launch()
            trajectory, total = segments.trajectory, segments.total
    return rollout_results(env, params, trajectory, total)


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_bear_segments_give_the_full_tapes_gradients_bit_for_bit():
    # 47-step segments over 2 frames of 80 steps: frames end inside segments, a segment inside a frame
    full = bear_gradients(None)
    assert np.abs(full["parameter gradient"]).max() > 0
    for graphs in (False, True):
        segmented = bear_gradients(47, graphs=graphs)
        assert full.keys() == segmented.keys()
        for name, value in full.items():
            np.testing.assert_array_equal(segmented[name], value, err_msg=f"{name} (graphs={graphs})")


def test_adam_warp_steps_as_warp_optim_adam():
    import warp.optim

    rng = np.random.default_rng(1)
    start = rng.normal(size=64).astype(np.float32)
    grads = [rng.normal(size=64).astype(np.float32) for _ in range(5)]
    theirs = wp.array(start, dtype=wp.float32, device="cpu")
    reference = warp.optim.Adam([theirs], lr=0.025)
    params = ParamSet([ParamSpec("w", (64,), init=start)], device="cpu")
    ours = optim.build("adam_warp", lr=0.025)
    state = ours.init(params)
    for g in grads:
        reference.step([wp.array(g, dtype=wp.float32, device="cpu")])
        params.grad.assign(g)
        ours.step(params, params.grad, state)
        np.testing.assert_array_equal(params.data.numpy(), theirs.numpy())
    assert not np.array_equal(params.data.numpy(), start)


def test_a_missing_usd_core_is_refused_in_one_line(tmp_path):
    launcher = tmp_path / "without_pxr.py"
    launcher.write_text(
        "import runpy, sys\n"
        "class NoPxr:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pxr' or name.startswith('pxr.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'pxr'\")\n"
        "sys.meta_path.insert(0, NoPxr())\n"
        "sys.argv[0] = 'harness'\n"
        "runpy.run_module('harness', run_name='__main__')\n"
    )
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(launcher), "train", "+env=bear", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=harness_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "usd-core" in done.stderr, done.stderr
    assert not run_dir.exists()


def test_a_bear_too_long_for_one_tape_is_refused_before_it_exhausts_memory(tmp_path):
    run_dir = tmp_path / "run"
    done = run_harness("train", "+env=bear", "env.frames=3000", "memory.segment_steps=null",
                       f"hydra.run.dir={run_dir}", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "GiB" in done.stderr, done.stderr
    assert not run_dir.exists()


@pytest.mark.slow
def test_render_draws_the_bears_particles_walking(tmp_path):
    run_dir = tmp_path / "run"
    train = run_harness("train", "+env=bear", "env.frames=3", "iterations=2", "device=cpu",
                        f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=900)  # fmt: skip
    assert train.returncode == 0, train.stderr
    done = run_harness("render", str(run_dir), "frames=4", cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr
    import imageio.v2 as imageio

    drawn = [frame for frame in imageio.get_reader(run_dir / "render" / "rollout.mp4")]  # unknown length
    assert len(drawn) == 4 and not np.array_equal(drawn[0], drawn[-1])
