"""Every config group composes with Hydra and instantiates into a working object."""

from __future__ import annotations

import pytest

from harness import config
from harness.build import Run, build_run
from harness.build import validate as validate_run
from harness.clip import ClipPolicy
from harness.losses import WeightedLoss
from harness.optim import Optimizer
from harness.schedules import Schedule
from tests.helpers import compose_run

GROUPS = ["env", "loss", "optim", "clip", "schedule", "experiment"]
REQUIRED = {"robot": ("env.asset=newton:nv_ant.xml", "env.settle_time=0")}
"""What an env option needs on the command line (the robot env has no default file)."""


def build(*overrides: str) -> Run:
    return build_run(*compose_run(*overrides))


def test_every_group_has_options():
    for group in GROUPS:
        assert config.available(group), group


@pytest.mark.parametrize("name", config.available("optim"))
def test_optim_option_instantiates(name):
    run = build("+env=cartpole", "env.horizon=2", f"optim={name}", "device=cpu")
    assert isinstance(run.optimizer, Optimizer)


@pytest.mark.parametrize("name", config.available("clip"))
def test_clip_option_instantiates(name):
    run = build("+env=cartpole", "env.horizon=2", f"clip={name}", "device=cpu")
    assert isinstance(run.clip, ClipPolicy)


@pytest.mark.parametrize("name", config.available("loss"))
def test_loss_option_binds_to_its_env(name):
    # A loss named after an env reads that env's observables; the others are cartpole losses.
    env = name if name in config.available("env") else "cartpole"
    run = build(
        f"+env={env}", "env.horizon=2", "env.world_count=1", *REQUIRED.get(env, ()), f"loss={name}", "device=cpu"
    )
    assert isinstance(run.loss, WeightedLoss)
    run.loss.bind(run.env.observables, device="cpu")


@pytest.mark.parametrize("name", config.available("schedule"))
def test_schedule_option_instantiates(name):
    run = build("+env=cartpole", "env.horizon=2", f"schedule={name}", "device=cpu")
    assert isinstance(run.schedule, Schedule)


@pytest.mark.parametrize("name", config.available("experiment"))
def test_experiment_preset_composes_and_validates(name):
    cfg, choices = compose_run(f"+experiment={name}", "device=cpu")
    run = validate_run(cfg, choices)
    assert run.settings.iterations >= 1


@pytest.mark.parametrize("name", config.available("env"))
def test_env_option_builds_and_declares_parameters(name):
    run = build(f"+env={name}", "env.horizon=2", "env.world_count=1", *REQUIRED.get(name, ()), "device=cpu")
    assert run.task.parameter_specs(run.env)
    assert run.settings.device == "cpu"


def test_gradcheck_config_composes_on_top_of_train():
    cfg, _ = compose_run("+env=cartpole", config_name="gradcheck")
    assert cfg.gradcheck.samples > 0
    assert cfg.gradcheck.tolerance is None  # the env's own (EnvConfig.gradcheck_tolerance)
    assert cfg.optim is not None


def test_missing_env_is_a_config_error():
    with pytest.raises(config.ConfigError, match=r"\+env=NAME"):
        build()


@pytest.mark.parametrize(
    ("override", "field"),
    [("iterations=0", "iterations"), ("log_every=-1", "log_every"), ("device=tpu:9", "device")],
)
def test_bad_top_level_values_name_the_field(override, field):
    with pytest.raises(config.ConfigError, match=rf"^{field}:"):
        build("+env=cartpole", "env.horizon=2", override)


@pytest.mark.parametrize(
    ("group", "old", "new"), [("clip", "norm", "global_norm"), ("schedule", "cosine", "cosine_decay")]
)
def test_an_old_option_name_is_refused_with_its_new_name(group, old, new):
    with pytest.raises(config.ConfigError, match=f"^{group}: '{old}' was renamed; use {group}={new}$"):
        config.compose_command("train", ["+env=cartpole", f"{group}={old}"])


def test_a_run_folder_written_under_old_option_names_composes_under_the_new_ones(tmp_path):
    (tmp_path / ".hydra").mkdir()
    old = ["+env=cartpole", "clip=norm", "schedule=step", "clip.max_norm=2", "resume=auto", "seed=3"]
    (tmp_path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in old))
    overrides = config.run_overrides(tmp_path, "render")
    assert overrides == ["+env=cartpole", "clip=global_norm", "schedule=step_decay", "clip.max_norm=2", "seed=3"]
    _cfg, choices, _ = config.compose_command("train", overrides)
    assert (choices["clip"], choices["schedule"]) == ("global_norm", "step_decay")


def test_a_checkpoint_recording_an_old_schedule_name_fits_the_renamed_option_only(tmp_path):
    from harness import checkpoint

    saved = checkpoint.Checkpoint(arrays={}, meta={"schedule": "cosine", "clip": "global_norm"})
    checkpoint.check_fits(saved, tmp_path / "c.hckpt", components={"schedule": "cosine_decay", "clip": "global_norm"})
    with pytest.raises(checkpoint.CheckpointError, match="its schedule is 'cosine', this run's is 'constant'"):
        checkpoint.check_fits(saved, tmp_path / "c.hckpt", components={"schedule": "constant"})
