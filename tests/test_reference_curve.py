"""scripts/reference_shac_ant.py: a published wandb export summarised per epoch, run as a process on
an export written here in the layout of imgeorgiev/DiffRL's ``results/data/*_time.csv`` (columns
``<run> - _step`` and ``<run> - rewards``, rows indexed by time, empty cells where a run logged
nothing), including the defect of ``ahac_hopper_time.csv``: a run with returns and no steps."""

from __future__ import annotations

import csv
import subprocess
import sys

from tests.helpers import ROOT


def cell(values, i):
    return values[i] if i < len(values) else ""


def write_export(path, runs):
    """runs: name -> (steps or None, rewards); one row per entry, '' where a run has none."""
    header = ["", "Relative Time (Process)"]
    for name, (steps, _) in runs.items():
        header += ([f"{name} - _step"] if steps is not None else []) + [f"{name} - rewards"]
    length = max(len(rewards) for _, rewards in runs.values())
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(header)
        for i in range(length):
            row = [i, 10.0 + i]
            for steps, rewards in runs.values():
                row += ([cell(steps, i)] if steps is not None else []) + [cell(rewards, i)]
            out.writerow(row)


def summarise(export, out, *args):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "reference_shac_ant.py"), str(export), "--out", str(out), *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip


def read_rows(path):
    return list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))


def test_mean_std_min_max_per_epoch_over_the_runs_that_logged_it(tmp_path):
    export = tmp_path / "shac_x_time.csv"
    write_export(export, {"a": ([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0]), "b": ([0, 1, 2], [3.0, 6.0, 9.0])})
    summarise(export, tmp_path / "x.csv", "--every", "1")
    rows = {int(r["epoch"]): r for r in read_rows(tmp_path / "x.csv")}
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[1]["seeds"] == "2" and float(rows[1]["mean"]) == 4.0 and float(rows[1]["min"]) == 2.0
    assert abs(float(rows[1]["std"]) - 2**0.5 * 2) < 0.05  # sample std of (2, 6): 2.83
    assert rows[3]["seeds"] == "1" and float(rows[3]["mean"]) == 4.0  # only a logged epoch 3


def test_a_run_without_a_step_column_is_left_out_and_named(tmp_path):
    export = tmp_path / "ahac_y_time.csv"
    write_export(export, {"a": ([0, 1], [1.0, 2.0]), "b": (None, [100.0, 200.0]), "c": ([0, 1], [3.0, 4.0])})
    result = summarise(export, tmp_path / "y.csv", "--every", "1", "--method", "AHAC")
    assert "left out (no _step column): b" in result.stdout
    assert "2 seeds" in result.stdout
    rows = read_rows(tmp_path / "y.csv")
    assert [(r["seeds"], float(r["mean"])) for r in rows] == [("2", 2.0), ("2", 3.0)]  # b's 100, 200 not in it
