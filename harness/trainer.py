"""The training loop: rollout under a tape, backward, statistics, clip, step, log.

One iteration is a fixed sequence of kernel launches over device arrays::

    zero every gradient buffer (parameters, env, loss)   # never rely on tape.zero()
    fresh tape: rollout + loss
    backward
    pre-clip statistics       # before anything touches the gradients
    clip (in place)
    post-clip statistics
    optimizer step            # reads the gradients, never writes them
    record the iteration's scalars into a device history row

The host reads the history back once per log interval and writes every iteration's
scalars to TensorBoard from it, so curves have one point per iteration without a
per-iteration host round-trip. Histograms, the parameter norm and the update ratio are
taken at log iterations only.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

from envs.base import Env
from harness.clip import ClipPolicy
from harness.losses import WeightedLoss
from harness.optim import Optimizer
from harness.params import ParamSet
from harness.runlog import RunLog
from harness.stats import FlatStats


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Loop settings (``configs/train.yaml`` top level).

    Attributes:
        iterations: Optimisation steps.
        log_every: Read back, write TensorBoard and print progress every N iterations.
        seed: Run seed (the env's initial conditions are drawn from it).
        device: Warp device name; None picks Warp's preferred device.
    """

    iterations: int = 100
    log_every: int = 10
    seed: int = 0
    device: str | None = None


@wp.kernel
def _record_row(
    row: int,
    loss_total: wp.array(dtype=wp.float32),
    loss_terms: wp.array(dtype=wp.float32),
    norm_pre: wp.array(dtype=wp.float32),
    norm_post: wp.array(dtype=wp.float32),
    coef: wp.array(dtype=wp.float32),
    clipped: wp.array(dtype=wp.int32),
    max_abs: wp.array(dtype=wp.float32),
    nonfinite: wp.array(dtype=wp.int32),
    lr: wp.array(dtype=wp.float32),
    segment_norm: wp.array(dtype=wp.float32),
    history: wp.array2d(dtype=wp.float32),
):
    history[row, 0] = loss_total[0]
    history[row, 1] = norm_pre[0]
    history[row, 2] = norm_post[0]
    history[row, 3] = coef[0]
    history[row, 4] = float(clipped[0])
    history[row, 5] = max_abs[0]
    history[row, 6] = float(nonfinite[0])
    history[row, 7] = lr[0]
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
    "grad/max_abs",
    "grad/nonfinite",
    "optim/lr",
)


