"""Training: the state, the captured iteration, and the loop with its callbacks.

- :mod:`harness.training.state`: :class:`TrainState`, what persists between iterations.
- :mod:`harness.training.step`: :class:`TrainStep`, one iteration's launches, eager or
  replayed from one captured graph, and the device history of per-iteration scalars.
- :mod:`harness.training.loop`: :class:`Loop`, iterations, read-backs, tallies, summary.
- :mod:`harness.training.callbacks`: checkpoints and resume, signals, TensorBoard,
  HParams, the progress line.

:class:`Trainer` puts them together for one run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import warp as wp

from harness.adjoint import AdjointSettings
from harness.clip import ClipPolicy
from harness.env import Env
from harness.losses import WeightedLoss
from harness.optim import Optimizer
from harness.params import ParamSet
from harness.schedules import Schedule
from harness.tasks import OpenLoop, Task, prepare_groups
from harness.training.callbacks import (
    Checkpointer,
    EpisodeLog,
    Episodes,
    HParamsRecord,
    ProgressLine,
    RolloutPlotLog,
    SignalStop,
    TensorBoardLog,
)
from harness.training.groups import SINGLE, Group, UpdateRule
from harness.training.loop import (
    NONFINITE_LOSS_LIMIT,
    Callback,
    Loop,
    Tally,
    TrainingDiverged,
    TrainingInterrupted,
    TrainSettings,
    write_json,
)
from harness.training.state import TrainState
from harness.training.step import FIXED_COLUMNS, CaptureError, TrainStep, capture_blocker, training_update

__all__ = [
    "FIXED_COLUMNS",
    "NONFINITE_LOSS_LIMIT",
    "SINGLE",
    "Callback",
    "CaptureError",
    "Episodes",
    "Group",
    "Loop",
    "Tally",
    "TrainSettings",
    "TrainState",
    "TrainStep",
    "Trainer",
    "TrainingDiverged",
    "TrainingInterrupted",
    "UpdateRule",
    "training_update",
    "write_json",
]


class Trainer:
    """One training run: builds the parameter groups, the state and the step, decides on
    capture, runs the loop.

    Args:
        env: The simulation.
        loss: The weighted loss over the env's observables.
        optimizer: Optimizer (:mod:`harness.optim`) of the task's first parameter group.
        clip: Clip policy (:mod:`harness.clip`) of that group; one given inside a non-finite
            wrapper (``zero_nonfinite(policy)``) sets ``nonfinite``.
        settings: Loop settings.
        schedule: Learning-rate schedule (:mod:`harness.schedules`) of that group; constant if None.
        task: What is trained (:mod:`harness.tasks`); open-loop actions if None.
        adjoint: Clipping inside backward (:class:`~harness.adjoint.AdjointSettings`, or
            the mapping ``clip.adjoint`` holds); off if None.
        nonfinite: What an iteration with a nan/inf gradient does to that group
            (``clip.nonfinite``): ``skip`` (no update; the default), ``zero`` (nan/inf entries
            become 0) or ``error`` (stop).
        rules: The :class:`~harness.training.groups.UpdateRule` of every further parameter
            group of the task, by name (SHAC's ``critic``).

    Attributes:
        state: The :class:`TrainState` (its ``groups`` by name).
        step: The :class:`TrainStep`.
        capture: Whether iterations after the first run as one captured graph.
        capture_reason: Why capture is off under ``capture=auto`` (None when it is on or
            was turned off by ``capture=false``).
        loop: The :class:`Loop` of the last :meth:`fit` (None before one): where it started
            and how far it got, also after it raised.

    Raises:
        CaptureError: ``settings.capture`` is True and something cannot be captured.
    """

    def __init__(
        self,
        env: Env,
        loss: WeightedLoss,
        optimizer: Optimizer,
        clip: ClipPolicy,
        settings: TrainSettings,
        schedule: Schedule | None = None,
        task: Task | None = None,
        adjoint: AdjointSettings | Mapping[str, Any] | None = None,
        nonfinite: str | None = None,
        *,
        rules: Mapping[str, UpdateRule] | None = None,
    ):
        primary_rule = UpdateRule(optimizer, clip, schedule, nonfinite)
        self.env, self.loss, self.settings = env, loss, settings
        self.adjoint = AdjointSettings.parse(adjoint)
        self.task = task or OpenLoop()
        self.device = wp.get_device(settings.device)
        params = prepare_groups(env, self.task, loss, device=self.device)
        names = list(params)
        rules = dict(rules or {})
        unknown = sorted(set(rules) - set(names[1:]))
        if unknown:
            raise ValueError(f"Trainer: rules for '{unknown[0]}', which is not a further group of this task ({names})")
        missing = [name for name in names[1:] if name not in rules]
        if missing:
            raise ValueError(f"Trainer: no update rule for parameter group '{missing[0]}' of task '{self.task.name}'")
        tagged = len(names) > 1
        groups = [
            Group(name, params[name], primary_rule if k == 0 else rules[name], tagged=tagged)
            for k, name in enumerate(names)
        ]
        self.state = TrainState(groups, task=self.task.state(env))
        self.step = TrainStep(env, self.task, loss, self.state, rows=settings.log_every, adjoint=self.adjoint)
        components: dict[str, Any] = {"task": self.task, "loss": loss}
        for group in groups:
            for role, member in group.rule.components().items():
                components[role if not tagged else f"{group.name} {role}"] = member
        blocker = capture_blocker(env, self.device, components)
        self.capture_reason = None
        self.loop: Loop | None = None
        if settings.capture is False:
            self.capture = False
        elif blocker is None:
            self.capture = True
        elif settings.capture is True:
            raise CaptureError(f"capture: cannot capture this run: {blocker}; accepted: capture=auto or false")
        else:
            self.capture = False
            self.capture_reason = blocker

    @property
    def params(self) -> ParamSet:
        """The first parameter group's parameters."""
        return self.state.params

    def fit(
        self,
        run_dir: str | Path,
        *,
        hparams: dict[str, bool | int | float | str] | None = None,
        swept: list[str] | tuple[str, ...] = (),
        meta: dict[str, Any] | None = None,
        callbacks: list[Callback] | None = None,
        label: str | None = None,
        episodes: Any = None,
    ) -> dict[str, Any]:
        """Train for ``settings.iterations``; write TensorBoard events, checkpoints and summary.json.

        Args:
            run_dir: Output folder of the run.
            hparams: Hyperparameters to record with the final metrics for TensorBoard's
                HParams dashboard (one row per run of a sweep).
            swept: The hyperparameters that differ between the runs of a sweep (the
                dashboard lists them first).
            meta: Extra JSON-serialisable facts stored in every checkpoint (e.g. the
                resolved config).
            callbacks: Further callbacks, called after the built-in ones.
            label: Put before every progress line (the job of a sweep, e.g. ``#2 clip.max_norm=10``).
            episodes: A policy's whole episodes to report before, during and after training
                (:class:`~harness.training.callbacks.Episodes`, :class:`~harness.training.callbacks.EpisodeLog`).

        Returns:
            The summary (also written to ``run_dir/summary.json``).

        Raises:
            TrainingInterrupted: SIGINT/SIGTERM arrived; a checkpoint and summary.json
                (``status: interrupted``) were written first.
            TrainingDiverged: The loss or the parameters went non-finite and stayed so
                (:mod:`harness.training.loop`); summary.json (``status: diverged``) was written
                first, and no checkpoint after the last good one.
            harness.clip.NonFiniteGradientError: the ``error`` non-finite policy fired.
        """
        settings = self.settings
        if self.capture_reason is not None:
            print(f"capture: off, every iteration runs eagerly: {self.capture_reason}", flush=True)
        tensorboard = TensorBoardLog()
        built: list[Callback] = [
            Checkpointer(
                every=settings.checkpoint_every,
                keep=settings.checkpoint_keep,
                resume=settings.resume,
                seed=settings.seed,
                meta=meta,
            ),
            SignalStop(),
            tensorboard,
            ProgressLine(label=label),
        ]
        if settings.plot_every is not None:
            built.append(RolloutPlotLog(tensorboard, every=settings.plot_every))
        if episodes is not None:  # before the HParams record, which shows its figures
            built.append(EpisodeLog(tensorboard, episodes))
        if hparams is not None:
            built.append(HParamsRecord(tensorboard, hparams, swept=swept))
        loop = Loop(self.step, settings, [*built, *(callbacks or [])], capture=self.capture)
        self.loop = loop
        return loop.fit(run_dir)
