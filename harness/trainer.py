"""The training loop: rollout under a tape, backward, statistics, clip, step, log, checkpoint.

One iteration is a fixed sequence of kernel launches over device arrays::

    zero every gradient buffer (parameters, env, loss)   # never rely on tape.zero()
    fresh tape: rollout (+ in-backward adjoint clip hooks) + loss
    backward
    pre-clip statistics       # before anything touches the gradients
    clip (in place; non-finite policy sets the device skip flag)
    post-clip statistics
    learning-rate schedule    # writes the optimizer's device lr
    optimizer step            # reads the gradients, never writes them; undone on the
                              # device when the skip flag is set (SkipGuard)
    record the iteration's scalars into a device history row

The host reads the history back once per log interval and writes every iteration's
scalars to TensorBoard from it, so curves have one point per iteration without a
per-iteration host round-trip. Histograms, the parameter norm, the update ratio and the
adjoint profile are taken at log iterations only. The ``error`` non-finite policy is
checked at the same read-back.

Checkpoints (:mod:`harness.checkpoint`) are written every ``checkpoint_every`` iterations,
when SIGINT or SIGTERM arrives (after the current iteration), and at the end; a run
resumed from one continues bit-identically on the CPU.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

from envs.base import Env
from harness import checkpoint as ckpt
from harness.adjoint import AdjointClipper, profile_histogram_values, profile_image, profile_summary
from harness.clip import ClipPolicy, SkipGuard
from harness.losses import WeightedLoss
from harness.optim import Optimizer, load_state, save_state
from harness.params import ParamSet
from harness.runlog import RunLog
from harness.schedules import Schedule, constant
from harness.stats import FlatStats


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Loop settings (``configs/train.yaml`` top level).

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
    """

    iterations: int = 100
    log_every: int = 10
    seed: int = 0
    device: str | None = None
    checkpoint_every: int = 0
    checkpoint_keep: int = 3
    resume: str | None = None


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the run after a checkpoint and summary.json were written."""

    def __init__(self, signum: int, iteration: int, checkpoint: Path):
        self.signum = signum
        self.iteration = iteration
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name
        super().__init__(f"interrupted by {name} after iteration {iteration}; checkpoint written: {checkpoint}")


@wp.kernel
def _record_row(
    row: int,
    loss_total: wp.array(dtype=wp.float32),
    loss_terms: wp.array(dtype=wp.float32),
    norm_pre: wp.array(dtype=wp.float32),
    norm_post: wp.array(dtype=wp.float32),
    coef: wp.array(dtype=wp.float32),
    clipped: wp.array(dtype=wp.int32),
    skipped: wp.array(dtype=wp.int32),
    max_abs: wp.array(dtype=wp.float32),
    nonfinite: wp.array(dtype=wp.int32),
    segment_norm: wp.array(dtype=wp.float32),
    history: wp.array2d(dtype=wp.float32),
):
    history[row, 0] = loss_total[0]
    history[row, 1] = norm_pre[0]
    history[row, 2] = norm_post[0]
    history[row, 3] = coef[0]
    history[row, 4] = float(clipped[0])
    history[row, 5] = float(skipped[0])
    history[row, 6] = max_abs[0]
    history[row, 7] = float(nonfinite[0])
    col = int(8)  # noqa: RUF046, UP018  (a dynamic Warp variable, mutated in the loops)
    for k in range(loss_terms.shape[0]):
        history[row, col] = loss_terms[k]
        col += 1
    for s in range(segment_norm.shape[0]):
        history[row, col] = segment_norm[s]
        col += 1


FIXED_COLUMNS = (
    "loss/total",
    "grad/norm_pre",
    "grad/norm_post",
    "grad/clip_coef",
    "grad/clipped",
    "grad/skipped",
    "grad/max_abs",
    "grad/nonfinite",
)
"""History columns every run has, in order; loss terms, per-parameter norms and the
optimizer's, schedule's and clip policy's own scalars follow."""


