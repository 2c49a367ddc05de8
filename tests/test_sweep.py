"""Sweeps as a user runs them: real Hydra multiruns with real launchers, the HParams
records read back with TensorBoard's own reader, the report, and a real TensorBoard server."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from tests.helpers import run_harness, start_harness

TINY = ["+env=cartpole", "env.horizon=10", "env.world_count=1", "iterations=4", "log_every=2", "plot_every=null"]


harness = run_harness


@pytest.fixture(scope="module")
def joblib_sweep(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """Two thresholds, joblib launcher with two worker processes."""
    root = tmp_path_factory.mktemp("sweep")
    sweep = root / "sweep"
    proc = harness(
        "train",
        "-m",
        *TINY,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "clip.max_norm=0.5,2",
        f"hydra.sweep.dir={sweep}",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sweep, proc


def hparams_of(run: Path) -> tuple[dict, dict]:
    """(hyperparameters, metrics) of one run, from TensorBoard's own event reader."""
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    values = {}
    for key, value in start.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        values[key] = getattr(value, kind)
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    # The dashboard shows the last value of each metric's scalar tag.
    metrics = {m.name.tag: (m.display_name, acc.Scalars(m.name.tag)[-1]) for m in experiment.metric_infos}
    return values, metrics


def test_joblib_multirun_names_job_folders_by_the_swept_value(joblib_sweep):
    sweep, proc = joblib_sweep
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["clip.max_norm=0.5", "clip.max_norm=2"]
    for job in jobs:
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["status"] == "finished"
        assert (sweep / job / "config.yaml").exists()
    assert "schema with the same name" not in proc.stderr


def test_parallel_jobs_label_every_line_they_print(joblib_sweep):
    """Two joblib workers print side by side: each line says which job it is from."""
    sweep, proc = joblib_sweep
    ours = [line for line in proc.stdout.splitlines() if not line.startswith("[20")]  # Hydra's log lines
    ours = [line for line in ours if "run folder:" in line or "done:" in line or "it/s" in line]
    assert ours  # the workers' output reached the terminal
    labels = {"[job 0: clip.max_norm=0.5]", "[job 1: clip.max_norm=2]"}
    assert all(line.split("] ", 1)[0] + "]" in labels for line in ours), ours
    for label in labels:
        assert sum(line.startswith(label + " done:") for line in ours) == 1
        # The done line's final loss is the one in the job's summary.json.
        (done,) = [line for line in ours if line.startswith(label + " done:")]
        summary = json.loads((sweep / label[len("[job 0: ") : -1] / "summary.json").read_text())
        assert f"final loss {summary['final_loss']:.6g}" in done
        assert any(line.startswith(label + " [") and "it/s" in line for line in ours)  # its progress lines


def test_every_job_carries_its_hparams_and_metrics(joblib_sweep):
    sweep, _ = joblib_sweep
    for value in (0.5, 2.0):
        run = sweep / f"clip.max_norm={value:g}"
        hparams, metrics = hparams_of(run)
        assert hparams["clip.max_norm"] == value
        assert hparams["clip"] == "global_norm" and hparams["optim"] == "adam" and hparams["env"] == "cartpole"
        # The seed names a replicate: shown as written (a number would read 0.0000 there).
        assert hparams["env.horizon"] == 10 and hparams["seed"] == "0" and hparams["optim.lr"] == 0.5
        summary = json.loads((run / "summary.json").read_text())
        assert set(metrics) == {"loss/final", "loss/best", "optim/clipped_fraction", "optim/grad_norm_pre"}
        assert metrics["loss/best"][0] == "best loss" and metrics["loss/final"][0] == "final loss"
        # Every metric sits at the last iteration's step; the final loss is summary.json's,
        # the loss of the trained parameters (float32 in the event file).
        assert {event.step for _, event in metrics.values()} == {summary["iterations"]}
        assert metrics["loss/final"][1].value == pytest.approx(summary["final_loss"], rel=1e-6)
        assert len(curve(run, "loss/final")) == 1
        assert metrics["loss/best"][1].value == pytest.approx(min(curve(run, "loss/total")))
        assert metrics["optim/clipped_fraction"][1].value == pytest.approx(summary["clipped_steps"] / 4)
        assert summary["best_loss"] <= metrics["loss/best"][1].value
        assert not [tag for tag in scalar_tags(run) if tag.startswith("hparams/")]


