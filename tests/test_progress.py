"""The progress line redraws in place on a real terminal (a pseudo-terminal here)."""

from __future__ import annotations

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
    redraws = [part for part in out.split("\r") if part.startswith("[")]
    # One redraw per iteration (6), each starting with the iteration counter.
    counters = [part.split("]")[0] for part in redraws]
    assert counters == [f"[{i}/6" for i in range(1, 7)]
    # A healthy run never shows nan: before the first read-back the line says when the
    # values come; between read-backs it says which iteration they belong to.
    assert "nan" not in out
    assert all("loss and |g|pre from iteration 3" in part for part in redraws[:2])
    assert all("(at 3)" in part for part in redraws[3:5])
    assert all("(at" not in part and "loss " in part for part in (redraws[2], redraws[5]))
    # How far along, and the time left.
    assert [part.split("]")[1].split("%")[0].strip() for part in redraws] == ["17", "33", "50", "67", "83", "100"]
    assert all(" left " in part for part in redraws)
