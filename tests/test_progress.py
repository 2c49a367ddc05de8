"""The progress line redraws in place on a real terminal (a pseudo-terminal here)."""

from __future__ import annotations

import json
import os
import pty
import subprocess

from tests.helpers import start_harness


def test_progress_line_is_redrawn_in_place_on_a_terminal(tmp_path):
    leader, follower = pty.openpty()
    proc = start_harness(
        "train",
        "+env=cartpole",
        "env.horizon=8",
        "env.world_count=1",
        "iterations=6",
        "log_every=3",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.DEVNULL,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(leader)
    out = b"".join(chunks).decode(errors="replace")
    parts = [part.replace("\x1b[K", "").strip() for part in out.split("\r")]
    # The two warm-up iterations say what they do while it happens, before their own count.
    warmup = [part for part in parts if "compiling" in part or "capturing" in part]
    assert warmup == [
        "[1/6] compiling kernels (or loading them from Warp's cache) and running iteration 1 eagerly",
        "[2/6] capturing iteration 2 into the graph every later iteration replays",
    ]
    redraws = [part for part in parts if part.startswith("[") and part not in warmup]
    # One redraw per iteration (6), each starting with the iteration counter.
    counters = [part.split("]")[0] for part in redraws]
    assert counters == [f"[{i}/6" for i in range(1, 7)]
    # A healthy run never shows nan: before the first read-back the line says when the
    # values come; between read-backs it says which iteration they belong to.
    assert "nan" not in out
    assert all("loss and |g|pre from iteration 3" in part for part in redraws[:2])
    assert all("(at 3)" in part for part in redraws[3:5])
    assert all("(at" not in part and "loss " in part for part in (redraws[2], redraws[5]))
    # How far along, and the time left: estimated from the iterations after the warm-up
    # only, so the warm-up's own lines give none.
    assert [part.split("]")[1].split("%")[0].strip() for part in redraws] == ["17", "33", "50", "67", "83", "100"]
    assert all("time left after warm-up" in part and "it/s" not in part for part in redraws[:2])
    assert all(" left " in part and part.endswith(" it/s") for part in redraws[2:])


def test_without_a_terminal_the_warm_up_and_every_log_step_get_one_line(tmp_path):
    from tests.helpers import run_harness

    proc = run_harness(
        "train", "+env=cartpole", "env.horizon=8", "env.world_count=1", "iterations=4", "log_every=2",
        f"hydra.run.dir={tmp_path / 'run'}", "capture=false", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert "\r" not in proc.stdout
    # Without capture only the first iteration warms up; the lines of iterations 2 and 4 follow.
    assert lines[0].startswith("[1/4] compiling kernels") and len(lines) == 3
    assert lines[1].startswith("[2/4]  50%  ") and " s left " in lines[1]  # iteration 2 is steady: a rate
    assert lines[2].startswith("[4/4] 100%  0.0 s left") and lines[2].endswith(" it/s")


def test_a_run_that_makes_the_loss_worse_says_so_on_its_last_line(tmp_path):
    from tests.helpers import run_harness

    proc = run_harness(
        "train",
        "+env=cartpole",
        "env.horizon=8",
        "env.world_count=1",
        "iterations=3",
        "optim=sgd",
        "optim.lr=3e4",
        "clip=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )  # fmt: skip  (a step far too large for this problem)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_loss"] > 2 * summary["initial_loss"]
    last = proc.stdout.strip().splitlines()[-1]
    ratio = summary["final_loss"] / summary["initial_loss"]
    assert last.startswith(
        f"done: initial loss {summary['initial_loss']:.6g} -> final loss {summary['final_loss']:.6g} "
        f"({ratio:.3g} times the initial loss: training made the loss worse)"
    ), last