@dataclasses.dataclass
class _Tally:
    """Host-side running totals of a run, fed from the history read-backs; checkpointed."""

    losses: list[float] = dataclasses.field(default_factory=list)
    norms: list[float] = dataclasses.field(default_factory=list)
    clipped_steps: int = 0
    skipped_steps: int = 0
    nonfinite_steps: int = 0
    lr_reductions: int = 0
    wall_time_s: float = 0.0
    initial_figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def flushed(self) -> int:
        """Iterations whose scalars were read back and logged."""
        return len(self.losses)

    def add(self, rows: np.ndarray) -> None:
        col = {name: i for i, name in enumerate(FIXED_COLUMNS)}
        self.losses.extend(float(v) for v in rows[:, col["loss/total"]])
        self.norms.extend(float(v) for v in rows[:, col["grad/norm_pre"]])
        self.clipped_steps += int(rows[:, col["grad/clipped"]].sum())
        self.skipped_steps += int(rows[:, col["grad/skipped"]].sum())
        self.nonfinite_steps += int((rows[:, col["grad/nonfinite"]] > 0).sum())

    def last(self, what: str) -> float:
        values = self.losses if what == "loss" else self.norms
        return values[-1] if values else float("nan")


@dataclasses.dataclass
class Trainer:
    """Owns the parameters, every gradient buffer, and the loop over iterations.

    Args:
        env: The simulation.
        loss: The weighted loss over the env's observables.
        optimizer: Optimizer (:mod:`harness.optim`).
        clip: Clip policy with its non-finite and adjoint settings (:mod:`harness.clip`).
        settings: Loop settings.
        schedule: Learning-rate schedule (:mod:`harness.schedules`); constant if None.
    """

    env: Env
    loss: WeightedLoss
    optimizer: Optimizer
    clip: ClipPolicy
    settings: TrainSettings
    schedule: Schedule | None = None

    def __post_init__(self) -> None:
        self.device = wp.get_device(self.settings.device)
        self.params = ParamSet(self.env.parameter_specs(), device=self.device)
        self.loss.bind(self.env.observables(), device=self.device)
        self.schedule = self.schedule or constant()
        self.opt_state = self.optimizer.init(self.params)
        self.sched_state = self.schedule.init(self.opt_state)
        self.clip_state = self.clip.init(self.params)
        # A skipped iteration restores parameters, optimizer state and schedule state alike.
        guarded = {**{f"optim/{k}": v for k, v in self.opt_state.items()}}
        guarded.update({f"schedule/{k}": v for k, v in self.sched_state.items()})
        self.skip_guard = SkipGuard(self.params, guarded, self.clip_state["skip"])
        self.adjoint = (
            AdjointClipper(
                horizon=self.env.horizon,
                world_count=self.env.world_count,
                max_norm=self.clip.adjoint.max_norm,
                device=self.device,
            )
            if self.clip.adjoint.active
            else None
        )
        self.stats_pre = FlatStats(self.params)
        self.stats_post = FlatStats(self.params)
        self.stats_param = FlatStats(self.params)
        self.stats_update = FlatStats(self.params)
        self._eval_before = wp.zeros_like(self.params.data)
        self._train_point = wp.zeros_like(self.params.data)

        extra: dict[str, wp.array] = {}
        if "threshold" in self.clip_state:
            extra["grad/clip_threshold"] = self.clip_state["threshold"]
        extra.update(self.optimizer.scalars(self.opt_state))
        extra.update(self.schedule.scalars(self.sched_state))
        for tag, array in extra.items():
            if array.dtype != wp.float32 or array.shape != (1,):
                raise TypeError(f"logged device scalar '{tag}' must be float32 (1,), got {array.dtype} {array.shape}")
        self.columns = [
            *FIXED_COLUMNS,
            *(f"loss/{name}" for name in self.loss.term_names),
            *(f"grad/norm_pre/{name}" for name in self.params.names),
            *extra,
        ]
        self._extra = [(self.columns.index(tag), array) for tag, array in extra.items()]
        self.history = wp.zeros((self.settings.log_every, len(self.columns)), dtype=wp.float32, device=self.device)
        self._history_flat = self.history.flatten()
        # Host seconds per phase. On the CPU, Warp launches are synchronous, so these are kernel
        # times; on CUDA they are the time to queue the launches, not to run them.
        self.timing = dict.fromkeys(("forward", "backward", "adjoint_clip", "grad_stats_clip", "optim"), 0.0)
        self._stop_signal: int | None = None

    # -- one iteration, split so tests and tools can run the pieces --------------------

    def zero_grad(self) -> None:
        """Zero every gradient buffer the run owns: parameters, env internals, loss."""
        self.params.zero_grad()
        self.env.zero_grad()
        self.loss.zero()

    def forward_backward(self) -> dict[str, wp.array]:
        """Zero all gradients, record rollout + loss on a fresh tape, run backward."""
        t0 = time.perf_counter()
        self.zero_grad()
        tape = wp.Tape()
        with tape:
            hook = self.adjoint.step_hook(tape) if self.adjoint is not None else None
            trajectory = self.env.rollout(self.params, after_step=hook)
            total = self.loss(trajectory)
        t1 = time.perf_counter()
        adjoint_before = self.adjoint.elapsed_s if self.adjoint is not None else 0.0
        tape.backward(total)
        t2 = time.perf_counter()
        adjoint_s = (self.adjoint.elapsed_s if self.adjoint is not None else 0.0) - adjoint_before
        self.timing["forward"] += t1 - t0
        self.timing["backward"] += t2 - t1 - adjoint_s
        self.timing["adjoint_clip"] += adjoint_s
        return trajectory

    def eval_params(self) -> wp.array:
        """The flat parameters to evaluate and export (ScheduleFree's average x, else the parameters)."""
        return self.optimizer.eval_params(self.params, self.opt_state)

    def evaluate(self) -> tuple[float, dict[str, Any]]:
        """Loss and env figures at the evaluation parameters (no tape, host values)."""
        x = self.eval_params()
        swap = x.ptr != self.params.data.ptr
        if swap:  # roll out at x, then put the training point back
            wp.copy(self._train_point, self.params.data)
            wp.copy(self.params.data, x)
        try:
            self.loss.zero()
            trajectory = self.env.rollout(self.params)
            total = self.loss(trajectory)
            return float(total.numpy()[0]), self.env.describe(trajectory)
        finally:
            if swap:
                wp.copy(self.params.data, self._train_point)

    def step(self, iteration: int, *, log_step: bool) -> dict[str, Any]:
        """One full iteration.

        Returns:
            ``trajectory`` (the env's device arrays of this rollout) and, on log steps,
            ``grad_pre`` (host copies of the pre-clip gradients, for histograms).
        """
        extras: dict[str, Any] = {"trajectory": self.forward_backward()}
        t0 = time.perf_counter()
        self.stats_pre.compute(self.params.grad)
        if log_step:
            extras["grad_pre"] = self.params.grad_numpy()
        self.clip.update(self.params, self.clip_state, self.stats_pre)
        self.stats_post.compute(self.params.grad)
        t1 = time.perf_counter()
        if log_step:
            wp.copy(self._eval_before, self.eval_params())
        self.skip_guard.save()
        self.schedule.update(self.opt_state, self.sched_state, self.clip_state["clipped"])
        self.optimizer.step(self.params, self.params.grad, self.opt_state)
        self.skip_guard.restore()
        t2 = time.perf_counter()
        self.timing["grad_stats_clip"] += t1 - t0
        self.timing["optim"] += t2 - t1
        if log_step:
            x = self.eval_params()
            self.stats_param.compute(x)
            self.stats_update.compute(x, minus=self._eval_before)
        row = iteration % self.settings.log_every
        wp.launch(
            _record_row,
            dim=1,
            inputs=[
                row,
                self.loss.total,
                self.loss.term_values,
                self.stats_pre.norm,
                self.stats_post.norm,
                self.clip_state["coef"],
                self.clip_state["clipped"],
                self.clip_state["skip"],
                self.stats_pre.max_abs,
                self.stats_pre.nonfinite,
                self.stats_pre.segment_norm,
            ],
            outputs=[self.history],
            device=self.device,
        )
        width = len(self.columns)
        for col, array in self._extra:
            wp.copy(self._history_flat, array, dest_offset=row * width + col, count=1)
        return extras

    # -- the loop -------------------------------------------------------------------------

    def fit(
        self,
        run_dir: str | Path,
        *,
        log: RunLog | None = None,
        hparams: dict[str, bool | int | float | str] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Train for ``settings.iterations``; write TensorBoard events, checkpoints and summary.json.

        Args:
            run_dir: Output folder of the run.
            log: Where events and progress go; a RunLog into ``run_dir`` by default.
            hparams: Hyperparameters to record with the final metrics for TensorBoard's
                HParams dashboard (one row per run of a sweep).
            meta: Extra JSON-serialisable facts stored in every checkpoint (e.g. the
                resolved config).

        Returns:
            The summary (also written to ``run_dir/summary.json``).

        Raises:
            TrainingInterrupted: SIGINT/SIGTERM arrived; a checkpoint and summary.json
                (``status: interrupted``) were written first.
            harness.clip.NonFiniteGradientError: the ``error`` non-finite policy fired; no
                checkpoint is written after the bad iteration.
        """
        run_dir = Path(run_dir)
        settings = self.settings
        tally, start_it = _Tally(), 0
        resume_from = ckpt.resolve(settings.resume, run_dir) if settings.resume else None
        if resume_from is not None:
            tally, start_it = self.load_checkpoint(resume_from)
            ckpt.set_aside_newer(resume_from, start_it)
        run_dir.mkdir(parents=True, exist_ok=True)
        own_log = log is None
        log = log or RunLog(run_dir, total=settings.iterations, purge_step=start_it or None)
        meta = dict(meta or {})
        # Signal handlers can only be installed from the main thread (a launcher may run a
        # job in another); elsewhere the process's own handling applies.
        in_main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
        for sig in previous:
            signal.signal(sig, self._request_stop)
        started = time.perf_counter()
        self._interval = (started, start_it)  # (time, first iteration) of the current log interval
        try:
            for it in range(start_it, settings.iterations):
                row = it % settings.log_every
                log_step = row == settings.log_every - 1 or it == settings.iterations - 1
                every = settings.checkpoint_every
                ckpt_step = every > 0 and (it + 1) % every == 0 and it != settings.iterations - 1
                extras = self.step(it, log_step=log_step)
                if it == 0:
                    tally.initial_figures = self.env.describe(extras["trajectory"])
                stopping = self._stop_signal is not None
                if log_step or ckpt_step or stopping:
                    self._flush(log, it, extras if log_step else None, tally)
                elif log.interactive:  # redraw count and rate; loss and norm are from the last read-back
                    rate = (it + 1 - self._interval[1]) / max(time.perf_counter() - self._interval[0], 1e-9)
                    log.progress(it + 1, loss=tally.last("loss"), grad_norm=tally.last("norm"), its_per_s=rate)
                if ckpt_step or stopping:
                    tally.wall_time_s += time.perf_counter() - started
                    started = time.perf_counter()
                    path = self.save_checkpoint(run_dir, it + 1, tally, meta)
                if stopping:
                    summary = self._summary(tally, *self.evaluate(), status="interrupted")
                    summary["signal"] = signal.Signals(self._stop_signal).name
                    write_json(run_dir / "summary.json", summary)
                    raise TrainingInterrupted(self._stop_signal, it + 1, path)
            tally.wall_time_s += time.perf_counter() - started
            summary = self._summary(tally, *self.evaluate(), status="finished")
            self.save_checkpoint(run_dir, settings.iterations, tally, meta)
            if hparams is not None:
                log.hparams(
                    hparams,
                    {
                        "hparams/final_loss": summary["final_loss"],
                        "hparams/best_loss": summary["best_loss"],
                        "hparams/clipped_fraction": summary["clipped_steps"] / settings.iterations,
                        "hparams/nonfinite_steps": summary["nonfinite_steps"],
                        "hparams/wall_time_s": summary["wall_time_s"],
                    },
                    step=settings.iterations,
                )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if own_log:
                log.close()
        write_json(run_dir / "summary.json", summary)
        return summary

    def _request_stop(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self._stop_signal = signum

    def _summary(self, tally: _Tally, final_loss: float, final_figures: dict[str, Any], *, status: str) -> dict:
        losses = tally.losses
        return {
            "status": status,
            "env": self.env.name,
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
            "lr_reductions": tally.lr_reductions,
            "timing_s": dict(self.timing),
            "initial": tally.initial_figures,
            "final": final_figures,
        }

    def _flush(self, log: RunLog, it: int, extras: dict[str, Any] | None, tally: _Tally) -> None:
        """The one read-back: every iteration's scalars since the last flush; at log steps
        (``extras`` given) also histograms, norms, the adjoint profile and the progress line."""
        wp.synchronize_device(self.device)
        now = time.perf_counter()
        first = tally.flushed
        rows = self.history.numpy()[first % self.settings.log_every : it % self.settings.log_every + 1]
        for r, values in enumerate(rows):
            log.scalars(first + r, dict(zip(self.columns, (float(v) for v in values), strict=True)))
        tally.add(rows)
        try:  # `error` policy: raises, naming iteration and parameter (after the rows are logged)
            self.clip.check(self.params, self.clip_state)
        except Exception:
            log.flush()
            raise
        count, message = self.schedule.read_reductions(self.sched_state)
        if count > tally.lr_reductions:
            print(message, flush=True)
            log.scalars(it, {"optim/lr_reductions": count})
            tally.lr_reductions = count
        if extras is None:
            return
        iter_s = (now - self._interval[0]) / (it + 1 - self._interval[1])
        self._interval = (now, it + 1)
        param_norm = float(self.stats_param.norm.numpy()[0])
        log.scalars(
            it,
            {
                "perf/iter_ms": 1e3 * iter_s,
                "perf/env_steps_per_s": self.env.horizon * self.env.world_count / iter_s,
                "param/norm": param_norm,
                "update/ratio": float(self.stats_update.norm.numpy()[0]) / max(param_norm, 1e-12),
            },
        )
        for name, grad in extras["grad_pre"].items():
            log.histogram(it, f"hist/grad/{name}", grad)
        if self.adjoint is not None:
            profile = self.adjoint.profile()
            log.scalars(it, profile_summary(profile, max_norm=self.adjoint.max_norm))
            for tag, values in profile_histogram_values(profile).items():
                log.histogram(it, tag, values)
            log.image(it, "adjoint/profile", profile_image(profile, max_norm=self.adjoint.max_norm, dt=self.env.dt))
        log.flush()
        log.progress(it + 1, loss=tally.last("loss"), grad_norm=tally.last("norm"), its_per_s=1.0 / iter_s)

    # -- checkpoints ------------------------------------------------------------------------

    def _layout(self) -> list[list[Any]]:
        """Name, shape and dtype of every parameter, as stored in checkpoints."""
        return [[s.name, list(s.shape), getattr(s.dtype, "__name__", str(s.dtype))] for s in self.params.specs]

    def save_checkpoint(self, run_dir: Path, iteration: int, tally: _Tally, meta: dict[str, Any]) -> Path:
        """Write the full training state after ``iteration`` completed iterations."""
        arrays = {"params/data": self.params.data.numpy()}
        for prefix, state in (("optim", self.opt_state), ("schedule", self.sched_state), ("clip", self.clip_state)):
            arrays.update({f"{prefix}/{k}": v for k, v in save_state(state).items()})
        record = {
            **meta,
            "iteration": iteration,
            "env": self.env.name,
            "layout": self._layout(),
            "optimizer": self.optimizer.name,
            "schedule": self.schedule.name,
            "clip": self.clip.name,
            "seed": self.settings.seed,
            "tally": dataclasses.asdict(tally),
            "timing": dict(self.timing),
        }
        return ckpt.save(
            ckpt.Checkpoint(arrays=arrays, meta=record),
            ckpt.checkpoint_dir(run_dir),
            keep=self.settings.checkpoint_keep,
        )

    def load_checkpoint(self, path: Path) -> tuple[_Tally, int]:
        """Restore parameters, optimizer, schedule and clip state; returns (tally, next iteration)."""
        saved = ckpt.load(path)
        meta = saved.meta
        for key, mine in (
            ("env", self.env.name),
            ("layout", self._layout()),
            ("optimizer", self.optimizer.name),
            ("schedule", self.schedule.name),
            ("clip", self.clip.name),
        ):
            if meta.get(key) != mine:
                raise ckpt.CheckpointError(
                    f"resume: checkpoint '{path}' does not fit this run: its {key} is {meta.get(key)!r}, "
                    f"this run's is {mine!r}"
                )
        try:
            self.params.data.assign(saved.arrays["params/data"])
            for prefix, state in (("optim", self.opt_state), ("schedule", self.sched_state), ("clip", self.clip_state)):
                part = {k[len(prefix) + 1 :]: v for k, v in saved.arrays.items() if k.startswith(prefix + "/")}
                load_state(state, part)
        except (KeyError, ValueError) as exc:
            raise ckpt.CheckpointError(f"resume: checkpoint '{path}' does not fit this run ({exc})") from None
        if saved.iteration > self.settings.iterations:
            raise ckpt.CheckpointError(
                f"resume: checkpoint '{path}' is at iteration {saved.iteration}, past this run's "
                f"iterations={self.settings.iterations}; accepted: iterations >= {saved.iteration}"
            )
        self.timing.update(meta.get("timing", {}))
        return _Tally(**meta["tally"]), saved.iteration


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON atomically: a temporary file in the same folder, then rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n")
    tmp.replace(path)
