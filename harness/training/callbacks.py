"""What a training run does besides iterating: each a :class:`~harness.training.loop.Callback`.

- :class:`Checkpointer`: resumes from a checkpoint, writes checkpoints every N iterations,
  on a stop request and at the end (:mod:`harness.checkpoint` for the file format).
- :class:`SignalStop`: SIGINT/SIGTERM ask the loop to stop after the current iteration.
- :class:`TensorBoardLog`: every iteration's scalars, the log-step histograms, the adjoint
  profile (:mod:`harness.events`).
- :class:`HParamsRecord`: the run's row of the HParams dashboard at the end.
- :class:`ProgressLine`: the console line, redrawn in place on a terminal.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from harness import checkpoint as ckpt
from harness.adjoint import profile_histogram_values, profile_image, profile_summary
from harness.events import EventWriter
from harness.training.loop import Callback, Loop, Tally

__all__ = ["Checkpointer", "HParamsRecord", "ProgressLine", "SignalStop", "TensorBoardLog", "run_identity"]


def run_identity(loop_or_step: Any) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it: the env, the parameter
    layout (name, shape, dtype and bounds of every parameter) and the optimizer, schedule
    and clip policy (by name)."""
    step = getattr(loop_or_step, "step", loop_or_step)
    return {
        "env": step.env.name,
        "layout": [
            [s.name, list(s.shape), getattr(s.dtype, "__name__", str(s.dtype)), s.lower, s.upper]
            for s in step.state.params.specs
        ],
        "optimizer": step.optimizer.name,
        "schedule": step.schedule.name,
        "clip": step.clip.name,
    }


def check_identity(
    saved: ckpt.Checkpoint, path: Path, step: Any, *, iterations: int | None = None, field: str = "resume"
) -> None:
    """Refuse a checkpoint whose :func:`run_identity` differs from ``step``'s (one line,
    :class:`harness.checkpoint.CheckpointError`)."""
    identity = run_identity(step)
    ckpt.check_fits(
        saved,
        path,
        env=identity["env"],
        shapes={name: shape for name, shape, *_ in identity["layout"]},
        iterations=iterations,
        components={key: identity[key] for key in ("layout", "optimizer", "schedule", "clip")},
        field=field,
    )


class Checkpointer(Callback):
    """Resume at the start; checkpoints every ``every`` iterations, on a stop request and at the end.

    Args:
        every: Iterations between checkpoints (0: only on a stop request and at the end).
        keep: Newest checkpoints kept.
        resume: None, ``auto`` or a checkpoint file or run folder (see :func:`harness.checkpoint.resolve`).
        seed: The run seed (stored).
        meta: Extra JSON-serialisable facts stored in every checkpoint (the resolved config).
    """

    def __init__(self, *, every: int, keep: int, resume: str | None, seed: int, meta: dict[str, Any] | None = None):
        self.every, self.keep, self.resume, self.seed = every, keep, resume, seed
        self.meta = dict(meta or {})

    def on_start(self, loop: Loop) -> None:
        if self.resume is None:
            return
        path = ckpt.resolve(self.resume, loop.run_dir)
        if path is None:
            print(f"resume={self.resume}: no checkpoint in {loop.run_dir}; starting at iteration 0", flush=True)
            return
        saved = ckpt.load(path)
        check_identity(saved, path, loop.step, iterations=loop.settings.iterations)
        try:
            loop.step.state.load(saved.arrays)
        except ValueError as exc:
            raise ckpt.CheckpointError(f"resume: checkpoint '{path}' does not fit this run ({exc})") from None
        loop.step.timing.update(saved.meta.get("timing", {}))
        loop.tally = Tally(**saved.meta["tally"])
        loop.start_iteration = saved.iteration
        ckpt.set_aside_newer(path, saved.iteration)
        print(f"resumed from {path} at iteration {saved.iteration} of {loop.settings.iterations}", flush=True)

    def _due(self, loop: Loop, iteration: int) -> bool:
        return self.every > 0 and (iteration + 1) % self.every == 0 and iteration != loop.settings.iterations - 1

    def wants_rows(self, loop: Loop, iteration: int) -> bool:
        return self._due(loop, iteration)

    def on_iteration(self, loop: Loop, iteration: int) -> None:
        if self._due(loop, iteration) or loop.stop_signal is not None:
            loop.fold_wall_time()
            self.save(loop, iteration + 1)

    def on_end(self, loop: Loop, summary: dict[str, Any]) -> None:
        self.save(loop, loop.settings.iterations)

    def save(self, loop: Loop, iteration: int) -> Path:
        """Write the full training state after ``iteration`` completed iterations."""
        record = {
            **self.meta,
            **run_identity(loop),
            "iteration": iteration,
            "seed": self.seed,
            "tally": dataclasses.asdict(loop.tally),
            "timing": dict(loop.step.timing),
        }
        path = ckpt.save(
            ckpt.Checkpoint(arrays=loop.step.state.to_numpy(), meta=record),
            ckpt.checkpoint_dir(loop.run_dir),
            keep=self.keep,
        )
        loop.last_checkpoint = path
        return path


