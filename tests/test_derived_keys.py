"""A refused value that the config derives from another (an interpolation) is reported under
the key the user typed, with the value typed and what is accepted (harness/derived.py).

Before: ``+env=drone task=mpc env.frames=0`` said ``iterations: must be an integer >= 1, got 0``
and ``+env=bear env.frames=-3`` said ``env.horizon: must be an integer >= 1, got -240``."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from harness import build, config, derived
from tests.helpers import run_harness

CASES = [
    # (id, overrides, the line's start, a part that must be in it)
    (
        "mpc_iterations_from_frames",
        ["+env=drone", "task=mpc", "env.frames=0"],
        "env.frames: must be an integer >= 1, got 0",
        "(iterations = env.frames)",
    ),
    (
        "bear_horizon_from_frames",
        ["+env=bear", "env.frames=-3"],
        "env.frames: must be an integer >= 1, got -3",
        "(env.horizon = env.frames x env.substeps)",
    ),
    (
        "bear_horizon_from_substeps",
        ["+env=bear", "env.frames=2", "env.substeps=0"],
        "env.substeps: must be an integer >= 1, got 0",
        "env.horizon = env.frames x env.substeps",
    ),
    (
        # env.horizon=1 passes its own rule; the window it gives (1 // 2 = 0) does not
        "policy_window_from_horizon",
        ["+env=cartpole", "task=policy", "env.horizon=1"],
        "env.horizon: 1 makes task.window = env.horizon / 2, which is refused",
        "accepted: env.horizon such that task.window is accepted, or task.window set on the command line",
    ),
]


@pytest.mark.parametrize(("overrides", "start", "part"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_refused_derived_value_names_the_key_typed(overrides, start, part):
    with pytest.raises(config.ConfigError) as caught:
        build.precheck("train", overrides)
    line = str(caught.value)
    assert line.startswith(start), line
    assert part in line, line
    assert "\n" not in line


def test_a_value_set_in_a_file_is_reported_as_it_was():
    """Nothing typed on the command line feeds the refused key: the message is left alone."""
    cfg = OmegaConf.create(
        {"env": {"frames": 0, "substeps": 2, "horizon": "${harness.mul:${env.frames},${env.substeps}}"}}
    )
    message = "env.horizon: must be an integer >= 1, got 0"
    assert derived.blame(cfg, message, typed=["env.world_count"]) == message
    assert derived.blame(cfg, "env.frames: must be an integer >= 1, got 0", typed=["env.frames"]) == (
        "env.frames: must be an integer >= 1, got 0"
    )  # not derived itself: unchanged


def test_sources_follow_references_through_other_interpolations_and_relative_ones():
    tree = {
        "env": {"frames": 3, "substeps": 2, "horizon": "${harness.mul:${env.frames},${.substeps}}"},
        "loss": {"weight": "${env.horizon}"},
    }
    leaves, chain = derived.sources(tree, "loss.weight")
    assert leaves == ["env.frames", "env.substeps"]
    assert chain == ["loss.weight", "env.horizon"]
    assert derived.expression(tree["env"]["horizon"]) == "env.frames x .substeps"
    assert derived.expression("${harness.div:${env.horizon},2}") == "env.horizon / 2"


def test_two_typed_sources_that_pass_their_own_rules_are_both_named():
    cfg = OmegaConf.create({"a": 3, "b": 4, "c": "${a}${b}"})
    line = derived.blame(cfg, "c: must be at most 10, got 34", typed=["a", "b"])
    assert line.startswith("a: a=3 and b=4 make c = ab, which is refused (c: must be at most 10, got 34)"), line
    assert "accepted: a and b such that c is accepted, or c set on the command line" in line


def test_the_command_line_and_a_sweep_job_name_the_key_typed(tmp_path):
    """The whole path once from the command line (exit 2, one line, nothing written), then as
    jobs of a sweep, where each job checks its own config: its summary names the key typed."""
    proc = run_harness("train", "+env=bear", "env.frames=-3", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["error: env.frames: must be an integer >= 1, got -3 (env.horizon = env.frames x env.substeps)"]
    assert not (tmp_path / "outputs").exists()

    sweep = tmp_path / "sweep"
    proc = run_harness(
        "train",
        "-m",
        "+env=drone",
        "task=mpc",
        "env.frames=0,-2",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = {p.parent.name: json.loads(p.read_text())["error"] for p in sweep.glob("*/summary.json")}
    assert errors == {
        "env.frames=0": "env.frames: must be an integer >= 1, got 0 (iterations = env.frames)",
        "env.frames=-2": "env.frames: must be an integer >= 1, got -2 (iterations = env.frames)",
    }
