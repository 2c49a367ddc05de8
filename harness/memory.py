"""Long horizons in bounded memory: a rollout in segments, backward segment by segment.

A taped rollout keeps every step's State, its gradients and the tape's launch records
until backward has run, so its memory grows with the horizon. With
``memory.segment_steps = K`` the env keeps the States of one segment (K + 1 of them) and a
copy of the state at every K-th step, and one iteration's forward + backward is:

1. the whole rollout without a tape, saving the state at each segment start
   (:func:`harness.tasks.rollout`), then the loss under a tape and its backward, which
   leaves the adjoint of every recorded observable in its ``.grad``;
2. for each segment from the last: restore its start state, re-run its K steps under a
   tape of their own (with the in-backward adjoint clip's hooks), write the adjoint of
   its last state carried from the later segment into that state's gradient, run the
   tape backward, and keep the adjoint of its first state for the previous segment.
   Segment 0 re-runs the task's ``begin`` too (it writes the trained quantities into the
   model under the tape); Warp's ``wp.copy`` also copies the source's gradient into the
   destination's in the forward pass, so the gradients accumulated so far (the model's,
   the initial state's) are kept aside around that re-run and put back before its backward.

Everything that accumulates over the rollout (the parameters' gradient, the model's, the
observables') is never zeroed between segments, and every adjoint reaches every array in
the order a full tape's backward would use, so the gradients are those of the full tape:
bit for bit on the CPU (tests/test_memory.py). The price is one more forward pass. Peak
memory is about K steps of tape and States plus ``horizon / K`` saved states, smallest near
``K = sqrt(horizon)`` (``auto``, :func:`harness.config.auto_segment_steps`); the classic
analysis is Griewank and Walther, "Algorithm 799: revolve", ACM TOMS 26(1), 2000, and Chen
et al., "Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174 (2016).

With graph capture, an env that reads the step from the device
(:attr:`harness.env.Segmentable.segment_graph`: its kernels address per-step rows as
``segment_base[0] + (t - start)``) and a task whose per-step launches go through the env
(:func:`segment_graph_blocker`) take :class:`SegmentGraphs`: one segment's forward and one
segment's re-run + backward are captured once (plus the first and the last segment's, which
run the task's ``begin`` and ``end``, and the loss), and an iteration is a host loop that
writes each segment's first step into ``env.segment_base`` and replays its graph: a constant
number of graphs, whatever the horizon. Otherwise the whole segmented iteration is recorded
into one graph like an unsegmented one (every segment's launches are the same at every
iteration), whose size grows with the horizon (docs/memory.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import warp as wp

from harness.env import Env, Trajectory
from harness.params import ParamSet
from harness.tasks import OpenLoop, Task, rollout, rollout_segment, segment_bounds

__all__ = ["SegmentGraphs", "segment_graph_blocker", "segmented_forward_backward", "shares_segment_graphs"]


def task_acts_through_env(task: Task) -> bool:
    """Whether the task's per-step launches are the env's (``env.act(t, array)`` with an array
    of every step, or none): then they read the step from the env's device base. A task may say
    so itself with ``segment_graph = True`` (or refuse with False)."""
    declared = getattr(task, "segment_graph", None)
    if declared is not None:
        return bool(declared)
    acts = {Task.act, OpenLoop.act}
    sysid = sys.modules.get("harness.tasks.sysid")  # loaded when a task of it exists
    if sysid is not None:
        acts.add(sysid.SystemId.act)
    return type(task).act in acts


def shares_segment_graphs(env: Env | type, task: Task) -> bool:
    """Whether segments of this env (an instance or, before one exists, its class) and task
    can share their captured graphs: the env reads the step from the device and the task's
    per-step launches are the env's (:func:`segment_graph_blocker` says which is missing)."""
    return bool(getattr(env, "segment_graph", False)) and task_acts_through_env(task)


def segment_graph_blocker(env: Env, task: Task) -> str | None:
    """Why a captured segmented iteration of this run cannot reuse one segment's graph for
    every segment (it is then one graph of all segments), or None when it can."""
    if env.segment_steps is None:
        return "the rollout does not run in segments"
    if not getattr(env, "segment_graph", False):
        return f"env '{env.name}' does not read the step from the device (harness.env.Segmentable.segment_graph)"
    if not task_acts_through_env(task):
        return f"task '{task.name}' indexes its own per-step buffers by the host step"
    return None


