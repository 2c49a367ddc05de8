"""One training iteration as a fixed sequence of launches, run eagerly or replayed as one graph.

This module owns :class:`TrainStep`. Its :meth:`~TrainStep.iteration` issues, in order::

    zero every gradient buffer (parameters, env, loss; one launch for the env's many)
    fresh tape: rollout (+ in-backward adjoint clip hooks) + loss
    backward
    pre-clip statistics            # before anything touches the gradients
    snapshot of the pre-clip gradient (histograms at log steps)
    snapshot of the evaluated parameters (update ratio at log steps)
    the update, one transformation (harness.transform; :class:`~harness.training.groups.UpdateRule`):
        non-finite stage (sets the device skip flag) -> skip guard save
        -> clip (in place) -> schedule (writes the device lr) -> optimizer step
        -> parameter bounds -> skip guard restore
    post-clip statistics
    (every parameter group in turn: :meth:`harness.training.groups.Group.apply`; a task with
    its own structure, SHAC's actor then critic epochs, issues these phases itself:
    :meth:`harness.tasks.Task.iterate`)
    write the iteration's row of scalars at row ``counter % rows`` of the device history
    advance the device iteration counter

Every number that changes between iterations (the history row, step counters, the
learning rate, clip thresholds, AutoClip/ZClip state) lives in a device array, nothing
allocates and nothing is read back, so the sequence is recorded once with
``wp.ScopedCapture`` (:meth:`~TrainStep.capture`) and every later iteration is one
``wp.capture_launch`` (:meth:`~TrainStep.run`), on the CPU as on CUDA, bit-identical to
running it eagerly. Work done only at log steps (parameter norm, update ratio, histogram
copies, the adjoint profile) runs outside the graph (:meth:`~TrainStep.log_values`).

With segments (``memory.segment_steps``) and an env and task that read the step from the
device (:func:`harness.memory.segment_graph_blocker`), the capture is split around the
segmented forward + backward: the launches before it (zeroing) are one graph, the segments
are :class:`harness.memory.SegmentGraphs` (one graph per kind of segment, replayed for every
segment), the launches after it (the update, the history row) another graph; a replay is
that short host loop of graph launches, and the memory it holds does not grow with the
horizon.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import warp as wp

from harness import tags
from harness.adjoint import AdjointClipper, AdjointSettings
from harness.clip import ClipPolicy
from harness.clip.nonfinite import NonFinite
from harness.env import Env, Trajectory
from harness.losses import WeightedLoss
from harness.memory import SegmentGraphs, segment_graph_blocker, segmented_forward_backward
from harness.optim import Optimizer
from harness.params import ParamSet
from harness.schedules import Schedule
from harness.tasks import OpenLoop, Task, prepare, rollout
from harness.training.groups import UpdateRule
from harness.training.state import TrainState

__all__ = [
    "CAPTURE_MODES",
    "FIXED_COLUMNS",
    "CaptureError",
    "TrainStep",
    "capture_blocker",
    "check_capture",
    "taped_rollout",
    "training_update",
    "zero_grads",
]

CAPTURE_MODES = ("auto", True, False)
"""Accepted values of the ``capture`` setting."""


class CaptureError(RuntimeError):
    """``capture=true`` was asked for and something in the run cannot be captured."""


FIXED_COLUMNS = (
    tags.LOSS_TOTAL,
    *(
        tags.optim(stat)
        for stat in (
            tags.GRAD_NORM_PRE,
            tags.GRAD_NORM_POST,
            tags.CLIP_COEF,
            tags.CLIPPED,
            tags.SKIPPED,
            tags.GRAD_MAX_ABS,
            tags.NONFINITE,
        )
    ),
)
"""History columns every single-group run has, in order (:meth:`harness.training.groups.Group.columns`);
loss terms, per-parameter norms and the optimizer's, schedule's and clip policy's own scalars follow."""


