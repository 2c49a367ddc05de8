"""``python -m harness render``: a video, plots and Newton recordings of a real run, headless."""

from __future__ import annotations

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


def test_render_writes_a_video_that_decodes_to_the_frames_asked_for(cartpole_run):
    root, run_dir = cartpole_run
    proc = harness("render", str(run_dir), "frames=25", "fps=10", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "ckpt_00000004" in proc.stdout  # the newest checkpoint
    frames = decoded(run_dir / "render" / "rollout.mp4")
    assert len(frames) == 25
    height, width, channels = frames[0].shape
    assert channels == 3 and width == 1280 and height % 16 == 0  # two 640-pixel panels
    assert frames[0].std() > 0 and not np.array_equal(frames[0], frames[-1])  # something is drawn, and it moves
    # The two panels start from the same state and differ later (the trained forces act).
    left, right = frames[-1][:, :640].astype(int), frames[-1][:, 640:].astype(int)
    assert np.abs(left - right).mean() > 0.5
    # Plots of the observables and the learned force, before and after.
    assert "cart force [N]" in proc.stdout and "pole 1 angle [rad]" in proc.stdout
    png = (run_dir / "render" / "rollout.png").read_bytes()
    assert png[:4] == b"\x89PNG"


def test_render_writes_recordings_newtons_viewer_file_replays(cartpole_run):
    import newton.viewer

    _, run_dir = cartpole_run
    if not (run_dir / "render" / "after.json").exists():
        assert harness("render", str(run_dir), "frames=25", cwd=run_dir.parent).returncode == 0
    viewer = newton.viewer.ViewerFile(str(run_dir / "render" / "after.json"), auto_save=False)
    viewer.load_recording()
    assert viewer.get_frame_count() == 25


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_render_a_particle_env_and_an_older_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = ("+env=spring_cage", "iterations=4", "checkpoint.every=2", f"hydra.run.dir={run_dir}")
    assert harness("train", *args, cwd=tmp_path).returncode == 0
    older = run_dir / "checkpoints" / "ckpt_00000002.hckpt"
    proc = harness("render", str(run_dir), f"checkpoint={older}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ckpt_00000002" in proc.stdout
    frames = decoded(run_dir / "render" / "rollout.mp4")
    assert len(frames) == 31  # the horizon's 30 steps and the start, fewer than the default 120


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nowhere",), "error: render: 'nowhere' is not a run folder"),
        ((), "error: render: expects one run folder"),
        (("RUN", "frames=1"), "error: render: frames must be a whole number >= 2, got 1"),
        (("RUN", "colour=red"), "error: render: unknown option 'colour'; accepted: checkpoint=PATH, frames=N, fps=N"),
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
