"""The training state: everything an optimisation carries from one iteration to the next.

This module owns :class:`TrainState`: every parameter group's flat parameter buffer and the
state of its update (one transformation, :mod:`harness.transform`: a non-finite wrapper
around the chain of clip policy, schedule, optimizer and bounds, whose keys are
``<member>/<key>``), and what the task carries (a windowed policy's env state, a critic's
target network and observation statistics). Nothing else persists between iterations
(gradients, statistics and the history buffer are recomputed or read back every iteration),
so a checkpoint is exactly these arrays, saved and loaded generically by name, and a resumed
run continues bit for bit.

Checkpoint names: a single-group run writes ``params/data``, ``nonfinite/...``, ``clip/...``,
``schedule/...``, ``optim/...`` and ``task/...``, as every run did before parameter groups
existed; a run with several groups prefixes each group's arrays with its name
(``actor/params/data``, ``critic/optim/exp_avg``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import warp as wp

from harness.optim import load_state, save_state
from harness.params import ParamSet
from harness.training.groups import Group

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

ADDED_ARRAYS = ("task/carried/root_offset", "task/root_offset")
"""Arrays a checkpoint from before them lacks, whose freshly made value is what that run had:
``env.recenter``'s per-world offsets in SHAC's (and AHAC's) carried state and in a windowed
``task=policy``'s (0: no world moved yet; a run that turns it on at resume,
``harness.config.ADDED_FIELDS``)."""


class TrainState:
    """The groups' parameters and update states plus what the task carries, all on the device.

    Args:
        groups: The parameter groups, in update order (the first is the primary one).
        task: What the task carries between iterations.

    Attributes:
        groups: By name.
        task: The task's carried arrays.
    """

    def __init__(self, groups: list[Group], task: State | None = None):
        self.groups = {group.name: group for group in groups}
        self.task = dict(task or {})

    @property
    def primary(self) -> Group:
        """The first group (the only one of a single-group run)."""
        return next(iter(self.groups.values()))

    @property
    def params(self) -> ParamSet:
        """The primary group's parameters."""
        return self.primary.params

    @property
    def update(self) -> State:
        """The primary group's update state (``nonfinite/``, ``clip/``, ``schedule/``, ``optim/``)."""
        return self.primary.state

    optim = property(lambda self: self.primary.substate("optim"), doc="The primary group's optimizer state.")
    schedule = property(lambda self: self.primary.substate("schedule"), doc="The primary group's schedule state.")
    clip = property(lambda self: self.primary.substate("clip"), doc="The primary group's clip policy state.")
    nonfinite = property(lambda self: self.primary.substate("nonfinite"), doc="The non-finite wrapper's counters.")

    def arrays(self) -> dict[str, wp.array]:
        """Every leaf by its checkpoint name (module docstring)."""
        prefixed = len(self.groups) > 1
        found: dict[str, wp.array] = {}
        for name, group in self.groups.items():
            head = f"{name}/" if prefixed else ""
            found[f"{head}params/data"] = group.params.data
            found.update({f"{head}{key}": array for key, array in group.state.items()})
        found.update({f"task/{key}": array for key, array in self.task.items()})
        return found

    def to_numpy(self) -> dict[str, np.ndarray]:
        """Host copies of every leaf, for a checkpoint (a host round trip: checkpoint time only)."""
        return save_state(self.arrays())

    def load(self, saved: Mapping[str, np.ndarray], *, task_keys: Collection[str] | None = None) -> None:
        """Overwrite every leaf with saved arrays, bit for bit (arrays of an older layout
        under their current names, :data:`RENAMED_ARRAYS`).

        Args:
            saved: The arrays of a checkpoint.
            task_keys: Load only these keys of the task's state (an evaluation's); None: all.

        Raises:
            ValueError: One line naming the missing, unexpected or mismatched arrays.
        """
        current = {RENAMED_ARRAYS.get(key, key): value for key, value in saved.items()}
        mine = self.arrays()
        for key in ADDED_ARRAYS:  # a checkpoint from before them: keep the fresh value
            if key in mine and key not in current:
                current[key] = mine[key].numpy()
        if task_keys is not None:
            keep = {f"task/{key}" for key in task_keys}
            mine = {k: v for k, v in mine.items() if not k.startswith("task/") or k in keep}
            current = {k: v for k, v in current.items() if not k.startswith("task/") or k in keep}
        load_state(mine, current)
