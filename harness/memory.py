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

The whole segmented iteration is recorded into one captured graph like an unsegmented one
(every segment's launches are the same at every iteration), so capture needs no device
segment index; the graph's size grows with the horizon (docs/memory.md).
"""

from __future__ import annotations

from typing import Any

import warp as wp

from harness.env import Env, Trajectory
from harness.params import ParamSet
from harness.tasks import Task, rollout, rollout_segment, segment_bounds

__all__ = ["segmented_forward_backward"]


def segmented_forward_backward(
    env: Env, task: Task, loss: Any, params: ParamSet, *, adjoint: Any = None
) -> tuple[list[Any], Trajectory, wp.array]:
    """One forward + backward in segments (module docstring); gradients zeroed by the caller.

    Args:
        env: An env with ``segment_steps`` set.
        task: What the parameters are.
        loss: The bound loss.
        params: The parameters (their gradient is accumulated).
        adjoint: The in-backward adjoint clipper, if any (its hooks go into every segment's tape).

    Returns:
        What every tape's backward referenced (its ``gradients``: the adjoint arrays and
        adjoint structs it made; a graph being captured replays launches that use them;
        the launch records themselves are dropped after each segment's backward), the
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
            hook = adjoint.hook(tape) if adjoint is not None else None
            rollout_segment(env, task, params, start, end, after_step=hook, begin=False)
        if start == 0:  # the task's begin (a wp.copy into a model array) overwrote their gradients
            env.restore_accumulated_grad()
        if j + 1 < len(bounds):
            env.load_adjoint(end)
        tape.backward()
        if j > 0:
            env.save_adjoint(start)
            env.zero_segment_grad()  # the previous segment reuses these States (the caller zeroed them for the last)
        kept.append(tape.gradients)
    return kept, trajectory, total
