"""An env that lives outside this repository: its own module and YAML in a temporary folder,
found through ``HARNESS_CONFIG_PATH`` (or ``hydra.searchpath``), trained, gradient-checked
and resumed from the command line; and the ways such an env can be wrong."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from harness import config
from tests.helpers import ROOT, run_harness
from tests.test_errors import assert_clean_rejection

MODULE = '''
"""A user's env: one particle launched under gravity; train its launch velocity to hit a target."""
import dataclasses

import newton
import numpy as np
import warp as wp

from harness.env import Quantity
from harness.newton_env import NewtonEnv, NewtonEnvConfig, finalize_worlds
from harness.schema import field


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProjectileConfig(NewtonEnvConfig):
    horizon: int = field(40, minimum=1, doc="steps")
    world_count: int = field(1, minimum=1, doc="copies of the scene")
    dt: float = field(0.01, minimum=0.0, strict=True, doc="time step [s]")
    launch: tuple = field((1.0, 0.0, 3.0), length=3, doc="initial velocity [m/s]")
    speed_limit: float = field(20.0, doc="largest velocity component [m/s]")

    def observable_dims(self):
        return {"position": 3}

    def quantities(self):
        return {
            "launch_velocity": Quantity(
                (self.world_count,), wp.vec3, lower=-self.speed_limit, upper=self.speed_limit, unit="m/s"
            )
        }

    def default_quantities(self, kind):
        return ["launch_velocity"] if kind == "initial" else []


@wp.kernel
def _position(q: wp.array(dtype=wp.vec3), row: int, out: wp.array3d(dtype=wp.float32)):
    w = wp.tid()
    out[row, w, 0] = q[w][0]
    out[row, w, 1] = q[w][1]
    out[row, w, 2] = q[w][2]


class Projectile(NewtonEnv):
    name = "projectile"
    Config = ProjectileConfig

    def __init__(self, config=None, /, *, device=None, **fields):
        super().__init__(config, device=device, **fields)
        self.dt = self.config.dt

    def build_model(self):
        scene = newton.ModelBuilder()
        scene.add_particle((0.0, 0.0, 0.0), self.config.launch, 1.0, radius=0.0)
        return finalize_worlds(scene, self.world_count, self.device)

    def build_solver(self):
        return newton.solvers.SolverSemiImplicit(self.model)

    def quantity_value(self, name):
        return np.tile(np.asarray(self.config.launch, np.float32), (self.world_count, 1))

    def set_quantity(self, name, value):
        wp.copy(self.initial["particle_qd"], value)

    def write_observables(self, t):
        row = self.row("position", t)
        if row is not None:
            wp.launch(_position, dim=self.world_count, inputs=[self.state(t + 1).particle_q, row],
                      outputs=[self.observed["position"]], device=self.device)


class Raising(Projectile):
    name = "raising"

    def build_model(self):
        raise RuntimeError("the robot's mesh file is missing")
