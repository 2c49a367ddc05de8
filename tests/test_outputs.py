"""Every file a command writes replaces the previous one whole or not at all: real commands
(``render``, ``report``, ``record``, ``evaluate``) killed with SIGKILL while they write leave
the previous files byte for byte, playable and readable; the temporary files a kill leaves are
removed by the next write into the folder; a destination that cannot be written is one line."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest

from harness.runs import OutputError, atomic_output, partial_name, remove_stale_partials, write_bytes, write_json
from tests.helpers import run_harness as harness
from tests.helpers import start_harness

RUN = ("+env=cartpole", "env.horizon=40", "env.world_count=2", "iterations=4")


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file directly in ``folder`` by name (temporary files included)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def partials(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.partial*"))


def kill_while_writing(
    args: tuple[str, ...], folder: Path, cwd: Path, *, writing: str | None = None, delay: float = 300.0
) -> list[Path]:
    """Start ``python -m harness ARGS`` and SIGKILL it as soon as it starts writing
    ``folder/<writing>`` (``writing`` given): its temporary file appears, or the file itself
    changes (what a writer in place would do); or after ``delay`` seconds (if it is still
    running: it may have ended, having written everything). Returns the temporary files in
    ``folder`` right after the kill (those of the writes the kill interrupted)."""

    def state(path: Path) -> tuple[int, int, int] | None:
        try:
            found = path.stat()
        except FileNotFoundError:
            return None
        return found.st_ino, found.st_size, found.st_mtime_ns

    proc = start_harness(*args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stem, _, suffix = (writing or "").rpartition(".")
    first = state(folder / writing) if writing else None
    try:
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and proc.poll() is None:
            if writing and (list(folder.glob(f".{stem}.*.partial.{suffix}")) or state(folder / writing) != first):
                break
            time.sleep(0.002)
    finally:
        proc.kill()  # SIGKILL
        proc.wait()
    assert proc.returncode in (0, -signal.SIGKILL), f"{args[0]} failed: {proc.returncode}"
    return partials(folder)


def assert_kept(folder: Path, before: dict[str, str], in_flight: list[Path]) -> None:
    """Every file of ``before`` is there, byte for byte; besides them only the temporary files
    the kill interrupted."""
    after = digests(folder)
    assert {name: after.get(name) for name in before} == before
    assert sorted(set(after) - set(before)) == sorted(p.name for p in in_flight)
    for tmp in in_flight:  # each a temporary name of one of the files kept
        assert tmp.name.startswith(".") and ".partial" in tmp.name


def frames_of(path: Path) -> list[np.ndarray]:
    return [frame for frame in imageio.get_reader(path)]


@pytest.fixture(scope="module")
def rendered_run(tmp_path_factory) -> tuple[Path, Path]:
    """A trained cartpole run, rendered once (``frames=16``: a video that takes a while to encode)."""
    root = tmp_path_factory.mktemp("outputs")
    run_dir = root / "run"
    proc = harness("train", *RUN, f"hydra.run.dir={run_dir}", cwd=root)
    assert proc.returncode == 0, proc.stderr
    proc = harness("render", str(run_dir), "frames=16", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root, run_dir


def test_a_killed_render_leaves_the_previous_video_plots_and_recordings(rendered_run):
    root, run_dir = rendered_run
    out = run_dir / "render"
    before = digests(out)
    assert set(before) == {"rollout.mp4", "rollout.png", "before.json", "after.json"}
    frames = frames_of(out / "rollout.mp4")
    assert len(frames) == 16
    args = ("render", str(run_dir), "frames=16")
    # Killed while it writes (a temporary file is there), then after a random delay.
    in_flight = kill_while_writing(args, out, root, writing="rollout.mp4")
    assert_kept(out, before, in_flight)
    assert [p.suffix for p in in_flight] == [".mp4"], "the kill came after the video was written"
    delay = random.Random().uniform(0.5, 4.0)
    assert_kept(out, before, kill_while_writing(args, out, root, delay=delay))
    # The previous files still play and read.
    again = frames_of(out / "rollout.mp4")
    assert len(again) == 16 and all(np.array_equal(a, b) for a, b in zip(frames, again, strict=True))
    assert (out / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "after.json").read_text())


def test_render_refuses_a_folder_where_its_video_goes_in_one_line(rendered_run, tmp_path):
    _, run_dir = rendered_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("render"))
    (copy / "render" / "rollout.mp4").mkdir(parents=True)
    proc = harness("render", str(copy), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: render: cannot write '{copy / 'render' / 'rollout.mp4'}': a folder has that name; "
        "accepted: a file name (move the folder)"
    ]
    shutil.rmtree(copy / "render")
    (copy / "render").write_text("not a folder")
    proc = harness("render", str(copy), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: render: cannot write into '{copy / 'render'}': it is a file, not a folder"
    ]


def sweep_of(run_dir: Path, sweep: Path) -> Path:
    """A sweep folder of two jobs, copies of ``run_dir`` (its overrides plus ``clip.max_norm=1`` / ``2``)."""
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for value in (1, 2):
        job = sweep / f"clip.max_norm={value}"
        shutil.copytree(run_dir, job, ignore=shutil.ignore_patterns("render", "checkpoints"))
        overrides = job / ".hydra" / "overrides.yaml"
        overrides.write_text(overrides.read_text() + f"- clip.max_norm={value}\n")
    return sweep


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_killed_report_leaves_the_previous_csv_and_png(rendered_run, tmp_path):
    _, run_dir = rendered_run
    sweep = sweep_of(run_dir, tmp_path / "sweep")
    proc = harness("report", str(sweep), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    before = digests(sweep)
    assert {"report.csv", "report.png"} <= set(before)
    in_flight = kill_while_writing(("report", str(sweep)), sweep, tmp_path, writing="report.png")
    assert_kept(sweep, before, in_flight)
    assert [p.suffix for p in in_flight] == [".png"], "the kill came after the PNG was written"
    delay = random.Random().uniform(0.5, 3.0)
    assert_kept(sweep, before, kill_while_writing(("report", str(sweep)), sweep, tmp_path, delay=delay))
    # The next report removes what the killed ones left and writes the same files again.
    proc = harness("report", str(sweep), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert partials(sweep) == [] and digests(sweep) == before


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_killed_record_and_evaluate_leave_the_previous_npz_and_eval_json(rendered_run, tmp_path):
    _, run_dir = rendered_run
    # record: a large enough trajectory (256 worlds x 400 steps) that the write takes a while
    out = tmp_path / "traj.npz"
    args = ("record", "+env=cartpole", "env.horizon=400", "env.world_count=256", f"out={out}")
    assert harness(*args, cwd=tmp_path).returncode == 0
    before = digests(tmp_path)
    landed = 0
    for _ in range(3):  # the write is short: a kill may come after it
        in_flight = kill_while_writing(args, tmp_path, tmp_path, writing="traj.npz")
        assert_kept(tmp_path, before, in_flight)
        landed += bool(in_flight)
    assert landed, "no kill came while the trajectory was written"
    with np.load(out) as archive:
        assert archive["obs/joint_q"].shape[:2] == (400, 256)
    # evaluate: eval.json in the run folder
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("render"))
    args = ("evaluate", str(copy), "env.seed=7")
    assert harness(*args, cwd=tmp_path).returncode == 0
    before = digests(copy)
    for delay in (random.Random().uniform(1.0, 6.0), random.Random().uniform(1.0, 6.0)):
        assert_kept(copy, before, kill_while_writing(args, copy, tmp_path, delay=delay))
    assert json.loads((copy / "eval.json").read_text())["iteration"] == 4


def dead_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_the_next_write_removes_temporary_files_of_dead_processes_only(tmp_path):
    target = tmp_path / "rollout.mp4"
    mine = partial_name(target)
    dead = mine.with_name(mine.name.replace(f".{os.getpid()}-", f".{dead_pid()}-"))
    alive = mine.with_name(mine.name.replace(f".{os.getpid()}-", f".{os.getppid()}-"))
    elsewhere = tmp_path / f".rollout.{dead_pid()}-another-host.partial.mp4"
    other_name = dead.with_name(dead.name.replace(".rollout.", ".2026-01-01_00-00-00."))
    for path in (dead, alive, elsewhere, other_name):
        path.write_bytes(b"half a file")
    write_bytes(tmp_path / "report.csv", b"a,b\n")  # any write into the folder
    assert sorted(p.name for p in partials(tmp_path)) == sorted([alive.name, elsewhere.name])
    assert remove_stale_partials(tmp_path) == []


def test_atomic_output_keeps_the_previous_file_when_the_write_fails(tmp_path):
    target = tmp_path / "eval.json"
    write_json(target, {"loss": 1.0})
    previous = target.read_bytes()
    with pytest.raises(OutputError) as caught, atomic_output(target) as tmp:
        tmp.write_bytes(b'{"loss": ')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert str(caught.value) == f"cannot write '{target}' (No space left on device)"
    with pytest.raises(OutputError, match="Permission denied"), atomic_output(target) as tmp:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp))
    with pytest.raises(RuntimeError), atomic_output(target) as tmp:  # any other error: as it is
        tmp.write_bytes(b"{")
        raise RuntimeError("drawing failed")
    assert target.read_bytes() == previous and partials(tmp_path) == []
    with atomic_output(target):  # a block that writes nothing leaves the file as it was
        pass
    assert target.read_bytes() == previous
    (tmp_path / "plot.png").mkdir()
    with pytest.raises(OutputError, match="a folder has that name"), atomic_output(tmp_path / "plot.png"):
        pytest.fail("the block runs")
    with pytest.raises(OutputError, match="is not a folder"):
        write_bytes(tmp_path / "missing" / "x.csv", b"")


def test_a_destination_that_is_not_a_regular_file_is_never_replaced(tmp_path):
    """A FIFO (like /dev/null or /dev/full, which a rename as root would replace) is refused."""
    import os
    import stat

    from harness.runs import OutputError, atomic_output

    fifo = tmp_path / "out.npz"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not a regular file"), atomic_output(fifo) as tmp:
        tmp.write_bytes(b"x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]
