"""Checkpoints and resume with real processes: SIGKILL mid-run, SIGTERM/SIGINT, corrupted
files, mismatched runs, determinism, and the non-finite policies in a real training run."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import checkpoint
from harness.training import state
from tests.helpers import run_harness, start_harness

RUN = ["+env=cartpole", "env.horizon=10", "env.world_count=2", "optim.lr=0.5", "log_every=3", "plot_every=null"]


def start(args: list[str], cwd: Path, **popen) -> subprocess.Popen:
    return start_harness("train", *args, cwd=cwd, **popen)


def train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_harness("train", *args, cwd=cwd)


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, "the run ended before the condition was met"
        assert time.monotonic() < deadline
        time.sleep(0.02)


def newest_iteration(folder: Path) -> int:
    """The iteration in the newest checkpoint's file name (``ckpt_<iteration>.hckpt``)."""
    return int(checkpoint.list_checkpoints(folder)[-1].stem.split("_")[1])


def loss_curve(run_dir: Path) -> tuple[list[int], list[float]]:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("loss/total")
    return [e.step for e in events], [e.value for e in events]


def final_checkpoint(run_dir: Path) -> checkpoint.Checkpoint:
    return checkpoint.load(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))[-1])


def assert_killed_run_resumes_bit_for_bit(
    args: list[str], tmp_path: Path, *, iterations: int, kill_after: int, timeout: float = 240
) -> subprocess.CompletedProcess:
    """Train ``args`` (which set ``iterations``) straight through; train them again, SIGKILL the
    process once a checkpoint at or after ``kill_after`` exists, resume it with ``resume=auto``; the
    two runs' final checkpoints agree bit for bit. Returns the straight run's process."""
    straight = train([*args, f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    assert straight.returncode == 0, straight.stderr
    killed = tmp_path / "killed"
    proc = start([*args, f"hydra.run.dir={killed}"], tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = checkpoint.checkpoint_dir(killed)
    wait_for(lambda: any(checkpoint.list_checkpoints(folder)) and newest_iteration(folder) >= kill_after, proc, timeout)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert checkpoint.load(checkpoint.list_checkpoints(folder)[-1]).iteration < iterations
    resumed = train([*args, "resume=auto", f"hydra.run.dir={killed}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    a, b = final_checkpoint(tmp_path / "straight"), final_checkpoint(killed)
    assert a.iteration == b.iteration == iterations
    for key, value in a.arrays.items():
        np.testing.assert_array_equal(value, b.arrays[key], err_msg=key)
    return straight


def test_run_killed_with_sigkill_and_resumed_matches_an_uninterrupted_run_bit_for_bit(tmp_path):
    """The killed and resumed run captures its iterations (capture=auto); the uninterrupted
    one runs them eagerly: the two agree bit for bit, so capture and resume both are exact."""
    # 240 short iterations, logged every iteration: the captured run spends over a
    # second past its checkpoint at 15, so the kill lands part-way even on a loaded machine.
    args = [*RUN, "iterations=240", "checkpoint.every=5", "log_every=1"]
    straight = train([*args, "capture=false", f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    assert straight.returncode == 0, straight.stderr

    killed_dir = tmp_path / "killed"
    proc = start([*args, f"hydra.run.dir={killed_dir}"], tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = checkpoint.checkpoint_dir(killed_dir)
    wait_for(lambda: any(checkpoint.list_checkpoints(ckpts)) and newest_iteration(ckpts) >= 15, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    newest = checkpoint.list_checkpoints(ckpts)[-1]
    killed_at = checkpoint.load(newest).iteration
    assert 15 <= killed_at < 240  # killed part-way, between checkpoints or later
    assert not (killed_dir / "summary.json").exists()

    resumed = train([*args, "resume=auto", f"hydra.run.dir={killed_dir}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    saying = f"resumed from {newest} at iteration {killed_at} of 240"
    assert saying in resumed.stdout.splitlines()

    a, b = final_checkpoint(tmp_path / "straight"), final_checkpoint(killed_dir)
    assert a.iteration == b.iteration == 240
    for key, value in a.arrays.items():
        np.testing.assert_array_equal(value, b.arrays[key], err_msg=key)
    steps_a, losses_a = loss_curve(tmp_path / "straight")
    steps_b, losses_b = loss_curve(killed_dir)
    assert steps_a == steps_b == list(range(1, 241))  # no duplicated or missing step in the resumed curve
    assert losses_a == losses_b
    summary_a = json.loads((tmp_path / "straight" / "summary.json").read_text())
    summary_b = json.loads((killed_dir / "summary.json").read_text())
    assert summary_b["timing_s"]["graph"] > 0.0 and summary_a["timing_s"]["graph"] == 0.0
    for key in ("wall_time_s", "timing_s"):  # measured times differ between any two runs
        summary_a.pop(key), summary_b.pop(key)
    assert summary_a == summary_b


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_or_sigint_finishes_the_iteration_then_writes_checkpoint_and_summary(tmp_path, sig, code):
    run_dir = tmp_path / "run"
    proc = start(
        [*RUN, "iterations=100000", "checkpoint.every=0", f"hydra.run.dir={run_dir}"],
        tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: list(run_dir.glob("events.out.tfevents.*")), proc)
    time.sleep(1.0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"interrupted by {sig.name}" in err
    # The command that continues the run, as the user can paste it.
    told = err.split("continue with: ")[1].splitlines()[0]
    assert shlex.split(told) == [
        "python", "-m", "harness", "train", *RUN, "iterations=100000", "checkpoint.every=0",
        "resume=auto", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == sig.name
    saved = final_checkpoint(run_dir)
    assert saved.iteration == summary["iterations_done"] >= 1
    steps, _ = loss_curve(run_dir)
    assert steps == list(range(1, saved.iteration + 1))  # every completed iteration was logged before the checkpoint


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory) -> Path:
    """A finished 6-iteration run with checkpoints at 2, 4 and 6 (made once, copied per test)."""
    root = tmp_path_factory.mktemp("checkpointed")
    run_dir = root / "run"
    proc = train([*RUN, "iterations=6", "checkpoint.every=2", "checkpoint.keep=3", f"hydra.run.dir={run_dir}"], root)
    assert proc.returncode == 0, proc.stderr
    return run_dir


@pytest.fixture
def make_checkpoints(checkpointed_run):
    def copy(tmp_path: Path) -> Path:
        return Path(shutil.copytree(checkpointed_run, tmp_path / "run"))

    return copy


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("damage", ["truncate", pytest.param("flip", marks=pytest.mark.slow)])
def test_damaged_checkpoint_is_refused_and_the_others_stay_untouched(tmp_path, damage, make_checkpoints):
    run_dir = make_checkpoints(tmp_path)
    files = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))
    assert [checkpoint.load(p).iteration for p in files] == [2, 4, 6]
    victim = files[-1]
    blob = bytearray(victim.read_bytes())
    if damage == "truncate":
        victim.write_bytes(bytes(blob[: len(blob) // 2]))
    else:
        blob[len(blob) // 3] ^= 0x40
        victim.write_bytes(bytes(blob))
    before = digests(victim.parent)
    summary_before = (run_dir / "summary.json").read_bytes()

    proc = train([*RUN, "iterations=8", "resume=auto", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "corrupted" in lines[0] and victim.name in lines[0]
    assert digests(victim.parent) == before
    assert (run_dir / "summary.json").read_bytes() == summary_before
    # An intact older checkpoint can still be resumed explicitly; the run continues in its
    # folder and the newer files (the damaged one included) are set aside, not deleted.
    ok = train([*RUN, "iterations=8", f"resume={files[0]}"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    folder = checkpoint.checkpoint_dir(run_dir)
    assert sorted(p.name for p in (folder / "abandoned").rglob("*.hckpt")) == [files[1].name, files[2].name]
    assert [checkpoint.load(p).iteration for p in checkpoint.list_checkpoints(folder)] == [2, 8]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.horizon=12", "holds parameters"),
        ("env.world_count=3", "holds parameters"),
        ("optim=sgd", "optim._target_="),
        ("seed=5", "seed=0"),
        ("optim.lr=0.1", "optim.lr=0.5"),
        ("env.tilt=0.3", "env.tilt=0.2"),
        ("iterations=4", "iterations: 4 is before the checkpoint's iteration 6"),
    ],
)
def test_checkpoint_of_a_different_run_is_refused_with_nothing_changed(tmp_path, override, message, make_checkpoints):
    run_dir = make_checkpoints(tmp_path)
    before = digests(checkpoint.checkpoint_dir(run_dir))
    summary_before = (run_dir / "summary.json").read_bytes()
    proc = train([*RUN, "iterations=8", override, "resume=auto", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert digests(checkpoint.checkpoint_dir(run_dir)) == before
    assert (run_dir / "summary.json").read_bytes() == summary_before


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_same_seed_and_config_give_the_same_loss_curve_bit_for_bit(tmp_path):
    curves = []
    for name in ("a", "b"):
        proc = train([*RUN, "iterations=8", "seed=4", f"hydra.run.dir={tmp_path / name}"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        curves.append(loss_curve(tmp_path / name))
    assert curves[0] == curves[1]
    other = train([*RUN, "iterations=8", "seed=5", f"hydra.run.dir={tmp_path / 'c'}"], tmp_path)
    assert other.returncode == 0
    assert loss_curve(tmp_path / "c")[1] != curves[0][1]  # the seed matters (initial tilts)


# A step size far too large: after the first update the forces are ~1e26 N, the simulation
# blows up and every later gradient is nan.
EXPLODE = [*RUN, "optim=sgd", "optim.lr=1e30", "optim.momentum=0", "clip=none", "log_every=1"]


def test_error_policy_stops_naming_iteration_and_parameter_and_keeps_the_last_good_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = train(
        [*EXPLODE, "iterations=5", "checkpoint.every=1", "clip.nonfinite=error", f"hydra.run.dir={run_dir}"], tmp_path
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "iteration 1" in lines[0] and "'controls'" in lines[0] and "ckpt_00000001" in lines[0]
    saved = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))
    assert [checkpoint.load(p).iteration for p in saved] == [1]
    assert np.isfinite(checkpoint.load(saved[0]).arrays["params/data"]).all()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


def test_skip_policy_continues_and_keeps_parameters_finite(tmp_path):
    """The run goes on to the end (4 nan losses are fewer than the divergence limit) and, its
    final loss nan, ends diverged (tests/test_diverged.py) with its last good checkpoint."""
    run_dir = tmp_path / "run"
    proc = train(
        [*EXPLODE, "iterations=5", "checkpoint.every=1", "clip.nonfinite=skip", f"hydra.run.dir={run_dir}"], tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["iterations_done"] == 5
    assert summary["diverged"]["what"] == "final loss"
    assert summary["nonfinite_steps"] == summary["skipped_steps"] == 4  # iterations 1..4
    assert final_checkpoint(run_dir).iteration == 1  # the later ones wait for a finite loss
    params = final_checkpoint(run_dir).arrays["params/data"]
    assert np.isfinite(params).all()


def test_a_checkpoint_outside_a_run_folder_is_refused(tmp_path, make_checkpoints):
    run_dir = make_checkpoints(tmp_path)
    loose = tmp_path / "loose.hckpt"
    loose.write_bytes(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))[-1].read_bytes())
    proc = train([*RUN, "iterations=8", f"resume={loose}"], tmp_path)
    assert proc.returncode == 2
    assert "not inside a run's checkpoints/ folder" in proc.stderr


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_resume_by_bare_file_name_from_inside_the_checkpoints_folder(tmp_path, make_checkpoints):
    run_dir = make_checkpoints(tmp_path)
    folder = checkpoint.checkpoint_dir(run_dir)
    proc = train([*RUN, "iterations=8", "resume=ckpt_00000006.hckpt"], folder)
    assert proc.returncode == 0, proc.stderr
    assert checkpoint.load(checkpoint.list_checkpoints(folder)[-1]).iteration == 8  # continued in the run folder


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_resuming_twice_from_an_old_checkpoint_keeps_both_abandoned_branches(tmp_path, make_checkpoints):
    run_dir = make_checkpoints(tmp_path)
    folder = checkpoint.checkpoint_dir(run_dir)
    originals = {p.name: p.read_bytes() for p in checkpoint.list_checkpoints(folder)[1:]}
    for every in ("2", "1"):  # two different continuations from iteration 2
        proc = train(
            [*RUN, "iterations=6", f"checkpoint.every={every}", f"resume={folder / 'ckpt_00000002.hckpt'}"], tmp_path
        )
        assert proc.returncode == 0, proc.stderr
    first, second = sorted((folder / "abandoned").iterdir())
    assert {p.name: p.read_bytes() for p in first.iterdir()} == originals  # the original run's files, unchanged
    assert sorted(p.name for p in second.iterdir()) == ["ckpt_00000004.hckpt", "ckpt_00000006.hckpt"]


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_changed_value_derived_from_iterations_is_named_with_its_source(tmp_path):
    run_dir = tmp_path / "run"
    args = [*RUN, "schedule=cosine_decay", "checkpoint.every=2", f"hydra.run.dir={run_dir}"]
    assert train([*args, "iterations=4"], tmp_path).returncode == 0
    proc = train([*args, "iterations=6", "resume=auto"], tmp_path)
    assert proc.returncode == 2
    assert "schedule.decay_steps=${iterations} gives 6; pass schedule.decay_steps=4" in proc.stderr
    assert train([*args, "iterations=6", "resume=auto", "schedule.decay_steps=4"], tmp_path).returncode == 0


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_multirun_resume_checks_each_jobs_checkpoint_against_its_config(tmp_path):
    sweep = tmp_path / "sweep"
    base = [*RUN, "iterations=4", "checkpoint.every=2", "clip.max_norm=1,2", f"hydra.sweep.dir={sweep}"]
    assert train(["-m", *base], tmp_path).returncode == 0
    records = {job: (sweep / job / ".hydra").iterdir() for job in ("clip.max_norm=1", "clip.max_norm=2")}
    records = {job: {p.name: p.read_bytes() for p in files} for job, files in records.items()}
    proc = train(["-m", *base, "iterations=6", "resume=auto", "optim.lr=0.01"], tmp_path)
    assert proc.returncode == 1  # every job refused, and the sweep counts them
    assert proc.stderr.count("was written with optim.lr=0.5, this run has optim.lr=0.01") == 2
    assert "sweep: 2 jobs: 0 finished, 2 failed" in proc.stdout
    for job, files in records.items():  # the refused jobs' .hydra/ records are those they were trained with
        kept = {p.name: p.read_bytes() for p in (sweep / job / ".hydra").iterdir() if p.name != "harness_outcome.json"}
        assert kept == {name: data for name, data in files.items() if name != "harness_outcome.json"}
    ok = train(["-m", *base, "iterations=6", "resume=auto"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    for job in ("clip.max_norm=1", "clip.max_norm=2"):
        saved = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(sweep / job))
        assert checkpoint.load(saved[-1]).iteration == 6
        # The job's curve continues: every iteration once, the resumed ones included.
        assert loss_curve(sweep / job)[0] == list(range(1, 7))
    # A job new to a resumed sweep starts from scratch and gets the .hydra/ record Hydra would write.
    wider = [*base[:-2], "clip.max_norm=1,2,3", base[-1]]
    more = train(["-m", *wider, "iterations=6", "resume=auto"], tmp_path)
    assert more.returncode == 0, more.stderr
    assert "sweep: 3 jobs: 3 finished, 0 failed" in more.stdout
    assert "clip.max_norm=3" in (sweep / "clip.max_norm=3" / ".hydra" / "overrides.yaml").read_text()
    assert (sweep / "clip.max_norm=3" / ".hydra" / "hydra.yaml").is_file()


STAGE2 = Path(__file__).parent / "data"
"""A run folder written by the code of commit 3ac405d (before the transformation protocol):
``stage2_run`` holds its ``.hydra`` files and its checkpoint at iteration 4 of 6
(``+env=cartpole env.horizon=10 env.world_count=2 optim.lr=0.5 log_every=3 iterations=6
checkpoint.every=2 clip=norm schedule=cosine``), ``stage2_run_expected`` the checkpoint
the same uninterrupted run ended with."""


def test_a_checkpoint_of_the_earlier_layout_resumes_under_the_new_names_bit_for_bit(tmp_path):
    """Old option names (clip=norm, schedule=cosine) and the non-finite counters stored as the
    clip policy's (clip/skipped, ...) are read under their current names; the resumed run ends
    exactly where the old code's uninterrupted run ended."""
    run_dir = tmp_path / "run"
    shutil.copytree(STAGE2 / "stage2_run", run_dir)
    args = [*RUN, "iterations=6", "checkpoint.every=2", "clip=global_norm", "schedule=cosine_decay"]
    proc = train([*args, "resume=auto", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    resumed = final_checkpoint(run_dir)
    expected = checkpoint.load(STAGE2 / "stage2_run_expected" / "ckpt_00000006.hckpt")
    assert resumed.iteration == expected.iteration == 6
    assert "clip/skipped" in expected.arrays and "nonfinite/skipped" in resumed.arrays
    for key, value in expected.arrays.items():
        np.testing.assert_array_equal(resumed.arrays[state.RENAMED_ARRAYS.get(key, key)], value, err_msg=key)


def test_a_checkpoint_from_before_init_noise_resumes_only_without_it(tmp_path):
    """``task.init_noise`` and ``task.seed`` came after the stage-2 checkpoints: a run without
    initial noise does what those runs did (resumed above); one that asks for noise is refused."""
    run_dir = tmp_path / "run"
    shutil.copytree(STAGE2 / "stage2_run", run_dir)
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    args = [*RUN, "iterations=6", "clip=global_norm", "schedule=cosine_decay", "task.init_noise=0.1"]
    proc = train([*args, "resume=auto", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "task.init_noise=None, this run has task.init_noise=0.1" in proc.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
