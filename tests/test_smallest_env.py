"""The smallest env of docs/envs.md, exactly as the docs show it: its code and YAML blocks
are written into a temporary folder outside this checkout and run from the command line."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.helpers import ROOT, run_harness
from tests.test_errors import assert_clean_rejection


def doc_blocks() -> dict[str, str]:
    """The fenced python and yaml blocks of docs/envs.md whose first line names their file."""
    text = (ROOT / "docs" / "envs.md").read_text()
    blocks = {}
    for body in re.findall(r"```(?:python|yaml)\n(.*?)```", text, flags=re.S):
        first = body.splitlines()[0]
        if first.startswith("# ") and (first.endswith(".py") or first.endswith(".yaml")):
            blocks[first[2:].strip()] = body
    return blocks


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("smallest")
    blocks = doc_blocks()
    for name in ("my_envs.py", "my_configs/env/point_mass.yaml", "my_configs/loss/point_mass.yaml"):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(blocks[name])
    (root / "work").mkdir()
    return root


def harness(folder, *args):
    env = {"HARNESS_CONFIG_PATH": str(folder / "my_configs"), "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}
    return run_harness(*args, cwd=folder / "work", env=env)


def test_the_smallest_env_trains_open_loop_and_passes_the_gradient_check(folder):
    proc = harness(folder, "train", "+env=point_mass", "optim.lr=0.5", "iterations=40", "hydra.run.dir=r")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((folder / "work" / "r" / "summary.json").read_text())
    assert summary["env"] == "point_mass"
    assert summary["final_loss"] < 0.1 * summary["initial_loss"], summary
    check = harness(folder, "gradcheck", "+env=point_mass", "hydra.run.dir=g")
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.rstrip().endswith(": ok"), check.stdout


@pytest.mark.parametrize(
    ("args", "field", "accepted"),
    [
        (["task=policy"], "task: policy needs an env with the role PolicyEnv", "env 'point_mass' does not have it"),
        (["memory.segment_steps=5"], "memory.segment_steps: env 'point_mass' cannot run in segments", "Segmentable"),
        (["task=physical"], "task: physical needs an env with the role Identifiable", "point_mass"),
    ],
    ids=["policy", "segments", "quantities"],
)
def test_a_task_that_needs_a_role_the_env_lacks_stops_in_one_line(folder, args, field, accepted):
    assert_clean_rejection(harness(folder, "train", "+env=point_mass", *args), field, accepted, folder / "work")
