"""Runs that diverge stop with status ``diverged``, one line and exit 1, keeping the last good
checkpoint; runs whose loss is non-finite for a few iterations go on; the tally (and so a
checkpoint) has the same size at every iteration."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import checkpoint, tags
from harness.training import NONFINITE_LOSS_LIMIT, Callback, Tally, TrainingDiverged
from tests.helpers import make_trainer, run_harness

SMALL = ["+env=cartpole", "env.horizon=10", "env.world_count=2", "log_every=5", "iterations=40", "plot_every=null"]
EXPLODE = [*SMALL, "optim=sgd", "optim.momentum=0", "clip=none", "checkpoint.every=1", "checkpoint.keep=50"]
"""SGD without clipping: at lr 1e30 the first update gives forces of ~1e26 N and every later
rollout (loss and gradient) is nan; at lr 1e39 (inf in float32) the first update makes the
forces themselves inf."""


def checkpoints(run_dir: Path) -> list[Path]:
    return checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and "CUDA" not in line]


def test_a_run_whose_loss_stays_nan_stops_diverged_with_one_line_and_keeps_its_last_good_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_harness("train", *EXPLODE, "optim.lr=1e30", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    # nan from iteration 2 on; a checkpoint falls due every iteration, so every iteration is read
    # back: after iteration 11 the loss has been nan for 10 in a row.
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "error: diverged at iteration 11: the loss has been nan since iteration 2 (10 iterations in a row; "
        f"limit {NONFINITE_LOSS_LIMIT}); 10 skipped steps; last good checkpoint: "
    ), lines[0]
    assert lines[0].endswith("ckpt_00000001.hckpt")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert summary["iterations_done"] == 11 < summary["iterations"] == 40  # stopped early
    assert summary["diverged"] == {
        "iteration": 11,
        "what": "loss",
        "value": "nan",
        "loss_nonfinite_since": 2,
        "last_checkpoint": str(checkpoints(run_dir)[-1]),
    }
    assert summary["skipped_steps"] == summary["nonfinite_steps"] == 10
    # Checkpoints wait while the loss is nan, and none is written at the end: iteration 1's is the newest.
    saved = [checkpoint.load(p) for p in checkpoints(run_dir)]
    assert [c.iteration for c in saved] == [1]
    assert np.isfinite(saved[0].arrays["params/data"]).all()
    # The skipped steps show on the progress line as they happen.
    progress = [line for line in proc.stdout.splitlines() if re.match(r"\[\s*\d+/40\]\s+\d+%", line)]
    assert [line.split("]")[0] for line in progress] == ["[ 5/40", "[10/40"]
    assert ["  4 skipped steps  " in progress[0], "  9 skipped steps  " in progress[1]] == [True, True]
    # TensorBoard was closed cleanly and holds every iteration that ran.
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars(tags.LOSS_TOTAL)] == list(range(1, 12))


def test_parameters_that_become_inf_stop_the_run_at_that_read_back_and_are_never_checkpointed(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_harness("train", *EXPLODE, "optim.lr=1e39", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = error_lines(proc.stderr)
    assert lines == [
        "error: diverged at iteration 1: the parameters are not finite ('controls' holds 20 nan or inf entries); "
        "no checkpoint was written before it"
    ], proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["iterations_done"] == 1
    assert summary["diverged"]["what"] == "parameters" and summary["diverged"]["parameter"] == "controls"
    assert checkpoints(run_dir) == []  # the checkpoint due at iteration 1 held inf forces


# -- the rule, in process (the history read-backs are doctored: the loss is nan where asked) ----------------------


def with_nan_losses(trainer, nan_at: set[int]):
    """Make the loop read a nan loss at the iterations (from 1) in ``nan_at``."""
    step = trainer.step
    read, column = step.read_rows, step.columns.index(tags.LOSS_TOTAL)

    def read_rows(first: int, last: int) -> np.ndarray:
        rows = read(first, last).copy()
        for r in range(len(rows)):
            if first + r + 1 in nan_at:
                rows[r, column] = np.nan
        return rows

    step.read_rows = read_rows
    return trainer


def small_trainer(iterations: int, *, checkpoint_every: int = 5, **kw):
    trainer = make_trainer(horizon=8, iterations=iterations, log_every=5, **kw)
    trainer.settings = dataclasses.replace(trainer.settings, checkpoint_every=checkpoint_every, checkpoint_keep=50)
    return trainer


def saved_iterations(run_dir: Path) -> list[int]:
    return [checkpoint.load(p).iteration for p in checkpoints(run_dir)]


def test_a_run_whose_loss_is_nan_for_fewer_iterations_than_the_limit_recovers_and_finishes(tmp_path, capsys):
    streak = set(range(3, 3 + NONFINITE_LOSS_LIMIT - 1))  # 3..11: one short of the limit
    trainer = with_nan_losses(small_trainer(30), streak | {20})
    summary = trainer.fit(tmp_path)
    assert summary["status"] == "finished" and summary["iterations_done"] == 30
    assert np.isfinite(summary["initial_loss"]) and summary["best_loss"] <= summary["initial_loss"]
    # The checkpoints due at 5 and 10 fell inside the nan losses and were left out; 20 too.
    assert saved_iterations(tmp_path) == [15, 25, 30]
    assert "diverged" not in json.loads((tmp_path / "summary.json").read_text())
    assert "nan" in capsys.readouterr().out  # the progress line showed it (no gradient was non-finite)


def test_a_loss_nan_for_the_limit_of_iterations_stops_the_run_at_the_next_read_back(tmp_path):
    trainer = with_nan_losses(small_trainer(40), set(range(7, 41)))
    with pytest.raises(TrainingDiverged) as caught:
        trainer.fit(tmp_path)
    # Read-backs every 5: after 15 the loss has been nan for 9 iterations, after 20 for 14.
    exc = caught.value
    assert (exc.iteration, exc.what, exc.checkpoint) == (20, "loss", checkpoints(tmp_path)[-1])
    assert str(exc) == (
        f"diverged at iteration 20: the loss has been nan since iteration 7 (14 iterations in a row; limit 10); "
        f"last good checkpoint: {exc.checkpoint}"
    )
    assert saved_iterations(tmp_path) == [5]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(exc.summary))
    assert summary["status"] == "diverged" and summary["iterations_done"] == 20
    assert summary["diverged"]["loss_nonfinite_since"] == 7


class SetInf(Callback):
    """Puts an inf into the parameters after iteration ``after`` (from 1)."""

    def __init__(self, after: int):
        self.after = after

    def on_iteration(self, loop, iteration: int) -> None:
        if iteration + 1 == self.after:
            flat = loop.step.params.data.numpy()
            flat[3] = np.inf
            loop.step.params.data.assign(flat)


def test_an_inf_parameter_stops_the_run_at_the_next_read_back_without_a_checkpoint_of_it(tmp_path):
    trainer = small_trainer(40)
    with pytest.raises(TrainingDiverged) as caught:
        trainer.fit(tmp_path, callbacks=[SetInf(after=12)])
    exc = caught.value
    assert (exc.iteration, exc.what) == (15, "parameters")
    assert str(exc).startswith(
        "diverged at iteration 15: the parameters are not finite ('controls' holds 1 nan or inf entry); "
        "the loss has been nan since iteration 13; 3 skipped steps; last good checkpoint: "
    ), str(exc)
    assert saved_iterations(tmp_path) == [5, 10]
    assert exc.summary["diverged"]["nonfinite_entries"] == 1


def test_zeroed_steps_show_on_the_progress_line(tmp_path, capsys):
    from harness import clip as clips
    from harness.optim import sgd

    trainer = small_trainer(10, optimizer=sgd(1e30), clip=clips.with_nonfinite(clips.no_clip(), "zero"))
    with pytest.raises(TrainingDiverged) as caught:  # the loss is nan from iteration 2: 9 in a row at 10
        trainer.fit(tmp_path)
    assert caught.value.what == "final loss"
    assert "the loss after the last iteration is nan; the loss has been nan since iteration 2" in str(caught.value)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert "  4 zeroed steps  " in lines[-2] and "  9 zeroed steps  " in lines[-1], lines


def test_tally_follows_the_current_run_of_nonfinite_losses_across_read_backs():
    tally = Tally()
    nan = float("nan")
    tally.feed(np.array([3.0, 2.0, nan]), np.array([0.1, 0.2, nan]))
    assert (tally.flushed, tally.initial_loss, tally.best_loss, tally.nonfinite_loss_since) == (3, 3.0, 2.0, 3)
    tally.feed(np.array([nan, np.inf]), np.array([nan, nan]))
    assert tally.nonfinite_loss_since == 3 and tally.last_loss == np.inf  # still the same run
    tally.feed(np.array([1.0, nan, nan]), np.array([0.3, 0.0, 0.0]))
    assert (tally.nonfinite_loss_since, tally.best_loss, tally.flushed) == (7, 1.0, 8)
    tally.feed(np.array([4.0]), np.array([0.5]))
    assert (tally.nonfinite_loss_since, tally.best_loss, tally.last_loss, tally.last_norm) == (None, 1.0, 4.0, 0.5)


def test_a_tally_of_the_earlier_layout_with_every_loss_is_read_as_the_constant_size_one():
    """Checkpoints written before the tally became constant-size carry ``losses`` and ``norms``
    lists (``tests/data/stage2_run`` is such a checkpoint; ``test_checkpoint`` resumes it)."""
    old = checkpoint.load(Path(__file__).parent / "data" / "stage2_run" / "checkpoints" / "ckpt_00000004.hckpt")
    saved = old.meta["tally"]
    assert "losses" in saved and "flushed" not in saved
    tally = Tally.from_meta(saved)
    assert tally.flushed == len(saved["losses"]) == 4
    assert tally.initial_loss == saved["losses"][0] and tally.last_loss == saved["losses"][-1]
    assert tally.best_loss == min(saved["losses"]) and tally.last_norm == saved["norms"][-1]
    assert tally.initial_figures == saved["initial_figures"] and tally.nonfinite_loss_since is None
    nan = float("nan")
    tail = Tally.from_meta({**saved, "losses": [0.5, 0.25, nan, nan], "norms": [1.0, 1.0, nan, nan]})
    assert (tail.best_loss, tail.nonfinite_loss_since) == (0.25, 3)


def shape_of(meta: dict) -> str:
    """The meta's JSON with every number written as 0: what remains when values change."""
    return re.sub(r"-?(\d+\.?\d*(e[+-]?\d+)?|NaN|Infinity)", "0", json.dumps(meta, sort_keys=True))


def test_a_checkpoint_has_the_same_size_after_20_and_after_200_iterations(tmp_path):
    trainer = small_trainer(200, checkpoint_every=20)
    trainer.fit(tmp_path)
    files = {checkpoint.load(p).iteration: p for p in checkpoints(tmp_path)}
    early, late = checkpoint.load(files[20]), checkpoint.load(files[200])
    assert shape_of(early.meta) == shape_of(late.meta)  # the same entries, lists of the same lengths
    # Only the digits of numbers may differ (wall time, timings, losses): a few bytes.
    assert abs(files[200].stat().st_size - files[20].stat().st_size) < 100
