"""Small builders shared by the tests (real Newton envs, short horizons)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from envs.cartpole import CartpoleEnv
from harness import config
from harness.clip import clip_by_global_norm
from harness.losses import WeightedLoss
from harness.optim import adam
from harness.trainer import Trainer, TrainSettings

UPRIGHT_TERMS = {
    "pose": {"source": "joint_q", "dim_weights": [0.1, 1.0, 1.0]},
    "velocity": {"source": "joint_qd", "dim_weights": [0.01, 0.1, 0.1]},
    "effort": {"source": "controls", "weight": 1e-3},
}


def make_trainer(
    *,
    horizon: int = 30,
    world_count: int = 2,
    iterations: int = 10,
    log_every: int = 5,
    lr: float = 0.5,
    max_norm: float = 1.0,
    **env_kw,
) -> Trainer:
    env = CartpoleEnv(horizon=horizon, world_count=world_count, device="cpu", **env_kw)
    return Trainer(
        env=env,
        loss=WeightedLoss(UPRIGHT_TERMS),
        optimizer=adam(lr),
        clip=clip_by_global_norm(max_norm),
        settings=TrainSettings(iterations=iterations, log_every=log_every, seed=0, device="cpu"),
    )


def compose_run(*overrides: str, config_name: str = "train") -> tuple[DictConfig, dict]:
    """Compose a config as the CLI would; returns (config without hydra, group choices)."""
    with initialize_config_dir(config_dir=str(config.CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices
