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
import json
import platform
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.schema import field
from harness.training.step import CAPTURE_MODES, FIXED_COLUMNS, TrainStep

__all__ = ["Callback", "Loop", "Tally", "TrainSettings", "TrainingInterrupted", "write_json"]


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Loop settings: the schema of the top level of ``configs/train.yaml``, built from the
    composed config by :func:`harness.schema.build` (types and ranges from these fields;
    ``checkpoint_every`` reads ``checkpoint.every``).

    Attributes:
        iterations: Optimisation steps.
        log_every: Read back, write TensorBoard and print progress every N iterations.
        seed: Run seed (the env's initial conditions are drawn from it).
        device: Warp device name; None picks Warp's preferred device.
        checkpoint_every: Write a checkpoint every N iterations (0: only at the end and on
            SIGINT/SIGTERM).
        checkpoint_keep: How many of the newest checkpoints to keep.
        resume: None (start fresh), ``auto`` (the newest checkpoint in the run folder, if
            any), or the path of a checkpoint file or run folder.
        capture: ``auto`` (capture one iteration into a graph when the device and every
            component allow it, else run eagerly and say why), True (capture or refuse),
            False (every iteration eagerly).
        plot_every: A TensorBoard image of the rollout against time (``rollout/plot``) at
            the first log step, at the first log step after every multiple of this many
            iterations and at the end; 0: the first log step and the end only; None: never.
    """

    iterations: int = field(100, minimum=1)
    log_every: int = field(10, minimum=1)
    seed: int = field(0, minimum=0)
    device: str | None = field(None)
    checkpoint_every: int = field(0, minimum=0, key="checkpoint.every")
    checkpoint_keep: int = field(3, minimum=1, key="checkpoint.keep")
    resume: str | None = field(None)
    capture: bool | str = field("auto", choices=CAPTURE_MODES)
    plot_every: int | None = field(50, minimum=0)

    def check(self) -> None:
        if self.resume == "":
            raise ValueError("resume: expected null, auto, or a checkpoint file or run folder path, got ''")


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

    @property
    def flushed(self) -> int:
        """Iterations whose scalars were read back and logged."""
        return len(self.losses)

    def add(self, rows: np.ndarray, columns: list[str]) -> None:
        col = {name: columns.index(name) for name in FIXED_COLUMNS}
        self.losses.extend(float(v) for v in rows[:, col["loss/total"]])
        self.norms.extend(float(v) for v in rows[:, col["optim/grad_norm_pre"]])
        self.clipped_steps += int(rows[:, col["optim/clipped"]].sum())
        self.skipped_steps += int(rows[:, col["optim/skipped"]].sum())
        self.nonfinite_steps += int((rows[:, col["optim/nonfinite"]] > 0).sum())
        if "through_time/clipped" in columns:
            self.adjoint_clipped_steps += int(rows[:, columns.index("through_time/clipped")].sum())

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

    @staticmethod
    def clock() -> float:
        """The loop's host clock [s] (``time.perf_counter``)."""
        return time.perf_counter()

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
                if self.capture and step.graph is None and it > self.start_iteration:
                    step.capture()
                step.run()
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
        tally.add(rows, step.columns)
        for callback in self.callbacks:
            callback.on_rows(self, first, rows)
        step.update.check(step.state.params, step.state.update)  # `error` policy: raises after the rows are logged
        count, message = step.schedule.read_reductions(step.state.schedule)
        if count > tally.lr_reductions:
            print(message, flush=True)
            tally.lr_reductions = count
            self._scalars(it, {"optim/lr_reductions": count})
        if not log_step:
            return
        iter_s = (now - self.interval[0]) / (it + 1 - self.interval[1])
        self.interval = (now, it + 1)
        values = step.log_values()
        self._scalars(
            it,
            {
                "perf/iter_ms": 1e3 * iter_s,
                "perf/env_steps_per_s": step.env.horizon * step.env.world_count / iter_s,
                "optim/param_norm": values["optim/param_norm"],
                "optim/update_ratio": values["optim/update_ratio"],
            },
        )
        values["iter_s"] = iter_s
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


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON atomically: a temporary file in the same folder, then rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n")
    tmp.replace(path)
