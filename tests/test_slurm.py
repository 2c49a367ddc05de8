"""Sweeps on a real SLURM cluster of one node on this machine (``hydra/launcher=submitit_slurm``).

The cluster is Debian's ``slurm-wlm`` with its own ``munged``, ``slurmctld`` and ``slurmd``
(tests/slurm_cluster.py: a private slurm.conf and munge key in a temporary folder, free ports,
one node with ``CPUs=2``, one partition ``debug``, no accounting database), started once for
the module and stopped at the end whatever happened, every process of it. ``make test-slurm``
installs slurm-wlm and munge with apt-get when they are missing and runs this module; without
them (or not as root) it is skipped. What docs/reliability.md promises for a sweep is checked
through the preset as documented: every job's status, the count line, the exit code and
``harness report``, a job refused by the harness, and a job cancelled with ``scancel``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import harness_env
from tests.processes import started_cluster
from tests.slurm_cluster import PARTITION, SlurmCluster, missing

pytestmark = pytest.mark.slow

TINY = ["+env=cartpole", "env.horizon=10", "env.world_count=1", "log_every=1"]
SLURM_SWEEP = [
    "hydra/launcher=submitit_slurm",
    f"hydra.launcher.partition={PARTITION}",
    # what this node has: no GPU, 2 CPUs (two jobs at once), 4 GB
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=1",
    "hydra.launcher.timeout_min=20",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = missing()
    if why is not None:
        pytest.skip(why)
    with started_cluster(SlurmCluster(logs=tmp_path_factory.mktemp("slurm-logs"))) as made:
        yield made


def harness_command(cluster: SlurmCluster, *args: str) -> tuple[list[str], dict]:
    return [sys.executable, "-m", "harness", *args], harness_env({"SLURM_CONF": str(cluster.conf)})


def run(cluster: SlurmCluster, *args: str, cwd: Path, timeout: float = 420) -> subprocess.CompletedProcess:
    command, env = harness_command(cluster, *args)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def summaries(sweep: Path) -> dict[str, dict]:
    return {path.parent.name: json.loads(path.read_text()) for path in sweep.glob("*/summary.json")}


def test_the_documented_clip_sweep_runs_on_slurm_counts_the_refused_job_and_reports_every_job(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run(
        cluster, "train", "-m", *TINY, "iterations=3", "clip.max_norm=1,-1,10", *SLURM_SWEEP,
        f"hydra.sweep.dir={sweep}", cwd=tmp_path,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # a job failed
    assert "Traceback" not in out
    assert re.search(r"slurm: submitted 3 jobs as job array \d+", out), out
    # The refused job's own line, reported in the launching terminal by its overrides.
    assert "[job 1: clip.max_norm=-1] error: clip.max_norm: must be a number >= 0, got -1" in proc.stderr, out
    assert f"sweep: 3 jobs: 2 finished, 1 failed ({sweep}; python -m harness report {sweep})" in proc.stdout, out
    found = summaries(sweep)
    assert found["clip.max_norm=1"]["status"] == "finished"
    assert found["clip.max_norm=10"]["status"] == "finished"
    refused = sweep / "clip.max_norm=-1" / ".hydra" / "harness_outcome.json"
    assert json.loads(refused.read_text())["status"] == "failed"
    assert list(sweep.glob(".submitit/*_0/*_result.pkl"))  # it really went through SLURM and submitit

    report = run(cluster, "report", str(sweep), cwd=tmp_path)
    text = report.stdout + report.stderr
    assert report.returncode == 0, text
    assert "Traceback" not in text
    assert "jobs: 3 (2 finished, 1 failed)" in text, text
    rows = {line.split()[0]: line for line in report.stdout.splitlines() if line.split()}
    assert "finished" in rows["1"] and "finished" in rows["10"], text
    assert "failed (clip.max_norm: must be a number >= 0, got -1)" in rows["-1"], text


def test_a_job_cancelled_with_scancel_is_reported_as_cancelled_and_counted(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    out_path = tmp_path / "out.txt"
    command, env = harness_command(
        cluster, "train", "-m", *TINY, "iterations=3,100000", *SLURM_SWEEP, f"hydra.sweep.dir={sweep}"
    )
    with out_path.open("w") as out:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # The long job has started training on the node: its outcome says running.
        outcome = sweep / "iterations=100000" / ".hydra" / "harness_outcome.json"
        deadline = time.monotonic() + 300
        while not (outcome.is_file() and json.loads(outcome.read_text() or "{}").get("status") == "running"):
            assert proc.poll() is None, out_path.read_text()
            assert time.monotonic() < deadline, out_path.read_text()
            time.sleep(0.5)
        array = re.search(r"slurm: submitted 2 jobs as job array (\d+)", out_path.read_text())
        assert array is not None, out_path.read_text()
        assert cluster.jobs().get(f"{array[1]}_1") == "RUNNING", cluster.jobs()
        cluster.run("scancel", f"{array[1]}_1")
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out_path.read_text()
    assert proc.returncode == 1, text
    assert "Traceback" not in text
    line = "[job 1: iterations=100000] error: slurm: the job was cancelled by the scheduler "
    line += "(scancel, or an administrator)"
    assert line in text, text
    assert f"sweep: 2 jobs: 1 finished, 1 failed ({sweep}; python -m harness report {sweep})" in text, text
    found = summaries(sweep)
    assert found["iterations=3"]["status"] == "finished"
    assert found["iterations=100000"]["status"] != "finished"

    report = run(cluster, "report", str(sweep), cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "Traceback" not in report.stdout + report.stderr
    assert "jobs: 2 (1 finished, 1 failed)" in report.stdout, report.stdout
