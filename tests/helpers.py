"""Small builders shared by the tests (real Newton envs, short horizons)."""

from __future__ import annotations

from envs.cartpole import CartpoleEnv
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
