"""The loop over iterations, and the callbacks it calls.

This module owns :class:`Loop`: it runs the :class:`~harness.training.step.TrainStep`
(the first iteration eagerly, then, with capture on, one captured graph per iteration),
reads the device history back once per log interval (or when a callback needs it), keeps
the host tallies, decides when the run ends, and writes ``summary.json``. Everything else
a run does is a :class:`Callback`: TensorBoard events, the progress line, checkpoints and
resume, signal handling, the HParams record (:mod:`harness.training.callbacks`).

Order of a run::

    on_start        (callbacks in order; the checkpointer resumes first)
    per iteration:  step -> [read-back -> on_rows -> on_log at log steps -> divergence check]
                    -> on_iteration
    on_end(summary) -> summary.json
    close           (always, in reverse order, also after an error)

A run *diverges* (:class:`TrainingDiverged`, ``summary.json`` with ``"status": "diverged"``)
when, at a read-back,

- the parameters of any group hold nan or inf (a device reduction per group, read back with
  the history; an update cannot bring them back), or
- the loss has been nan or inf for :data:`NONFINITE_LOSS_LIMIT` iterations in a row (under
  ``clip.nonfinite=skip`` nothing moves after a non-finite loss unless the rollout changes,
  so a deterministic run would repeat it until the end), or

when the loss evaluated after the last iteration is not finite. The loop then stops at
once: the iterations read back so far are logged, no further checkpoint is written (the
newest one on disk is the last good one), ``on_end`` is not called, every callback is
closed, ``summary.json`` gets a ``diverged`` entry, and the exception's message is the one
line to print. A shorter run of non-finite losses is counted and shown (skipped or zeroed
steps on the progress line) and the run goes on; periodic checkpoints wait until the loss
is finite again.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import math
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

__all__ = [
    "NONFINITE_LOSS_LIMIT",
    "Callback",
    "Loop",
    "Tally",
    "TrainSettings",
    "TrainingDiverged",
    "TrainingInterrupted",
    "write_json",
]

NONFINITE_LOSS_LIMIT = 10
"""Iterations in a row with a nan or inf loss after which a run is diverged (checked at
read-backs, so the run stops at the first read-back at or after that many)."""


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
    """Host-side running totals of a run, fed from the history read-backs; checkpointed.

    Its size does not depend on the iteration count: the loss and gradient-norm curves live
    in the TensorBoard events, the tally keeps only what the summary, the progress line, the
    running ``loss/best`` and the divergence rule read. Losses are ``nan`` until known.

    Attributes:
        flushed: Iterations whose scalars were read back and logged.
        initial_loss: The loss of iteration 1.
        best_loss: The smallest finite loss read back (nan while there is none).
        last_loss: The loss of iteration ``flushed``.
        last_norm: The primary group's pre-clip gradient norm at iteration ``flushed``.
        nonfinite_loss_since: The iteration (from 1) that began the current run of nan or inf
            losses; None while the last loss read back is finite.
    """

    flushed: int = 0
    initial_loss: float = math.nan
    best_loss: float = math.nan
    last_loss: float = math.nan
    last_norm: float = math.nan
    nonfinite_loss_since: int | None = None
    clipped_steps: int = 0
    skipped_steps: int = 0
    nonfinite_steps: int = 0
    adjoint_clipped_steps: int = 0
    lr_reductions: int = 0
    wall_time_s: float = 0.0
    aside_s: float = 0.0
    """Host seconds callbacks set aside over the whole run, resumed parts included
    (:meth:`Loop.set_aside`: a policy's episode evaluations)."""
    initial_figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    episodes_before: dict[str, float] = dataclasses.field(default_factory=dict)
    """A policy's whole episodes before training (:class:`~harness.training.callbacks.EpisodeLog`)."""
    groups: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """The counts of every group after the primary one (a task with several groups)."""

    @classmethod
    def from_meta(cls, saved: dict[str, Any]) -> Tally:
        """The tally a checkpoint stored; one of the earlier layout, which kept every loss and
        norm (``losses``, ``norms``), is reduced to the figures above."""
        saved = dict(saved)
        losses = [float(v) for v in saved.pop("losses", [])]
        norms = [float(v) for v in saved.pop("norms", [])]
        tally = cls(**{f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved})
        if losses:
            tally.feed(np.asarray(losses, dtype=np.float64), np.asarray(norms[-1:], dtype=np.float64))
        return tally

    def feed(self, losses: np.ndarray, norms: np.ndarray) -> None:
        """Take the next iterations' losses and the primary group's pre-clip norms."""
        if len(losses) == 0:
            return
        if self.flushed == 0:
            self.initial_loss = float(losses[0])
        finite = np.isfinite(losses)
        if finite.any():
            smallest = float(losses[finite].min())
            self.best_loss = smallest if not self.best_loss <= smallest else self.best_loss
        good = np.flatnonzero(finite)
        if finite[-1]:
            self.nonfinite_loss_since = None
        elif good.size:  # the iteration after the last finite one (row r is iteration flushed + r + 1)
            self.nonfinite_loss_since = self.flushed + int(good[-1]) + 2
        elif self.nonfinite_loss_since is None:
            self.nonfinite_loss_since = self.flushed + 1
        self.flushed += len(losses)
        self.last_loss = float(losses[-1])
        if len(norms):
            self.last_norm = float(norms[-1])

    def add(self, rows: np.ndarray, columns: list[str], group: Any = None) -> None:
        """Count the rows' iterations: the loss, and the primary group's norm, clipped,
        skipped and non-finite steps (``group.tag`` names its columns; default: a single group's)."""
        tag = group.tag if group is not None else tags.optim
        col = {
            stat: columns.index(tag(stat)) for stat in (tags.GRAD_NORM_PRE, tags.CLIPPED, tags.SKIPPED, tags.NONFINITE)
        }
        self.feed(
            rows[:, columns.index(tags.LOSS_TOTAL)].astype(np.float64),
            rows[:, col[tags.GRAD_NORM_PRE]].astype(np.float64),
        )
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

    def handled_steps(self, groups: Any) -> tuple[int, int]:
        """Steps with a nan/inf gradient that made no update (skipped: ``clip.nonfinite=skip``
        or ``error``) and those whose nan/inf entries became 0 (zeroed: ``zero``), summed over
        ``groups`` (the step's :class:`~harness.training.groups.Group` objects, primary first)."""
        skipped = zeroed = 0
        for k, group in enumerate(groups):
            counts = (
                {"skipped_steps": self.skipped_steps, "nonfinite_steps": self.nonfinite_steps}
                if k == 0
                else self.groups.get(group.name, {})
            )
            if getattr(getattr(group, "rule", None), "nonfinite", "skip") == "zero":
                zeroed += counts.get("nonfinite_steps", 0)
            else:
                skipped += counts.get("skipped_steps", 0)
        return skipped, zeroed


def handled_text(skipped: int, zeroed: int) -> str:
    """``3 skipped steps, 1 zeroed step`` (the non-zero ones; empty when both are 0)."""
    parts = [f"{n} {what} step{'s' if n != 1 else ''}" for n, what in ((skipped, "skipped"), (zeroed, "zeroed")) if n]
    return ", ".join(parts)


class TrainingDiverged(RuntimeError):
    """The run diverged (module docstring); ``summary.json`` (``status: diverged``) was written.

    Its message is the one line to print: the iteration, what went non-finite, the skipped
    or zeroed steps and the newest checkpoint on disk.

    Attributes:
        iteration: The last iteration that ran (from 1).
        what: ``loss``, ``parameters`` or ``final loss``.
        summary: The summary written to ``summary.json``.
        checkpoint: The newest checkpoint this run wrote or resumed from, or None.
    """

    def __init__(self, summary: dict[str, Any], message: str, checkpoint: Path | None):
        self.summary = summary
        self.iteration = int(summary["diverged"]["iteration"])
        self.what = str(summary["diverged"]["what"])
        self.checkpoint = checkpoint
        super().__init__(message)


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
        last_checkpoint: Path of the newest checkpoint this process wrote or resumed from (set by
            the checkpointer), or None.
        stop_signal: The signal that asked the run to stop, or None.
        stopping: Whether the current iteration is the last: the loop saw ``stop_signal``
            after running it (callbacks checkpoint on this, not on ``stop_signal``, which a
            signal may set after the loop's check).
        stops_after: The iteration, counted from 1, after which the loop stops if a stop is
            requested now (the running one, or the next once the loop has checked).
        interval: ``(clock, iteration)`` at the start of the current log interval.
        steady: ``(clock, iteration)`` after the last warm-up iteration (the eager first one
            and, with capture, the one that records the graph), or None before it: rates and
            the time left are estimated from the iterations after it.
        divergence: What the divergence rule found at the last read-back (the ``diverged``
            entry of the summary without its iteration), or None.
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
        self.stopping = False
        self.stops_after = 0
        self.run_dir = Path(".")
        self._started = 0.0
        self.interval = (0.0, 0)
        self.steady: tuple[float, int] | None = None
        self.divergence: dict[str, Any] | None = None
        self._aside_in_interval = 0.0

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

    def set_aside(self, seconds: float) -> None:
        """Count ``seconds`` of host time a callback just spent on work that is not an iteration
        (an evaluation of whole episodes) out of the log interval's ``perf/iter_ms``: an
        iteration's cost then reads the same whether or not an evaluation fell in its interval.
        The total is the tally's ``aside_s`` (the summary's ``timing_s.aside``). The rate and time
        left on the progress line keep what falls between iterations, and so does
        ``wall_time_s``; the evaluations before the first iteration and after the last are
        outside both."""
        self.tally.aside_s += seconds
        self._aside_in_interval += seconds

    def request_stop(self, signum: int) -> None:
        """Finish the current iteration, checkpoint, write an ``interrupted`` summary, stop."""
        self.stop_signal = signum

    def fit(self, run_dir: str | Path) -> dict[str, Any]:
        """Train; returns the summary (also written to ``run_dir/summary.json``).

        Raises:
            TrainingInterrupted: A stop was requested; a checkpoint and summary.json
                (``status: interrupted``) were written first.
            TrainingDiverged: The run diverged (module docstring); summary.json
                (``status: diverged``) was written first, no checkpoint after the last good one.
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
            self._aside_in_interval = 0.0  # what on_start set aside is before the first interval
            for it in range(self.start_iteration, settings.iterations):
                self.stops_after, self.stopping = it + 1, False
                capturing = self.capture and step.graph is None and it > self.start_iteration
                warmup = it == self.start_iteration or capturing
                if warmup:
                    self.steady = None
                    for callback in self.callbacks:
                        callback.on_warmup(self, it, "capture" if capturing else "eager")
                if capturing:
                    step.capture()
                    # what the run holds from here on (the env's States, the tapes and the graph's
                    # launch records: Python objects by the hundred thousand for a robot) lives as
                    # long as the run; a collection that walks it again and again costs a robot's
                    # replay about a quarter of its time (docs/capture.md)
                    gc.freeze()
                step.run()
                if warmup:  # the estimate starts after the last one
                    self.steady = (self.clock(), it + 1)
                if it == 0:
                    self.tally.initial_figures = step.env.describe(step.trajectory)
                log_step = (it + 1) % settings.log_every == 0 or it == settings.iterations - 1
                stopping = self.stopping = self.stop_signal is not None
                if not stopping:  # a stop requested from here on takes effect after the next iteration
                    self.stops_after = min(it + 2, settings.iterations)
                if log_step or stopping or any(c.wants_rows(self, it) for c in self.callbacks):
                    self._flush(it, log_step)
                if self.divergence is not None:
                    self._diverged(it + 1, *step.evaluate())
                for callback in self.callbacks:
                    callback.on_iteration(self, it)
                if stopping:
                    summary = self.summary(*step.evaluate(), status="interrupted")
                    summary["signal"] = signal.Signals(self.stop_signal).name
                    write_json(self.run_dir / "summary.json", summary)
                    raise TrainingInterrupted(self.stop_signal, it + 1, self.last_checkpoint)
            self.fold_wall_time()
            final_loss, final_figures = step.evaluate()
            if not math.isfinite(final_loss):
                self.divergence = {"what": "final loss", "value": _word(final_loss)}
                self._diverged(settings.iterations, final_loss, final_figures)
            summary = self.summary(final_loss, final_figures, status="finished")
            for callback in self.callbacks:
                callback.on_end(self, summary)
            summary["timing_s"]["aside"] = self.tally.aside_s  # with what on_end set aside (the last episodes)
        finally:
            for callback in reversed(self.callbacks):
                callback.close(self)
        write_json(self.run_dir / "summary.json", summary)
        return summary

    def _diverged(self, iteration: int, final_loss: float, final_figures: dict[str, Any]) -> None:
        """Write the ``diverged`` summary and raise :class:`TrainingDiverged` after ``iteration``."""
        self.fold_wall_time()
        tally = self.tally
        found = {"iteration": iteration, **self.divergence}
        where = self.step.env.blowup()  # where the simulation left finite numbers, when the env can tell
        if where:
            found["simulation"] = where
        if tally.nonfinite_loss_since is not None:
            found["loss_nonfinite_since"] = tally.nonfinite_loss_since
        saved = self.last_checkpoint
        found["last_checkpoint"] = str(saved) if saved is not None else None
        summary = self.summary(final_loss, final_figures, status="diverged")
        summary["diverged"] = found
        write_json(self.run_dir / "summary.json", summary)
        what = found["what"]
        if what == "loss":
            since = found["loss_nonfinite_since"]
            reason = (
                f"the loss has been {found['value']} since iteration {since} ({iteration - since + 1} iterations in a "
                f"row; limit {NONFINITE_LOSS_LIMIT})"
            )
        elif what == "parameters":
            where = f" of group '{found['group']}'" if len(self.step.groups) > 1 else ""
            count = found["nonfinite_entries"]
            entries = f"{count} nan or inf entr{'ies' if count != 1 else 'y'}"
            reason = f"the parameters{where} are not finite ('{found['parameter']}' holds {entries})"
        else:
            reason = f"the loss after the last iteration is {found['value']}"
        if what != "loss" and tally.nonfinite_loss_since is not None:
            reason += f"; the loss has been {_word(tally.last_loss)} since iteration {tally.nonfinite_loss_since}"
        if found.get("simulation"):
            reason += f"; {found['simulation']}"
        handled = handled_text(*tally.handled_steps(self.step.groups.values()))
        last = f"last good checkpoint: {saved}" if saved is not None else "no checkpoint was written before it"
        message = f"diverged at iteration {iteration}: {reason}; " + (f"{handled}; " if handled else "") + last
        raise TrainingDiverged(summary, message, saved)

    def _check_divergence(self) -> None:
        """The divergence rule at a read-back (module docstring): sets :attr:`divergence`."""
        bad = self.step.nonfinite_parameters()
        if bad:
            group, parameter, count = bad[0]
            self.divergence = {"what": "parameters", "group": group, "parameter": parameter, "nonfinite_entries": count}
            return
        since = self.tally.nonfinite_loss_since
        if since is not None and self.tally.flushed - since + 1 >= NONFINITE_LOSS_LIMIT:
            self.divergence = {"what": "loss", "value": _word(self.tally.last_loss)}

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
        self._check_divergence()  # acted on after this read-back is logged
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
        iter_s = (now - self.interval[0] - self._aside_in_interval) / (it + 1 - self.interval[1])
        self.interval, self._aside_in_interval = (now, it + 1), 0.0
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
        initial = tally.initial_loss
        known = [v for v in (tally.best_loss, final_loss) if not math.isnan(v)]
        best = min(known) if known else math.nan
        return {
            "status": status,
            "env": step.env.name,
            "device": str(step.device),
            "segment_steps": step.env.segment_steps,
            "versions": versions(),
            "iterations": self.settings.iterations,
            "iterations_done": tally.flushed,
            "initial_loss": initial,
            "final_loss": final_loss,
            "best_loss": best,
            "loss_reduction": 1.0 - final_loss / initial if initial else None,
            "wall_time_s": tally.wall_time_s,
            "clipped_steps": tally.clipped_steps,
            "skipped_steps": tally.skipped_steps,
            "nonfinite_steps": tally.nonfinite_steps,
            "adjoint_clipped_steps": tally.adjoint_clipped_steps,
            "lr_reductions": tally.lr_reductions,
            "timing_s": {**step.timing, "aside": tally.aside_s},
            "before_training": tally.initial_figures,
            "after_training": final_figures,
            **({"groups": tally.groups} if tally.groups else {}),
            **step.task.summary(step.state.params.split(step.eval_params().numpy())),
        }


def _word(value: float) -> str:
    """``nan``, ``inf`` or ``-inf``."""
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def versions() -> dict[str, str | None]:
    """Python and the installed versions of the packages a run's numbers depend on."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("harness", "warp-lang", "newton", "numpy"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found
