"""``harness report`` on sweeps whose jobs did not all finish: every job listed with its status
(finished, diverged, failed, interrupted, no summary, no or empty events), a line of counts, a
CSV with a status column and a PNG of the jobs that have curves, never a crash.

The finished jobs come from a real sweep; the others are copies of them edited the way each
outcome leaves a folder (a failed job's summary, a killed job's missing summary, a deleted or
empty event file), which the report reads as it reads real ones."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_harness as harness

TINY = ["+env=cartpole", "env.horizon=10", "env.world_count=1", "iterations=4", "log_every=2", "plot_every=null"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory) -> Path:
    """A real two-job sweep (``clip.max_norm=0.5,2``), both finished."""
    root = tmp_path_factory.mktemp("report_status")
    sweep = root / "sweep"
    proc = harness("train", "-m", *TINY, "clip.max_norm=0.5,2", f"hydra.sweep.dir={sweep}", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sweep


def add_job(sweep: Path, value: str, *, summary: dict | str | None = "keep", events: str = "keep", overrides=None):
    """A copy of the finished job ``clip.max_norm=2`` as ``clip.max_norm=<value>``, with its
    summary replaced (None: removed, as a killed job leaves it), its events kept, removed
    (``none``) or emptied (``empty``), and its overrides replaced when given."""
    job = sweep / f"clip.max_norm={value}"
    shutil.copytree(sweep / "clip.max_norm=2", job)
    lines = (job / ".hydra" / "overrides.yaml").read_text().replace("clip.max_norm=2", f"clip.max_norm={value}")
    (job / ".hydra" / "overrides.yaml").write_text(lines if overrides is None else overrides)
    if summary is None:
        (job / "summary.json").unlink()
    elif summary != "keep":
        (job / "summary.json").write_text(json.dumps(summary, allow_nan=True))
    for event_file in job.glob("events.out.tfevents.*"):
        if events == "none":
            event_file.unlink()
        elif events == "empty":
            event_file.write_bytes(b"")
    return job


def finished_summary(sweep: Path, **changes) -> dict:
    summary = json.loads((sweep / "clip.max_norm=2" / "summary.json").read_text())
    return {**summary, **changes}


def report(sweep: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The report's printed lines (rc 0 asserted) and its CSV rows by ``clip.max_norm``."""
    proc = harness("report", str(sweep), cwd=sweep.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not drawn" not in proc.stdout, proc.stdout
    with open(sweep / "report.csv") as f:
        rows = {row["clip.max_norm"]: row for row in csv.DictReader(f)}
    assert (sweep / "report.png").read_bytes()[:8] == PNG
    return proc.stdout.splitlines(), rows


def test_report_lists_every_job_with_its_status_and_counts_them(finished_sweep, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(finished_sweep, sweep)
    add_job(sweep, "-1", summary={"status": "failed", "error": "clip.max_norm: must be >= 0, got -1"}, events="none")
    nan = finished_summary(sweep, status="diverged", final_loss=math.nan, diverged={"iteration": 3, "what": "loss nan"})
    add_job(sweep, "5", summary=nan)
    stopped = finished_summary(sweep, status="interrupted", signal="SIGTERM", iterations_done=2)
    add_job(sweep, "7", summary=stopped)
    add_job(sweep, "9", summary=None)  # killed: no summary.json
    add_job(sweep, "11", events="empty")  # finished, its event file empty
    add_job(sweep, "13", events="none")  # finished, no event file
    # A failed job whose overrides lack the swept key (another sweep in the same folder).
    overrides = (sweep / "clip.max_norm=2" / ".hydra" / "overrides.yaml").read_text().splitlines()
    without = "\n".join(line for line in overrides if "clip.max_norm" not in line) + "\n"
    add_job(sweep, "15", summary={"status": "failed", "error": "RuntimeError: boom"}, events="none", overrides=without)

    lines, rows = report(sweep)
    table = {line.split()[0]: line for line in lines[1:] if line.split() and not line.startswith(("jobs:", "wrote"))}
    assert "finished" in table["0.5"] and "finished" in table["2"]
    assert "failed (clip.max_norm: must be >= 0, got -1); no event file" in table["-1"]
    assert "diverged (at iteration 3, loss nan)" in table["5"]
    assert "interrupted (SIGTERM after 2 of 4 iterations)" in table["7"]
    assert "unfinished (no summary.json: running or killed)" in table["9"]
    assert "finished; no loss in the events" in table["11"]
    assert "finished; no event file" in table["13"]
    assert "failed (RuntimeError: boom)" in table["-"]  # the missing swept value
    # Sorted: finished by final loss, then diverged, interrupted, unfinished, failed.
    order = [table_line.split()[0] for table_line in lines[1:10]]
    assert order[4:7] == ["5", "7", "9"] and set(order[7:]) == {"-1", "-"}
    assert "jobs: 9 (4 finished, 1 diverged, 1 interrupted, 1 unfinished, 2 failed); 4 without a loss curve" in lines
    # The CSV: every job, its status, its error and its number of curve points.
    assert {v: r["status"] for v, r in rows.items()} == {
        "0.5": "finished",
        "2": "finished",
        "-1": "failed",
        "5": "diverged",
        "7": "interrupted",
        "9": "unfinished",
        "11": "finished",
        "13": "finished",
        "": "failed",
    }
    assert rows["2"]["curve_points"] == "4" and rows["11"]["curve_points"] == "0"
    assert rows["-1"]["error"] == "clip.max_norm: must be >= 0, got -1" and rows["5"]["final_loss"] == "nan"
    # The PNG names how many jobs have no curve, and why.
    from harness.report import _curves_title, collect

    jobs, _ = collect(sweep)
    assert _curves_title(jobs, 0) == "loss curves of 5 of 9 jobs; none for 4: 2 finished, 2 failed"


def test_report_of_a_sweep_where_every_job_failed(finished_sweep, tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.copy(finished_sweep / "multirun.yaml", sweep)
    shutil.copytree(finished_sweep / "clip.max_norm=2", sweep / "clip.max_norm=2")
    failed = {"status": "failed", "error": "ValueError: optim.lr must be > 0"}
    for value in ("-1", "-2"):
        add_job(sweep, value, summary=failed, events="none")
    shutil.rmtree(sweep / "clip.max_norm=2")
    lines, rows = report(sweep)
    assert "jobs: 2 (2 failed); 2 without a loss curve" in lines
    assert [r["status"] for r in rows.values()] == ["failed", "failed"]


def test_report_of_a_sweep_started_but_with_no_summary_or_events_yet(finished_sweep, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(finished_sweep, sweep)
    for job in ("clip.max_norm=0.5", "clip.max_norm=2"):
        (sweep / job / "summary.json").unlink()
        for event_file in (sweep / job).glob("events.out.tfevents.*"):
            event_file.unlink()
    lines, rows = report(sweep)
    assert "jobs: 2 (2 unfinished); 2 without a loss curve" in lines
    assert {r["error"] for r in rows.values()} == {"no summary.json: running or killed"}


def test_report_of_jobs_with_nan_and_inf_curves(finished_sweep, tmp_path):
    from harness import tags
    from harness.events import EventWriter

    sweep = tmp_path / "sweep"
    shutil.copytree(finished_sweep, sweep)
    for value, curve in (("3", [1.0, math.nan, math.inf, 0.0]), ("4", [math.nan] * 4), ("6", [-1.0, 0.0, 2.0, 1e6])):
        job = add_job(sweep, value, summary=finished_summary(sweep, final_loss=curve[-1]), events="none")
        writer = EventWriter(job)
        for step, loss in enumerate(curve, start=1):
            writer.scalars(step, {tags.LOSS_TOTAL: loss})
        writer.close()
    lines, rows = report(sweep)
    assert "jobs: 5 (3 finished, 2 diverged)" in lines
    assert rows["4"]["final_loss"] == "nan" and rows["4"]["curve_points"] == "4"


def jobs_for_figure(finals: list[float], curves: list[list[float]], status: str = "finished") -> tuple:
    """Synthetic rows (seed 0 and 1 per threshold), for the figure alone."""
    from harness.report import JobRow, aggregate

    rows = []
    for i, (final, curve) in enumerate(zip(finals, curves, strict=True)):
        rows.append(
            JobRow(
                folder=Path(f"job{i}"),
                overrides={"clip.max_norm": str([0.01, 1.0, 100.0][i % 3]), "seed": str(i // 3)},
                status=status,
                final_loss=final,
                best_loss=final,
                clipped_fraction=0.5,
                nonfinite_steps=0.0,
                curve=(list(range(1, len(curve) + 1)), curve),
                norm_pre_median=final,
            )
        )
    swept = ["clip.max_norm", "seed"]
    return (rows, swept, *aggregate(rows, swept))


@pytest.mark.parametrize(
    ("finals", "curves"),
    [
        ([0.0, 10.0, 1000.0, 5.0, 0.1, 2.0], [[0.0, 1.0, 100.0]] * 6),  # zeros where a log axis would be
        ([-1.0, 10.0, 1000.0, math.nan, math.inf, -math.inf], [[-5.0, 1.0, 1e4]] * 6),  # negative, nan, inf
        ([math.nan] * 6, [[math.nan, math.nan]] * 6),  # nothing finite at all
        ([math.inf] * 6, [[math.inf, -math.inf]] * 6),
        ([1.0] * 6, [[]] * 6),  # no curve anywhere
    ],
)
def test_report_figure_draws_whatever_the_values(finals, curves):
    import io
    import warnings

    from harness.report import report_figure

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a warning from a log axis or a non-finite value
        fig = report_figure(*jobs_for_figure(finals, curves))
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=40)
    assert buffer.getvalue()[:8] == PNG
    for ax in fig.axes:
        low, high = ax.get_ylim()
        assert np.isfinite([low, high]).all(), ax.get_title()
        if ax.get_yscale() == "log":
            assert low > 0, ax.get_title()


def test_report_refuses_an_unwritable_report_in_one_line(finished_sweep, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(finished_sweep, sweep)
    (sweep / "report.png").mkdir()  # a folder where the picture goes
    proc = harness("report", str(sweep), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: report: cannot write '{sweep / 'report.png'}': a folder has that name; "
        "accepted: a file name (move the folder)"
    ]
