"""Parameter groups: each trained parameter set with its own update and statistics.

A task trains one or several parameter sets (:meth:`harness.tasks.Task.groups`): open-loop
actions, a policy's weights and fitted quantities are one group, ``params``; SHAC's actor and
critic are two. Each group is updated by its own :class:`UpdateRule` (optimizer, clip policy,
schedule and non-finite handling, composed into one transformation, :mod:`harness.transform`)
and has its own gradient statistics before and after clipping, so every group's norms reach
TensorBoard (``optim/<stat>`` for a single group, ``optim/<group>/<stat>`` otherwise,
:mod:`harness.tags`).

:class:`Group` is the one object the training step receives per group: the parameters with
their gradient buffer, the update transformation and its state, and the statistics. Its
:meth:`Group.apply` is the fixed sequence of launches that follows a backward pass::

    pre-clip statistics -> copy of the pre-clip gradient (histograms) -> copy of the evaluated
    parameters (update ratio) -> the update (non-finite wrapper around clip, schedule,
    optimizer, bounds) -> post-clip statistics
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import warp as wp

from harness import tags
from harness.clip import ClipPolicy, no_clip, with_nonfinite
from harness.clip.nonfinite import NonFinite, check_mode
from harness.optim import Optimizer
from harness.params import ParamSet
from harness.schedules import Schedule, constant
from harness.stats import FlatStats
from harness.tasks.base import SINGLE_GROUP
from harness.transform import Shared, chain, project_to_bounds, substate

__all__ = ["SINGLE", "Group", "UpdateRule"]

SINGLE = SINGLE_GROUP
"""The name of the one group of a single-group task (its checkpoint arrays and tags carry no
group name: a run of such a task reads and writes what it always did)."""


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """How one parameter group is updated: ``nonfinite`` around the chain of the clip policy,
    the schedule, the optimizer and the parameter bounds.

    Args:
        optimizer: The optimizer (:mod:`harness.optim`).
        clip: The clip policy (:mod:`harness.clip`); one given inside a non-finite wrapper
            (``zero_nonfinite(policy)``) sets ``nonfinite``. None: no clipping.
        schedule: The learning-rate schedule (:mod:`harness.schedules`); None: constant.
        nonfinite: ``skip`` (the default), ``zero`` or ``error`` (:mod:`harness.clip.nonfinite`).
    """

    optimizer: Optimizer
    clip: ClipPolicy | NonFinite | None = None
    schedule: Schedule | None = None
    nonfinite: str | None = None

    def __post_init__(self) -> None:
        clip, nonfinite = self.clip if self.clip is not None else no_clip(), self.nonfinite
        if isinstance(clip, NonFinite):  # a wrapped policy: its wrapper goes around the whole update
            if nonfinite is not None and nonfinite != clip.mode:
                raise ValueError(
                    f"Trainer: clip is wrapped for nonfinite={clip.mode} and nonfinite={nonfinite} was given; "
                    "accepted: one of them, or both the same"
                )
            clip, nonfinite = clip.inner, clip.mode
        if not isinstance(clip, ClipPolicy):
            raise TypeError(f"Trainer: clip must be a harness.clip policy, got {type(clip).__name__}")
        object.__setattr__(self, "clip", clip)
        object.__setattr__(self, "nonfinite", check_mode("skip" if nonfinite is None else nonfinite))
        object.__setattr__(self, "schedule", self.schedule or constant())

    def transform(self) -> NonFinite:
        """The update as one transformation (state keys ``nonfinite/``, ``clip/``, ``schedule/``, ``optim/``)."""
        inner = chain(
            ("clip", self.clip), ("schedule", self.schedule), ("optim", self.optimizer), ("bounds", project_to_bounds())
        )
        return with_nonfinite(inner, self.nonfinite)

    def components(self) -> dict[str, Any]:
        """The members by role, for capture checks and identity."""
        return {"optimizer": self.optimizer, "clip": self.clip, "schedule": self.schedule}


class Group:
    """One trained parameter set with its update, its state and its statistics.

    Args:
        name: The group's name (:data:`SINGLE` for a single-group task).
        params: The parameters (one flat buffer with its gradient).
        rule: How the group is updated.
        tagged: Whether tags carry the group's name (several groups in the run).

    Attributes:
        update: The rule as one transformation; state: its device state (``nonfinite/...``,
            ``clip/...``, ``schedule/...``, ``optim/...``); shared: what its members publish.
        stats_pre, stats_post: The gradient's statistics before and after the update's clip.
        grad_pre: A copy of the pre-clip gradient (histograms at log steps).
        eval_before: The evaluated parameters before the step (the update ratio at log steps).
        timing: Host seconds of each member of the update (eager iterations).
    """

    def __init__(self, name: str, params: ParamSet, rule: UpdateRule, *, tagged: bool = False):
        self.name, self.params, self.rule = name, params, rule
        self.tag_group = name if tagged else None
        self.update = rule.transform()
        self.shared = Shared()
        self.state = self.update.init(params, self.shared)
        self.stats_pre = FlatStats(params)
        self.shared.stats = self.stats_pre  # what the update's first member sees
        self.stats_post = FlatStats(params)
        self.stats_param = FlatStats(params)
        self.stats_update = FlatStats(params)
        self.grad_pre = wp.zeros_like(params.grad)
        # Values only: a copy into a buffer that has a gradient would copy params.grad along.
        self.eval_before = wp.zeros_like(params.data, requires_grad=False)
        self._train_point = wp.zeros_like(params.data, requires_grad=False)
        # The array the evaluation point lives in (a fixed buffer: params.data, or ScheduleFree's x).
        self._eval_point = rule.optimizer.eval_params(params, self.substate("optim"))
        self.evaluates_elsewhere = self._eval_point is not params.data
        self.timing: dict[str, float] = {}
        self.shared.timing = self.timing

    # -- views ------------------------------------------------------------------------------

    def substate(self, member: str) -> dict[str, wp.array]:
        """The state of one member of the update (``optim``, ``schedule``, ``clip``, ``nonfinite``)."""
        return substate(self.state, member)

    def tag(self, stat: str, param: str | None = None) -> str:
        """This group's TensorBoard tag of ``stat`` (:func:`harness.tags.optim`)."""
        return tags.optim(stat, self.tag_group, param)

    # -- one update ---------------------------------------------------------------------------

    def apply(self) -> tuple[float, float]:
        """Issue the update's launches (module docstring) after a backward pass wrote
        ``params.grad``.

        Returns:
            Host seconds of the statistics and the clip member, and of the rest (eager runs;
            on the CPU launches are synchronous, so these are kernel times).
        """
        params = self.params
        t0 = time.perf_counter()
        self.stats_pre.compute(params.grad)
        wp.copy(self.grad_pre, params.grad)
        wp.copy(self.eval_before, self._eval_point)
        t1 = time.perf_counter()
        clip_before = self.timing.get("clip", 0.0)
        self.update.update(params, self.state, self.shared)
        self.stats_post.compute(params.grad)
        clip_s = self.timing.get("clip", 0.0) - clip_before
        return t1 - t0 + clip_s, time.perf_counter() - t1 - clip_s

    def check(self) -> None:
        """The ``error`` wrapper's host check (:meth:`harness.clip.nonfinite.NonFinite.check`)."""
        self.update.check(self.params, self.state)

    # -- what it logs -----------------------------------------------------------------------------

    def columns(self) -> list[tuple[str, wp.array, int]]:
        """Per-iteration device scalars of this group: ``(tag, array, index)``."""
        state = self.state
        found = [
            (self.tag(tags.GRAD_NORM_PRE), self.stats_pre.norm, 0),
            (self.tag(tags.GRAD_NORM_POST), self.stats_post.norm, 0),
            (self.tag(tags.CLIP_COEF), state["clip/coef"], 0),
            (self.tag(tags.CLIPPED), state["clip/clipped"], 0),
            (self.tag(tags.SKIPPED), state["nonfinite/skip"], 0),
            (self.tag(tags.GRAD_MAX_ABS), self.stats_pre.max_abs, 0),
            (self.tag(tags.NONFINITE), self.stats_pre.nonfinite, 0),
        ]
        norms = self.stats_pre.segment_norm
        found += [(self.tag(tags.GRAD_NORM_PRE, name), norms, k) for k, name in enumerate(self.params.names)]
        if "clip/threshold" in state:
            found.append((self.tag(tags.CLIP_THRESHOLD), state["clip/threshold"], 0))
        rule = self.rule
        scalars = {**rule.optimizer.stats(self.substate("optim")), **rule.schedule.stats(self.substate("schedule"))}
        found += [(self.tag(stat), array, 0) for stat, array in scalars.items()]
        return found

    def log_values(self) -> dict[str, Any]:
        """Host values at log steps: the evaluated parameters' norm and the step's update ratio,
        and the pre-clip gradient of every parameter (histograms)."""
        x = self.eval_params()
        self.stats_param.compute(x)
        self.stats_update.compute(x, minus=self.eval_before)
        param_norm = float(self.stats_param.norm.numpy()[0])
        return {
            self.tag(tags.PARAM_NORM): param_norm,
            self.tag(tags.UPDATE_RATIO): float(self.stats_update.norm.numpy()[0]) / max(param_norm, 1e-12),
            "grad_pre": self.params.split(self.grad_pre.numpy()),
        }

    def read_reductions(self) -> tuple[int, str | None]:
        """The clip-aware schedule's reductions so far and its latest message (a host read)."""
        count, message = self.rule.schedule.read_reductions(self.substate("schedule"))
        if message is not None and self.tag_group is not None:
            message = f"{self.name}: {message}"
        return count, message

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must share with a run that loads this group: the parameter layout
        (name, shape, dtype and bounds of every parameter) and the members' names."""
        return {
            "layout": [
                [s.name, list(s.shape), getattr(s.dtype, "__name__", str(s.dtype)), s.lower, s.upper]
                for s in self.params.specs
            ],
            "optimizer": self.rule.optimizer.name,
            "schedule": self.rule.schedule.name,
            "clip": self.rule.clip.name,
        }

    # -- the evaluation point -----------------------------------------------------------------------

    def eval_params(self) -> wp.array:
        """The flat parameters to evaluate and export (ScheduleFree's average x, else the parameters)."""
        return self._eval_point

    @contextlib.contextmanager
    def at_eval_params(self) -> Iterator[ParamSet]:
        """The parameters, holding the evaluation point inside the block (ScheduleFree's
        average x); the training point is put back after it."""
        params = self.params
        swap = self._eval_point.ptr != params.data.ptr
        if swap:
            wp.copy(self._train_point, params.data)
            wp.copy(params.data, self._eval_point)
        try:
            yield params
        finally:
            if swap:
                wp.copy(params.data, self._train_point)
