"""Device names as Warp takes them (``cpu``, ``cuda``, ``cuda:N``, null) and the choice null
makes (harness/devices.py). Without a GPU here, the CUDA cases fake the list of devices Warp
sees; the real machine's own behaviour (no CUDA device) is checked through the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import build, config, devices

GPUS = [("cpu", False), ("cuda:0", True), ("cuda:1", True)]


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "listed", lambda: list(GPUS))
    monkeypatch.setattr(devices, "current_cuda", lambda: "cuda:0")


def test_cuda_is_accepted_wherever_cuda_0_is(two_gpus: None) -> None:
    assert devices.accepted() == ["cpu", "cuda", "cuda:0", "cuda:1"]
    assert config.check_device("cuda") == "cuda:0"
    assert config.check_device("cuda:0") == "cuda:0"
    assert config.check_device("cuda:1") == "cuda:1"
    assert config.check_device("cpu") == "cpu"
    assert config.check_device(None) is None


def test_a_device_that_is_not_here_is_one_line_listing_those_that_are(two_gpus: None) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.check_device("cuda:2")
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith("device: 'cuda:2' is not available here; accepted: null")
    assert line.endswith("cpu, cuda, cuda:0, cuda:1")


def test_cuda_names_the_current_cuda_device_in_the_run(two_gpus: None) -> None:
    cfg, choices, _ = config.compose_command("train", ["+env=cartpole", "device=cuda"])
    run = build.validate(cfg, choices)
    assert run.settings.device == "cuda:0"
    assert run.device_note == "device=cuda:0"


def test_null_picks_the_cpu_for_few_worlds_and_the_gpu_for_many(two_gpus: None) -> None:
    few, why = devices.choose(4)
    assert few == "cpu" and f"under the {devices.GPU_MIN_WORLDS}" in why
    many, why = devices.choose(devices.GPU_MIN_WORLDS)
    assert many == "cuda:0" and f"{devices.GPU_MIN_WORLDS} worlds" in why
    cfg, choices, _ = config.compose_command("train", ["+env=cartpole", f"env.world_count={devices.GPU_MIN_WORLDS}"])
    assert build.validate(cfg, choices).settings.device == "cuda:0"
    cfg, choices, _ = config.compose_command("train", ["+env=cartpole"])  # make train's 4 worlds
    run = build.validate(cfg, choices)
    assert run.settings.device == "cpu" and run.device_note.startswith("null: 4 worlds")


def test_null_counts_the_worlds_the_task_trains_with(two_gpus: None) -> None:
    # task=policy trains the cartpole on 32 worlds (its per_env settings), not the env's 4
    cfg, choices, _ = config.compose_command("train", ["+env=cartpole", "task=policy"])
    config.apply_task_env_defaults(cfg, choices, ["+env=cartpole", "task=policy"])
    assert build.validate(cfg, choices).device_note.startswith("null: 32 worlds")


def test_without_a_gpu_null_is_the_cpu_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "listed", lambda: [("cpu", False)])
    assert devices.choose(100_000) == ("cpu", "null: no CUDA device here")
    with pytest.raises(config.ConfigError, match=r"accepted: null \(the faster for the run\), cpu$"):
        config.check_device("cuda")


def test_the_first_line_of_a_run_says_which_device_and_why(tmp_path) -> None:
    """On this machine (no CUDA device): null runs on the CPU, as before, and says so first."""
    run = f"hydra.run.dir={tmp_path / 'run'}"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "train", "+env=cartpole", "iterations=1", run],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "device: cpu (null: no CUDA device here)"
    refused = subprocess.run(
        [sys.executable, "-m", "harness", "train", "+env=cartpole", "device=cuda", f"hydra.run.dir={tmp_path / 'r2'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: device: 'cuda' is not available here; accepted: null (the faster for the run), cpu"
    ]
    assert not (tmp_path / "r2").exists()