'''

ENV_YAML = """
defaults:
  - /loss@_global_.loss: projectile
  - override /task@_global_.task: initial

_target_: my_robots.Projectile
horizon: 40
world_count: 2
dt: 0.01
launch: [1.0, 0.0, 3.0]
speed_limit: 20.0
seed: ${seed}
per_step_states: true
"""

LOSS_YAML = """
_target_: harness.losses.WeightedLoss
terms:
  miss:
    source: position
    steps: last
    target: [1.5, 0.0, 0.5]
"""


REPO_ENVS = config.available("env")
USER_ENVS = ["projectile", "projectile_long", "no_module", "raising", "inverted"]
"""The user folder's env files (``user_folder``): a refusal lists them beside the repository's."""


@pytest.fixture
def user_folder(tmp_path) -> Path:
    """``code/my_robots.py`` and ``configs/{env,loss}/*.yaml``, outside this checkout."""
    code, configs = tmp_path / "code", tmp_path / "configs"
    (configs / "env").mkdir(parents=True)
    (configs / "loss").mkdir()
    code.mkdir()
    (code / "my_robots.py").write_text(textwrap.dedent(MODULE))
    (configs / "env" / "projectile.yaml").write_text(ENV_YAML)
    # A second YAML for the same class: same env identity, so it resumes the other's runs.
    (configs / "env" / "projectile_long.yaml").write_text(ENV_YAML.replace("horizon: 40", "horizon: 40  # same"))
    (configs / "env" / "no_module.yaml").write_text(ENV_YAML.replace("my_robots.Projectile", "my_robotz.Projectile"))
    (configs / "env" / "raising.yaml").write_text(ENV_YAML.replace("my_robots.Projectile", "my_robots.Raising"))
    (configs / "env" / "inverted.yaml").write_text(ENV_YAML.replace("speed_limit: 20.0", "speed_limit: -1.0"))
    (configs / "loss" / "projectile.yaml").write_text(LOSS_YAML)
    (tmp_path / "work").mkdir()
    return tmp_path


def harness(folder: Path, *args: str, via: str = "variable"):
    env = {"PYTHONPATH": os.pathsep.join([str(folder / "code"), str(ROOT)])}
    if via == "variable":
        env["HARNESS_CONFIG_PATH"] = str(folder / "configs")
    else:
        args = (*args, f"hydra.searchpath=[file://{folder / 'configs'}]")
    return run_harness(*args, cwd=folder / "work", env=env, timeout=300)


def test_user_env_trains_gradchecks_and_resumes_from_its_own_folder(user_folder):
    run_dir = user_folder / "work" / "run"
    args = ["train", "+env=projectile", "iterations=30", "log_every=10", "checkpoint.every=10", "optim.lr=0.2"]
    first = harness(user_folder, *args, f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == "projectile"
    assert summary["final_loss"] < 0.05 * summary["initial_loss"], summary

    check = harness(user_folder, "gradcheck", "+env=projectile", via="searchpath")
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.rstrip().endswith(": ok"), check.stdout

    # Continue the same run for 20 more iterations, through the second YAML of the same class.
    more = harness(user_folder, *args[:2], "optim.lr=0.2", "iterations=50", "resume=auto", f"hydra.run.dir={run_dir}")
    assert more.returncode == 0, more.stderr
    other = harness(user_folder, "train", "+env=projectile_long", "iterations=60", "optim.lr=0.2", f"resume={run_dir}")
    assert other.returncode == 0, other.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["iterations_done"] == 60
    assert resumed["final_loss"] <= summary["final_loss"]


@pytest.mark.parametrize(
    ("name", "field", "accepted"),
    [
        ("nowhere", "env:", "accepted: " + ", ".join(sorted({*REPO_ENVS, *USER_ENVS}))),
        ("no_module", "env._target_", "cannot import 'my_robotz.Projectile'"),
        ("raising", "env:", "RuntimeError: the robot's mesh file is missing"),
        ("inverted", "env: quantity 'launch_velocity'", "accepted: lower <= upper"),
    ],
)
def test_a_broken_user_env_is_refused_in_one_line_and_nothing_is_written(user_folder, name, field, accepted):
    proc = harness(user_folder, "train", f"+env={name}")
    assert_clean_rejection(proc, field, accepted, user_folder / "work")


def test_the_user_env_runs_with_capture_on(user_folder):
    proc = harness(user_folder, "train", "+env=projectile", "iterations=4", "capture=true", "hydra.run.dir=r")
    assert proc.returncode == 0, proc.stderr
    final = json.loads((user_folder / "work" / "r" / "summary.json").read_text())["final_loss"]
    assert np.isfinite(final)


def test_segments_are_refused_for_a_user_env_that_does_not_declare_them(user_folder):
    """A NewtonEnv subclass is not segmentable until it says its per-step arrays follow
    NewtonEnv.slot: one line, nothing written."""
    proc = harness(user_folder, "train", "+env=projectile", "memory.segment_steps=5")
    assert_clean_rejection(
        proc, "memory.segment_steps: env 'projectile' cannot run in segments", "NewtonEnv.slot", user_folder / "work"
    )
