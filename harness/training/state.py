"""The training state: everything an optimisation carries from one iteration to the next.

This module owns :class:`TrainState`: the flat parameter buffer, the state of the trainer's
update (one transformation, :mod:`harness.transform`: a non-finite wrapper around the chain
of clip policy, schedule, optimizer and bounds, whose keys are ``<member>/<key>``) and what
the task carries. Nothing else persists between iterations (gradients, statistics and the
history buffer are recomputed or read back every iteration), so a checkpoint is exactly
these arrays, saved and loaded generically by name, and a resumed run continues bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import warp as wp

from harness.optim import load_state, save_state
from harness.params import ParamSet
from harness.transform import substate

__all__ = ["RENAMED_ARRAYS", "TrainState"]

State = dict[str, wp.array]

RENAMED_ARRAYS = {
    "clip/skip": "nonfinite/skip",
    "clip/skipped": "nonfinite/skipped",
    "clip/iteration": "nonfinite/iteration",
    "clip/nonfinite_iteration": "nonfinite/first_iteration",
    "clip/nonfinite_param": "nonfinite/first_param",
}
"""Checkpoint arrays written under an older layout (the non-finite counters were the clip
policy's before they became the wrapper's), read under their current names."""


@dataclasses.dataclass
class TrainState:
    """Parameters plus the update's state, all on the device.

    Attributes:
        params: The flat parameter buffer with its named views.
        update: The trainer's update state: ``nonfinite/...`` (the non-finite wrapper's
            counters), ``clip/...``, ``schedule/...``, ``optim/...``.
        task: What the task carries between iterations (a windowed policy's env state).
    """

    params: ParamSet
    update: State
    task: State = dataclasses.field(default_factory=dict)

    optim = property(lambda self: substate(self.update, "optim"), doc="The optimizer's state (step, lr, moments).")
    schedule = property(lambda self: substate(self.update, "schedule"), doc="The schedule's state (base rate, window).")
    clip = property(lambda self: substate(self.update, "clip"), doc="The clip policy's state (coef, history).")
    nonfinite = property(lambda self: substate(self.update, "nonfinite"), doc="The non-finite wrapper's counters.")

    def groups(self) -> dict[str, State]:
        """The state by group: ``params`` (``data``), each member of the update that has
        state (``nonfinite``, ``clip``, ``schedule``, ``optim``) and, when the task carries
        something between iterations, ``task``."""
        found = {"params": {"data": self.params.data}}
        for key in self.update:
            group = key.split("/", 1)[0]
            if group not in found:
                found[group] = substate(self.update, group)
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
        """Overwrite every leaf with saved arrays, bit for bit (arrays of an older layout
        under their current names, :data:`RENAMED_ARRAYS`).

        Raises:
            ValueError: One line naming the missing, unexpected or mismatched arrays.
        """
        current = {RENAMED_ARRAYS.get(key, key): value for key, value in saved.items()}
        load_state(self.arrays(), current)
