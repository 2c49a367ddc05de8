"""Every config group composes with Hydra and instantiates into a working object."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from harness import config
from harness.clip import ClipPolicy
from harness.losses import WeightedLoss
from harness.optim import Optimizer

GROUPS = ["env", "loss", "optim", "clip"]


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(config.CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def test_every_group_has_options():
    for group in GROUPS:
        assert config.available(group), group


@pytest.mark.parametrize("name", config.available("optim"))
def test_optim_option_instantiates(name):
    run = config.build_run(compose_train("+env=cartpole", "env.horizon=2", f"optim={name}", "device=cpu"))
    assert isinstance(run.optimizer, Optimizer)


@pytest.mark.parametrize("name", config.available("clip"))
def test_clip_option_instantiates(name):
    run = config.build_run(compose_train("+env=cartpole", "env.horizon=2", f"clip={name}", "device=cpu"))
    assert isinstance(run.clip, ClipPolicy)


@pytest.mark.parametrize("name", config.available("loss"))
def test_loss_option_binds_to_the_cartpole(name):
    run = config.build_run(compose_train("+env=cartpole", "env.horizon=2", f"loss={name}", "device=cpu"))
    assert isinstance(run.loss, WeightedLoss)
    run.loss.bind(run.env.observables(), device="cpu")


@pytest.mark.parametrize("name", config.available("env"))
def test_env_option_builds_and_declares_parameters(name):
    run = config.build_run(compose_train(f"+env={name}", "env.horizon=2", "env.world_count=1", "device=cpu"))
    assert run.env.parameter_specs()
    assert run.settings.device == "cpu"


def test_gradcheck_config_composes_on_top_of_train():
    with initialize_config_dir(config_dir=str(config.CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="gradcheck", overrides=["+env=cartpole"])
    assert cfg.gradcheck.tolerance > 0
    assert cfg.optim is not None


def test_missing_env_is_a_config_error():
    with pytest.raises(config.ConfigError, match=r"\+env=NAME"):
        config.build_run(compose_train())


@pytest.mark.parametrize(
    ("override", "field"),
    [("iterations=0", "iterations"), ("log_every=-1", "log_every"), ("device=tpu:9", "device")],
)
def test_bad_top_level_values_name_the_field(override, field):
    with pytest.raises(config.ConfigError, match=rf"^{field}:"):
        config.build_run(compose_train("+env=cartpole", "env.horizon=2", override))
