"""scripts/pack_run.py, run as a process on a real SHAC run killed part-way: the pack holds one
checkpoint and the kept scalars up to it, the run goes on from the pack bit for bit as from its
own folder with the same episode curve, and bad input is refused with nothing written."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import checkpoint
from tests.helpers import ROOT, run_harness, start_harness

SCRIPT = ROOT / "scripts" / "pack_run.py"
# 120 short iterations with a checkpoint every 5: the kill lands part-way even on a loaded machine
SHAC = ["+env=cartpole_swingup", "task=shac", "env.world_count=4", "env.horizon=64", "task.window=16"]
SHAC += ["iterations=120", "log_every=1", "checkpoint.every=5", "plot_every=null"]


def pack(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def scalars(run, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A SHAC run SIGKILLed after its checkpoint at iteration 15 or later, as a lost machine leaves it."""
    root = tmp_path_factory.mktemp("pack")
    run = root / "killed"
    proc = start_harness("train", *SHAC, f"hydra.run.dir={run}", cwd=root, stdout=subprocess.DEVNULL)
    folder = checkpoint.checkpoint_dir(run)
    deadline = time.monotonic() + 240
    while not (found := checkpoint.list_checkpoints(folder)) or int(found[-1].stem.split("_")[1]) < 15:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its checkpoint at 15"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert checkpoint.load(checkpoint.list_checkpoints(folder)[-1]).iteration < 120  # killed part-way
    return root, run


def test_a_run_goes_on_from_its_pack_bit_for_bit_as_from_its_own_folder(killed):
    root, run = killed
    newest = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run))[-1]
    at = checkpoint.load(newest).iteration
    done = pack(str(run), str(root / "packed"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"packed {run} at iteration {at} ({newest.name}) into {root / 'packed'}")
    packed = root / "packed"
    assert sorted(p.name for p in checkpoint.list_checkpoints(checkpoint.checkpoint_dir(packed))) == [newest.name]
    assert (packed / "config.yaml").read_bytes() == (run / "config.yaml").read_bytes()
    assert (packed / ".hydra" / "overrides.yaml").is_file()
    events = EventAccumulator(str(packed), size_guidance={"scalars": 0})
    events.Reload()
    everything = EventAccumulator(str(run), size_guidance={"scalars": 0})
    everything.Reload()
    episode = sorted(tag for tag in everything.Tags()["scalars"] if tag.startswith("episode/"))
    assert "episode/return" in episode and len(episode) < len(everything.Tags()["scalars"])
    assert sorted(events.Tags()["scalars"]) == episode  # what --keep's default names, and nothing else
    kept = scalars(packed, "episode/return")
    assert kept and kept == [(s, v) for s, v in scalars(run, "episode/return") if s <= at]  # none past the checkpoint

    moved = root / "moved"  # where it lands, as the pack's docstring says: copied out first
    shutil.copytree(packed, moved)
    own = root / "own"
    shutil.copytree(run, own)
    for folder in (moved, own):
        resumed = run_harness("train", *SHAC, "resume=auto", f"hydra.run.dir={folder}", cwd=root)
        assert resumed.returncode == 0, resumed.stderr
        assert f"at iteration {at} of 120" in resumed.stdout
    a, b = (checkpoint.load(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(f))[-1]) for f in (moved, own))
    assert a.iteration == b.iteration == 120
    for key, value in b.arrays.items():
        np.testing.assert_array_equal(a.arrays[key], value, err_msg=key)
    curve = scalars(own, "episode/return")
    assert [s for s, _ in curve] == [*range(0, 120, 12), 120]
    assert scalars(moved, "episode/return") == curve  # the kept points and the resumed run's, none twice
    assert scalars(moved, "loss/total")[0][0] == at + 1  # the per-iteration scalars start after the pack's checkpoint


def test_a_folder_that_holds_something_is_refused_and_left_as_it_was(killed, tmp_path):
    _, run = killed
    (tmp_path / "note.txt").write_text("mine")
    done = pack(str(run), str(tmp_path))
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(f"out: '{tmp_path}' exists and is not an empty folder; accepted: a new or empty folder")
    )
    assert [p.name for p in tmp_path.iterdir()] == ["note.txt"] and (tmp_path / "note.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda run: run.mkdir(), "is not a run folder of python -m harness train (no config.yaml)"),
        (lambda run: (run.mkdir(), (run / "config.yaml").write_text("seed: 0\n")), "has no checkpoint to go on from"),
    ],
    ids=["no-config", "no-checkpoint"],
)
def test_a_folder_without_a_run_or_a_checkpoint_is_refused_and_nothing_is_written(tmp_path, make, message):
    run = tmp_path / "run"
    make(run)
    done = pack(str(run), str(tmp_path / "out"))
    assert done.returncode == 2
    assert message in done.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no pack, no partial folder
