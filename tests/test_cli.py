"""The command line as a user runs it: real subprocesses, real Hydra, real Newton."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness import config
from tests.helpers import harness_env
from tests.helpers import run_harness as harness

ENVS = ", ".join(sorted(config.available("env")))
"""The env options of the repository, as Hydra's help lists them."""


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
    assert not list(run_dir.glob("*.log"))  # no empty Hydra job log: the harness prints, it does not log
    # No terminal: plain periodic lines, no carriage-return redraws.
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in lines] == ["[1/4", "[2/4", "[2/4", "[4/4"]
    assert "compiling kernels" in lines[0] and "capturing iteration 2" in lines[1]  # the warm-up, said once each
    progress = lines[2:]
    assert "\r" not in proc.stdout
    assert all("|g|pre" in line for line in progress)
    assert "time left after warm-up" in progress[0] and progress[1].endswith(" it/s")  # a rate after the warm-up


def test_a_run_folder_is_named_by_its_time_and_overrides(tmp_path):
    """Without hydra.run.dir: outputs/<env>/<date>_<time>_<overrides>, the env, device and
    resume left out of the name (the env is the parent folder)."""
    proc = harness(
        "train", "+env=cartpole", "env.horizon=5", "iterations=1", "seed=3", "device=cpu", "resume=auto", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    (folder,) = (tmp_path / "outputs" / "cartpole").iterdir()
    stamp, overrides = folder.name[:19], folder.name[20:]
    time.strptime(stamp, "%Y-%m-%d_%H-%M-%S")
    assert overrides == "env.horizon=5,iterations=1,seed=3"
    assert (folder / "summary.json").exists()
    assert f"run folder: {folder}" in proc.stdout


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


def test_hydra_inspection_flags_work_as_in_any_hydra_app(tmp_path):
    """--cfg/-c, --info/-i and --help print and exit 0, writing nothing (they used to be
    parsed as overrides: "Error parsing override 'job'")."""
    shown = harness("train", "+env=cartpole", "--cfg", "job", "env.horizon=33", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    composed = yaml.safe_load(shown.stdout)
    assert composed["env"]["horizon"] == 33 and composed["optim"]["lr"] == 0.5
    short = harness("train", "+env=cartpole", "-c", "job", "--resolve", cwd=tmp_path)
    assert short.returncode == 0, short.stderr
    assert yaml.safe_load(short.stdout)["env"]["seed"] == 0  # resolved from ${seed}
    info = harness("train", "+env=cartpole", "--info", "defaults", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert "env/cartpole" in info.stdout and "clip/global_norm" in info.stdout and "base/clip" in info.stdout
    for args in (("train", "--help"), ("gradcheck", "--help")):
        helped = harness(*args, cwd=tmp_path)
        assert helped.returncode == 0, helped.stderr
        assert f"python -m harness {args[0]} is powered by Hydra" in helped.stdout
        assert f"env: {ENVS}" in helped.stdout  # the config groups and their options
    assert not (tmp_path / "outputs").exists()


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_misspelt_group_or_key_names_what_is_accepted_and_the_closest(tmp_path):
    line = one_error_line(harness("train", "+env=cartpole", "optm=adam", cwd=tmp_path))
    assert line.startswith("error: optm: no such key or config group; accepted: ")
    assert "optim" in line and "clip" in line and "iterations" in line
    assert line.endswith("did you mean optim?")
    line = one_error_line(harness("train", "+env=cartpole", "optim.lrr=0.1", cwd=tmp_path))
    assert line == (
        "error: optim.lrr: no such key in optim; accepted: _target_, amsgrad, betas, eps, lr, weight_decay; "
        "did you mean optim.lr?"
    )
    line = one_error_line(harness("train", "+env=ball", "env.horizn=3", cwd=tmp_path))
    assert "accepted:" in line and line.endswith("did you mean env.horizon?")
    assert not (tmp_path / "outputs").exists()


def test_a_forgotten_plus_says_to_write_it(tmp_path):
    line = one_error_line(harness("train", "env=cartpole", cwd=tmp_path))
    assert line == "error: env: no env is chosen by default, so choosing one needs a '+': write +env=cartpole"
    line = one_error_line(harness("train", "+env=cartpole", "experiment=cartpole_clip_sweep", cwd=tmp_path))
    assert line.endswith("write +experiment=cartpole_clip_sweep")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_no_cuda_driver_warning_on_a_machine_without_one(tmp_path):
    """Warp's native library prints a warning at start-up when no NVIDIA driver is found;
    the harness, which needs none, keeps that line off the console."""
    bare = subprocess.run(
        [sys.executable, "-c", "import warp; warp.config.quiet = True; warp.init()"],
        capture_output=True,
        text=True,
        env=harness_env(),
        timeout=120,
    )
    if "Could not find or load the NVIDIA CUDA driver" not in bare.stderr:
        pytest.skip("this machine has a CUDA driver: Warp prints no warning to keep off")
    for args in (
        ("train", "+env=spring_cage", "iterations=1", f"hydra.run.dir={tmp_path / 'run'}"),
        ("gradcheck", "+env=spring_cage", "env.horizon=3", f"hydra.run.dir={tmp_path / 'gc'}"),
    ):
        proc = harness(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "CUDA driver" not in proc.stderr + proc.stdout


SLOW_ENV = """
import os
import pathlib
import time

from envs.spring_cage import SpringCageEnv


class SlowCage(SpringCageEnv):
    def __init__(self, *args, **kwargs):
        pathlib.Path(os.environ["SLOW_ENV_MARKER"]).write_text("building")
        time.sleep(120)
        super().__init__(*args, **kwargs)
"""


def test_ctrl_c_while_the_env_is_built_stops_in_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "slow_env.py").write_text(SLOW_ENV)
    (tmp_path / "configs" / "env").mkdir(parents=True)
    cage = (Path(config.CONFIG_DIR) / "env" / "spring_cage.yaml").read_text()
    (tmp_path / "configs" / "env" / "slow_cage.yaml").write_text(
        cage.replace("envs.spring_cage.SpringCageEnv", "slow_env.SlowCage")
    )
    marker = tmp_path / "building"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "train", "+env=slow_cage"],
        cwd=tmp_path,
        env=harness_env(
            {
                "PYTHONPATH": os.pathsep.join([str(tmp_path / "code"), harness_env()["PYTHONPATH"]]),
                "HARNESS_CONFIG_PATH": str(tmp_path / "configs"),
                "SLOW_ENV_MARKER": str(marker),
            }
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "train: interrupted by SIGINT before it started; nothing was written"
    assert not (tmp_path / "outputs").exists()


def test_train_help_lists_only_the_config_groups_a_user_picks(tmp_path):
    proc = harness("train", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    groups = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    names = [line.split(":")[0] for line in groups.splitlines() if ": " in line]
    assert names == ["clip", "env", "experiment", "loss", "memory", "optim", "schedule", "task"], names
    assert "optim:\n  _target_: harness.optim.adam" in proc.stdout  # the config itself is still shown
