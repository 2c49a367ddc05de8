"""What a training run does besides iterating: each a :class:`~harness.training.loop.Callback`.

- :class:`Checkpointer`: resumes from a checkpoint, writes checkpoints every N iterations,
  on a stop request and at the end (:mod:`harness.checkpoint` for the file format).
- :class:`SignalStop`: SIGINT/SIGTERM ask the loop to stop after the current iteration.
- :class:`TensorBoardLog`: every iteration's scalars, the log-step histograms, the adjoint
  profile (:mod:`harness.events`).
- :class:`RolloutPlotLog`: a TensorBoard image of the rollout against time at log steps.
- :class:`EpisodeLog`: a policy's whole episodes from the env's own starts, before training,
  every few log steps and at the end (:class:`Episodes` rolls them out).
- :class:`HParamsRecord`: the run's row of the HParams dashboard at the end.
- :class:`ProgressLine`: the console line, redrawn in place on a terminal.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from harness import checkpoint as ckpt
from harness import compile as kernel_compile
from harness import tags
from harness.adjoint import profile_histogram_values, profile_image, profile_summary
from harness.events import EventWriter
from harness.training.loop import Callback, Loop, Tally, handled_text

__all__ = [
    "Checkpointer",
    "EpisodeLog",
    "Episodes",
    "HParamsRecord",
    "ProgressLine",
    "RolloutPlotLog",
    "SignalStop",
    "TensorBoardLog",
    "iteration_series",
]


class Checkpointer(Callback):
    """Resume at the start; checkpoints every ``every`` iterations, on a stop request and at the end.

    A periodic checkpoint falls due only while the last loss read back is finite (it waits
    for the next multiple of ``every`` otherwise), and a diverged run writes none after the
    divergence (:class:`~harness.training.loop.TrainingDiverged`): the newest checkpoint is
    the last good one. The tally stored with it has the same size at every iteration
    (:class:`~harness.training.loop.Tally`).

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
        ckpt.check_identity(saved, path, loop.step.identity(), iterations=loop.settings.iterations)
        try:
            loop.step.state.load(saved.arrays)
        except ValueError as exc:
            raise ckpt.CheckpointError(f"resume: checkpoint '{path}' does not fit this run ({exc})") from None
        loop.step.timing.update(saved.meta.get("timing", {}))
        loop.tally = Tally.from_meta(saved.meta["tally"])
        loop.start_iteration = saved.iteration
        loop.last_checkpoint = path
        ckpt.set_aside_newer(path, saved.iteration)
        print(f"resumed from {path} at iteration {saved.iteration} of {loop.settings.iterations}", flush=True)

    def _due(self, loop: Loop, iteration: int) -> bool:
        return self.every > 0 and (iteration + 1) % self.every == 0 and iteration != loop.settings.iterations - 1

    def wants_rows(self, loop: Loop, iteration: int) -> bool:
        return self._due(loop, iteration)

    def on_iteration(self, loop: Loop, iteration: int) -> None:
        due = self._due(loop, iteration) and loop.tally.nonfinite_loss_since is None
        if due or loop.stopping:
            loop.fold_wall_time()
            self.save(loop, iteration + 1)

    def on_end(self, loop: Loop, summary: dict[str, Any]) -> None:
        self.save(loop, loop.settings.iterations)

    def save(self, loop: Loop, iteration: int) -> Path:
        """Write the full training state after ``iteration`` completed iterations."""
        record = {
            **self.meta,
            **loop.step.identity(),
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
    """SIGINT or SIGTERM: finish the iteration, checkpoint, stop; a second signal stops at once.

    The first signal says at once, on the progress stream, what happens next::

        SIGINT: stopping after iteration 37 finishes: writing a checkpoint (Ctrl-C again to stop at once)

    and asks the loop to stop (:meth:`Loop.request_stop`: it finishes the iteration, writes a
    checkpoint and an ``interrupted`` summary.json, and raises ``TrainingInterrupted``).

    A second signal of either kind stops at once, wherever the loop is: it raises what the
    process's own handler for that signal raises (``KeyboardInterrupt`` for SIGINT; for
    SIGTERM :class:`harness.commands.common.Terminated` under the command line), its message the one line
    to print, which names the newest complete checkpoint in the run folder. Checkpoints are
    written atomically (:func:`harness.checkpoint.save`), so one being written at that
    moment is not left behind half-written and the newest complete one still loads. Where
    SIGTERM had no handler of Python's (the library used alone), the line is printed and
    the process ends by the signal's default action.

    A signal that comes while Warp compiles a kernel module (:func:`harness.compile.compiling`:
    seconds on the CPU, minutes for a network on CUDA) stops at once as a second one does: the
    iteration would wait for the compiler.

    Handlers can only be installed from the main thread (a launcher may run a job in
    another); elsewhere the process's own handling applies.
    """

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._done = 0  # iterations completed: the one running is the next

    def on_start(self, loop: Loop) -> None:
        self._done = loop.start_iteration
        if threading.current_thread() is not threading.main_thread():
            return
        label = next((c.label for c in loop.callbacks if isinstance(c, ProgressLine)), "")

        def handler(signum: int, frame: Any) -> None:
            name = signal.Signals(signum).name
            if loop.stop_signal is None and not kernel_compile.compiling():
                loop.request_stop(signum)
                self._say(
                    f"{label}{name}: stopping after iteration {loop.stops_after} finishes: writing a checkpoint "
                    "(Ctrl-C again to stop at once)"
                )
                return
            self._stop_at_once(loop, signum, frame)

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, handler)

    @staticmethod
    def _say(line: str) -> None:
        """One line on stdout, the progress stream, below a progress line redrawn in place."""
        stream = sys.stdout
        try:
            fresh = "\n" if stream.isatty() else ""
            stream.write(f"{fresh}{line}\n")
            stream.flush()
        except (OSError, ValueError):  # stdout closed or gone: the signal still stops the run
            pass

    def _stop_at_once(self, loop: Loop, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        saved = ckpt.list_checkpoints(ckpt.checkpoint_dir(loop.run_dir))
        kept = (
            f"newest complete checkpoint: {saved[-1]} (resume=auto continues from it)"
            if saved
            else "no checkpoint was written"
        )
        why = "while Warp compiled kernels" if kernel_compile.compiling() else "by a second signal"
        line = f"stopped at once {why} ({name}) in iteration {self._done + 1}; {kept}"
        previous = self._previous.get(signum)
        if signum == signal.SIGINT or not callable(previous):
            if signum == signal.SIGINT:
                raise KeyboardInterrupt(line)
            print(line, file=sys.stderr, flush=True)
            signal.signal(signum, signal.SIG_DFL)  # the signal's own action: the process ends
            signal.raise_signal(signum)
            return
        try:
            previous(signum, frame)  # harness.cli's SIGTERM handler raises its Terminated
        except BaseException as exc:
            raise type(exc)(line) from None

    def on_iteration(self, loop: Loop, iteration: int) -> None:
        self._done = iteration + 1

    def close(self, loop: Loop) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


class TensorBoardLog(Callback):
    """TensorBoard events in the run folder: one scalar per history column and iteration,
    the running ``loss/best`` and ``optim/clipped_fraction``, the log-step scalars and
    histograms, and the adjoint profile when it is on.

    TensorBoard's step is the iteration counted from 1, as the progress line and the
    checkpoints count it: step ``n`` holds what iteration ``n`` computed (its loss is that of
    the parameters after ``n - 1`` updates).
    """

    def __init__(self) -> None:
        self.writer: EventWriter | None = None
        self._best = float("nan")  # the running loss/best (the resumed tally's, set at the start)
        self._clipped: dict[str, int] | None = None  # clipped steps so far, per group's clipped_fraction tag

    def on_start(self, loop: Loop) -> None:
        # A resumed run hides whatever an earlier process wrote after its checkpoint; one that
        # starts from scratch in a folder with events (resume=auto before any checkpoint) all of it.
        earlier = loop.start_iteration > 0 or any(loop.run_dir.glob("events.out.tfevents.*"))
        self.writer = EventWriter(loop.run_dir, purge_step=loop.start_iteration + 1 if earlier else None)
        self._best = loop.tally.best_loss  # after the checkpointer's resume: the best so far (nan: none)

    def on_rows(self, loop: Loop, first: int, rows: np.ndarray) -> None:
        columns, tally = loop.step.columns, loop.tally
        groups = list(loop.step.groups.values())
        clipped = {g.tag(tags.CLIPPED_FRACTION): rows[:, columns.index(g.tag(tags.CLIPPED))] for g in groups}
        if self._clipped is None:  # the clipped counts before these rows (the tallies already count them)
            counts = [tally.clipped_steps, *(tally.groups.get(g.name, {}).get("clipped_steps", 0) for g in groups[1:])]
            self._clipped = {tag: n - int(c.sum()) for (tag, c), n in zip(clipped.items(), counts, strict=True)}
        best = self._best
        for r, values in enumerate(rows):
            scalars = dict(zip(columns, (float(v) for v in values), strict=True))
            loss = scalars[tags.LOSS_TOTAL]
            best = loss if np.isfinite(loss) and not best <= loss else best
            scalars[tags.LOSS_BEST] = best
            for tag, flags in clipped.items():
                self._clipped[tag] += int(flags[r])
                scalars[tag] = self._clipped[tag] / (first + r + 1)
            self.writer.scalars(first + r + 1, scalars)
        self._best = best

    def on_scalars(self, loop: Loop, iteration: int, values: dict[str, float]) -> None:
        self.writer.scalars(iteration + 1, values)

    def on_end(self, loop: Loop, summary: dict[str, Any]) -> None:
        self.writer.scalars(loop.settings.iterations, {tags.LOSS_FINAL: float(summary["final_loss"])})

    def on_log(self, loop: Loop, iteration: int, values: dict[str, Any]) -> None:
        step = iteration + 1
        for tag, values_ in values["histograms"].items():
            self.writer.histogram(step, tag, values_)
        actions = values.get("actions")
        if actions is not None:
            scale = getattr(loop.step.task, "action_scale", None)
            self.writer.histogram(step, tags.POLICY_ACTIONS, actions)
            summary = {tags.POLICY_ACTION_ABS_MEAN: float(np.abs(actions).mean())}
            if scale:
                summary[tags.POLICY_SATURATED_FRACTION] = float(np.mean(np.abs(actions) >= 0.99 * scale))
            self.writer.scalars(step, summary)
        profile = values.get("adjoint_profile")
        if profile is not None:
            adjoint = loop.step.adjoint
            self.writer.scalars(step, profile_summary(profile, max_norm=adjoint.max_norm))
            for tag, hist in profile_histogram_values(profile).items():
                self.writer.histogram(step, tag, hist)
            self.writer.image(
                step, tags.ADJOINT_PROFILE, profile_image(profile, max_norm=adjoint.max_norm, dt=loop.step.env.dt)
            )
        self.writer.flush()

    def close(self, loop: Loop) -> None:
        if self.writer is not None:
            self.writer.close()


def iteration_series(step: Any) -> dict[str, np.ndarray]:
    """Host copies of what the last iteration's rollout did, step by step: every per-step
    observable and every parameter laid out per step (:func:`harness.plots.per_step_series`),
    at the parameters the rollout ran with (``step.rollout_params``).

    An observable that is a view of the flat parameters (the cartpole's ``controls`` are the
    actions themselves) already holds the updated values after the iteration, so it is read
    from those parameters too.
    """
    import warp as wp

    from harness.plots import per_step_series

    used = step.rollout_params.numpy()
    data = step.state.params.data
    observables: dict[str, Any] = {}
    for name, array in step.trajectory.items():
        offset = (array.ptr - data.ptr) // wp.types.type_size_in_bytes(data.dtype) if array.ptr else -1
        if 0 <= offset < data.size and array.is_contiguous:
            inner = tuple(getattr(array.dtype, "_shape_", ()))
            count = array.size * int(np.prod(inner, dtype=int))
            observables[name] = used[offset : offset + count].reshape(*array.shape, *inner)
        else:
            observables[name] = array
    return per_step_series(step.env.horizon, observables, step.state.params.split(used))


def _import_matplotlib() -> None:
    """What :class:`harness.plots.SeriesFigure` imports (on the rollout plot's worker thread)."""
    import importlib

    for name in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
        importlib.import_module(name)


class RolloutPlotLog(Callback):
    """TensorBoard image ``loss/rollout``: every per-step observable and an open-loop task's
    actions against time, the first iteration this process ran dashed (before training, for
    a fresh run) and the current one solid.

    Drawn at the first log step, at the first log step at or after every multiple of
    ``every`` iterations, and at the last iteration, from the iteration's rollout and the
    parameters it ran with (:func:`iteration_series`). The values are copied on the loop's
    thread; matplotlib draws on one worker thread (a pyplot-free figure) while the next
    iterations run (Warp's launches release the GIL), after importing matplotlib there while
    the run starts; one image is drawn while at most one more waits (the loop waits for the
    older one when a third is due), and a drawing error is reported in one line, never
    raised. Envs without per-step observables get no image.

    Args:
        tensorboard: The run's :class:`TensorBoardLog` (listed before this callback).
        every: Iterations between images; 0: only the first log step and the last iteration.
        max_worlds: Draw at most this many worlds.
    """

    TAG = tags.ROLLOUT_PLOT

    def __init__(self, tensorboard: TensorBoardLog, *, every: int, max_worlds: int = 8):
        self.tensorboard, self.every, self.max_worlds = tensorboard, every, max_worlds
        self._first: tuple[int, dict[str, np.ndarray]] | None = None
        self._figure: Any = None
        self._drawn = -1  # multiples of `every` already drawn
        self._worker: Any = None
        self._pending: list[Any] = []  # the images drawn or waiting to be (Futures), oldest first

    def on_start(self, loop: Loop) -> None:
        # matplotlib's import (about 0.4 s) on the worker thread while the loop compiles, loads
        # and runs its first iterations (Warp's kernels run with the GIL released), not after
        from concurrent.futures import ThreadPoolExecutor

        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-plot")
        self._pending.append(self._worker.submit(_import_matplotlib))

    def on_iteration(self, loop: Loop, iteration: int) -> None:
        if self._first is None:
            self._first = (iteration + 1, iteration_series(loop.step))

    def on_log(self, loop: Loop, iteration: int, values: dict[str, Any]) -> None:
        done = iteration + 1
        bucket = done // self.every if self.every else 0
        if not (done == loop.settings.iterations or bucket > self._drawn):
            return
        self._drawn = bucket
        current = iteration_series(loop.step)
        if self._first is None:
            self._first = (done, current)
        if not current:
            return
        env = loop.step.env
        # at most two pending, one drawn and one waiting: the loop goes on past a log step while
        # the previous image is drawn, and waits for the older one when a third is due (none dropped)
        while len(self._pending) > 1:
            self._settle()
        self._pending.append(
            self._worker.submit(self._draw, done, self._first, current, float(env.dt), env.component_names())
        )

    def _settle(self) -> None:
        """Wait for the oldest image in flight; a drawing error is one warning line, never
        raised (an image is not worth failing a run for)."""
        if not self._pending:
            return
        error = self._pending.pop(0).exception()
        if error is not None:
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            print(f"warning: {self.TAG}: drawing failed: {type(error).__name__}: {first}", file=sys.stderr)

    def _draw(self, done: int, first: tuple[int, dict[str, np.ndarray]], current: dict[str, np.ndarray], dt, names):
        from harness.plots import SeriesFigure

        if self._figure is None:
            self._figure = SeriesFigure(current, dt, names, max_worlds=self.max_worlds, dpi=72)
        first_iteration, reference = first
        start = "before training" if first_iteration == 1 else f"iteration {first_iteration}"
        self._figure.draw(reference, current, (start, f"iteration {done}"))
        self.tensorboard.writer.image(done, self.TAG, self._figure.image())

    def close(self, loop: Loop) -> None:
        if self._worker is None:
            return
        while self._pending:
            self._settle()
        self._worker.shutdown(wait=True)
        self._worker = None
        self.tensorboard.writer.flush()


EPISODE_TITLES = {"episode_return": "episode return", "upright_fraction": "upright fraction", "loss": "episode loss"}
"""The HParams column titles of a policy's episode figures."""


def hparams_metrics(group: Any = None, episodes: dict[str, Any] | None = None) -> dict[str, str]:
    """The scalars whose last values the HParams table shows, with their column titles: a
    policy's episode figures after training (``episodes``, :class:`EpisodeLog`) first, the
    final loss (``loss/final``), the best loss, and the primary parameter group's clipped
    fraction and pre-clip norm."""
    tag = group.tag if group is not None else tags.optim
    after = (episodes or {}).get("after") or {}
    return {
        **{EPISODE_TAGS[key]: title for key, title in EPISODE_TITLES.items() if key in after},
        tags.LOSS_FINAL: "final loss",
        tags.LOSS_BEST: "best loss",
        tag(tags.CLIPPED_FRACTION): "clipped fraction",
        tag(tags.GRAD_NORM_PRE): "|g| pre-clip (last iteration)",
    }


@dataclasses.dataclass
class Episodes:
    """Whole episodes from the env's own starts at a training run's current parameters: what
    ``harness evaluate`` reports for a trained run, during training. The env, task and loss are
    built for evaluation (:func:`harness.build.episode_evaluator`: no window, the env's own
    starts, whole horizon), with a state of their own that each call fills from the training
    state: every group's evaluation parameters (ScheduleFree's average) and what the task's
    evaluation reads (:attr:`harness.tasks.Task.evaluation_state`, SHAC's observation
    statistics). The training state is only read.

    Attributes:
        env, task, loss: Built for evaluation.
        state: Their own training state (:class:`~harness.training.state.TrainState`).
    """

    env: Any
    task: Any
    loss: Any
    state: Any

    @property
    def size(self) -> tuple[int, int]:
        """``(worlds, steps)`` of one evaluation."""
        return int(self.env.world_count), int(self.env.horizon)

    def __call__(self, trained: Any) -> dict[str, float]:
        """The episodes' loss and the env's and task's scalar figures (``episode_return``,
        ``upright_fraction``, ...) at ``trained``'s evaluation parameters."""
        import warp as wp

        from harness.tasks import rollout

        for name, group in trained.groups.items():
            wp.copy(self.state.groups[name].params.data, group.eval_params())
        for key in getattr(self.task, "evaluation_state", ()):
            wp.copy(self.state.task[key], trained.task[key])
        self.loss.zero()
        trajectory = rollout(self.env, self.task, self.state.primary.params)
        found = {"loss": float(self.loss(trajectory).numpy()[0])}
        figures = {**self.env.describe(trajectory), **self.task.figures(self.env, self.loss, trajectory)}
        for key, value in figures.items():
            if isinstance(value, int | float | np.floating) and not isinstance(value, bool):
                found[key] = float(value)
        return found


EPISODE_TAGS = {
    "episode_return": tags.EPISODE_RETURN,
    "upright_fraction": tags.EPISODE_UPRIGHT,
    "loss": tags.EPISODE_LOSS,
}
"""Which figures of :class:`Episodes` go to TensorBoard, under which tag."""
EPISODE_POINTS = 10
"""About how many evaluations a run makes between its first and its last (at log steps)."""


class EpisodeLog(Callback):
    """A policy's whole episodes (:class:`Episodes`) before training (TensorBoard step 0; kept
    in the tally, so a resumed run reports the same), at every ``every``-th iteration (a
    multiple of ``log_every`` with about :data:`EPISODE_POINTS` of them in a run) and at the
    end: ``episode/return``, ``episode/upright_fraction`` and ``episode/loss``. A finished run's
    summary gets ``episodes``: the worlds and steps of one evaluation, and the figures before
    and after training (what the done line, the HParams record and the sweep report show).

    Args:
        tensorboard: The run's :class:`TensorBoardLog` (listed before this callback).
        episodes: Rolls the episodes out.
    """

    def __init__(self, tensorboard: TensorBoardLog, episodes: Episodes):
        self.tensorboard = tensorboard
        self.episodes = episodes
        self.every = 1

    def on_start(self, loop: Loop) -> None:
        settings = loop.settings
        self.every = settings.log_every * max(1, math.ceil(settings.iterations / (EPISODE_POINTS * settings.log_every)))
        if loop.start_iteration == 0:
            loop.tally.episodes_before = self._point(loop, 0)

    def on_iteration(self, loop: Loop, iteration: int) -> None:
        done = iteration + 1
        if done % self.every == 0 and done < loop.settings.iterations:
            self._point(loop, done)

    def on_end(self, loop: Loop, summary: dict[str, Any]) -> None:
        worlds, steps = self.episodes.size
        after = self._point(loop, loop.settings.iterations)
        before = loop.tally.episodes_before or None
        summary["episodes"] = {"worlds": worlds, "steps": steps, "before": before, "after": after}

    def _point(self, loop: Loop, step: int) -> dict[str, float]:
        start = loop.clock()
        found = self.episodes(loop.step.state)
        elapsed = loop.clock() - start
        loop.set_aside(elapsed)  # an evaluation is not an iteration: kept out of perf/iter_ms
        values = {tag: found[key] for key, tag in EPISODE_TAGS.items() if key in found}
        self.tensorboard.writer.scalars(step, {**values, tags.PERF_EPISODES_MS: 1e3 * elapsed})
        return found


class HParamsRecord(Callback):
    """At the end of a finished run: its row of TensorBoard's HParams dashboard.

    The metrics are the last values of scalars the run has (:func:`hparams_metrics`): the
    final loss (``loss/final``, the one scalar written for it) and curves; the record sits at
    the last iteration's step.

    Args:
        tensorboard: The run's :class:`TensorBoardLog` (listed before this callback).
        values: The hyperparameters (``config.hparams``).
        swept: Those that differ between the runs of a sweep (``config.swept_keys``).
    """

    def __init__(self, tensorboard: TensorBoardLog, values: dict[str, bool | int | float | str], *, swept: Any = ()):
        self.tensorboard = tensorboard
        self.values = values
        self.swept = tuple(swept)

    def on_end(self, loop: Loop, summary: dict[str, Any]) -> None:
        metrics = hparams_metrics(loop.step.state.primary, summary.get("episodes"))
        self.tensorboard.writer.hparams(self.values, metrics, step=loop.settings.iterations, differs=self.swept)


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


WARMUP_LINES = {
    "eager": "compiling kernels (or loading them from Warp's cache) and running iteration {n} eagerly",
    "capture": "capturing iteration {n} into the graph every later iteration replays",
}
"""What the progress line says before each kind of warm-up iteration (:meth:`Callback.on_warmup`)."""


class ProgressLine(Callback):
    """Iteration, share done, time left, loss, pre-clip gradient norm, iterations per second.

    Printed at every log step; on a terminal also redrawn in place after every other
    iteration (count, share, time left and rate). Loss and norm come from the device
    history, read back once per log interval: between read-backs the line says which
    iteration they belong to (``(at 10)``), and before the first one it says when they come,
    so a healthy run never shows nan. Before a warm-up iteration (the first, eager one, which
    compiles or loads kernels, and the one that captures the graph) a line says so; the
    rate and the time left count only the iterations after the warm-up, so the first lines'
    estimate is not thrown off by it. Once an iteration had a nan/inf gradient, the line ends
    with how many steps so far were skipped or zeroed (``clip.nonfinite``), as read back.

    Args:
        stream: Where the line goes; default: ``sys.stdout`` when the callback is made.
        interactive: Redraw in place; default: whether ``stream`` is a terminal.
        label: Put before every line (which job of a sweep the line is from).
    """

    def __init__(self, *, stream: TextIO | None = None, interactive: bool | None = None, label: str | None = None):
        stream = self.stream = stream if stream is not None else sys.stdout
        self.label = f"{label} " if label else ""
        self.interactive = stream.isatty() if interactive is None else interactive
        self._logged = -1

    def _write(self, line: str) -> None:
        self.stream.write("\r" + self.label + line + "\x1b[K" if self.interactive else self.label + line + "\n")
        self.stream.flush()

    def _line(self, loop: Loop, done: int) -> None:
        total = loop.settings.iterations
        rate = loop.steady_rate(done)  # warm-up iterations (compiling, capturing) are not counted
        seen = loop.tally.flushed  # iterations whose scalars have been read back
        if seen == 0:
            every = loop.settings.log_every
            values = f"loss and |g|pre from iteration {min(total, every * (done // every + 1))}"
        else:
            values = f"loss {loop.tally.last_loss:.6g}  |g|pre {loop.tally.last_norm:.3e}"
            if seen != done:
                values += f" (at {seen})"
            handled = handled_text(*loop.tally.handled_steps(loop.step.groups.values()))
            if handled:
                values += f"  {handled}"
        if rate is None:
            pace = "time left after warm-up" if done < total else "done"
            speed = ""
        else:
            pace = f"{_duration((total - done) / rate)} left"
            speed = f"  {rate:.2f} it/s"
        self._write(f"[{done:>{len(str(total))}d}/{total}] {100 * done / total:3.0f}%  {pace}  {values}{speed}")

    def on_warmup(self, loop: Loop, iteration: int, what: str) -> None:
        total = loop.settings.iterations
        self._write(f"[{iteration + 1:>{len(str(total))}d}/{total}] " + WARMUP_LINES[what].format(n=iteration + 1))

    def on_log(self, loop: Loop, iteration: int, values: dict[str, Any]) -> None:
        self._logged = iteration
        self._line(loop, iteration + 1)

    def on_iteration(self, loop: Loop, iteration: int) -> None:
        if self.interactive and self._logged != iteration:
            self._line(loop, iteration + 1)

    def close(self, loop: Loop) -> None:
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()
