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
    proc = start_harness(
        "train", *SHAC, f"hydra.run.dir={run}", cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    folder = checkpoint.checkpoint_dir(run)
    deadline = time.monotonic() + 240
    while not (found := checkpoint.list_checkpoints(folder)) or int(found[-1].stem.split("_")[1]) < 15:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its checkpoint at 15"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 15 <= checkpoint.load(checkpoint.list_checkpoints(folder)[-1]).iteration < 120  # killed part-way
    return root, run


def test_a_run_goes_on_from_its_pack_bit_for_bit_as_from_its_own_folder(killed):
    """Packed at its oldest kept checkpoint (the newer two deleted from a copy), so that the
    killed run has episode points past the checkpoint that the pack must leave out."""
    root, killed_run = killed
    run = root / "older"
    shutil.copytree(killed_run, run)
    for newer in checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run))[1:]:
        newer.unlink()
    (oldest,) = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run))
    at = checkpoint.load(oldest).iteration
    logged = scalars(run, "episode/return")
    assert any(step > at for step, _ in logged)  # what the filter is for
    done = pack(str(run), str(root / "packed"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"packed {run} at iteration {at} ({oldest.name}) into {root / 'packed'}")
    packed = root / "packed"
    assert sorted(p.name for p in checkpoint.list_checkpoints(checkpoint.checkpoint_dir(packed))) == [oldest.name]
    assert (packed / "config.yaml").read_bytes() == (run / "config.yaml").read_bytes()
    assert (packed / ".hydra" / "overrides.yaml").is_file()
    assert not list(root.glob(".packed.partial-*"))
    events = EventAccumulator(str(packed), size_guidance={"scalars": 0})
    events.Reload()
    everything = EventAccumulator(str(run), size_guidance={"scalars": 0})
    everything.Reload()
    episode = sorted(tag for tag in everything.Tags()["scalars"] if tag.startswith("episode/"))
    assert "episode/return" in episode and len(episode) < len(everything.Tags()["scalars"])
    assert sorted(events.Tags()["scalars"]) == episode  # what --keep's default names, and nothing else
    kept = scalars(packed, "episode/return")
    assert kept and kept == [(s, v) for s, v in logged if s <= at]  # none past the checkpoint

    moved = root / "moved"  # where it lands, as the pack's docstring says: copied out first
    shutil.copytree(packed, moved)
    for folder in (moved, run):
        resumed = run_harness("train", *SHAC, "resume=auto", f"hydra.run.dir={folder}", cwd=root)
        assert resumed.returncode == 0, resumed.stderr
        assert f"at iteration {at} of 120" in resumed.stdout
    a, b = (checkpoint.load(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(f))[-1]) for f in (moved, run))
    assert a.iteration == b.iteration == 120
    for key, value in b.arrays.items():
        np.testing.assert_array_equal(a.arrays[key], value, err_msg=key)
    curve = scalars(run, "episode/return")
    assert [s for s, _ in curve] == [*range(0, 120, 12), 120]
    assert scalars(moved, "episode/return") == curve  # the kept points and the resumed run's, none twice
    assert scalars(moved, "loss/total")[0][0] == at + 1  # the per-iteration scalars start after the pack's checkpoint


def _stopped_run(folder):
    """A run folder in the parts the script reads, its checkpoint written by harness.checkpoint."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / "config.yaml").write_text("seed: 0\n")
    (folder / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    saved = checkpoint.Checkpoint(arrays={"params/data": np.arange(4.0)}, meta={"iteration": 5})
    checkpoint.save(saved, checkpoint.checkpoint_dir(folder), keep=3)
    return folder


def test_a_folder_that_holds_something_is_refused_and_left_as_it_was(tmp_path):
    run = _stopped_run(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    (out / "note.txt").write_text("mine")
    done = pack(str(run), str(out))
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(f"out: '{out}' exists and is not an empty folder; accepted: a new or empty folder")
    )
    assert [p.name for p in out.iterdir()] == ["note.txt"] and (out / "note.txt").read_text() == "mine"


def test_a_pack_that_fails_part_way_leaves_nothing_and_an_empty_out_stays(tmp_path):
    run = _stopped_run(tmp_path / "run")
    (run / ".hydra" / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")  # copied after the checkpoint is read
    out = tmp_path / "out"
    out.mkdir()
    done = pack(str(run), str(out))
    assert done.returncode == 2
    assert f"out: cannot pack into '{out}'" in done.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"] and not any(out.iterdir())
    (run / ".hydra" / "gone.yaml").unlink()
    done = pack(str(run), str(out))  # the same pack, once it can be made
    assert done.returncode == 0, done.stderr
    assert [p.name for p in checkpoint.list_checkpoints(checkpoint.checkpoint_dir(out))] == ["ckpt_00000005.hckpt"]
    assert "scalars: none" in done.stdout


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