@wp.kernel
def _write_row_kernel(
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


def zero_grads(env: Env, loss: WeightedLoss, params: ParamSet | list[ParamSet], task: Task | None = None) -> None:
    """Zero every gradient buffer a run owns: every group's parameters, env internals, loss,
    the task's own buffers (never ``tape.zero()``)."""
    for group in params if isinstance(params, list) else [params]:
        group.zero_grad()
    env.zero_grad()
    loss.zero()
    if task is not None:
        task.zero_grad(env)


def taped_rollout(
    env: Env,
    task: Task,
    loss: WeightedLoss,
    params: ParamSet,
    *,
    adjoint: AdjointClipper | None = None,
    objective: Callable[[Trajectory], wp.array] | None = None,
) -> tuple[wp.Tape, Trajectory, wp.array]:
    """Zero every gradient, then record rollout + loss on a fresh tape (``tape.backward(total)`` next).

    Args:
        env: The simulation.
        task: What the parameters are.
        loss: The loss, bound to the env's observables.
        params: The parameters the rollout reads.
        adjoint: In-backward adjoint clipper hooked into the rollout, if any.
        objective: What backward starts from, recorded after the rollout (a task with an
            objective of its own: SHAC's actor loss); default: the loss.

    Returns:
        The tape (keep it as long as a graph that captured it), the trajectory and the loss total.
    """
    if env.segment_steps is not None:  # its States are reused by every segment: one tape would read overwritten values
        raise ValueError(
            f"taped_rollout: env '{env.name}' runs in segments of {env.segment_steps} steps; "
            "use harness.memory.segmented_forward_backward"
        )
    zero_grads(env, loss, params, task)
    tape = wp.Tape()
    with tape:
        hook = adjoint.step_hook(tape) if adjoint is not None else None
        trajectory = rollout(env, task, params, after_step=hook)
        total = loss(trajectory) if objective is None else objective(trajectory)
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
        holder["tape"], holder["trajectory"], holder["total"] = taped_rollout(env, task, loss, params)
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
    """The trainer's update of one group as one transformation: ``nonfinite`` (``skip``,
    ``zero`` or ``error``) around the chain of the clip policy, the schedule, the optimizer and
    the parameter bounds (state keys ``nonfinite/``, ``clip/``, ``schedule/``, ``optim/``);
    :meth:`harness.training.groups.UpdateRule.transform`."""
    return UpdateRule(optimizer, clip, schedule, nonfinite).transform()


class TrainStep:
    """The launches of one training iteration, their device history, and their graph.

    Args:
        env: The simulation.
        task: What the parameters are (how they drive the rollout).
        loss: The loss, bound to the env's observables.
        state: The training state: the parameter groups (each with its parameters and
            gradient, its update and its statistics) and what the task carries.
        rows: Rows of the device history, i.e. iterations between two read-backs.
        adjoint: Clipping inside backward (off by default).

    Attributes:
        groups: The parameter groups by name (``state.groups``).
        columns: The history's column tags, in order.
        history: float32 ``(rows, len(columns))``: one row of scalars per iteration, at
            row ``iteration % rows``.
        counter: int32 ``(1,)``: iterations done (the row index source); set by
            :meth:`set_iteration` when a run starts or resumes.
        graph: The captured iteration (with segment graphs: the graph of the launches after
            the segments), or None while running eagerly.
        segment_graphs: The captured segments (:class:`harness.memory.SegmentGraphs`) when the
            capture was split around them, else None.
        trajectory: The env's observables of the latest rollout (device arrays).
        timing: Host seconds: ``forward``, ``backward``, ``adjoint_clip``,
            ``grad_stats_clip`` and ``optim`` of eager iterations (on the CPU launches are
            synchronous, so these are kernel times; on CUDA the time to queue them),
            ``capture`` (recording the graph) and ``graph`` (replays).
    """

    def __init__(
        self,
        env: Env,
        task: Task,
        loss: WeightedLoss,
        state: TrainState,
        *,
        rows: int,
        adjoint: AdjointSettings | None = None,
    ):
        adjoint = adjoint or AdjointSettings()
        self.env, self.task, self.loss, self.state = env, task, loss, state
        self.groups = state.groups
        primary = state.primary
        self.device = primary.params.device
        self.adjoint = (
            AdjointClipper(
                horizon=env.horizon, world_count=env.world_count, max_norm=adjoint.max_norm, device=self.device
            )
            if adjoint.active
            else None
        )
        # The parameters the last rollout ran with (plots): the primary group's eval_before
        # holds them already unless the optimizer evaluates elsewhere (ScheduleFree's x).
        self.rollout_params = (
            wp.zeros_like(primary.params.data, requires_grad=False)
            if primary.evaluates_elsewhere
            else primary.eval_before
        )
        self.counter = wp.zeros(1, dtype=wp.int32, device=self.device)

        groups = list(self.groups.values())
        sources: list[tuple[str, wp.array, int]] = [(tags.LOSS_TOTAL, loss.total, 0)]
        sources += groups[0].columns()[:7]  # the fixed columns of the primary group first
        sources += [(tags.loss_term(name), loss.term_values, k) for k, name in enumerate(loss.term_names)]
        sources += groups[0].columns()[7:]
        for group in groups[1:]:
            sources += group.columns()
        if self.adjoint is not None and self.adjoint.scales:
            sources.append((tags.ADJOINT_CLIPPED, self.adjoint.rescaled, 0))
        sources += task.columns(primary.params, loss)
        sources += env.columns()
        for tag, array, _ in sources:
            if array.dtype not in (wp.float32, wp.int32) or array.device != self.device:
                raise TypeError(f"logged device scalar '{tag}' must be float32 or int32 on {self.device}")
        self.columns = [tag for tag, _, _ in sources]
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(
                f"two history columns share a tag: {sorted(t for t in self.columns if self.columns.count(t) > 1)}"
            )
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
        self.segment_graphs: SegmentGraphs | None = None  # a split capture's segments (module docstring)
        self._program: list[tuple[Any, Any]] = []  # a split capture: (graph, or SegmentGraphs) in order
        self._capturing = False
        self.trajectory: Trajectory | None = None
        self._tape: Any = None  # the tape (or what a segmented backward kept) a captured graph references
        self._timed = True
        self.timing = dict.fromkeys(
            ("forward", "backward", "adjoint_clip", "grad_stats_clip", "optim", "capture", "graph"), 0.0
        )

    @property
    def params(self) -> ParamSet:
        """The first parameter group's parameters (what a rollout reads)."""
        return self.state.primary.params

    @property
    def stats_pre(self) -> Any:
        """The first parameter group's pre-clip statistics."""
        return self.state.primary.stats_pre

    # -- the iteration --------------------------------------------------------------------

    def all_params(self) -> list[ParamSet]:
        return [group.params for group in self.groups.values()]

    def forward_backward(self, objective: Callable[[Trajectory], wp.array] | None = None) -> Trajectory:
        """Zero all gradients, record rollout + loss (or ``objective``) on a fresh tape, run
        backward; with ``env.segment_steps`` set, in segments
        (:func:`harness.memory.segmented_forward_backward`, whose time counts as ``backward``:
        it re-runs the forward pass segment by segment)."""
        t0 = time.perf_counter()
        adjoint_before = self.adjoint.elapsed_s if self.adjoint is not None else 0.0
        params = self.state.primary.params
        # A graph replays launches that reference what the tape holds: keep it (or, with
        # segments, what each segment's tape held) until the next iteration.
        with self.task.training(self.counter):
            if self.env.segment_steps is not None:
                zero_grads(self.env, self.loss, self.all_params(), self.task)
                if self._capturing and segment_graph_blocker(self.env, self.task) is None:
                    self._split_capture(params)
                else:
                    self._tape, self.trajectory, _ = segmented_forward_backward(
                        self.env, self.task, self.loss, params, adjoint=self.adjoint, keep=self._capturing
                    )
                t1 = t0
            else:
                for other in self.all_params()[1:]:  # taped_rollout zeroes the rollout's own (the first group's)
                    other.zero_grad()
                self._tape, self.trajectory, total = taped_rollout(
                    self.env, self.task, self.loss, params, adjoint=self.adjoint, objective=objective
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

    def apply(self, name: str) -> None:
        """Update group ``name`` from its gradient (:meth:`harness.training.groups.Group.apply`)."""
        stats_clip_s, rest_s = self.groups[name].apply()
        if self._timed:
            self.timing["grad_stats_clip"] += stats_clip_s
            self.timing["optim"] += rest_s

    def iteration(self) -> None:
        """Issue every launch of one iteration (eagerly, or into a capture in progress)."""
        primary = self.state.primary
        if primary.evaluates_elsewhere:
            wp.copy(self.rollout_params, primary.params.data)
        self.task.iterate(self)
        t0 = time.perf_counter()
        wp.launch(
            _write_row_kernel,
            dim=len(self.columns),
            inputs=[self.counter, self.rows, self._column_address, self._column_index, self._column_int],
            outputs=[self.history],
            device=self.device,
        )
        wp.launch(_advance_kernel, dim=1, inputs=[self.counter], device=self.device)
        if self._timed:
            self.timing["optim"] += time.perf_counter() - t0

    def _split_capture(self, params: ParamSet) -> None:
        """In a capture: end the graph so far, capture the segments' graphs, start the next graph."""
        self._program.append((wp.capture_end(device=self.device), None))
        self._capturing = False
        graphs = SegmentGraphs(self.env, self.task, self.loss, params, adjoint=self.adjoint, device=self.device)
        self._program.append((None, graphs))
        self._tape, self.trajectory, self.segment_graphs = graphs, graphs.trajectory, graphs
        wp.capture_begin(device=self.device)
        self._capturing = True

    def run(self) -> None:
        """One iteration: a replay of the captured graph (or of a split capture's graphs, in
        order) when there is one, else eagerly."""
        if self.graph is None:
            self.iteration()
            return
        t0 = time.perf_counter()
        if self._program:
            for graph, segments in self._program:
                if segments is not None:
                    segments.launch()
                else:
                    wp.capture_launch(graph)
        else:
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
        self._program, self.segment_graphs = [], None
        wp.capture_begin(device=self.device)
        self._capturing = True
        try:
            self.iteration()
        finally:
            last = wp.capture_end(device=self.device) if self._capturing else None
            self._capturing, self._timed = False, True
        if self._program:  # split around the segments (module docstring)
            self._program.append((last, None))
        self.graph = last
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

    def check(self) -> None:
        """Every group's ``error`` non-finite check (a host read; log steps only)."""
        for group in self.groups.values():
            group.check()

    def nonfinite_parameters(self) -> list[tuple[str, str, int]]:
        """Every parameter that holds nan or inf entries, at its group's training point or its
        evaluation point (ScheduleFree's average): ``(group, parameter, entries)`` in layout
        order. A device reduction per point and one small read-back (read-backs only)."""
        found = []
        for group in self.groups.values():
            stats = group.stats_param  # recomputed before every other use (log_values)
            points = [group.params.data]
            if group.evaluates_elsewhere:
                points.append(group.eval_params())
            counts = np.zeros(len(group.params.names), dtype=np.int64)
            for point in points:
                stats.compute(point)
                counts = np.maximum(counts, stats.segment_nonfinite.numpy())
            found += [(group.name, name, int(n)) for name, n in zip(group.params.names, counts, strict=True) if n]
        return found

    def log_values(self) -> dict[str, Any]:
        """Host values taken at log steps only, after the iteration ran.

        Returns:
            ``scalars``: every group's parameter norm and update ratio (of the evaluated
            parameters), by tag; ``histograms``: every parameter's pre-clip gradient, by tag;
            with the adjoint clip or profile on, ``adjoint_profile`` ``(horizon, world_count)``;
            for a task whose actions are computed (a policy), ``actions`` of the latest rollout.
        """
        scalars: dict[str, float] = {}
        histograms: dict[str, np.ndarray] = {}
        for group in self.groups.values():
            found = group.log_values()
            for name, grad in found.pop("grad_pre").items():
                histograms[tags.grad_hist(name, group.tag_group)] = grad
            scalars.update(found)
        values: dict[str, Any] = {"scalars": scalars, "histograms": histograms}
        if self.adjoint is not None:
            values["adjoint_profile"] = self.adjoint.profile()
        actions = self.task.rollout_actions(self.env)
        if actions is not None:  # a policy's: the latest training rollout's
            values["actions"] = actions.numpy()
        return values

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must share with this run (:func:`harness.checkpoint.check_identity`):
        the env, and per group the parameter layout and the update's members by name (a
        single-group run: ``layout``, ``optimizer``, ``schedule``, ``clip`` at the top, as
        checkpoints always recorded them)."""
        groups = {name: group.identity() for name, group in self.groups.items()}
        if len(groups) == 1:
            return {"env": self.env.name, **next(iter(groups.values()))}
        return {"env": self.env.name, "groups": groups}

    def eval_params(self) -> wp.array:
        """The primary group's flat parameters to evaluate and export (ScheduleFree's average x)."""
        return self.state.primary.eval_params()

    def at_eval_params(self) -> contextlib.ExitStack:
        """Every group holding its evaluation point inside the block (ScheduleFree's average x)."""
        stack = contextlib.ExitStack()
        for group in self.groups.values():
            stack.enter_context(group.at_eval_params())
        return stack

    def evaluate(self) -> tuple[float, dict[str, Any]]:
        """Loss and env figures at the evaluation parameters (an eager rollout without a tape)."""
        found = self.task.final_evaluation(self)
        if found is not None:  # a task whose result is what its iterations did (task=mpc)
            return found
        with self.at_eval_params():
            self.loss.zero()
            trajectory = rollout(self.env, self.task, self.state.primary.params)
            total = self.loss(trajectory)
            figures = {**self.env.describe(trajectory), **self.task.figures(self.env, self.loss, trajectory)}
            return float(total.numpy()[0]), figures

    def eval_values(self) -> dict[str, dict[str, np.ndarray]]:
        """Host copies of every group's evaluated parameters, by group and name."""
        return {name: group.params.split(group.eval_params().numpy()) for name, group in self.groups.items()}
