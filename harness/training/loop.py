"""The loop over iterations, and the callbacks it calls.

This module owns :class:`Loop`: it runs the :class:`~harness.training.step.TrainStep`
(the first iteration eagerly, then, with capture on, one captured graph per iteration),
reads the device history back once per log interval (or when a callback needs it), keeps
the host tallies, decides when the run ends, and writes ``summary.json``. Everything else
a run does is a :class:`Callback`: TensorBoard events, the progress line, checkpoints and
resume, signal handling, the HParams record (:mod:`harness.training.callbacks`).

Order of a run::

    on_start        (callbacks in order; the checkpointer resumes first)
    per iteration:  step -> [read-back -> on_rows -> on_log at log steps] -> on_iteration
    on_end(summary) -> summary.json
    close           (always, in reverse order, also after an error)
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness import tags
from harness.config import TrainSettings
from harness.runs import write_json
from harness.training.step import TrainStep

__all__ = ["Callback", "Loop", "Tally", "TrainSettings", "TrainingInterrupted", "write_json"]


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the run after a checkpoint and summary.json were written."""

    def __init__(self, signum: int, iteration: int, checkpoint: Path):
        self.signum = signum
        self.iteration = iteration
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name
        super().__init__(f"interrupted by {name} after iteration {iteration}; checkpoint written: {checkpoint}")


@dataclasses.dataclass
class Tally:
    """Host-side running totals of a run, fed from the history read-backs; checkpointed."""

    losses: list[float] = dataclasses.field(default_factory=list)
    norms: list[float] = dataclasses.field(default_factory=list)
    clipped_steps: int = 0
    skipped_steps: int = 0
    nonfinite_steps: int = 0
    adjoint_clipped_steps: int = 0
    lr_reductions: int = 0
    wall_time_s: float = 0.0
    initial_figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    groups: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """The counts of every group after the primary one (a task with several groups)."""

    @property
    def flushed(self) -> int:
        """Iterations whose scalars were read back and logged."""
        return len(self.losses)

    def add(self, rows: np.ndarray, columns: list[str], group: Any = None) -> None:
        """Count the rows' iterations: the loss, and the primary group's norm, clipped,
        skipped and non-finite steps (``group.tag`` names its columns; default: a single group's)."""
        tag = group.tag if group is not None else tags.optim
        col = {
            stat: columns.index(tag(stat)) for stat in (tags.GRAD_NORM_PRE, tags.CLIPPED, tags.SKIPPED, tags.NONFINITE)
        }
        self.losses.extend(float(v) for v in rows[:, columns.index(tags.LOSS_TOTAL)])
        self.norms.extend(float(v) for v in rows[:, col[tags.GRAD_NORM_PRE]])
        self.clipped_steps += int(rows[:, col[tags.CLIPPED]].sum())
        self.skipped_steps += int(rows[:, col[tags.SKIPPED]].sum())
        self.nonfinite_steps += int((rows[:, col[tags.NONFINITE]] > 0).sum())
        if tags.ADJOINT_CLIPPED in columns:
            self.adjoint_clipped_steps += int(rows[:, columns.index(tags.ADJOINT_CLIPPED)].sum())

    def add_group(self, rows: np.ndarray, columns: list[str], group: Any) -> None:
        """Count a further group's clipped, skipped and non-finite steps (``groups[<name>]``)."""
        counts = self.groups.setdefault(group.name, {"clipped_steps": 0, "skipped_steps": 0, "nonfinite_steps": 0})
        counts["clipped_steps"] += int(rows[:, columns.index(group.tag(tags.CLIPPED))].sum())
        counts["skipped_steps"] += int(rows[:, columns.index(group.tag(tags.SKIPPED))].sum())
        counts["nonfinite_steps"] += int((rows[:, columns.index(group.tag(tags.NONFINITE))] > 0).sum())

    def last(self, what: str) -> float:
        values = self.losses if what == "loss" else self.norms
        return values[-1] if values else float("nan")