class SignalStop(Callback):
    """SIGINT or SIGTERM: finish the iteration, checkpoint, stop; a second SIGINT stops at once.

    Handlers can only be installed from the main thread (a launcher may run a job in
    another); elsewhere the process's own handling applies.
    """

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def on_start(self, loop: Loop) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: Any) -> None:
            if loop.stop_signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            loop.request_stop(signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, handler)

    def close(self, loop: Loop) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


class TensorBoardLog(Callback):
    """TensorBoard events in the run folder: one scalar per history column and iteration,
    the log-step scalars and histograms, and the adjoint profile when it is on."""

    def __init__(self) -> None:
        self.writer: EventWriter | None = None

    def on_start(self, loop: Loop) -> None:
        self.writer = EventWriter(loop.run_dir, purge_step=loop.start_iteration or None)

    def on_rows(self, loop: Loop, first: int, rows: np.ndarray) -> None:
        columns = loop.step.columns
        for r, values in enumerate(rows):
            self.writer.scalars(first + r, dict(zip(columns, (float(v) for v in values), strict=True)))

    def on_scalars(self, loop: Loop, iteration: int, values: dict[str, float]) -> None:
        self.writer.scalars(iteration, values)

    def on_log(self, loop: Loop, iteration: int, values: dict[str, Any]) -> None:
        for name, grad in values["grad_pre"].items():
            self.writer.histogram(iteration, f"hist/grad/{name}", grad)
        profile = values.get("adjoint_profile")
        if profile is not None:
            adjoint = loop.step.adjoint
            self.writer.scalars(iteration, profile_summary(profile, max_norm=adjoint.max_norm))
            for tag, hist in profile_histogram_values(profile).items():
                self.writer.histogram(iteration, tag, hist)
            self.writer.image(
                iteration, "adjoint/profile", profile_image(profile, max_norm=adjoint.max_norm, dt=loop.step.env.dt)
            )
        self.writer.flush()

    def close(self, loop: Loop) -> None:
        if self.writer is not None:
            self.writer.close()


class HParamsRecord(Callback):
    """At the end of a finished run: its hyperparameters and final metrics for the HParams dashboard.

    Args:
        tensorboard: The run's :class:`TensorBoardLog` (listed before this callback).
        values: The hyperparameters (``config.hparams``).
    """

    def __init__(self, tensorboard: TensorBoardLog, values: dict[str, bool | int | float | str]):
        self.tensorboard = tensorboard
        self.values = values

    def on_end(self, loop: Loop, summary: dict[str, Any]) -> None:
        self.tensorboard.writer.hparams(
            self.values,
            {
                "hparams/final_loss": summary["final_loss"],
                "hparams/best_loss": summary["best_loss"],
                "hparams/clipped_fraction": summary["clipped_steps"] / loop.settings.iterations,
                "hparams/nonfinite_steps": summary["nonfinite_steps"],
                "hparams/wall_time_s": summary["wall_time_s"],
            },
            step=loop.settings.iterations,
        )


def _duration(seconds: float) -> str:
    """``12 s``, ``3 min 05 s``, ``2 h 07 min``; ``?`` when unknown."""
    if not np.isfinite(seconds):
        return "?"
    whole = round(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class ProgressLine(Callback):
    """Iteration, share done, time left, loss, pre-clip gradient norm, iterations per second.

    Printed at every log step; on a terminal also redrawn in place after every other
    iteration (count, share, time left and rate). Loss and norm come from the device
    history, read back once per log interval: between read-backs the line says which
    iteration they belong to (``(at 10)``), and before the first one it says when they come,
    so a healthy run never shows nan.

    Args:
        stream: Where the line goes.
        interactive: Redraw in place; default: whether ``stream`` is a terminal.
        label: Put before every line (which job of a sweep the line is from).
    """

    def __init__(self, *, stream: TextIO = sys.stdout, interactive: bool | None = None, label: str | None = None):
        self.stream = stream
        self.label = f"{label} " if label else ""
        self.interactive = stream.isatty() if interactive is None else interactive
        self._logged = -1

    def _line(self, loop: Loop, done: int, its_per_s: float) -> None:
        total = loop.settings.iterations
        left = (total - done) / its_per_s if its_per_s > 0 else float("inf")
        seen = loop.tally.flushed  # iterations whose scalars have been read back
        if seen == 0:
            every = loop.settings.log_every
            values = f"loss and |g|pre from iteration {min(total, every * (done // every + 1))}"
        else:
            values = f"loss {loop.tally.last('loss'):.6g}  |g|pre {loop.tally.last('norm'):.3e}"
            if seen != done:
                values += f" (at {seen})"
        line = self.label + (
            f"[{done:>{len(str(total))}d}/{total}] {100 * done / total:3.0f}%  {_duration(left)} left  "
            f"{values}  {its_per_s:.2f} it/s"
        )
        self.stream.write("\r" + line + "\x1b[K" if self.interactive else line + "\n")
        self.stream.flush()

    def on_log(self, loop: Loop, iteration: int, values: dict[str, Any]) -> None:
        self._logged = iteration
        self._line(loop, iteration + 1, 1.0 / values["iter_s"])

    def on_iteration(self, loop: Loop, iteration: int) -> None:
        if self.interactive and self._logged != iteration:
            start, first = loop.interval
            self._line(loop, iteration + 1, (iteration + 1 - first) / max(loop.clock() - start, 1e-9))

    def close(self, loop: Loop) -> None:
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()
