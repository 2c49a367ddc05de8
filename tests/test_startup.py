"""Start-up: help, config printing and refusals of bad input import nothing heavy (real
subprocesses; docs/startup.md has the timings, scripts/bench_startup.py measures them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import harness_env

HEAVY = ("newton", "harness.training", "matplotlib", "imageio", "torch")
"""Never imported before a command line has passed its checks."""

ENV_MODULES = ("envs.",)
"""The env modules (prefixes): imported only once the command line names an env whose fields need checking."""

LIGHT = ("warp", "tensorboard", "harness.tasks", "harness.losses")
"""Not imported by help, config printing and refusals that come before the env's fields are checked."""

PROBE = """
import json, sys
from harness.cli import main
try:
    main({args!r})
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""


def run_cli(args: list[str], cwd: Path) -> tuple[int, set[str], str]:
    """Run ``harness.cli.main(args)`` in a fresh interpreter: its exit code, the modules it
    imported, its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args)],
        cwd=cwd,
        env=harness_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return found["code"], set(found["modules"]), proc.stderr


def imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules among ``modules`` that are one of ``names`` or inside one (a name ending in '.' is a prefix)."""
    return sorted(
        m for m in modules for n in names if (m.startswith(n) if n.endswith(".") else m == n or m.startswith(n + "."))
    )


EARLY = [
    # (id, arguments, exit code): answered before any env's fields are checked
    ("help", ["--help"], 0),
    ("train_help", ["train", "--help"], 0),
    ("gradcheck_help", ["gradcheck", "--help"], 0),
    ("cfg_job", ["train", "+env=cartpole", "--cfg", "job"], 0),
    ("unknown_env", ["train", "+env=nope"], 2),
    ("unknown_clip", ["train", "+env=cartpole", "clip=bogus"], 2),
    ("unknown_command", ["fly"], 2),
]

REFUSED = [
    # (id, arguments): refused after the env's fields (its module, without Newton) or a run folder were read
    ("negative_lr", ["train", "+env=cartpole", "optim.lr=-1"]),
    ("zero_horizon", ["gradcheck", "+env=cartpole", "env.horizon=0"]),
    ("record_negative_horizon", ["record", "+env=cartpole", "env.horizon=-3", "out=trajectory.npz"]),
    ("soft_body_bad_field", ["train", "+env=soft_body", "env.world_count=0"]),
    ("evaluate_missing_folder", ["evaluate", "/nonexistent"]),
    ("render_missing_folder", ["render", "/nonexistent"]),
    ("report_missing_folder", ["report", "/nonexistent"]),
]


@pytest.mark.parametrize(("args", "code"), [c[1:] for c in EARLY], ids=[c[0] for c in EARLY])
def test_help_config_printing_and_early_refusals_import_nothing_heavy(args, code, tmp_path):
    exit_code, modules, stderr = run_cli(args, tmp_path)
    assert exit_code == code, stderr
    assert not imported(modules, HEAVY + ENV_MODULES + LIGHT)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args", [c[1] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refusals_of_bad_values_do_not_import_newton(args, tmp_path):
    exit_code, modules, stderr = run_cli(args, tmp_path)
    assert exit_code == 2, stderr
    assert [line for line in stderr.splitlines() if line.strip()][-1].startswith("error: ")
    assert not imported(modules, HEAVY)
    if args[0] in ("evaluate", "render", "report"):
        assert not imported(modules, ENV_MODULES)
    assert not (tmp_path / "outputs").exists()


def test_a_valid_command_line_builds_its_env_with_newton(tmp_path):
    """The other side: once the command line passes, Newton is imported and the env built
    (the check above is not passing because nothing runs)."""
    args = ["gradcheck", "+env=cartpole", "env.horizon=2", "env.world_count=1", f"hydra.run.dir={tmp_path / 'run'}"]
    exit_code, modules, stderr = run_cli(args, tmp_path)
    assert exit_code == 0, stderr
    assert {"newton", "envs.cartpole", "warp"} <= modules


def test_importing_the_package_configures_warp_when_warp_is_imported(tmp_path):
    """`import harness` leaves Warp alone; the first `import warp` after it (by any module)
    gets the harness's log level and determinism, before any kernel module exists."""
    probe = (
        "import sys, harness\n"
        "assert 'warp' not in sys.modules\n"
        "import warp as wp\n"
        "print(wp.config.log_level == wp.LOG_ERROR, wp.config.deterministic == wp.DeterministicMode.RUN_TO_RUN)\n"
    )
    extra = {"HARNESS_WARP_LOG_LEVEL": "error", "HARNESS_DETERMINISTIC": "run_to_run"}
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=harness_env(extra), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]
    first = "import warp as wp\nimport harness\nprint(wp.config.log_level == wp.LOG_WARNING)\n"
    proc = subprocess.run(
        [sys.executable, "-c", first], cwd=tmp_path, env=harness_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"]
