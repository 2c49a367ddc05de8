"""The training state: everything an optimisation carries from one iteration to the next.

This module owns :class:`TrainState`, a nested structure of device arrays: the flat
parameter buffer and the optimizer's, the schedule's and the clip policy's state dicts.
Nothing else persists between iterations (gradients, statistics and the history buffer
are recomputed or read back every iteration), so a checkpoint is exactly this structure,
saved and loaded generically as ``<group>/<key>`` arrays, and a resumed run continues bit
for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import warp as wp

from harness.optim import load_state, save_state
from harness.params import ParamSet

__all__ = ["TrainState"]

State = dict[str, wp.array]


@dataclasses.dataclass
class TrainState:
    """Parameters plus the optimizer, schedule and clip-policy state, all on the device.

    Attributes:
        params: The flat parameter buffer with its named views.
        optim: Optimizer state (``step``, ``lr``, moments, ...).
        schedule: Schedule state (base rate, clip-aware window, ...).
        clip: Clip-policy state (coefficient, skip flag, AutoClip/ZClip history, ...).
        task: What the task carries between iterations (a windowed policy's env state).
    """

    params: ParamSet
    optim: State
    schedule: State
    clip: State
    task: State = dataclasses.field(default_factory=dict)

    def groups(self) -> dict[str, State]:
        """The nested structure, by group: ``params`` (``data``), ``optim``, ``schedule``,
        ``clip`` and, when the task carries something between iterations, ``task``."""
        found = {
            "params": {"data": self.params.data},
            "optim": self.optim,
            "schedule": self.schedule,
            "clip": self.clip,
        }
        if self.task:
            found["task"] = self.task
        return found

    def arrays(self) -> dict[str, wp.array]:
        """Every leaf, flattened to ``<group>/<key>``."""
        return {f"{group}/{key}": array for group, leaves in self.groups().items() for key, array in leaves.items()}

    def to_numpy(self) -> dict[str, np.ndarray]:
        """Host copies of every leaf, for a checkpoint (a host round trip: checkpoint time only)."""
        return save_state(self.arrays())

    def load(self, saved: Mapping[str, np.ndarray]) -> None:
        """Overwrite every leaf with saved arrays, bit for bit.

        Raises:
            ValueError: One line naming the missing, unexpected or mismatched arrays.
        """
        load_state(self.arrays(), saved)
