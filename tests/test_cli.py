"""The command line as a user runs it: real subprocesses, real Hydra, real Newton."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from tests.helpers import harness_env
from tests.helpers import run_harness as harness


def test_train_with_overrides_writes_summary_config_and_events(tmp_path):
    run_dir = tmp_path / "run"
    proc = harness(
        "train",
        "+env=cartpole",
        "env.horizon=12",
        "env.world_count=1",
        "optim.lr=0.05",
        "clip.max_norm=1",
        "iterations=4",
        "log_every=2",
        "device=cpu",
        "seed=3",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 4
    assert summary["final_loss"] > 0
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["optim"]["lr"] == 0.05
    assert config["clip"]["max_norm"] == 1
    assert config["env"]["seed"] == 3  # interpolations are resolved
    assert list(run_dir.glob("events.out.tfevents.*"))
    # No terminal: plain periodic lines, no carriage-return redraws.
    progress = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in progress] == ["[2/4", "[4/4"]
    assert "\r" not in proc.stdout
    assert "|g|pre" in progress[0] and "it/s" in progress[0]


def test_train_without_env_names_the_envs_in_one_line(tmp_path):
    proc = harness("train", "hydra.run.dir=" + str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert "+env=" in lines[0] and "cartpole" in lines[0]
    assert "Traceback" not in proc.stderr


def test_unknown_command_is_rejected(tmp_path):
    proc = harness("fly", cwd=tmp_path)
    assert proc.returncode == 2
    assert "train" in proc.stderr and "gradcheck" in proc.stderr


def test_gradcheck_command_exits_nonzero_when_gradients_are_wrong(tmp_path):
    ok = harness("gradcheck", "+env=cartpole", "env.horizon=120", f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "worst relative error" in ok.stdout
    bad = harness(
        "gradcheck",
        "+env=cartpole",
        "env.horizon=120",
        "env.per_step_scratch=false",
        f"hydra.run.dir={tmp_path / 'b'}",
        cwd=tmp_path,
    )
    assert bad.returncode == 1
    assert "FAILED" in bad.stdout


def test_a_training_run_never_imports_torch(tmp_path):
    """torch is installed here (test extras), so this would catch any import path to it
    (tensorboardX's writer imported it: 1 s and 194 MiB per run)."""
    script = (
        "import sys\n"
        "from harness.cli import main\n"
        f"main(['train', '+env=cartpole', 'env.horizon=4', 'env.world_count=1', 'iterations=2',"
        f" 'hydra.run.dir={tmp_path / 'run'}'])\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    command = [sys.executable, "-c", script]
    proc = subprocess.run(command, cwd=tmp_path, env=harness_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "torch imported: False"
    assert (tmp_path / "run" / "summary.json").exists()
