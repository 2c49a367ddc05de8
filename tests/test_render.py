"""``python -m harness render``: a video, plots and Newton recordings of a real run, headless."""

from __future__ import annotations

import itertools

import imageio.v2 as imageio
import numpy as np
import pytest

from tests.helpers import run_harness as harness


def decoded(path) -> list[np.ndarray]:
    """Every frame of a video (iterated: the reader reports an unknown length)."""
    return [frame for frame in imageio.get_reader(path)]


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("render")
    run_dir = root / "run"
    args = ("+env=cartpole", "env.horizon=40", "env.world_count=2", "iterations=4", f"hydra.run.dir={run_dir}")
    proc = harness("train", *args, cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root, run_dir


def colour_boxes(frame: np.ndarray) -> dict[str, tuple[int, int, int, int]]:
    """Bounding boxes (top, bottom, left, right) of the before run's orange and the after
    run's blue pixels (both as H.264 decodes them)."""
    r, g, b = (frame[..., i].astype(int) for i in range(3))
    masks = {
        "orange": (r > 190) & (g > 80) & (g < 190) & (b < 110),  # tab:orange (255, 127, 14)
        "blue": (b > 140) & (r < 90) & (g > 80) & (g < 160),  # tab:blue (31, 119, 180)
    }
    boxes = {}
    for name, mask in masks.items():
        rows, cols = np.nonzero(mask)
        assert len(rows) > 100, f"no {name} drawn"
        boxes[name] = (rows.min(), rows.max(), cols.min(), cols.max())
    return boxes


def test_render_plays_in_real_time_with_each_run_in_its_colour_and_the_time_on_every_frame(cartpole_run):
    root, run_dir = cartpole_run
    proc = harness("render", str(run_dir), cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "ckpt_00000004" in proc.stdout  # the newest checkpoint
    # 40 steps of 1/240 s at 30 fps, real time: a frame per 8 steps, the start and the end.
    assert "0.167 s simulated, 6 frames at 30 fps, 1x real time" in proc.stdout
    frames = decoded(run_dir / "render" / "rollout.mp4")
    assert len(frames) == 6 and (len(frames) - 1) / 30 == pytest.approx(40 / 240)
    height, width, channels = frames[0].shape
    assert channels == 3 and width == 1280 and height % 16 == 0 and height <= 720
    # Before training in orange, after in blue, each in a panel of its own: the two colours'
    # pixels do not share a region (the panels are stacked or side by side).
    boxes = colour_boxes(frames[-1])
    (o_top, o_bottom, _, o_right), (b_top, _, b_left, _) = boxes["orange"], boxes["blue"]
    assert o_bottom < b_top or o_right < b_left
    # The header line (the time, which changes, and the playback speed) above the panels.
    header = [frame[: min(o_top, b_top)].astype(int) for frame in frames]
    assert header[0].min() < 100  # dark text
    assert all(np.abs(a - b).max() > 100 for a, b in itertools.pairwise(header))  # the clock moves
    assert frames[0].std() > 0 and not np.array_equal(frames[0], frames[-1])  # something is drawn, and it moves


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_render_in_slow_motion_with_plots_and_recordings_newtons_viewer_file_replays(cartpole_run):
    import newton.viewer

    root, run_dir = cartpole_run
    proc = harness("render", str(run_dir), "speed=0.25", "fps=12", cwd=root)
    assert proc.returncode == 0, proc.stderr
    # 40 steps of 1/240 s at a quarter of real time: 2/3 s of video, a frame per 5 steps.
    assert "9 frames at 12 fps, 0.25x real time (slow motion)" in proc.stdout
    assert len(decoded(run_dir / "render" / "rollout.mp4")) == 9
    # Plots of the observables and the learned force, before and after.
    assert "cart force [N]" in proc.stdout and "pole 1 angle [rad]" in proc.stdout
    png = (run_dir / "render" / "rollout.png").read_bytes()
    assert png[:4] == b"\x89PNG"
    viewer = newton.viewer.ViewerFile(str(run_dir / "render" / "after.json"), auto_save=False)
    viewer.load_recording()
    assert viewer.get_frame_count() == 9


def test_real_time_is_the_default_for_every_env_preset():
    from harness.config import CONFIG_DIR, check_env_fields, compose_config
    from harness.video import MAX_FRAMES, playback_speed, real_time_frames, sample_steps, speed_text

    for preset in sorted((CONFIG_DIR / "env").glob("*.yaml")):
        # composed: a preset may derive its horizon and step (the bear: frames x substeps)
        _, env = check_env_fields(compose_config("train", [f"+env={preset.stem}"])[0])
        horizon, dt = env.horizon, env.dt
        frames = real_time_frames(horizon, dt, 30)
        speed = playback_speed(sample_steps(horizon, frames), dt, 30)
        assert speed == pytest.approx(1.0, rel=0.02), preset.name
        assert speed_text(speed) == "1x real time", preset.name
    assert real_time_frames(240, 1 / 240, 30) == 31  # the cartpole: 1 s, 30 frame intervals
    assert real_time_frames(240, 1 / 240, 30, 0.25) == 121  # a quarter of real time
    long = real_time_frames(24000, 1 / 240, 30)  # 100 s: capped, and faster than real time
    assert long == MAX_FRAMES and speed_text(playback_speed(sample_steps(24000, long), 1 / 240, 30)).startswith("5x")
    assert real_time_frames(30, 1 / 30, 60) == 31  # no more frames than states


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_render_a_particle_env_and_an_older_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = ("+env=spring_cage", "iterations=4", "checkpoint.every=2", f"hydra.run.dir={run_dir}")
    assert harness("train", *args, cwd=tmp_path).returncode == 0
    older = run_dir / "checkpoints" / "ckpt_00000002.hckpt"
    proc = harness("render", str(run_dir), f"checkpoint={older}", "frames=16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ckpt_00000002" in proc.stdout
    # 30 steps of 1/30 s in 15 frame intervals at 30 fps: twice real time, and it says so.
    assert "1 s simulated, 16 frames at 30 fps, 2x real time (fast)" in proc.stdout
    frames = decoded(run_dir / "render" / "rollout.mp4")
    assert len(frames) == 16


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nowhere",), "error: render: 'nowhere' is not a run folder"),
        ((), "error: render: expects one run folder"),
        (("RUN", "frames=1"), "error: render: frames must be a whole number >= 2, got 1"),
        (("RUN", "colour=red"), "error: render: unknown option 'colour'; accepted: checkpoint=PATH, fps=N, speed=X"),
        (("RUN", "speed=0"), "error: render: speed must be a number > 0 (1: real time, 0.25: slow motion), got 0"),
        (("RUN", "speed=1", "frames=9"), "error: render: give speed=X (the playback speed) or frames=N"),
        (("RUN", "checkpoint=missing.hckpt"), "error: checkpoint: 'missing.hckpt' does not exist"),
    ],
)
def test_bad_render_input_is_refused_in_one_line(cartpole_run, args, message):
    root, run_dir = cartpole_run
    args = tuple(str(run_dir) if a == "RUN" else a for a in args)
    proc = harness("render", *args, cwd=root)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