@dataclasses.dataclass
class _Tally:
    """Host-side running totals of a run, fed from the history read-backs."""

    start: float
    interval_start: float = 0.0
    losses: list[float] = dataclasses.field(default_factory=list)
    norms: list[float] = dataclasses.field(default_factory=list)
    clipped_steps: int = 0
    nonfinite_steps: int = 0
    initial_figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.interval_start = self.start

    def add(self, rows: np.ndarray) -> None:
        col = {name: i for i, name in enumerate(FIXED_COLUMNS)}
        self.losses.extend(float(v) for v in rows[:, col["loss/total"]])
        self.norms.extend(float(v) for v in rows[:, col["grad/norm_pre"]])
        self.clipped_steps += int(rows[:, col["grad/clipped"]].sum())
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
        optimizer: Optimizer (init/step pair).
        clip: Clip policy (init/update pair).
        settings: Loop settings.
    """

    env: Env
    loss: WeightedLoss
    optimizer: Optimizer
    clip: ClipPolicy
    settings: TrainSettings

    def __post_init__(self) -> None:
        self.device = wp.get_device(self.settings.device)
        self.params = ParamSet(self.env.parameter_specs(), device=self.device)
        self.loss.bind(self.env.observables(), device=self.device)
        self.opt_state = self.optimizer.init(self.params)
        self.clip_state = self.clip.init(self.params)
        self.stats_pre = FlatStats(self.params)
        self.stats_post = FlatStats(self.params)
        self.stats_param = FlatStats(self.params)
        self.stats_update = FlatStats(self.params)
        self._data_before = wp.zeros_like(self.params.data)
        self.columns = [
            *FIXED_COLUMNS,
            *(f"loss/{name}" for name in self.loss.term_names),
            *(f"grad/norm_pre/{name}" for name in self.params.names),
        ]
        self.history = wp.zeros((self.settings.log_every, len(self.columns)), dtype=wp.float32, device=self.device)
        self.timing = {"forward": 0.0, "backward": 0.0, "grad_stats_clip": 0.0, "optim": 0.0}

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
            trajectory = self.env.rollout(self.params)
            total = self.loss(trajectory)
        t1 = time.perf_counter()
        tape.backward(total)
        t2 = time.perf_counter()
        self.timing["forward"] += t1 - t0
        self.timing["backward"] += t2 - t1
        return trajectory

    def evaluate(self) -> tuple[float, dict[str, Any]]:
        """Loss and env figures at the current parameters (no tape, host values)."""
        self.loss.zero()
        trajectory = self.env.rollout(self.params)
        total = self.loss(trajectory)
        return float(total.numpy()[0]), self.env.describe(trajectory)

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
            wp.copy(self._data_before, self.params.data)
        self.optimizer.step(self.params, self.opt_state)
        t2 = time.perf_counter()
        self.timing["grad_stats_clip"] += t1 - t0
        self.timing["optim"] += t2 - t1
        if log_step:
            self.stats_param.compute(self.params.data)
            self.stats_update.compute(self.params.data, minus=self._data_before)
        wp.launch(
            _record_row,
            dim=1,
            inputs=[
                iteration % self.settings.log_every,
                self.loss.total,
                self.loss.term_values,
                self.stats_pre.norm,
                self.stats_post.norm,
                self.clip_state["coef"],
                self.clip_state["clipped"],
                self.stats_pre.max_abs,
                self.stats_pre.nonfinite,
                self.opt_state["lr"],
                self.stats_pre.segment_norm,
            ],
            outputs=[self.history],
            device=self.device,
        )
        return extras

    # -- the loop -------------------------------------------------------------------------

    def fit(
        self,
        run_dir: str | Path,
        *,
        log: RunLog | None = None,
        hparams: dict[str, bool | int | float | str] | None = None,
    ) -> dict[str, Any]:
        """Train for ``settings.iterations`` and write TensorBoard events and summary.json.

        Args:
            run_dir: Output folder of the run.
            log: Where events and progress go; a RunLog into ``run_dir`` by default.
            hparams: Hyperparameters to record with the final metrics for TensorBoard's
                HParams dashboard (one row per run of a sweep).

        Returns:
            The summary (also written to ``run_dir/summary.json``).
        """
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        settings = self.settings
        own_log = log is None
        log = log or RunLog(run_dir, total=settings.iterations)
        tally = _Tally(start=time.perf_counter())
        try:
            for it in range(settings.iterations):
                row = it % settings.log_every
                log_step = row == settings.log_every - 1 or it == settings.iterations - 1
                extras = self.step(it, log_step=log_step)
                if it == 0:
                    tally.initial_figures = self.env.describe(extras["trajectory"])
                if log_step:
                    self._flush_interval(log, it, extras, tally)
                elif log.interactive:  # redraw count and rate; loss and norm are from the last read-back
                    rate = (row + 1) / max(time.perf_counter() - tally.interval_start, 1e-9)
                    log.progress(it + 1, loss=tally.last("loss"), grad_norm=tally.last("norm"), its_per_s=rate)
            final_loss, final_figures = self.evaluate()
            summary = self._summary(tally, final_loss, final_figures)
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
                )
        finally:
            if own_log:
                log.close()
        write_json(run_dir / "summary.json", summary)
        return summary

    def _summary(self, tally: _Tally, final_loss: float, final_figures: dict[str, Any]) -> dict[str, Any]:
        losses = tally.losses
        return {
            "status": "finished",
            "env": self.env.name,
            "iterations": self.settings.iterations,
            "initial_loss": losses[0],
            "final_loss": final_loss,
            "best_loss": min([*losses, final_loss]),
            "loss_reduction": 1.0 - final_loss / losses[0] if losses[0] else None,
            "wall_time_s": time.perf_counter() - tally.start,
            "clipped_steps": tally.clipped_steps,
            "nonfinite_steps": tally.nonfinite_steps,
            "timing_s": dict(self.timing),
            "initial": tally.initial_figures,
            "final": final_figures,
        }

    def _flush_interval(self, log: RunLog, it: int, extras: dict[str, Any], tally: _Tally) -> None:
        """The one read-back per interval: every iteration's scalars since the last flush."""
        wp.synchronize_device(self.device)
        now = time.perf_counter()
        row = it % self.settings.log_every
        rows = self.history.numpy()[: row + 1]
        for r, values in enumerate(rows):
            self.log_scalars(log, it - row + r, values)
        tally.add(rows)
        iter_s = (now - tally.interval_start) / (row + 1)
        tally.interval_start = now
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
        log.flush()
        log.progress(it + 1, loss=tally.last("loss"), grad_norm=tally.last("norm"), its_per_s=1.0 / iter_s)

    def log_scalars(self, log: RunLog, step: int, values: np.ndarray) -> None:
        log.scalars(step, dict(zip(self.columns, (float(v) for v in values), strict=True)))


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON atomically: a temporary file in the same folder, then rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n")
    tmp.replace(path)