def curve(run: Path, tag: str) -> list[float]:
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


def scalar_tags(run: Path) -> list[str]:
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return acc.Tags()["scalars"]


def test_report_writes_a_sorted_table_csv_and_png(joblib_sweep, tmp_path):
    sweep, _ = joblib_sweep
    proc = harness("report", str(sweep), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["clip.max_norm", "final_loss"]
    finals = [float(line.split()[1]) for line in lines[1:3]]
    assert finals == sorted(finals)
    with open(sweep / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["clip.max_norm"] for r in rows) == ["0.5", "2"]
    assert all(r["status"] == "finished" for r in rows)
    png = (sweep / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > 600 and height > 300
    # The curves count iterations from 1, as TensorBoard's step does (4 iterations, logged every 2).
    from harness.report import collect

    jobs, _ = collect(sweep)
    assert [job.curve[0] for job in jobs] == [[1, 2, 3, 4]] * 2


def synthetic_sweep() -> tuple:
    """Three thresholds, three seeds each, spreads wide enough that mean - std < 0."""
    from harness.report import JobRow, aggregate

    finals = {"0.01": [0.01, 1.0, 100.0], "1": [5.0, 6.0, 7.0], "inf": [3.0, 30.0, 300.0]}
    clipped = {"0.01": [1.0, 1.0, 0.7], "1": [0.0, 0.05, 0.9], "inf": [0.0, 0.0, 0.0]}
    rows = []
    for value, losses in finals.items():
        for seed, loss in enumerate(losses):
            rows.append(
                JobRow(
                    folder=Path(f"clip.max_norm={value},seed={seed}"),
                    overrides={"clip.max_norm": value, "seed": str(seed)},
                    status="finished",
                    final_loss=loss,
                    best_loss=loss,
                    clipped_fraction=clipped[value][seed],
                    nonfinite_steps=0.0,
                    wall_time_s=1.0,
                    curve=(list(range(1, 31)), list(np.geomspace(10 * loss, loss, 30))),
                    norm_pre_median=loss / 10,
                )
            )
    swept = ["clip.max_norm", "seed"]
    keys, groups = aggregate(rows, swept)
    return rows, swept, keys, groups


def test_report_figure_legends_cover_no_data_and_bars_stay_on_the_axes():
    from harness.report import report_figure

    fig = report_figure(*synthetic_sweep())
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    curves, finals, clipped, norms = fig.axes
    legends = [curves.get_legend(), *fig.legends]
    assert all(legend is not None for legend in legends) and len(fig.legends) == 1
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), (legend, ax.get_title())
    # The loss curves start at iteration 1, and 1 is a tick.
    assert curves.get_xticks()[0] == 1
    # Every error bar lies within its axes' limits, on log axes too (0.01, 1 and 100: the
    # mean minus one standard deviation is negative); the clipped fraction within 0-100 %.
    assert finals.get_yscale() == "log" and norms.get_yscale() == "log"
    for ax in (finals, clipped, norms):
        low, high = ax.get_ylim()
        bars = [c for c in ax.collections if type(c).__name__ == "LineCollection"]
        assert bars, ax.get_title()
        ends = np.concatenate([np.asarray(seg)[:, 1] for bar in bars for seg in bar.get_segments()])
        assert ends.min() >= low and ends.max() <= high, ax.get_title()
        if ax is clipped:
            assert ends.min() >= 0.0 and ends.max() <= 1.0


def start_long_job(sweep: Path, threshold: str, cwd: Path) -> tuple[subprocess.Popen, Path]:
    """A multirun job that would run for a long time, once it has logged a few iterations."""
    long_args = ["+env=cartpole", "env.horizon=10", "env.world_count=1", "iterations=100000", "log_every=1"]
    proc = start_harness(
        "train",
        "-m",
        *long_args,
        f"clip.max_norm={threshold},99",
        f"hydra.sweep.dir={sweep}",
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    job = sweep / f"clip.max_norm={threshold}"
    deadline = time.monotonic() + 240
    while not list(job.glob("events.out.tfevents.*")) or not (job / "config.yaml").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.5)
    time.sleep(2.0)
    return proc, job


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_report_marks_failed_interrupted_and_unfinished_jobs(joblib_sweep, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(joblib_sweep[0], sweep)
    # A job that fails: a negative threshold is rejected by the clip policy.
    failed = harness("train", "-m", *TINY, "clip.max_norm=-1,3", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert failed.returncode != 0
    # A job that never finishes: killed with SIGKILL.
    proc, job = start_long_job(sweep, "7", tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (job / "summary.json").exists()
    # A job pre-empted the way a scheduler does it: SIGTERM, then it checkpoints and stops.
    proc, job = start_long_job(sweep, "9", tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert json.loads((job / "summary.json").read_text())["status"] == "interrupted"

    out = harness("report", str(sweep), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines()[1:] if line[:1].isdigit() or line[:1] == "-"]
    status = {line.split()[0]: line for line in rows}
    assert "finished" in status["0.5"] and "finished" in status["2"]
    assert "failed" in status["-1"] and "clip.max_norm" in status["-1"]
    assert "unfinished" in status["7"]
    assert "interrupted (SIGTERM after" in status["9"]
    # finished rows first, then interrupted, unfinished, failed
    assert [line.split()[0] for line in rows][-3:] == ["9", "7", "-1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def post_json(url: str, body: dict):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_tensorboard_server_serves_the_sweep_runs_scalars_and_hparams(joblib_sweep):
    sweep, _ = joblib_sweep
    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "tensorboard"),
            "--logdir",
            str(sweep),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        runs = []
        while sorted(runs) != ["clip.max_norm=0.5", "clip.max_norm=2"]:
            assert time.monotonic() < deadline, runs
            assert server.poll() is None
            try:
                runs = get_json(f"{base}/data/runs")
            except OSError:
                pass
            time.sleep(0.5)
        query = urllib.parse.urlencode({"run": "clip.max_norm=2", "tag": "loss/total"})
        deadline = time.monotonic() + 60
        while True:
            try:
                points = get_json(f"{base}/data/plugin/scalars/scalars?{query}")
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert [step for _, step, _ in points] == [1, 2, 3, 4]  # iterations counted from 1
        # TensorBoard's HParams plugin: the swept value is marked as differing (listed
        # first), the metrics are the final loss and three curves, read at the last iteration.
        experiment = post_json(f"{base}/data/plugin/hparams/experiment", {"experimentName": ""})
        infos = experiment["hparamInfos"]
        assert infos[0]["name"] == "clip.max_norm" and infos[0]["differs"]
        assert not any(info["differs"] for info in infos[1:])
        tags = [m["name"]["tag"] for m in experiment["metricInfos"]]
        assert tags == ["loss/final", "loss/best", "optim/clipped_fraction", "optim/grad_norm_pre"]
        groups = post_json(
            f"{base}/data/plugin/hparams/session_groups",
            {
                "experimentName": "",
                "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
                "colParams": [{"metric": {"tag": tag}} for tag in tags],
                "startIndex": 0,
                "sliceSize": 10,
            },
        )["sessionGroups"]
        assert sorted(g["name"] for g in groups) == ["clip.max_norm=0.5", "clip.max_norm=2"]
        for group in groups:
            summary = json.loads((sweep / group["name"] / "summary.json").read_text())
            values = {m["name"]["tag"]: m for m in group["metricValues"]}
            assert {m["trainingStep"] for m in values.values()} == {4}
            assert values["loss/best"]["value"] == pytest.approx(min(curve(sweep / group["name"], "loss/total")))
            assert values["loss/final"]["value"] == pytest.approx(summary["final_loss"], rel=1e-6)
            assert values["optim/clipped_fraction"]["value"] == pytest.approx(summary["clipped_steps"] / 4)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_submitit_local_launcher_runs_one_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = harness(
        "train",
        "-m",
        *TINY,
        "hydra/launcher=submitit_local",
        "clip.max_norm=1",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summaries = list(sweep.rglob("summary.json"))
    assert len(summaries) == 1
    assert json.loads(summaries[0].read_text())["status"] == "finished"
    assert list(sweep.glob(".submitit/*"))  # submitit's own job folder: it really went through submitit


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_parallel_jobs_share_a_cold_kernel_cache_compiled_once_before_launch(tmp_path):
    """A fresh WARP_CACHE_PATH: the warm-up callback compiles in the launching process;
    both parallel jobs then only load cached modules, Featherstone's included."""
    cache = tmp_path / "warp-cache"
    proc = harness(
        "train",
        "-m",
        *TINY,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "clip.max_norm=1,2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        env={"WARP_CACHE_PATH": str(cache), "HARNESS_WARP_LOG_LEVEL": "info"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    launch = next(i for i, line in enumerate(lines) if "Launching jobs" in line)
    before, after = lines[:launch], lines[launch:]
    assert any("featherstone" in line and "(compiled)" in line for line in before)
    assert not [line for line in after if "(compiled)" in line]
    featherstone_loads = [line for line in after if "featherstone" in line and "(cached)" in line]
    assert len(featherstone_loads) >= 2  # once in each job
    assert len(list(cache.rglob("*featherstone*"))) >= 1


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_report_treats_seeds_as_replicates_and_plots_against_the_threshold(tmp_path):
    sweep = tmp_path / "sweep"
    proc = harness(
        "train", "-m", *TINY, "clip.max_norm=1e-6,1,inf", "seed=0,1", f"hydra.sweep.dir={sweep}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = harness("report", str(sweep), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = lines.index("per value, over seeds (mean and standard deviation of the finished ones):")
    header, *values = lines[start + 1 : start + 5]
    assert header.split()[:3] == ["clip.max_norm", "seeds", "final_loss_mean"]
    assert [v.split()[0] for v in values] == ["1e-06", "1", "inf"]  # sorted by value, not by loss
    assert all(v.split()[1] == "2/2" for v in values)
    assert values[0].split()[4] == "100%" and values[1].split()[4] == "0%"  # 1e-6 clips every step
    with open(sweep / "report.csv") as f:
        jobs = list(csv.DictReader(f))
    with open(sweep / "report_by_value.csv") as f:
        groups = {row["clip.max_norm"]: row for row in csv.DictReader(f)}
    for value, group in groups.items():
        finals = [float(j["final_loss"]) for j in jobs if j["clip.max_norm"] == value]
        assert len(finals) == 2
        assert float(group["final_loss_mean"]) == pytest.approx(sum(finals) / 2, rel=1e-12)
        assert float(group["final_loss_std"]) == pytest.approx(abs(finals[0] - finals[1]) / 2**0.5, rel=1e-9)
    png = (sweep / "report.png").read_bytes()
    assert png[:4] == b"\x89PNG" and int.from_bytes(png[16:20], "big") >= 1200


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_report_on_a_single_run_says_it_is_not_a_sweep(tmp_path):
    run_dir = tmp_path / "run"
    assert harness("train", *TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path).returncode == 0
    out = harness("report", str(run_dir), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: report: '{run_dir}' is a single run, not a sweep; accepted: the folder of a multirun "
        "(multirun/<time>, holding multirun.yaml and one folder per job)"
    ]
