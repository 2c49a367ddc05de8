"""Turns a composed Hydra config into typed objects, and rejects bad input early.

Hydra lives only here, in :mod:`harness.cli` and in :mod:`harness.sweep`: everything below ``train(...)`` receives
plain Python objects (an :class:`~envs.base.Env`, a :class:`~harness.losses.WeightedLoss`,
an :class:`~harness.optim.Optimizer`, a :class:`~harness.clip.ClipPolicy`,
:class:`~harness.trainer.TrainSettings`). Every error is a :class:`ConfigError` whose
message is one line naming the field and what is accepted.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
"""The repository's ``configs/`` folder (the project is installed in editable mode)."""


class ConfigError(ValueError):
    """A bad configuration value; the message names the field and what is accepted."""


def available(group: str) -> list[str]:
    """Option names of a config group (``env``, ``loss``, ``optim``, ``clip``)."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def require_env(cfg: DictConfig) -> None:
    """Stop with the list of envs when the command line did not pick one."""
    if cfg.get("env") is None:
        raise ConfigError(
            f"env: no environment selected; pick one with +env=NAME, available: {', '.join(available('env'))}"
        )


@dataclasses.dataclass
class Run:
    """Everything a training run needs, as typed objects."""

    env: Any
    loss: Any
    optimizer: Any
    clip: Any
    settings: Any


def _check_int(cfg: DictConfig, field: str, minimum: int) -> int:
    value = cfg.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{field}: must be an integer >= {minimum}, got {value!r}")
    return value


def check_device(name: str | None) -> str | None:
    """Accept None (Warp's preferred device) or the name of a device Warp sees."""
    import warp as wp

    if name is None:
        return None
    names = [d.alias for d in wp.get_devices()]
    if str(name) not in names:
        raise ConfigError(f"device: '{name}' is not available here; accepted: null (preferred), {', '.join(names)}")
    return str(name)


def _instantiate(cfg: DictConfig, group: str, **kwargs: Any) -> Any:
    try:
        return hydra.utils.instantiate(cfg[group], _convert_="all", **kwargs)
    except hydra.errors.InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, ValueError):
            raise ConfigError(str(cause)) from None
        raise ConfigError(f"{group}: could not be built ({str(cause or exc).splitlines()[0]})") from None


def build_run(cfg: DictConfig) -> Run:
    """Validate the top-level fields, then instantiate env, loss, optimizer and clip policy."""
    from harness.trainer import TrainSettings

    require_env(cfg)
    settings = TrainSettings(
        iterations=_check_int(cfg, "iterations", 1),
        log_every=_check_int(cfg, "log_every", 1),
        seed=_check_int(cfg, "seed", 0),
        device=check_device(cfg.get("device")),
    )
    optimizer = _instantiate(cfg, "optim")
    clip = _instantiate(cfg, "clip")
    loss = _instantiate(cfg, "loss")
    env = _instantiate(cfg, "env", device=settings.device)
    return Run(env=env, loss=loss, optimizer=optimizer, clip=clip, settings=settings)


HPARAM_KEYS = (
    "env.horizon",
    "env.world_count",
    "clip.max_norm",
    "clip.clip_value",
    "optim.lr",
    "iterations",
    "seed",
)
"""Config values recorded as hyperparameters of every run (when the config has them)."""


def hparams(cfg: DictConfig, hydra_cfg: Any) -> dict[str, bool | int | float | str]:
    """The run's hyperparameters for TensorBoard's HParams dashboard.

    The chosen option of each config group (``env``, ``clip``, ``optim``, ``loss``), the
    values in :data:`HPARAM_KEYS`, and every key overridden on the command line (so a
    sweep's swept values are always there).
    """
    values: dict[str, bool | int | float | str] = {}
    for group in ("env", "loss", "optim", "clip"):
        choice = hydra_cfg.runtime.choices.get(group)
        if choice is not None:
            values[group] = str(choice)
    keys = list(HPARAM_KEYS)
    for override in OverridesParser.create().parse_overrides(list(hydra_cfg.overrides.task)):
        key = override.key_or_group
        if "/" not in key and key not in values and key not in keys:
            keys.append(key)
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)  # HParams stores numbers as finite doubles; "inf" stays readable
        if isinstance(value, bool | int | float | str):
            values[key] = value
    return values


def resolved_yaml(cfg: DictConfig) -> str:
    """The run's config with every interpolation resolved, as YAML."""
    return OmegaConf.to_yaml(cfg, resolve=True)
