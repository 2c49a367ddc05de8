"""A plain, non-editable install trains: the wheel built from this checkout carries the
envs and every config group, and nothing is read from the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = (".git", ".venv", ".gpu", "build", "*.egg-info", "__pycache__", "outputs", "multirun", ".ruff_cache")


def test_the_built_wheel_trains_the_cartpole_outside_the_checkout(tmp_path):
    # Build from a copy of the sources, so the build leaves nothing in the checkout.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*SKIP))
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = wheels.glob("harness-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "harness/configs/train.yaml" in names and "harness/configs/optim/env/spring_cage.yaml" in names
        archive.extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HARNESS_CONFIG_PATH")}
    env["PYTHONPATH"] = str(site)  # ahead of the editable install of this checkout
    where = subprocess.run(
        [sys.executable, "-c", "import harness, envs.cartpole; print(harness.__file__); print(envs.cartpole.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "train",
            "+env=cartpole",
            "env.horizon=20",
            "iterations=3",
            "hydra.run.dir=run",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["iterations_done"] == 3


def test_the_library_never_imports_the_bundled_envs():
    modules = [
        "harness",
        "harness.cli",
        "harness.config",
        "harness.env",
        "harness.newton_env",
        "harness.tasks",
        "harness.training",
        "harness.gradcheck",
    ]
    code = (
        f"import sys; import {', '.join(modules)}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'envs'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout
