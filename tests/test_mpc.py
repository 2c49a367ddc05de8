"""``task=mpc`` and ``+env=drone`` (envs/drone.py, harness/tasks/mpc.py).

Newton's own drone example is the oracle: built with ``ViewerNull`` and stepped with ``step()``
(one frame each, ``render()`` after it to advance its frame counter, as
../shared/tools/run_newton_example.py does), its ``cost_history`` is compared with the harness's
``loss/total`` per frame, read back from the run's TensorBoard events, with the example's two
quirks switched on (``task.stale_state=true env.example_control_cost=true``).
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
import warp as wp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness.build import build_run
from tests.helpers import compose_run, run_harness

EXAMPLE = ("task.stale_state=true", "env.example_control_cost=true")
"""The switches that make the harness's drone the example's."""


def example_costs(frames: int) -> np.ndarray:
    """The best cost of each of the example's first ``frames`` frames (its ``cost_history``)."""
    import newton.viewer

    module = importlib.import_module("newton.examples.diffsim.example_diffsim_drone")
    args = module.Example.create_parser().parse_args(["--viewer", "null", "--device", "cpu"])
    with wp.ScopedDevice("cpu"):
        example = module.Example(newton.viewer.ViewerNull(num_frames=10**9), args)
        for _ in range(frames):
            example.step()
            example.render()  # advances the example's frame counter (its target schedule reads it)
    return np.asarray(example.cost_history, dtype=np.float32)


def scalars(run_dir, tag: str) -> np.ndarray:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return np.asarray([e.value for e in events.Scalars(tag)], dtype=np.float32)


def test_drone_frames_match_newtons_example_bit_for_bit(tmp_path):
    frames = 100  # the example's own --num-frames
    reference = example_costs(frames)
    run_dir = tmp_path / "run"
    build_run(*compose_run("+env=drone", *EXAMPLE, f"iterations={frames}", "log_every=10", "device=cpu")).trainer().fit(
        run_dir
    )
    ours = scalars(run_dir, "loss/total")
    assert reference[-1] < reference[0] / 5, "the example's cost did not fall: nothing is compared"
    np.testing.assert_array_equal(ours, reference)
    np.testing.assert_array_equal(scalars(run_dir, "mpc/best_cost"), reference)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_loss"] == float(reference[-1])  # the best plan's cost at the last frame
    # per frame: the real drone's distance to its target and the inner steps' norms
    distance = scalars(run_dir, "mpc/distance_to_target")
    assert len(distance) == frames and distance[-1] < 0.1 < 1.1 < distance[0] < 1.2
    pre, post = scalars(run_dir, "mpc/grad_norm_pre_max"), scalars(run_dir, "mpc/grad_norm_post_max")
    assert len(pre) == frames and (pre > 0).all()
    np.testing.assert_array_equal(pre, post)  # the drone's default: no clip, as the example
    assert (scalars(run_dir, "mpc/grad_norm_pre_mean") <= pre).all()


def mpc_trainer(*overrides: str):
    run = build_run(*compose_run("+env=drone", "device=cpu", *overrides))
    return run, run.trainer()


def flight(run, trainer) -> dict[str, np.ndarray]:
    state = run.task.state(run.env)
    return {
        "plans": trainer.step.params.data.numpy(),
        **{name: state[name].numpy() for name in ("best_plan", "distances", "best_costs", "flight", "plant/body_q")},
    }


def test_captured_frames_equal_eager_frames():
    frames = 4
    results = []
    for captured in (False, True):
        run, trainer = mpc_trainer(*EXAMPLE, "clip=global_norm", "clip.max_norm=10")
        for it in range(frames):
            if captured and it == 1:
                trainer.step.capture()
            trainer.step.run()
        assert (trainer.step.graph is not None) == captured
        results.append(flight(run, trainer))
    eager, replayed = results
    assert np.isfinite(eager["best_costs"][:frames]).all()
    for name, value in eager.items():
        np.testing.assert_array_equal(replayed[name], value, err_msg=name)


def test_stale_state_plans_every_odd_frame_from_the_state_one_frame_old():
    costs = {}
    for stale in ("true", "false"):
        run, trainer = mpc_trainer("env.example_control_cost=true", f"task.stale_state={stale}")
        for _ in range(3):
            trainer.step.run()
        costs[stale] = run.task.state(run.env)["best_costs"].numpy()[:3]
    assert costs["true"][0] == costs["false"][0]  # frame 0 plans from the start either way
    assert costs["true"][1] != costs["false"][1]  # frame 1: the start again, or the state after frame 0


@pytest.mark.slow
def test_evaluate_replays_the_controller_and_render_draws_the_flight(tmp_path):
    run_dir = tmp_path / "run"
    train = ["train", "+env=drone", "env.frames=8", "device=cpu", f"hydra.run.dir={run_dir}"]
    assert run_harness(*train, cwd=tmp_path).returncode == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 8  # one iteration per frame (env.frames)
    flown = summary["after_training"]
    assert flown["frames"] == 8 and 0 < flown["mean_distance_m"] < 1.2
    done = run_harness("evaluate", str(run_dir), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["figures"] == flown  # the replay flies the training's flight again, exactly
    assert report["loss"] == summary["final_loss"]
    assert "within_0.1m_fraction" in done.stdout
    done = run_harness("render", str(run_dir), "frames=4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    import imageio.v2 as imageio

    drawn = [frame for frame in imageio.get_reader(run_dir / "render" / "rollout.mp4")]  # unknown length
    assert len(drawn) == 4 and not np.array_equal(drawn[0], drawn[-1])
    assert (run_dir / "render" / "flight.json").stat().st_size > 0


@pytest.mark.parametrize(
    ("override", "field"),
    [("env.horizon=0", "env.horizon"), ("task.knots=0", "task.knots"), ("memory.segment_steps=5", "segment_steps")],
)
def test_bad_drone_settings_are_refused_in_one_line(tmp_path, override, field):
    run_dir = tmp_path / "run"
    done = run_harness("train", "+env=drone", override, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and field in done.stderr, done.stderr
    assert not run_dir.exists()


def test_an_mpc_run_resumed_with_another_env_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    build_run(*compose_run("+env=drone", "env.frames=2", "device=cpu")).trainer().fit(run_dir)
    (run_dir / ".hydra").mkdir()  # what the command line writes beside a run
    (run_dir / ".hydra" / "overrides.yaml").write_text("- +env=drone\n- env.frames=2\n")
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    done = run_harness("train", "+env=spring_cage", "resume=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "env 'drone'" in done.stderr, done.stderr
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


@pytest.mark.slow
def test_an_mpc_run_resumed_mid_flight_continues_bit_for_bit(tmp_path):
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    common = ["train", "+env=drone", "env.frames=6", "checkpoint.every=3", "log_every=3"]
    assert run_harness(*common, f"hydra.run.dir={straight}", cwd=tmp_path).returncode == 0
    assert run_harness(*common, "iterations=3", f"hydra.run.dir={halves}", cwd=tmp_path).returncode == 0
    done = run_harness(*common, "resume=auto", f"hydra.run.dir={halves}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first, second = (json.loads((d / "summary.json").read_text()) for d in (straight, halves))
    assert second["final_loss"] == first["final_loss"]
    assert second["after_training"] == first["after_training"]
    np.testing.assert_array_equal(scalars(halves, "loss/total")[-3:], scalars(straight, "loss/total")[-3:])
