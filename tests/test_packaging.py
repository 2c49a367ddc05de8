"""A plain, non-editable install trains: the wheel built from this checkout carries the
envs and every config group (the top-level ``configs/``, shipped as ``harness/configs/``),
installs into a fresh virtual environment, and nothing is read from the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = (".git", ".venv", ".gpu", "build", "*.egg-info", "__pycache__", "outputs", "multirun", ".ruff_cache")


def test_configs_is_the_only_config_folder_in_the_tree():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    parts = [Path(p).parts for p in tracked]
    folders = {Path(*p[: p.index("configs") + 1]) for p in parts if "configs" in p}
    assert folders == {Path("configs")}, sorted(map(str, folders))
    assert not (ROOT / "harness" / "configs").exists()


def test_the_built_wheel_installs_into_a_fresh_venv_and_trains_from_another_folder(tmp_path):
    # Build from a copy of the sources, so the build leaves nothing in the checkout.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*SKIP))
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = wheels.glob("harness-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    configs = {p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml")}
    assert {n.removeprefix("harness/configs/") for n in names if n.startswith("harness/configs/")} == configs
    assert "envs/cartpole.py" in names and not any(n.startswith("configs/") for n in names)
    assert "envs/robot/assets/hopper.xml" in names  # env.asset=harness:hopper.xml
    assert "hydra_plugins/harness_ray_launcher/ray_launcher.py" in names  # hydra/launcher=ray

    # A fresh venv that sees this one's third-party packages (a .pth line adds the folder
    # without running its .pth files, so this checkout's editable install stays out), and
    # the wheel installed into it with pip, without dependencies and without an index.
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "shared_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # --ignore-installed: pip sees this checkout's editable install through the .pth line and
    # would keep it as "already installed"; nothing is uninstalled anywhere.
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index"]
    install.append("--ignore-installed")
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, timeout=300)

    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HARNESS_CONFIG_PATH", "VIRTUAL_ENV")}
    where = subprocess.run(
        [str(python), "-c", "import harness.config as c, envs.cartpole as e; print(c.CONFIG_DIR, e.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(path.startswith(site) for path in where.stdout.split()), where.stdout
    train = ["train", "+env=cartpole", "env.horizon=20", "iterations=1", "hydra.run.dir=run"]
    proc = subprocess.run(
        [str(fresh / "bin" / "harness"), *train],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["iterations_done"] == 1


def test_an_editable_install_finds_the_ray_launcher(tmp_path):
    """``pip install -e .`` maps ``hydra_plugins/harness_ray_launcher`` through setuptools' import
    finder, which Hydra's scan of ``hydra_plugins`` does not walk; the commands register it."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*SKIP))
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "shared_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index"]
    install += ["--no-build-isolation", "--ignore-installed", "-e", str(source)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HARNESS_CONFIG_PATH", "VIRTUAL_ENV")}
    name = "hydra_plugins.harness_ray_launcher.ray_launcher.RayLauncher"
    code = (
        "import harness; from hydra.core.plugins import Plugins; print(harness.__file__); "
        f"print({name!r} in Plugins.instance().class_name_to_class); "
        "from harness.commands.common import register_launchers; register_launchers(); "
        f"print({name!r} in Plugins.instance().class_name_to_class)"
    )
    found = subprocess.run([str(python), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    where, scanned, registered = found.stdout.split()
    assert where.startswith(str(source)), where  # the editable install, not this checkout
    assert scanned == "False"  # Hydra's own scan misses it (why the commands register it)
    assert registered == "True"


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
