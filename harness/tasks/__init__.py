"""What is trained, and the rollout that drives an env with it.

A task decides what the trainable parameters are and how they enter a rollout; the env
(:mod:`harness.env`) only simulates. Tasks, by their ``configs/task/`` option:

- ``open_loop`` (:class:`~harness.tasks.open_loop.OpenLoop`): one action per step and world.
- ``policy`` (:class:`~harness.tasks.policy.Policy`): an MLP from observation to action.
- ``shac`` (:class:`~harness.tasks.shac.SHAC`): SHAC's actor and critic (Xu et al. 2022).
- ``ahac`` (:class:`~harness.tasks.ahac.AHAC`): SHAC with windows cut by contact, a learned
  horizon, a twin critic and a critic fitted to a stopping rule (Georgiev et al. 2024).
- ``mpc`` (:class:`~harness.tasks.mpc.MPC`): model-predictive control of the env's real
  system, one frame per iteration.
- ``sysid`` (:class:`~harness.tasks.sysid.SystemId`): physical quantities fitted to a
  recorded trajectory.
- ``physical`` and ``initial`` (:class:`~harness.tasks.quantities.TrainQuantities`): named
  physical quantities the env exposes (masses, rest lengths, material parameters), or
  quantities of its initial state (initial velocities).

:func:`rollout` is the one loop over steps every task shares.

The other tasks' modules are imported when their class is first asked for
(``harness.tasks.SHAC``, as Hydra's ``_target_`` does), so a run trains without importing the
modules of the tasks it does not use (docs/startup.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.tasks.base import SINGLE_GROUP, Task, prepare, prepare_groups, rollout, rollout_segment, segment_bounds
from harness.tasks.open_loop import OpenLoop

if TYPE_CHECKING:
    from harness.tasks.ahac import AHAC
    from harness.tasks.mpc import MPC
    from harness.tasks.policy import Policy
    from harness.tasks.quantities import TrainQuantities
    from harness.tasks.shac import SHAC
    from harness.tasks.sysid import SystemId

_LAZY = {
    "AHAC": "ahac", "MPC": "mpc", "Policy": "policy", "TrainQuantities": "quantities", "SHAC": "shac",
    "SystemId": "sysid",
}  # fmt: skip
"""Task classes imported on first use, by the module of this package that defines each."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        found = getattr(importlib.import_module(f"harness.tasks.{_LAZY[name]}"), name)
        globals()[name] = found
        return found
    raise AttributeError(f"module 'harness.tasks' has no attribute '{name}'")


__all__ = [
    "AHAC",
    "MPC",
    "SHAC",
    "SINGLE_GROUP",
    "OpenLoop",
    "Policy",
    "SystemId",
    "Task",
    "TrainQuantities",
    "prepare",
    "prepare_groups",
    "rollout",
    "rollout_segment",
    "segment_bounds",
]
