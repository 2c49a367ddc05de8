"""``python -m harness evaluate RUN_DIR [overrides]``: a run's checkpoint rolled out again, for
a policy, an open-loop run and a sysid run; eval.json, the table, and one-line refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import run_harness

POLICY = ["+env=cartpole", "task=policy", "task.hidden=[8]", "env.horizon=8", "task.window=null", "env.world_count=2"]


def train(tmp_path, name: str, *args: str) -> None:
    proc = run_harness("train", *args, "iterations=3", "log_every=3", f"hydra.run.dir={name}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def evaluate(tmp_path, *args: str):
    return run_harness("evaluate", *args, cwd=tmp_path, timeout=300)


def one_line_refusal(proc, *parts: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    assert all(part in lines[0] for part in parts), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def policy_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    train(root, "policy", *POLICY, "plot_every=null")
    return root


def test_evaluating_with_the_run_own_config_reproduces_its_final_loss(policy_run):
    proc = evaluate(policy_run, "policy", "out=same.json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((policy_run / "same.json").read_text())
    summary = json.loads((policy_run / "policy" / "summary.json").read_text())
    assert report["loss"] == summary["final_loss"]  # the same rollout: the env's own starts, the final policy
    assert report["iteration"] == 3 and report["task"] == "policy"
    assert report["figures"]["upright_fraction"] == summary["after_training"]["upright_fraction"]


def test_a_policy_is_evaluated_elsewhere_and_the_table_names_the_figures(policy_run):
    proc = evaluate(policy_run, "policy", "env.seed=7", "env.world_count=5", "env.horizon=16")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((policy_run / "policy" / "eval.json").read_text())
    assert report["env"]["world_count"] == 5 and report["env"]["horizon"] == 16 and report["env"]["seed"] == 7
    assert report["env"]["tilt"] == 0.1  # task=policy's setting for the cartpole, as the run trained
    assert report["overrides"] == ["env.seed=7", "env.world_count=5", "env.horizon=16"]
    assert np.array(report["figures"]["final_pole_angles_rad"]).shape == (5, 2)
    assert 0.0 <= report["figures"]["upright_fraction"] <= 1.0
    for row in ("loss", "loss/pose", "upright_fraction"):
        assert any(line.split()[:1] == [row] for line in proc.stdout.splitlines()), proc.stdout
    assert "5 worlds x 16 steps, seed 7" in proc.stdout


def test_an_earlier_checkpoint_can_be_named(policy_run):
    saved = sorted((policy_run / "policy" / "checkpoints").glob("*.hckpt"))
    proc = evaluate(policy_run, "policy", f"checkpoint={saved[0]}", "out=first.json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((policy_run / "first.json").read_text())["checkpoint"] == str(saved[0])


def test_a_rollout_that_blows_up_exits_1_and_keeps_the_earlier_result(policy_run):
    earlier = policy_run / "kept.json"
    earlier.write_text('{"loss": 0.5}')
    proc = evaluate(policy_run, "policy", "env.dt=0.5", "out=kept.json")  # a step far too long: nan
    assert proc.returncode == 1, proc.stderr
    assert earlier.read_text() == '{"loss": 0.5}'
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: evaluate: the loss is nan"), proc.stderr
    assert "kept.json was not written" in lines[0] and "Traceback" not in proc.stderr
    assert "written:" not in proc.stdout and "loss" in proc.stdout  # the table still shows what happened


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_open_loop_overrides_that_change_shapes_are_refused_and_others_accepted(tmp_path):
    train(tmp_path, "open", "+env=cartpole", "env.horizon=8", "env.world_count=2")
    line = one_line_refusal(evaluate(tmp_path, "open", "env.horizon=16"), "controls", "(8, 2)", "(16, 2)")
    assert "env.horizon=16" in line
    assert not (tmp_path / "open" / "eval.json").exists()
    proc = evaluate(tmp_path, "open", "env.seed=3")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "open" / "eval.json").read_text())["env"]["seed"] == 3


@pytest.mark.slow
def test_a_sysid_run_is_evaluated_on_its_recording(tmp_path):
    proc = run_harness("record", "+env=cartpole", "env.horizon=8", "env.world_count=2", "out=t.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    train(tmp_path, "fit", "+env=cartpole", "task=sysid", "task.reference=t.npz")
    proc = evaluate(tmp_path, "fit")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "fit" / "eval.json").read_text())
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert report["loss"] == summary["final_loss"] and report["env"]["horizon"] == 8


@pytest.mark.slow
def test_a_newton_port_with_a_quantity_task_is_evaluated(tmp_path):
    train(tmp_path, "ball", "+env=ball", "env.horizon=24")
    proc = evaluate(tmp_path, "ball", "env.target=[0.5,-2.0,1.5]", "out=moved.json")
    assert proc.returncode == 0, proc.stderr
    moved = json.loads((tmp_path / "moved.json").read_text())
    assert moved["task"] == "initial" and moved["env"]["target"] == [0.5, -2.0, 1.5]
    assert evaluate(tmp_path, "ball", "out=same.json").returncode == 0
    same = json.loads((tmp_path / "same.json").read_text())
    assert same["loss"] == json.loads((tmp_path / "ball" / "summary.json").read_text())["final_loss"]
    assert moved["loss"] != same["loss"]  # the target moved, the trained initial velocity did not
    one_line_refusal(evaluate(tmp_path, "ball", "env.world_count=2"), "initial_velocity", "(1,)", "(2,)")


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        (["policy", "optim.lr=1"], ("evaluate: 'optim.lr' cannot be set here", "env.<field>=VALUE")),
        (["nowhere"], ("evaluate: 'nowhere' is not a run folder",)),
        ([], ("evaluate: expects one run folder",)),
        (["policy", "out=missing/eval.json"], ("out: 'missing/eval.json'",)),
        (["policy", "env.world_count=0"], ("env.world_count", ">= 1")),
        (["policy", "checkpoint=nope.hckpt"], ("checkpoint",)),
        (["policy", "env.bogus=3"], ("env.bogus: no such key in env", "tilt")),
    ],
    ids=["not_env", "no_folder", "no_args", "bad_out", "bad_env_value", "bad_checkpoint", "unknown_env_key"],
)
def test_bad_evaluate_arguments_are_refused_in_one_line_and_write_nothing(policy_run, args, parts):
    written = policy_run / "policy" / "eval.json"
    before = written.read_bytes() if written.exists() else None
    one_line_refusal(evaluate(policy_run, *args), *parts)
    assert (written.read_bytes() if written.exists() else None) == before