class Callback:
    """What a run does besides iterating; every hook is optional.

    A callback reads the loop's public attributes (``step``, ``settings``, ``run_dir``,
    ``tally``, ``start_iteration``) and may set ``start_iteration`` and ``tally`` in
    :meth:`on_start` (resuming) or call :meth:`Loop.request_stop`.
    """

    def on_start(self, loop: Loop) -> None:
        """Before the first iteration (after the callbacks listed before this one)."""

    def wants_rows(self, loop: Loop, iteration: int) -> bool:
        """Whether the history must be read back after ``iteration`` (besides log steps)."""
        return False

    def on_rows(self, loop: Loop, first: int, rows: np.ndarray) -> None:
        """Every read-back: the scalars of iterations ``first .. first + len(rows) - 1``."""

    def on_scalars(self, loop: Loop, iteration: int, values: dict[str, float]) -> None:
        """Host scalars the loop derived at ``iteration`` (perf, parameter norm, lr reductions)."""

    def on_log(self, loop: Loop, iteration: int, values: dict[str, Any]) -> None:
        """Log steps: the step's :meth:`~harness.training.step.TrainStep.log_values`."""

    def on_iteration(self, loop: Loop, iteration: int) -> None:
        """After every iteration, once its read-back (if any) is done."""

    def on_warmup(self, loop: Loop, iteration: int, what: str) -> None:
        """Before a warm-up iteration, one that is slower than the rest: ``what`` is ``eager``
        (the process's first iteration: kernels compile or load from Warp's cache) or
        ``capture`` (the iteration that records the graph every later one replays)."""

    def on_end(self, loop: Loop, summary: dict[str, Any]) -> None:
        """The run finished; ``summary`` is about to be written."""

    def close(self, loop: Loop) -> None:
        """Always called at the end, also after an error or an interruption."""