class SegmentGraphs:
    """One segmented forward + backward as a constant number of captured graphs (module docstring).

    Capturing runs nothing. The graphs, by kind of segment (first, middle, last; the first
    runs the task's ``begin``, the last its ``end`` and may be shorter): a forward without a
    tape (restore the start state, the steps, save the end state), and a re-run under a tape
    with its backward (restore, the steps, load the later segment's adjoint, backward, keep
    the first state's adjoint); and the loss with its backward. :meth:`launch` replays them
    in the order :func:`segmented_forward_backward` issues the same launches, writing each
    segment's first step into ``env.segment_base`` before its graph: the results are the
    eager segments' bit for bit on the CPU.

    Args:
        env: An env with ``segment_steps`` set and ``segment_graph`` True.
        task: What the parameters are (:func:`segment_graph_blocker` is None).
        loss: The bound loss.
        params: The parameters.
        adjoint: The in-backward adjoint clipper, if any: its hooks go into every segment's
            tape and address their profile row from ``env.segment_base``.
        device: The device to capture on (default: the parameters').

    Attributes:
        graphs: The captured graphs by kind (their number does not grow with the horizon).
        trajectory: The env's trajectory (device arrays the graphs write).
        total: The loss total.
        steps: ``(segment base or None, graph)`` in launch order.
    """

    def __init__(
        self,
        env: Env,
        task: Task,
        loss: Any,
        params: ParamSet,
        *,
        adjoint: Any = None,
        device: wp.context.Devicelike = None,
    ):
        why = segment_graph_blocker(env, task)
        if why is not None:
            raise ValueError(f"SegmentGraphs: {why}")
        self.env, self.task, self.loss, self.params, self.adjoint = env, task, loss, params, adjoint
        self.device = wp.get_device(device if device is not None else params.device)
        self.graphs: dict[tuple, Any] = {}
        self._kept: list[Any] = []  # what the tapes' backward allocated: the graphs use it
        self.steps: list[tuple[int | None, Any]] = []
        horizon = env.horizon
        bounds = segment_bounds(horizon, env.segment_steps)
        for start, end in bounds:
            self.steps.append((start, self._graph("forward", start, end, self._forward)))
        self.trajectory = env.trajectory()
        self.total: Any = None
        self.steps.append((None, self._capture(self._loss)))
        for start, end in reversed(bounds):
            self.steps.append((start, self._graph("backward", start, end, self._backward)))

    def _capture(self, record: Callable[[], None]) -> Any:
        with wp.ScopedCapture(device=self.device) as capture:
            record()
        return capture.graph

    def _graph(self, phase: str, start: int, end: int, record: Callable[[int, int], None]) -> Any:
        key = (phase, start == 0, end == self.env.horizon, end - start)
        found = self.graphs.get(key)
        if found is None:
            self.env.set_segment_base(start)  # the slots the launches use; the device base is written per launch
            found = self.graphs[key] = self._capture(lambda: record(start, end))
        return found

    def _forward(self, start: int, end: int) -> None:
        env = self.env
        if start > 0:
            env.restore_segment()
        rollout_segment(env, self.task, self.params, start, end, begin=False)
        if end < env.horizon:
            env.save_segment(end - start)

    def _loss(self) -> None:
        tape = wp.Tape()
        with tape:
            self.total = self.loss(self.trajectory)
        tape.backward(self.total)
        self._kept.append(tape.gradients)
        if self.adjoint is not None:
            self.adjoint.reset()

    def _backward(self, start: int, end: int) -> None:
        env = self.env
        if start > 0:
            env.restore_segment()
        else:
            env.stash_accumulated_grad()
        tape = wp.Tape()
        with tape:
            hook = _adjoint_hook(self.adjoint, tape, env, start)
            rollout_segment(env, self.task, self.params, start, end, after_step=hook, begin=False)
        if start == 0:
            env.restore_accumulated_grad()
        if end < env.horizon:
            env.load_adjoint(end)
        tape.backward()
        if start > 0:
            env.save_adjoint(start)
            env.zero_segment_grad()
        self._kept.append(tape.gradients)

    def launch(self) -> None:
        """Replay one forward + backward (gradients zeroed by the caller)."""
        env = self.env
        for base, graph in self.steps:
            if base is not None:
                env.set_segment_base(base)
            wp.capture_launch(graph)


def _adjoint_hook(adjoint: Any, tape: wp.Tape, env: Env, start: int) -> Any:
    """The adjoint clipper's hook for the segment starting at ``start`` (None without one). An
    env that reads the step from the device lends it its ``segment_base``, so eager segments
    and the segment graphs launch the same kernels."""
    if adjoint is None:
        return None
    if getattr(env, "segment_graph", False):
        return adjoint.hook(tape, base=env.segment_base, start=start)
    return adjoint.hook(tape)


def segmented_forward_backward(
    env: Env, task: Task, loss: Any, params: ParamSet, *, adjoint: Any = None, keep: bool = True
) -> tuple[list[Any], Trajectory, wp.array]:
    """One forward + backward in segments (module docstring); gradients zeroed by the caller.

    Args:
        env: An env with ``segment_steps`` set.
        task: What the parameters are.
        loss: The bound loss.
        params: The parameters (their gradient is accumulated).
        adjoint: The in-backward adjoint clipper, if any (its hooks go into every segment's tape).
        keep: Keep what every segment's tape referenced (a graph being captured needs it);
            False drops it after each segment's backward (an eager pass: kept, it took the
            cartpole's captured run of 4 x 10,000 steps from 460 to 474 MiB at its peak).

    Returns:
        What every tape's backward referenced, with ``keep`` (its ``gradients``: the adjoint
        arrays and adjoint structs it made; a graph being captured replays launches that use
        them; the launch records themselves are dropped after each segment's backward), the
        trajectory and the loss total.
    """
    trajectory = rollout(env, task, params)
    loss_tape = wp.Tape()
    with loss_tape:
        total = loss(trajectory)
    loss_tape.backward(total)
    kept = [loss_tape.gradients]
    if adjoint is not None:
        adjoint.reset()
    bounds = segment_bounds(env.horizon, env.segment_steps)
    for j in reversed(range(len(bounds))):
        start, end = bounds[j]
        env.begin_segment(start, restore=start > 0)  # outside the tape: nothing flows into a saved state
        if start == 0:
            env.stash_accumulated_grad()
        tape = wp.Tape()
        with tape:
            hook = _adjoint_hook(adjoint, tape, env, start)
            rollout_segment(env, task, params, start, end, after_step=hook, begin=False)
        if start == 0:  # the task's begin (a wp.copy into a model array) overwrote their gradients
            env.restore_accumulated_grad()
        if j + 1 < len(bounds):
            env.load_adjoint(end)
        tape.backward()
        if j > 0:
            env.save_adjoint(start)
            env.zero_segment_grad()  # the previous segment reuses these States (the caller zeroed them for the last)
        if keep:
            kept.append(tape.gradients)
    return kept, trajectory, total
