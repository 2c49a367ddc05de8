"""A run owns its folder, and a sweep outlives its failing jobs (issue 26, classes 1 and 2):
real processes started side by side, killed, resumed and refused, and real multiruns under
the basic and the joblib launcher with a refused, a failed and a diverged job."""

from __future__ import annotations

import csv
import hashlib
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import checkpoint
from tests.helpers import ROOT, run_harness, start_harness

TINY = ["+env=cartpole", "env.horizon=10", "env.world_count=1", "log_every=2", "plot_every=null"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (the lock file aside) by its SHA-256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def one_line_refusal(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run in a folder named on the command line."""
    root = tmp_path_factory.mktemp("finished")
    proc = run_harness("train", *TINY, "iterations=4", "checkpoint.every=2", f"hydra.run.dir={root / 'run'}", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root / "run"


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_second_writer_of_a_folder_is_refused_while_the_first_runs(tmp_path):
    run = tmp_path / "run"
    first = start_harness(
        "train", *TINY, "iterations=100000", f"hydra.run.dir={run}", cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        for line in first.stdout:  # the first run holds the folder once it trains
            if "compiling kernels" in line:
                break
        # read on what it prints (a line every log step): a full pipe would stop it mid-print
        threading.Thread(target=first.stdout.read, daemon=True).start()
        second = run_harness("train", *TINY, "iterations=4", f"hydra.run.dir={run}", cwd=tmp_path)
        line = one_line_refusal(second, "hydra.run.dir", str(run), f"process {first.pid}")
        assert "another folder" in line
        # nor may a resume or an overwrite take a folder another process writes
        again = run_harness("train", *TINY, "iterations=4", "overwrite=true", f"hydra.run.dir={run}", cwd=tmp_path)
        one_line_refusal(again, f"process {first.pid}")
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["iterations"] == 100000  # the first run's, untouched


def test_the_lock_dies_with_a_killed_process_and_the_folder_resumes(tmp_path):
    run = tmp_path / "run"
    first = start_harness(
        "train",
        *TINY,
        "iterations=3000",
        "checkpoint.every=20",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not checkpoint.list_checkpoints(run / "checkpoints") and time.monotonic() < deadline:
        time.sleep(0.2)
    first.kill()
    first.wait(timeout=30)
    assert checkpoint.list_checkpoints(run / "checkpoints"), "no checkpoint before the kill"
    resumed = run_harness("train", *TINY, "iterations=200", "resume=auto", f"hydra.run.dir={run}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout


def test_default_folders_of_runs_started_together_never_collide(tmp_path):
    """Two runs whose default folder name is the same (same second, same overrides) get two folders."""
    name = "hydra.run.dir=${harness.unique:outputs/cartpole/same_second}"
    procs = [
        start_harness(
            "train",
            *TINY,
            "iterations=2",
            name,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    folders = sorted(p.name for p in (tmp_path / "outputs" / "cartpole").iterdir())
    assert folders == ["same_second", "same_second_2"]
    for folder in folders:
        assert (
            json.loads((tmp_path / "outputs" / "cartpole" / folder / "summary.json").read_text())["status"]
            == "finished"
        )
    printed = sorted(
        line.split("run folder: ")[1] for out, _ in outs for line in out.splitlines() if "run folder: " in line
    )
    assert [Path(p).name for p in printed] == folders


def test_a_finished_run_is_reused_only_by_resume_or_overwrite(finished, tmp_path):
    before = snapshot(finished)
    again = run_harness("train", *TINY, "iterations=4", f"hydra.run.dir={finished}", cwd=tmp_path)
    line = one_line_refusal(again, "hydra.run.dir", "a finished run of 4 iterations", "resume=auto", "overwrite=true")
    assert snapshot(finished) == before, line
    # a resume refused for a config change leaves every file as it was, .hydra/ included
    changed = run_harness(
        "train", *TINY, "iterations=8", "optim.lr=0.123", "resume=auto", f"hydra.run.dir={finished}", cwd=tmp_path
    )
    one_line_refusal(changed, "optim.lr")
    assert snapshot(finished) == before
    # a resume asked for fewer iterations than were done
    fewer = run_harness("train", *TINY, "iterations=2", "resume=auto", f"hydra.run.dir={finished}", cwd=tmp_path)
    assert fewer.returncode == 2 and "Traceback" not in fewer.stderr, fewer.stderr
    assert snapshot(finished) == before


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_overwrite_replaces_a_finished_run(tmp_path):
    run = tmp_path / "run"
    first = run_harness("train", *TINY, "iterations=4", "checkpoint.every=1", f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert len(checkpoint.list_checkpoints(run / "checkpoints")) == 3
    second = run_harness("train", *TINY, "iterations=2", "overwrite=true", f"hydra.run.dir={run}", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert [p.name for p in checkpoint.list_checkpoints(run / "checkpoints")] == ["ckpt_00000002.hckpt"]
    assert json.loads((run / "summary.json").read_text())["iterations"] == 2
    events = list(run.glob("events.out.tfevents.*"))
    assert len(events) == 1  # the first run's events went with it


def test_a_resumed_run_keeps_its_folders_hydra_record(finished, tmp_path):
    """The overrides render and evaluate compose the run from stay those it was trained with."""
    copy = tmp_path / "run"
    subprocess.run(["cp", "-a", str(finished), str(copy)], check=True)
    before = (copy / ".hydra" / "overrides.yaml").read_text()
    more = run_harness(
        "train", *TINY, "iterations=6", "checkpoint.every=2", "resume=auto", f"hydra.run.dir={copy}", cwd=tmp_path
    )
    assert more.returncode == 0, more.stderr
    assert (copy / ".hydra" / "overrides.yaml").read_text() == before
    assert json.loads((copy / "summary.json").read_text())["iterations"] == 6


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_resume_that_starts_from_scratch_hides_the_earlier_events(tmp_path):
    run = tmp_path / "run"
    short = [a for a in TINY if not a.startswith("log_every=")]
    first = start_harness(
        "train",
        *short,
        "iterations=100000",
        "log_every=1",
        "plot_every=null",
        "checkpoint.every=0",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    try:  # some iterations logged (the events are flushed at every log step), no checkpoint yet
        while time.monotonic() < deadline:
            events = list(run.glob("events.out.tfevents.*"))
            if events and events[0].stat().st_size > 20_000:
                break
            assert first.poll() is None
            time.sleep(0.2)
    finally:
        first.kill()
        first.wait(timeout=30)
    assert not checkpoint.list_checkpoints(run / "checkpoints")
    before = EventAccumulator(str(run), size_guidance={"scalars": 0})
    before.Reload()
    assert len(before.Scalars("loss/total")) > 3  # the killed process logged steps 1, 2, 3, 4, ...
    again = run_harness(
        "train", *short, "iterations=3", "log_every=1", "resume=auto", f"hydra.run.dir={run}", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("loss/total")]
    assert steps == [1, 2, 3], steps  # the killed process's steps are hidden, none doubled


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_sweep_dir_holding_an_earlier_sweep_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    first = run_harness("train", "-m", *TINY, "iterations=2", "seed=0,1", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = snapshot(sweep)
    again = run_harness("train", "-m", *TINY, "iterations=2", "seed=0,1", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    one_line_refusal(again, "hydra.sweep.dir", "runs of an earlier sweep in 2 of this sweep's job folders")
    assert snapshot(sweep) == before
    # a sweep whose job folders are new may share the folder: the earlier jobs stay as they were
    more = run_harness("train", "-m", *TINY, "iterations=2", "seed=2,3", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    assert "sweep: 2 jobs: 2 finished, 0 failed (" in more.stdout, more.stdout  # this launch's jobs only
    assert json.loads((sweep / "seed=2" / "summary.json").read_text())["status"] == "finished"
    assert {k: v for k, v in snapshot(sweep).items() if not k.startswith(("seed=2", "seed=3", "multirun.yaml"))} == {
        k: v for k, v in before.items() if not k.startswith("multirun.yaml")
    }


def test_a_folder_named_through_an_interpolation_is_checked_too(finished, tmp_path):
    """The run claims its folder however it was named (here through an environment variable)."""
    before = {k: v for k, v in snapshot(finished).items() if not k.startswith(".hydra")}
    proc = run_harness(
        "train",
        *TINY,
        "iterations=4",
        "hydra.run.dir=${oc.env:RUN_FOLDER}",
        cwd=tmp_path,
        env={"RUN_FOLDER": str(finished)},
    )
    one_line_refusal(proc, "a finished run of 4 iterations", "overwrite=true")
    assert {k: v for k, v in snapshot(finished).items() if not k.startswith(".hydra")} == before


CRASHING = """
import dataclasses

from envs.cartpole import CartpoleConfig, CartpoleEnv
from harness.schema import field


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrashingConfig(CartpoleConfig):
    crash: bool = field(False, doc="raise when the trained run is described")


class Crashing(CartpoleEnv):
    Config = CrashingConfig

    def describe(self, trajectory):
        if self.config.crash:
            raise RuntimeError("the env crashed on purpose")
        return super().describe(trajectory)
"""


@pytest.fixture
def crashing_env(tmp_path) -> dict[str, str]:
    """A user's env (outside the checkout) that raises in its describe() when ``env.crash=true``."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "crashing.py").write_text(CRASHING)
    (tmp_path / "configs" / "env").mkdir(parents=True)
    cartpole = (ROOT / "configs" / "env" / "cartpole.yaml").read_text()
    yaml = cartpole.replace("_target_: envs.cartpole.CartpoleEnv", "_target_: crashing.Crashing") + "crash: false\n"
    (tmp_path / "configs" / "env" / "crashing.yaml").write_text(yaml)
    return {"PYTHONPATH": f"{tmp_path / 'code'}:{ROOT}", "HARNESS_CONFIG_PATH": str(tmp_path / "configs")}


@pytest.mark.parametrize("launcher", ["basic", pytest.param("joblib", marks=pytest.mark.slow)])
def test_a_sweep_runs_every_job_past_a_refused_a_crashed_and_a_diverged_one(launcher, crashing_env, tmp_path):
    """optim.lr=-1 is refused by the schema, optim.lr=1e20 (plain SGD) diverges, env.crash=true
    raises inside training; the other jobs run to their end, the sweep counts them all."""
    sweep = tmp_path / "sweep"
    args = [
        "+env=crashing",
        "env.horizon=10",
        "env.world_count=1",
        "log_every=2",
        "iterations=6",
        "optim=sgd",
        "clip=none",
        "optim.lr=0.01,-1,1e20",
        "env.crash=false,true",
        f"hydra.sweep.dir={sweep}",
    ]
    if launcher == "joblib":
        args += ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    proc = run_harness("train", "-m", *args, cwd=tmp_path, env=crashing_env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = [line for line in proc.stdout.splitlines() if line.startswith("sweep: ")]
    assert last and last[-1].startswith("sweep: 6 jobs: 1 finished, 4 failed, 1 diverged"), proc.stdout
    statuses = {}
    for job in sweep.iterdir():
        if (job / ".hydra").is_dir():
            given = dict(o.split("=", 1) for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
            key = (given["env.crash"].lower(), float(given["optim.lr"]))
            statuses[key] = json.loads((job / "summary.json").read_text())["status"]
    assert statuses == {
        ("false", 0.01): "finished",
        ("false", -1): "failed",
        ("false", 1e20): "diverged",
        ("true", 0.01): "failed",
        ("true", -1): "failed",
        ("true", 1e20): "failed",
    }, statuses
    refusal = [line for line in proc.stderr.splitlines() if "env.crash=False,optim.lr=-1]" in line]
    assert len(refusal) == 1 and "error: optim.lr" in refusal[0], proc.stderr
    crash = [line for line in proc.stderr.splitlines() if "env.crash=True,optim.lr=0.01]" in line]
    assert len(crash) == 1 and "RuntimeError: the env crashed on purpose" in crash[0], proc.stderr
    report = run_harness("report", str(sweep), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    with open(sweep / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6, rows


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_sweep_job_too_big_for_the_machine_is_refused_and_the_others_run(tmp_path):
    sweep = tmp_path / "sweep"
    sizes = [a for a in TINY if not a.startswith("env.world_count=")]
    proc = run_harness(
        "train", "-m", *sizes, "iterations=2", "env.world_count=1,100000000", f"hydra.sweep.dir={sweep}", cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "sweep: 2 jobs: 1 finished, 1 failed" in proc.stdout, proc.stdout
    refused = [line for line in proc.stderr.splitlines() if "env.world_count=100000000]" in line]
    assert len(refused) == 1 and "env.world_count=100000000" in refused[0] and "needs" in refused[0], proc.stderr
