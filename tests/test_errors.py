"""Bad input: one line naming the field and what is accepted, exit 2, no traceback, and
nothing written (validation runs before Hydra creates a folder or a kernel is compiled)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import checkpoint, config
from tests.helpers import harness_env, run_harness, run_harness_here

ENVS = ", ".join(sorted(config.available("env")))
"""The env options of the repository (every file of configs/env), as a refusal lists them."""

ENV = ["+env=cartpole", "env.horizon=4", "env.world_count=1", "iterations=1"]

CASES = [
    # (id, extra arguments (without ENV when the case replaces it), field named, what is accepted)
    ("missing_env", ["train"], "env:", "+env=NAME"),
    ("unknown_env", ["train", "+env=pendulum"], "env:", f"accepted: {ENVS}"),
    ("unknown_clip", ["train", *ENV, "clip=bogus"], "clip:", "accepted: "),
    ("unknown_optim", ["train", *ENV, "optim=nadam"], "optim:", "adam"),
    ("unknown_loss", ["train", *ENV, "loss=nope"], "loss:", "cartpole_upright"),
    ("non_numeric_threshold", ["train", *ENV, "clip.max_norm=abc"], "clip.max_norm", "number"),
    ("negative_threshold", ["train", *ENV, "clip.max_norm=-1"], "clip.max_norm", ">= 0"),
    ("negative_lr", ["train", *ENV, "optim.lr=-0.1"], "optim.lr", ">= 0"),
    ("non_numeric_lr", ["train", *ENV, "optim.lr=fast"], "optim.lr", "number"),
    ("zero_horizon", ["train", *ENV, "env.horizon=0"], "env.horizon", ">= 1"),
    ("negative_world_count", ["train", *ENV, "env.world_count=-3"], "env.world_count", ">= 1"),
    ("zero_iterations", ["train", *ENV, "iterations=0"], "iterations", ">= 1"),
    ("negative_plot_every", ["train", *ENV, "plot_every=-1"], "plot_every", ">= 0"),
    ("segments_above_horizon", ["train", *ENV, "memory.segment_steps=5"], "memory.segment_steps", "1 .. 4"),
    ("zero_segments", ["train", *ENV, "memory.segment_steps=0"], "memory.segment_steps", "null, auto, 1 .. 4"),
    ("negative_segments", ["train", *ENV, "memory.segment_steps=-2"], "memory.segment_steps", "1 .. 4"),
    (
        "word_segments",
        ["train", *ENV, "memory.segment_steps=often"],
        "memory.segment_steps",
        "null, auto or an integer",
    ),
    (
        "segments_for_an_env_without_them",
        ["train", "+env=soft_body", "env.horizon=4", "env.per_step_contacts=false", "memory.segment_steps=2"],
        "memory.segment_steps: env 'soft_body' cannot run in segments",
        "accepted: true",
    ),
    (
        "segments_with_shared_scratch",
        ["train", *ENV, "env.per_step_scratch=false", "memory.segment_steps=2"],
        "memory.segment_steps: env 'cartpole' cannot run in segments",
        "env.per_step_scratch=false",
    ),
    (
        "segments_with_two_states",
        ["train", *ENV, "+env.per_step_states=false", "memory.segment_steps=2"],
        "memory.segment_steps",
        "env.per_step_states=true",
    ),
    ("unknown_device", ["train", *ENV, "device=cuda:7"], "device", "cpu"),
    ("not_an_env", ["train", *ENV, "env._target_=harness.losses.WeightedLoss"], "env._target_", "Env subclass"),
    ("unknown_loss_source", ["train", *ENV, "loss.terms.pose.source=bogus"], "loss.terms.pose.source", "joint_q"),
    ("unknown_command", ["fly"], "command", "train"),
]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_harness(*args, cwd=cwd, timeout=120)


def assert_clean_rejection(proc: subprocess.CompletedProcess, field: str, accepted: str, cwd: Path) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert field in lines[0] and accepted in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (cwd / "outputs").exists() and not (cwd / "multirun").exists()


THROUGH_A_PROCESS = {"missing_env", "negative_lr", "unknown_device", "unknown_command"}
"""The cases that run as a real ``python -m harness`` process; the rest run the same command
line in-process (:func:`tests.helpers.run_harness_here`: the same code, without a new
interpreter's imports)."""
assert THROUGH_A_PROCESS <= {c[0] for c in CASES}, "a case named above that does not exist"


@pytest.mark.parametrize(("args", "field", "accepted"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_in_one_line_before_anything_is_written(request, args, field, accepted, tmp_path):
    if request.node.callspec.id in THROUGH_A_PROCESS:
        proc = run(args, tmp_path)
    else:
        proc = run_harness_here(*args, cwd=tmp_path)
    assert_clean_rejection(proc, field, accepted, tmp_path)


def test_output_folder_that_cannot_be_created_is_rejected(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    proc = run(["train", *ENV, f"hydra.run.dir={blocker / 'run'}"], tmp_path)
    assert_clean_rejection(proc, "hydra.run.dir", "is not a folder", tmp_path)
    assert blocker.read_text() == "not a folder"


def test_zero_learning_rate_is_accepted_and_measures_without_moving(tmp_path):
    """lr = 0 is valid (as in PyTorch): gradients are measured, parameters stay put."""
    run_dir = tmp_path / "run"
    proc = run(["train", *ENV, "iterations=2", "optim.lr=0", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    saved = checkpoint.load(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))[-1])
    assert not saved.arrays["params/data"].any()  # the controls start at zero and stay there
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    assert all(e.value > 0 for e in acc.Scalars("optim/grad_norm_pre"))


def test_a_bad_harness_variable_stops_the_command_line_and_not_an_import(tmp_path):
    """HARNESS_DETERMINISTIC=bogus: `import harness` works (a library import never exits);
    init_warp() raises a ValueError naming it; the command line says it in one line, exit 2."""
    bad = {"HARNESS_DETERMINISTIC": "bogus"}
    probe = "import harness\ntry:\n    harness.init_warp()\nexcept ValueError as exc:\n    print('raised:', exc)\n"
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=harness_env(bad), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("raised: HARNESS_DETERMINISTIC: 'bogus' is not one of run_to_run, gpu_to_gpu")
    proc = run_harness("train", *ENV, cwd=tmp_path, env=bad)
    assert_clean_rejection(proc, "HARNESS_DETERMINISTIC", "run_to_run, gpu_to_gpu", tmp_path)