class Loop:
    """Runs a training step for ``settings.iterations`` iterations with callbacks.

    Args:
        step: The iteration.
        settings: Loop settings.
        callbacks: In the order their hooks are called.
        capture: Capture the iteration into a graph after the first eager one.

    Attributes:
        start_iteration: The first iteration this process runs (0, or where a resume continues).
        tally: The host totals.
        last_checkpoint: Path of the newest checkpoint this process wrote (set by the checkpointer).
        stop_signal: The signal that asked the run to stop, or None.
        interval: ``(clock, iteration)`` at the start of the current log interval.
        steady: ``(clock, iteration)`` after the last warm-up iteration (the eager first one
            and, with capture, the one that records the graph), or None before it: rates and
            the time left are estimated from the iterations after it.
    """

    def __init__(self, step: TrainStep, settings: TrainSettings, callbacks: list[Callback], *, capture: bool):
        self.step = step
        self.settings = settings
        self.callbacks = list(callbacks)
        self.capture = capture
        self.start_iteration = 0
        self.tally = Tally()
        self.last_checkpoint: Path | None = None
        self.stop_signal: int | None = None
        self.run_dir = Path(".")
        self._started = 0.0
        self.interval = (0.0, 0)
        self.steady: tuple[float, int] | None = None

    @staticmethod
    def clock() -> float:
        """The loop's host clock [s] (``time.perf_counter``)."""
        return time.perf_counter()

    def steady_rate(self, done: int) -> float | None:
        """Iterations per second since the warm-up, with ``done`` iterations done; None before
        the first steady iteration has finished."""
        if self.steady is None or done <= self.steady[1]:
            return None
        return (done - self.steady[1]) / max(self.clock() - self.steady[0], 1e-9)

    def request_stop(self, signum: int) -> None:
        """Finish the current iteration, checkpoint, write an ``interrupted`` summary, stop."""
        self.stop_signal = signum

    def fit(self, run_dir: str | Path) -> dict[str, Any]:
        """Train; returns the summary (also written to ``run_dir/summary.json``).

        Raises:
            TrainingInterrupted: A stop was requested; a checkpoint and summary.json
                (``status: interrupted``) were written first.
            harness.clip.NonFiniteGradientError: the ``error`` non-finite policy fired.
        """
        self.run_dir = Path(run_dir)
        settings, step = self.settings, self.step
        try:
            for callback in self.callbacks:
                callback.on_start(self)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            step.set_iteration(self.start_iteration)
            self._started = time.perf_counter()
            self.interval = (self._started, self.start_iteration)
            for it in range(self.start_iteration, settings.iterations):
                capturing = self.capture and step.graph is None and it > self.start_iteration
                warmup = it == self.start_iteration or capturing
                if warmup:
                    self.steady = None
                    for callback in self.callbacks:
                        callback.on_warmup(self, it, "capture" if capturing else "eager")
                if capturing:
                    step.capture()
                step.run()
                if warmup:  # the estimate starts after the last one
                    self.steady = (self.clock(), it + 1)
                if it == 0:
                    self.tally.initial_figures = step.env.describe(step.trajectory)
                log_step = (it + 1) % settings.log_every == 0 or it == settings.iterations - 1
                stopping = self.stop_signal is not None
                if log_step or stopping or any(c.wants_rows(self, it) for c in self.callbacks):
                    self._flush(it, log_step)
                for callback in self.callbacks:
                    callback.on_iteration(self, it)
                if stopping:
                    summary = self.summary(*step.evaluate(), status="interrupted")
                    summary["signal"] = signal.Signals(self.stop_signal).name
                    write_json(self.run_dir / "summary.json", summary)
                    raise TrainingInterrupted(self.stop_signal, it + 1, self.last_checkpoint)
            self.fold_wall_time()
            summary = self.summary(*step.evaluate(), status="finished")
            for callback in self.callbacks:
                callback.on_end(self, summary)
        finally:
            for callback in reversed(self.callbacks):
                callback.close(self)
        write_json(self.run_dir / "summary.json", summary)
        return summary

    def fold_wall_time(self) -> None:
        """Add the time since the last call to ``tally.wall_time_s`` (before a checkpoint is written)."""
        now = time.perf_counter()
        self.tally.wall_time_s += now - self._started
        self._started = now

    def _flush(self, it: int, log_step: bool) -> None:
        """The one read-back: every iteration's scalars since the last one; at log steps also
        the host values of :meth:`TrainStep.log_values`."""
        step, tally = self.step, self.tally
        first = tally.flushed
        rows = step.read_rows(first, it)
        now = time.perf_counter()
        groups = list(step.groups.values())
        tally.add(rows, step.columns, groups[0])
        for group in groups[1:]:
            tally.add_group(rows, step.columns, group)
        for callback in self.callbacks:
            callback.on_rows(self, first, rows)
        step.check()  # the `error` policy: raises after the rows are logged
        reductions = [group.read_reductions() for group in groups]
        count = sum(found for found, _ in reductions)
        if count > tally.lr_reductions:
            for _, message in reductions:
                if message is not None:
                    print(message, flush=True)
            tally.lr_reductions = count
            self._scalars(it, {groups[0].tag(tags.LR_REDUCTIONS): count})
        if not log_step:
            return
        iter_s = (now - self.interval[0]) / (it + 1 - self.interval[1])
        self.interval = (now, it + 1)
        values = step.log_values()
        self._scalars(
            it,
            {
                tags.PERF_ITER_MS: 1e3 * iter_s,
                tags.PERF_ENV_STEPS_PER_S: step.env.horizon * step.env.world_count / iter_s,
                **values["scalars"],
            },
        )
        for callback in self.callbacks:
            callback.on_log(self, it, values)

    def _scalars(self, iteration: int, values: dict[str, float]) -> None:
        for callback in self.callbacks:
            callback.on_scalars(self, iteration, values)

    def summary(self, final_loss: float, final_figures: dict[str, Any], *, status: str) -> dict[str, Any]:
        """The run's summary (``summary.json``) from the tallies and a final evaluation."""
        tally, step = self.tally, self.step
        losses = tally.losses
        return {
            "status": status,
            "env": step.env.name,
            "device": str(step.device),
            "segment_steps": step.env.segment_steps,
            "versions": versions(),
            "iterations": self.settings.iterations,
            "iterations_done": tally.flushed,
            "initial_loss": losses[0],
            "final_loss": final_loss,
            "best_loss": float(np.nanmin([*losses, final_loss])),
            "loss_reduction": 1.0 - final_loss / losses[0] if losses[0] else None,
            "wall_time_s": tally.wall_time_s,
            "clipped_steps": tally.clipped_steps,
            "skipped_steps": tally.skipped_steps,
            "nonfinite_steps": tally.nonfinite_steps,
            "adjoint_clipped_steps": tally.adjoint_clipped_steps,
            "lr_reductions": tally.lr_reductions,
            "timing_s": dict(step.timing),
            "before_training": tally.initial_figures,
            "after_training": final_figures,
            **({"groups": tally.groups} if tally.groups else {}),
            **step.task.summary(step.state.params.split(step.eval_params().numpy())),
        }


def versions() -> dict[str, str | None]:
    """Python and the installed versions of the packages a run's numbers depend on."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("harness", "warp-lang", "newton", "numpy"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found
