"""One training iteration as a fixed sequence of launches, run eagerly or replayed as one graph.

This module owns :class:`TrainStep`. Its :meth:`~TrainStep.iteration` issues, in order::

    zero every gradient buffer (parameters, env, loss; one launch for the env's many)
    fresh tape: rollout (+ in-backward adjoint clip hooks) + loss
    backward
    pre-clip statistics            # before anything touches the gradients
    snapshot of the pre-clip gradient (histograms at log steps)
    snapshot of the evaluated parameters (update ratio at log steps)
    the update, one transformation (harness.transform; :func:`training_update`):
        non-finite stage (sets the device skip flag) -> skip guard save
        -> clip (in place) -> schedule (writes the device lr) -> optimizer step
        -> parameter bounds -> skip guard restore
    post-clip statistics
    record the iteration's row of scalars at row ``counter % rows`` of the device history
    advance the device iteration counter

Every number that changes between iterations (the history row, step counters, the
learning rate, clip thresholds, AutoClip/ZClip state) lives in a device array, nothing
allocates and nothing is read back, so the sequence is recorded once with
``wp.ScopedCapture`` (:meth:`~TrainStep.capture`) and every later iteration is one
``wp.capture_launch`` (:meth:`~TrainStep.run`), on the CPU as on CUDA, bit-identical to
running it eagerly. Work done only at log steps (parameter norm, update ratio, histogram
copies, the adjoint profile) runs outside the graph (:meth:`~TrainStep.log_values`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import warp as wp

from harness.adjoint import AdjointClipper, AdjointSettings
from harness.clip import ClipPolicy, with_nonfinite
from harness.clip.nonfinite import NonFinite
from harness.env import Env, Trajectory
from harness.losses import WeightedLoss
from harness.memory import segmented_forward_backward
from harness.optim import Optimizer
from harness.params import ParamSet
from harness.schedules import Schedule
from harness.stats import FlatStats
from harness.tasks import OpenLoop, Task, prepare, rollout
from harness.training.state import TrainState
from harness.transform import Shared, chain, project_to_bounds

__all__ = [
    "CAPTURE_MODES",
    "FIXED_COLUMNS",
    "CaptureError",
    "TrainStep",
    "capture_blocker",
    "check_capture",
    "record_rollout",
    "training_update",
    "zero_grads",
]

CAPTURE_MODES = ("auto", True, False)
"""Accepted values of the ``capture`` setting."""


class CaptureError(RuntimeError):
    """``capture=true`` was asked for and something in the run cannot be captured."""


FIXED_COLUMNS: dict[str, Callable[[TrainStep], wp.array]] = {
    "loss/total": lambda s: s.loss.total,
    "optim/grad_norm_pre": lambda s: s.stats_pre.norm,
    "optim/grad_norm_post": lambda s: s.stats_post.norm,
    "optim/clip_coef": lambda s: s.state.clip["coef"],
    "optim/clipped": lambda s: s.state.clip["clipped"],
    "optim/skipped": lambda s: s.state.nonfinite["skip"],
    "optim/grad_max_abs": lambda s: s.stats_pre.max_abs,
    "optim/nonfinite": lambda s: s.stats_pre.nonfinite,
}
"""History columns every run has, in order, with the device scalar each is read from;
loss terms, per-parameter norms and the optimizer's, schedule's and clip policy's own
scalars follow."""


@wp.kernel
def _record_row_kernel(
    counter: wp.array(dtype=wp.int32),
    rows: int,
    address: wp.array(dtype=wp.uint64),
    index: wp.array(dtype=wp.int32),
    is_int: wp.array(dtype=wp.int32),
    history: wp.array2d(dtype=wp.float32),
):
    # Column c is entry index[c] of the float32 or int32 device array at address[c].
    c = wp.tid()
    row = counter[0] % rows
    k = index[c]
    if is_int[c] != 0:
        history[row, c] = float(wp.array(ptr=address[c], shape=(k + 1,), dtype=wp.int32)[k])
    else:
        history[row, c] = wp.array(ptr=address[c], shape=(k + 1,), dtype=wp.float32)[k]


@wp.kernel
def _advance_kernel(counter: wp.array(dtype=wp.int32)):
    counter[0] = counter[0] + 1


def zero_grads(env: Env, loss: WeightedLoss, params: ParamSet, task: Task | None = None) -> None:
    """Zero every gradient buffer a run owns: parameters, env internals, loss, the task's own
    buffers (never ``tape.zero()``)."""
    params.zero_grad()
    env.zero_grad()
    loss.zero()
    if task is not None:
        task.zero_grad(env)


def record_rollout(
    env: Env, task: Task, loss: WeightedLoss, params: ParamSet, *, adjoint: AdjointClipper | None = None
) -> tuple[wp.Tape, Trajectory, wp.array]:
    """Zero every gradient, then record rollout + loss on a fresh tape (``tape.backward(total)`` next).

    Args:
        env: The simulation.
        task: What the parameters are.
        loss: The loss, bound to the env's observables.
        params: The parameters the rollout reads.
        adjoint: In-backward adjoint clipper hooked into the rollout, if any.

    Returns:
        The tape (keep it as long as a graph that captured it), the trajectory and the loss total.
    """
    if env.segment_steps is not None:  # its States are reused by every segment: one tape would read overwritten values
        raise ValueError(
            f"record_rollout: env '{env.name}' runs in segments of {env.segment_steps} steps; "
            "use harness.memory.segmented_forward_backward"
        )
    zero_grads(env, loss, params, task)
    tape = wp.Tape()
    with tape:
        hook = adjoint.step_hook(tape) if adjoint is not None else None
        trajectory = rollout(env, task, params, after_step=hook)
        total = loss(trajectory)
    return tape, trajectory, total


def check_capture(
    env: Env,
    loss: WeightedLoss,
    task: Task | None = None,
    *,
    seed: int = 0,
    rtol: float = 0.0,
    device: wp.context.Devicelike = None,
) -> None:
    """Assert that a replayed graph of the env's forward + backward equals eager runs bit for bit.

    Runs forward + backward eagerly at the initial parameters ``p0`` and at perturbed ones
    ``p1``, captures one run at ``p0``, then replays the graph at ``p1`` and at ``p0`` and
    compares the loss, every observable and the parameter gradient with the eager results.
    A rollout that reads a device value on the host, allocates per call, or hands a
    changing Python value to a kernel gives a replay that differs (or fails).

    Args:
        env: The env under test (its rollout is run five times).
        loss: A loss over its observables (bound here).
        task: What is trained (default: open-loop actions).
        seed: Seed of the perturbation ``p1 - p0`` (1% of ``|p0| + 1``, normal).
        rtol: 0 compares bit for bit (the CPU; CUDA with ``HARNESS_DETERMINISTIC``); a
            tolerance for CUDA runs whose float atomics may sum in any order.
        device: The device (default: the env's ``device`` attribute, else Warp's default).

    Raises:
        AssertionError: Naming the first array that differs.
    """
    device = wp.get_device(device if device is not None else env.device)
    task = task or OpenLoop()
    params = prepare(env, task, loss, device=device)
    p0 = params.data.numpy().copy()
    p1 = (p0 + 0.01 * (np.abs(p0) + 1.0) * np.random.default_rng(seed).standard_normal(p0.shape)).astype(np.float32)
    holder: dict[str, Any] = {}

    def run() -> None:
        holder["tape"], holder["trajectory"], holder["total"] = record_rollout(env, task, loss, params)
        holder["tape"].backward(holder["total"])

    def snapshot() -> dict[str, np.ndarray]:
        wp.synchronize_device(device)
        found = {f"observable '{k}'": v.numpy().copy() for k, v in holder["trajectory"].items()}
        return {"loss": holder["total"].numpy().copy(), "parameter gradient": params.grad.numpy().copy(), **found}

    expected = []
    for point in (p0, p1):
        params.data.assign(point)
        run()
        expected.append(snapshot())
    params.data.assign(p0)
    with wp.ScopedCapture(device=device) as capture:
        run()
    for point, reference in ((p1, expected[1]), (p0, expected[0])):
        params.data.assign(point)
        wp.capture_launch(capture.graph)
        for name, value in snapshot().items():
            same = (
                np.allclose(value, reference[name], rtol=rtol, atol=0.0, equal_nan=True)
                if rtol
                else np.array_equal(value, reference[name], equal_nan=True)
            )
            if not same:
                diff = np.nanmax(np.abs(value.astype(np.float64) - reference[name]))
                raise AssertionError(
                    f"env '{env.name}': the replayed graph differs from an eager run in the {name} "
                    f"(largest difference {diff:.3g}); the rollout breaks the capture contract (harness.env)"
                )


def capture_blocker(env: Env, device: wp.context.Device, components: dict[str, Any]) -> str | None:
    """Why this run's iteration cannot be captured, or None when it can.

    Args:
        env: The env (its ``capturable`` and ``capture_note``).
        device: The Warp device of the run.
        components: Other parts of the iteration by name (loss, optimizer, clip, schedule);
            any of them may say ``capturable = False`` (with a ``capture_note``).
    """
    if not getattr(env, "capturable", True):
        note = getattr(env, "capture_note", "") or "it declares capturable = False"
        return f"env '{env.name}' is not capturable: {note}"
    for name, component in components.items():
        if not getattr(component, "capturable", True):
            note = getattr(component, "capture_note", "") or "it declares capturable = False"
            return f"{name} is not capturable: {note}"
    if device.is_cuda and wp.config.verify_cuda:
        return "wp.config.verify_cuda is on (CUDA error checks cannot run inside a graph capture)"
    return None


def training_update(clip: ClipPolicy, schedule: Schedule, optimizer: Optimizer, nonfinite: str = "skip") -> NonFinite:
    """The trainer's update as one transformation: ``nonfinite`` (``skip``, ``zero`` or
    ``error``) around the chain of the clip policy, the schedule, the optimizer and the
    parameter bounds (state keys ``nonfinite/``, ``clip/``, ``schedule/``, ``optim/``)."""
    inner = chain(("clip", clip), ("schedule", schedule), ("optim", optimizer), ("bounds", project_to_bounds()))
    return with_nonfinite(inner, nonfinite)


class TrainStep:
    """The launches of one training iteration, their device history, and their graph.

    Args:
        env: The simulation.
        task: What the parameters are (how they drive the rollout).
        loss: The loss, bound to the env's observables.
        optimizer: The optimizer.
        clip: The clip policy.
        schedule: The learning-rate schedule.
        update: The update of :func:`training_update` over these three.
        shared: The arrays its members published at init (its ``stats`` are set here).
        state: The training state (parameters and the update's state).
        rows: Rows of the device history, i.e. iterations between two read-backs.
        adjoint: Clipping inside backward (off by default).

    Attributes:
        columns: The history's column tags, in order.
        history: float32 ``(rows, len(columns))``: one row of scalars per iteration, at
            row ``iteration % rows``.
        counter: int32 ``(1,)``: iterations done (the row index source); set by
            :meth:`set_iteration` when a run starts or resumes.
        graph: The captured iteration, or None while running eagerly.
        trajectory: The env's observables of the latest rollout (device arrays).
        timing: Host seconds: ``forward``, ``backward``, ``adjoint_clip``,
            ``grad_stats_clip`` and ``optim`` of eager iterations (on the CPU launches are
            synchronous, so these are kernel times; on CUDA the time to queue them),
            ``capture`` (recording the graph) and ``graph`` (replays).
    """

    def __init__(
        self,
        *,
        env: Env,
        task: Task,
        loss: WeightedLoss,
        optimizer: Optimizer,
        clip: ClipPolicy,
        schedule: Schedule,
        update: NonFinite,
        shared: Shared,
        state: TrainState,
        rows: int,
        adjoint: AdjointSettings | None = None,
    ):
        adjoint = adjoint or AdjointSettings()
        self.env, self.task, self.loss = env, task, loss
        self.optimizer, self.clip, self.schedule = optimizer, clip, schedule
        self.update, self.shared = update, shared
        self.state = state
        params = state.params
        self.device = params.device
        self.adjoint = (
            AdjointClipper(
                horizon=env.horizon, world_count=env.world_count, max_norm=adjoint.max_norm, device=self.device
            )
            if adjoint.active
            else None
        )
        self.stats_pre = FlatStats(params)
        self.shared.stats = self.stats_pre  # what the update's first member sees
        self.stats_post = FlatStats(params)
        self.stats_param = FlatStats(params)
        self.stats_update = FlatStats(params)
        self.grad_pre = wp.zeros_like(params.grad)
        # Values only: a copy into a buffer that has a gradient would copy params.grad along.
        self.eval_before = wp.zeros_like(params.data, requires_grad=False)
        self._train_point = wp.zeros_like(params.data, requires_grad=False)
        # The parameters the last rollout ran with (plots): eval_before holds them already
        # unless the optimizer evaluates elsewhere (ScheduleFree's x).
        # The array the evaluation point lives in (a fixed buffer: params.data, or ScheduleFree's x).
        self._eval_point = optimizer.eval_params(params, state.optim)
        self._rollout_copy = self._eval_point is not params.data
        self.rollout_params = (
            wp.zeros_like(params.data, requires_grad=False) if self._rollout_copy else self.eval_before
        )
        self.counter = wp.zeros(1, dtype=wp.int32, device=self.device)

        sources: list[tuple[str, wp.array, int]] = [(tag, get(self), 0) for tag, get in FIXED_COLUMNS.items()]
        sources += [(f"loss/{name}", loss.term_values, k) for k, name in enumerate(loss.term_names)]
        norms = self.stats_pre.segment_norm
        sources += [(f"optim/grad_norm_pre/{name}", norms, k) for k, name in enumerate(params.names)]
        extra: dict[str, wp.array] = {}
        if "threshold" in state.clip:
            extra["optim/clip_threshold"] = state.clip["threshold"]
        if self.adjoint is not None and self.adjoint.scales:
            extra["through_time/clipped"] = self.adjoint.rescaled
        sources += task.columns(params, loss)
        extra.update(optimizer.scalars(state.optim))
        extra.update(schedule.scalars(state.schedule))
        sources += [(tag, array, 0) for tag, array in extra.items()]
        for tag, array, _ in sources:
            if array.dtype not in (wp.float32, wp.int32) or array.device != self.device:
                raise TypeError(f"logged device scalar '{tag}' must be float32 or int32 on {self.device}")
        self.columns = [tag for tag, _, _ in sources]
        self._sources = [array for _, array, _ in sources]  # keep the addressed arrays alive
        self._column_address = wp.array(
            np.array([a.ptr for _, a, _ in sources], np.uint64), dtype=wp.uint64, device=self.device
        )
        self._column_index = wp.array(
            np.array([k for _, _, k in sources], np.int32), dtype=wp.int32, device=self.device
        )
        self._column_int = wp.array(
            np.array([int(a.dtype == wp.int32) for _, a, _ in sources], np.int32), dtype=wp.int32, device=self.device
        )
        self.rows = int(rows)
        self.history = wp.zeros((self.rows, len(self.columns)), dtype=wp.float32, device=self.device)

        self.graph: Any = None
        self.trajectory: Trajectory | None = None
        self._tape: Any = None  # the tape (or what a segmented backward kept) a captured graph references
        self._timed = True
        self._member_time: dict[str, float] = {}
        self.shared.timing = self._member_time  # host seconds of each member of the update (eager)
        self.timing = dict.fromkeys(
            ("forward", "backward", "adjoint_clip", "grad_stats_clip", "optim", "capture", "graph"), 0.0
        )

    # -- the iteration --------------------------------------------------------------------

    def forward_backward(self) -> Trajectory:
        """Zero all gradients, record rollout + loss on a fresh tape, run backward; with
        ``env.segment_steps`` set, in segments (:func:`harness.memory.segmented_forward_backward`,
        whose time counts as ``backward``: it re-runs the forward pass segment by segment)."""
        t0 = time.perf_counter()
        adjoint_before = self.adjoint.elapsed_s if self.adjoint is not None else 0.0
        # A graph replays launches that reference what the tape holds: keep it (or, with
        # segments, what each segment's tape held) until the next iteration.
        with self.task.training(self.counter):
            if self.env.segment_steps is not None:
                zero_grads(self.env, self.loss, self.state.params, self.task)
                self._tape, self.trajectory, _ = segmented_forward_backward(
                    self.env, self.task, self.loss, self.state.params, adjoint=self.adjoint
                )
                t1 = t0
            else:
                self._tape, self.trajectory, total = record_rollout(
                    self.env, self.task, self.loss, self.state.params, adjoint=self.adjoint
                )
                t1 = time.perf_counter()
                self._tape.backward(total)
        t2 = time.perf_counter()
        if self._timed:
            adjoint_s = (self.adjoint.elapsed_s if self.adjoint is not None else 0.0) - adjoint_before
            self.timing["forward"] += t1 - t0
            self.timing["backward"] += t2 - t1 - adjoint_s
            self.timing["adjoint_clip"] += adjoint_s
        return self.trajectory

    def iteration(self) -> None:
        """Issue every launch of one iteration (eagerly, or into a capture in progress)."""
        state, params = self.state, self.state.params
        if self._rollout_copy:
            wp.copy(self.rollout_params, params.data)
        self.forward_backward()
        t0 = time.perf_counter()
        self.stats_pre.compute(params.grad)
        wp.copy(self.grad_pre, params.grad)
        wp.copy(self.eval_before, self._eval_point)
        t1 = time.perf_counter()
        clip_before = self._member_time.get("clip", 0.0)
        self.update.update(params, state.update, self.shared)
        self.stats_post.compute(params.grad)
        wp.launch(
            _record_row_kernel,
            dim=len(self.columns),
            inputs=[self.counter, self.rows, self._column_address, self._column_index, self._column_int],
            outputs=[self.history],
            device=self.device,
        )
        wp.launch(_advance_kernel, dim=1, inputs=[self.counter], device=self.device)
        t2 = time.perf_counter()
        if self._timed:
            clip_s = self._member_time.get("clip", 0.0) - clip_before
            self.timing["grad_stats_clip"] += t1 - t0 + clip_s
            self.timing["optim"] += t2 - t1 - clip_s

    def run(self) -> None:
        """One iteration: a replay of the captured graph when there is one, else eagerly."""
        if self.graph is None:
            self.iteration()
            return
        t0 = time.perf_counter()
        wp.capture_launch(self.graph)
        self.timing["graph"] += time.perf_counter() - t0

    def capture(self) -> float:
        """Record one iteration into a graph (nothing runs); later :meth:`run` calls replay it.

        Call after at least one eager iteration: kernels are compiled and buffers a first
        rollout allocates lazily exist by then.

        Returns:
            The host seconds the capture took.
        """
        t0 = time.perf_counter()
        self._timed = False
        try:
            with wp.ScopedCapture(device=self.device) as capture:
                self.iteration()
        finally:
            self._timed = True
        self.graph = capture.graph
        elapsed = time.perf_counter() - t0
        self.timing["capture"] += elapsed
        return elapsed

    def set_iteration(self, iteration: int) -> None:
        """Set the device iteration counter (where the next row of the history goes)."""
        self.counter.fill_(int(iteration))

    # -- outside the graph ----------------------------------------------------------------

    def read_rows(self, first: int, last: int) -> np.ndarray:
        """The history rows of iterations ``first .. last`` (at most ``rows`` of them); one read-back."""
        if not 0 <= last - first < self.rows:
            raise ValueError(f"read_rows: {first}..{last} spans more than {self.rows} rows")
        wp.synchronize_device(self.device)
        return self.history.numpy()[first % self.rows : last % self.rows + 1]

    def log_values(self) -> dict[str, Any]:
        """Host values taken at log steps only, after the iteration ran.

        Returns:
            ``optim/param_norm`` and ``optim/update_ratio`` (of the evaluated parameters), ``grad_pre``
            (the pre-clip gradient of every parameter, for histograms) and, with the
            adjoint clip or profile on, ``adjoint_profile`` ``(horizon, world_count)``; for a
            task whose actions are computed (a policy), ``actions`` of the latest rollout.
        """
        x = self.eval_params()
        self.stats_param.compute(x)
        self.stats_update.compute(x, minus=self.eval_before)
        param_norm = float(self.stats_param.norm.numpy()[0])
        values: dict[str, Any] = {
            "optim/param_norm": param_norm,
            "optim/update_ratio": float(self.stats_update.norm.numpy()[0]) / max(param_norm, 1e-12),
            "grad_pre": self.state.params.split(self.grad_pre.numpy()),
        }
        if self.adjoint is not None:
            values["adjoint_profile"] = self.adjoint.profile()
        actions = self.task.rollout_actions(self.env)
        if actions is not None:  # a policy's: the latest training rollout's
            values["actions"] = actions.numpy()
        return values

    def eval_params(self) -> wp.array:
        """The flat parameters to evaluate and export (ScheduleFree's average x, else the parameters)."""
        return self.optimizer.eval_params(self.state.params, self.state.optim)

    @contextlib.contextmanager
    def at_eval_params(self) -> Iterator[ParamSet]:
        """The parameters, holding the evaluation point inside the block (ScheduleFree's
        average x); the training point is put back after it."""
        params = self.state.params
        x = self.eval_params()
        swap = x.ptr != params.data.ptr
        if swap:
            wp.copy(self._train_point, params.data)
            wp.copy(params.data, x)
        try:
            yield params
        finally:
            if swap:
                wp.copy(params.data, self._train_point)

    def evaluate(self) -> tuple[float, dict[str, Any]]:
        """Loss and env figures at the evaluation parameters (an eager rollout without a tape)."""
        with self.at_eval_params() as params:
            self.loss.zero()
            trajectory = rollout(self.env, self.task, params)
            total = self.loss(trajectory)
            return float(total.numpy()[0]), self.env.describe(trajectory)
