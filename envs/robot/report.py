"""What a robot run reports of its rollouts: the locomotion figures of whole episodes, and where a
simulation blew up (:meth:`RobotEnv.describe <envs.robot.env.RobotEnv.describe>`,
:meth:`~envs.robot.env.RobotEnv.blowup`), from host arrays only."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["BLOWUP_DISTANCE", "SATURATED", "blown_up", "drive_figures", "episode_figures"]

BLOWUP_DISTANCE = 1.0e4
"""[m] a body this far from the origin has blown up (:meth:`RobotEnv.blowup`)."""


SATURATED = 0.999
"""A drive whose torque reaches this share of its effort limit on a substep is at the limit."""


def blown_up(body_q: np.ndarray, world_count: int, body_count: int) -> tuple[int, int] | None:
    """The first (world, body) of one State's ``body_q`` whose pose is not finite or lies beyond
    :data:`BLOWUP_DISTANCE` of the origin; None when every body is finite and near."""
    position = body_q[:, :3].reshape(world_count, body_count, 3)
    bad = ~np.isfinite(position).all(axis=2) | (np.abs(np.nan_to_num(position, nan=0.0)).max(axis=2) > BLOWUP_DISTANCE)
    if not bad.any():
        return None
    world, body = (int(i) for i in np.argwhere(bad)[0])
    return world, body


def episode_figures(
    reward: np.ndarray,
    terminated: np.ndarray,
    root_position: np.ndarray,
    start: np.ndarray,
    forward: np.ndarray,
    dt: float,
) -> dict[str, Any]:
    """What a locomotion user reads of whole-episode rollouts from the env's own starts (no restarts):
    ``episode_return`` (the summed rewards up to and including the step that ends the episode, mean
    over worlds), ``forward_speed`` (the root's forward displacement over the rollout's simulated
    time [m/s], mean over worlds), ``fall_fraction`` (the share of worlds whose episode ended early)
    and ``episode_length`` (steps, mean). A world whose simulation left finite numbers (a fallen
    world under ``env.nan_guard``) counts with its last finite root position, and
    ``nonfinite_worlds`` says how many did so (only where some did)."""
    steps = reward.shape[0]
    ended = terminated[:, :, 0] > 0.5
    fell = ended.any(axis=0)
    length = np.where(fell, ended.argmax(axis=0) + 1, steps)
    alive = np.arange(steps)[:, None] < length[None, :]
    returns = np.where(alive, reward.sum(axis=2), 0.0).sum(axis=0)  # (what follows the end counts nothing, nan too)
    finite = np.isfinite(root_position).all(axis=2)  # (steps, worlds)
    last = steps - 1 - np.argmax(finite[::-1], axis=0)  # each world's last finite step (0 if none)
    final = root_position[last, np.arange(root_position.shape[1])]
    displacement = np.nan_to_num(final - start) @ forward
    found = {
        "episode_return": float(returns.mean()),
        "forward_speed": float(displacement.mean() / (steps * dt)),
        "fall_fraction": float(fell.mean()),
        "episode_length": float(length.mean()),
    }
    if not finite[-1].all():
        found["nonfinite_worlds"] = int((~finite[-1]).sum())
    return found


def drive_figures(drive: np.ndarray, terminated: np.ndarray) -> dict[str, Any]:
    """What a position-driven robot's drive gave over whole episodes (the observable ``drive``:
    per step and world the largest |torque| / effort limit and |torque| over substeps and actuated
    dofs, and the largest |joint speed|), the steps up to and including the one that ends an
    episode: ``drive_peak_fraction`` (the largest torque / limit: at most 1 by construction),
    ``drive_saturated_fraction`` (the share of world-steps with some dof at its limit on some
    substep), ``drive_torque_peak`` [N m] and ``joint_speed_peak`` [rad/s], and the mean over
    world-steps of the step's largest joint speed, ``joint_speed_mean``."""
    steps = drive.shape[0]
    ended = terminated[:, :, 0] > 0.5
    length = np.where(ended.any(axis=0), ended.argmax(axis=0) + 1, steps)
    alive = np.arange(steps)[:, None] < length[None, :]
    kept = drive[alive]  # (world-steps, 3)
    return {
        "drive_peak_fraction": float(kept[:, 0].max()),
        "drive_saturated_fraction": float((kept[:, 0] >= SATURATED).mean()),
        "drive_torque_peak": float(kept[:, 1].max()),
        "joint_speed_peak": float(kept[:, 2].max()),
        "joint_speed_mean": float(kept[:, 2].mean()),
    }
