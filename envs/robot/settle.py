"""The settle check: one world of a robot, unactuated, must come to rest before a run trains it.

:func:`check_settles` refuses, in one line, a file whose robot does not come to rest within
``env.settle_time`` seconds (:func:`settle` says why); ``env.settle_time=0`` skips it. The check
simulates an env of its own, one world without start noise, built by the caller: about 0.1 s to
build for the Ant on the CPU, where checking on the env being built would simulate all of its
``world_count`` worlds (the Ant's 64: 2.3 s against one world's 0.5 s) from noiseless starts it
does not have, and overwrite its first states. The result is cached per file and physical
settings for the process, so a process builds the quiet env once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import warp as wp

from envs.robot.config import RobotConfig
from envs.robot.layout import RobotFileError, asset_path

__all__ = ["SETTLE_SPEED", "UP_TOLERANCE", "check_settles", "settle"]

UP_TOLERANCE = 0.5
"""[m] how far above its start height the root may rise while an unactuated file settles."""

SETTLE_SPEED = 0.5
"""[m/s] the root's largest speed at the end of the settle time that counts as at rest."""

_SETTLED: dict[tuple, str | None] = {}


def check_settles(cfg: RobotConfig, build: Callable[[RobotConfig], Any]) -> None:
    """Refuse ``cfg``'s file unless :func:`settle` finds it comes to rest (nothing with ``settle_time`` 0).

    Raises:
        RobotFileError: One line naming ``env.asset``, what its robot did, and what to change.
    """
    if cfg.settle_time <= 0:
        return
    why = settle(cfg, build)
    if why is not None:
        raise RobotFileError(
            f"env.asset: '{cfg.asset}' does not come to rest unactuated: {why}; "
            "accepted: a file that does with "
            "these settings (more env.substeps, env.armature, env.joint_damping, stiffer env.contact_ke), "
            "or env.settle_time=0 to train it anyway"
        )


def settle(cfg: RobotConfig, build: Callable[[RobotConfig], Any]) -> str | None:
    """Why one world of ``cfg``'s robot, unactuated and without start noise, does not come to rest
    within ``cfg.settle_time`` seconds; None when it does. It has not when its root goes non-finite,
    rises more than :data:`UP_TOLERANCE` above its start, or still moves faster than
    :data:`SETTLE_SPEED` at the end (a robot that folds up and lies down has come to rest). One
    control step is captured and replayed (cached per file and physical settings for the process).
    ``build`` makes the env of the one quiet world from its config (the caller's env class)."""
    quiet = dataclasses.replace(
        cfg, world_count=1, horizon=1, settle_time=0.0, seed=0, noise_position=0.0, noise_rotation=0.0,
        noise_joint_q=0.0, noise_joint_qd=0.0, recenter=0.0,
    )  # fmt: skip
    key = (repr(quiet), asset_path(cfg.asset), cfg.settle_time)
    if key in _SETTLED:
        return _SETTLED[key]
    env = build(quiet)
    env.request({})
    up = "xyz".index(cfg.up_axis)

    def one_step() -> None:
        env.reset()
        env.step(0)
        for name in ("joint_q", "joint_qd"):
            wp.copy(env.initial[name], getattr(env.state(1), name))

    env.reset()  # a root that is not a floating base starts where the file's pose puts its body
    posed = env.state(0).body_q.numpy()[env.layout.root_body]
    start = float(env.base_q[up]) if env.layout.root_free else float(posed[up])
    one_step()  # eager first: kernels load, the solver allocates
    graph = None
    if env.device.is_cpu or env.device.is_cuda:
        with wp.ScopedCapture(device=env.device) as capture:
            one_step()
        graph = capture.graph
    steps = max(1, round(cfg.settle_time / cfg.dt))
    why = None
    for t in range(1, steps):
        if graph is not None:
            wp.capture_launch(graph)
        else:
            one_step()
        root = env.state(1).body_q.numpy()[env.layout.root_body]
        speed = float(np.linalg.norm(env.state(1).body_qd.numpy()[env.layout.root_body][:3]))
        seconds = (t + 1) * cfg.dt
        if not (np.isfinite(root).all() and math.isfinite(speed)):
            why = f"its root went non-finite after {seconds:.2f} s"
            break
        if root[up] > start + UP_TOLERANCE:
            why = f"its root rose to {root[up]:.2f} m (from {start:.2f} m) after {seconds:.2f} s"
            break
        if t == steps - 1 and speed > SETTLE_SPEED:
            why = f"its root still moves at {speed:.2f} m/s after {seconds:.2f} s"
            break
    _SETTLED[key] = why
    return why
