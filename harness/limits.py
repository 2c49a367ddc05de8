"""Sizes: the memory a run will need, estimated before anything is allocated.

Memory (:func:`check_memory`, called by :func:`harness.build.precheck` and by the commands that
build an env of their own). A run's memory is, in bytes:

- the env's Warp arrays, ``a + b W + f S (c + d W)`` for ``W`` worlds and ``S`` steps kept on
  the tape (the horizon, or one segment's ``K`` steps with ``memory.segment_steps``), plus, in
  segments, one values-only copy of the state per segment start, ``(ceil(H / K) - 1) (c + d W) / 2``,
  and the observables of the steps outside the segment. ``a, b, c, d`` are measured, not
  assumed: four probe envs of 1 and 2 worlds and 1 and 2 steps are built and the bytes of
  every Warp array (and gradient) they hold are summed (:func:`probe_env`); ``f`` is what
  a taped rollout adds to them (:data:`EAGER_STEP_FACTOR`, :data:`CAPTURED_STEP_FACTOR`);
- host memory per taped step, whatever the world count (:data:`STEP_HOST_BYTES`, or
  :data:`HOST_BYTES_PER_STEP_ARRAY` per array the env holds per step where that is more: the
  Python objects of each step's State, gradients and scratch, and the tape's launch records), in
  segments a little per step of the horizon (:data:`SEGMENT_HOST_BYTES_PER_STEP`), and with
  a captured graph the graph's launch records (:data:`GRAPH_BYTES_PER_STEP`, on the CPU: per
  step of the horizon, or with the segment graphs of :mod:`harness.memory` per step of each of
  their :data:`SEGMENT_GRAPH_KINDS` kinds of segment);
- the task's own arrays: every parameter with its gradient, the update's copies and the
  optimizer's state (:data:`PARAMETER_COPIES` copies of the parameters, ``Task.flat_shapes``),
  and, for a task that maps observations to actions, each step's observation and action with
  their gradients (kept for the whole horizon, and in segments that share their graphs one
  segment's more);
- the device history of ``log_every`` rows (:data:`HISTORY_COLUMNS` columns), read back to the
  host, and the host tallies kept per iteration (:data:`TALLY_BYTES_PER_ITERATION`);
- what the process still loads after the check (Newton, kernels, TensorBoard):
  :data:`PROCESS_BYTES`.

The constants are calibrated on real runs (docs/reliability.md, "Sizes"). Before the probes a
*floor* is checked: the same sum without the env's state (whose size only a built env knows),
so a world count or horizon far beyond the machine is refused at once, without importing
Newton or compiling a kernel. What is free: on the CPU, ``MemAvailable`` of ``/proc/meminfo``,
less still where a cgroup limit (v2 ``memory.max - memory.current``, v1
``memory.limit_in_bytes - memory.usage_in_bytes``) leaves less; on a CUDA device, Warp's
``Device.free_memory`` for the arrays and the host's for the rest.

Files a run reads are checked by :mod:`harness.files`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from harness.files import MIB, available_host_bytes, format_bytes

__all__ = [
    "Estimate",
    "available_host_bytes",
    "check_memory",
    "estimate_run",
    "format_bytes",
    "probe_env",
]


STEP_HOST_BYTES = 160 * 1024
"""Host bytes per step kept on a tape, whatever the world count: the Python objects of the
step's State, gradients and solver scratch and the tape's launch records (calibrated on the
cartpole: docs/reliability.md). The least a step costs: an env with many arrays per step costs
:data:`HOST_BYTES_PER_STEP_ARRAY` per array instead, where that is more."""

HOST_BYTES_PER_STEP_ARRAY = 9 * 1024
"""Host bytes per Warp array an env holds per step, on a tape and (on the CPU) again in a
captured graph: the host cost of a step grows with what the step launches, which its arrays
track (the cartpole holds 22 per step and its 16 launches; the swing-up's four Featherstone
substeps 82 and 64; calibrated on the swing-up: docs/reliability.md, "Sizes")."""

GRAPH_BYTES_PER_STEP = 150 * 1024
"""Host bytes per simulated step of a captured graph on the CPU (its recorded launches; one
graph covers the whole horizon, also in segments when they cannot share their graphs), at
least: :data:`HOST_BYTES_PER_STEP_ARRAY` per array of the step where that is more. On CUDA the
graph lives in driver memory."""

SEGMENT_HOST_BYTES_PER_STEP = 4 * 1024
"""Host bytes per step of the horizon that a run in segments holds beyond the other terms, at
least (calibrated on the cartpole at 4 worlds: from 2,000 to 10,000 steps in segments of about
``sqrt(H)`` the measured peak grew by 3.9 KiB per step eager and 7.9 KiB captured, the other
terms by 2.0 and 5.3; docs/reliability.md, "Sizes"); :data:`SEGMENT_HOST_BYTES_PER_STEP_ARRAY`
per array of the step where that is more."""

SEGMENT_HOST_BYTES_PER_STEP_ARRAY = 192
""":data:`SEGMENT_HOST_BYTES_PER_STEP` per Warp array the env holds per step (the cartpole's 4 KiB
over its 22 arrays, rounded up), for envs whose steps hold more (the swing-up)."""

SEGMENT_GRAPH_KINDS = 3
"""Kinds of segment captured once each when segments share their graphs (the first, a middle
one and the last; :class:`harness.memory.SegmentGraphs`): their graphs hold that many segments'
steps, whatever the horizon."""

EAGER_STEP_FACTOR = 1.6
"""The arrays of a step kept on a tape, as a multiple of those the env holds per step when built:
what the taped forward adds (the solver's temporaries the tape keeps alive, the gradients backward
allocates), measured on the cartpole (docs/reliability.md)."""

CAPTURED_STEP_FACTOR = 2.4
""":data:`EAGER_STEP_FACTOR` when a graph is captured: the eager first iteration's arrays and the
captured iteration's are alive at once."""

PARAMETER_COPIES = 10
"""Copies of the parameters a run holds: the values, the gradient, the pre-clip gradient, the
evaluation and training points, and up to four optimizer slots (Adam's moments,
ScheduleFree's z and x), with one to spare."""

HISTORY_COLUMNS = 64
"""An upper bound on the device history's columns (scalars per iteration, every group's)."""

TALLY_BYTES_PER_ITERATION = 200
"""Host bytes the loop keeps per iteration over a whole run (the loss and norm histories as
Python floats in lists, and what a summary reads of them)."""

PROCESS_BYTES = 200 * MIB
"""What the process still loads after the check: Newton, Warp's kernels, TensorBoard's
writer (the peak of a 4-world, 240-step cartpole run less what is resident at the check)."""

MARGIN = 1.25
"""The estimate must fit ``available / MARGIN``: room for what no term counts (allocator
slack, the rendering thread, TensorBoard's queue)."""


@dataclasses.dataclass
class Estimate:
    """Bytes a run needs, by where they live and what they are.

    Attributes:
        host: Bytes in host memory (on the CPU: everything).
        device: Bytes of Warp arrays on a CUDA device (0 on the CPU).
        parts: What the bytes are, by name (for the notes and the tests).
        floor: True when the env's own arrays are left out (no probe ran): a lower bound.
    """

    host: int
    device: int
    parts: dict[str, int]
    floor: bool = False

    @property
    def total(self) -> int:
        return self.host + self.device


# -- what the env holds ---------------------------------------------------------------------------


def _walk_arrays(root: Any) -> list[Any]:
    """Every Warp array reachable from ``root`` through attributes, lists, tuples and dicts
    (and each array's gradient), each once."""
    import types

    import warp as wp

    found: list[Any] = []
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > 12:
            continue
        seen.add(id(obj))
        if isinstance(obj, wp.array):
            found.append(obj)
            if obj.grad is not None:
                stack.append((obj.grad, depth + 1))
            continue
        if isinstance(obj, str | bytes | int | float | bool | type | types.ModuleType | types.FunctionType) or (
            obj is None
        ):
            continue
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, list | tuple | set):
            stack.extend((v, depth + 1) for v in obj)
        elif type(obj).__module__.split(".")[0] != "warp" and hasattr(obj, "__dict__"):
            stack.extend((v, depth + 1) for v in vars(obj).values())
    return found


def _array_bytes(arrays: list[Any]) -> int:
    """Bytes of the memory the arrays span, views and their owners counted once (merged ranges)."""
    import warp as wp

    spans = []
    for array in arrays:
        if not array.ptr:
            continue
        size = getattr(array, "capacity", 0) or array.size * wp.types.type_size_in_bytes(array.dtype)
        spans.append((array.ptr, array.ptr + size))
    total, end = 0, 0
    for lo, hi in sorted(spans):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def probe_env(env_class: Any, env_config: Any, device: Any) -> tuple[tuple[float, float, float, float], int]:
    """``(a, b, c, d)`` of the env's array bytes ``a + b W + S (c + d W)``, and the Warp arrays
    it holds per step, from four probe envs of 1 and 2 worlds and 1 and 2 steps (no segments),
    built and dropped here.

    The first probe imports what the env needs (Newton: millions of objects that live as long
    as the process). While the collector is paused (:func:`harness.commands.common.collector_paused`,
    which freezes everything alive when it ends) they are moved to its permanent generation
    before the other three are built, so the collection that frees the probes' cycles walks
    only those three (0.4 s less on the cartpole, docs/startup.md); what the first probe leaves
    in cycles then stays (an env of one world and one step)."""
    import gc

    size, count = {}, {}
    for worlds, steps in ((1, 1), (1, 2), (2, 1), (2, 2)):
        env = env_class(dataclasses.replace(env_config, world_count=worlds, horizon=steps), device=device)
        arrays = _walk_arrays(env)
        size[worlds, steps], count[worlds, steps] = _array_bytes(arrays), len(arrays)
        del env, arrays
        if (worlds, steps) == (1, 1) and not gc.isenabled():
            gc.freeze()
    gc.collect()
    d = size[2, 2] - size[2, 1] - size[1, 2] + size[1, 1]
    c = size[1, 2] - size[1, 1] - d
    b = size[2, 1] - size[1, 1] - d
    a = size[1, 1] - b - c - d
    return (float(max(a, 0)), float(max(b, 0)), float(max(c, 0)), float(max(d, 0))), max(count[1, 2] - count[1, 1], 0)


# -- the estimate ---------------------------------------------------------------------------------


def estimate_run(
    env_config: Any,
    *,
    shapes: dict[str, tuple[int, ...]],
    segment_steps: int | None,
    capture: bool,
    log_every: int,
    iterations: int,
    cuda: bool = False,
    probe: tuple[float, float, float, float] | None = None,
    step_arrays: int = 0,
    segment_graphs: bool = False,
    step_io: bool = False,
) -> Estimate:
    """The bytes a run needs (module docstring); without ``probe`` the env's own arrays are
    left out and the result is a floor.

    Args:
        env_config: The env config the run builds (after the task's ``training_config``).
        shapes: The parameters' shapes (``Task.flat_shapes``).
        segment_steps: ``memory.segment_steps`` as resolved (None: the whole horizon on one tape).
        capture: Whether a graph may be captured (``capture`` is not false).
        log_every: Rows of the device history.
        iterations: Iterations of the run.
        cuda: Whether the arrays live on a CUDA device.
        probe: The env's ``(a, b, c, d)`` (:func:`probe_env`).
        step_arrays: The Warp arrays the env holds per step (:func:`probe_env`; 0: unknown).
        segment_graphs: The segments share their captured graphs
            (:func:`harness.memory.segment_graph_blocker` is None).
        step_io: The task keeps every step's observation and action (a policy's inputs and
            outputs, with their gradients): the whole horizon's, and in segments that share
            their graphs one segment's more.
    """
    worlds, horizon = int(env_config.world_count), int(env_config.horizon)
    kept = int(segment_steps or horizon)
    starts = math.ceil(horizon / kept) - 1
    observed = sum(env_config.observable_dims().values())
    per_step_io = env_config.observation_dim() + env_config.action_dim()
    graphed = min(horizon, SEGMENT_GRAPH_KINDS * kept) if segment_graphs and segment_steps else horizon
    device = {
        "parameters": PARAMETER_COPIES * 4 * sum(math.prod(shape) for shape in shapes.values()),
        "observables": 2 * 4 * observed * worlds * (horizon - kept if probe else horizon),
        "step_inputs": 2 * 4 * per_step_io * worlds * (horizon + (kept if segment_graphs else 0)) if step_io else 0,
        "history": 4 * HISTORY_COLUMNS * log_every,
    }
    if probe is not None:
        a, b, c, d = probe
        per_step = c + d * worlds
        taped = CAPTURED_STEP_FACTOR if capture else EAGER_STEP_FACTOR
        device["env"] = int(a + b * worlds + kept * per_step * taped + starts * per_step / 2)
    per_arrays = HOST_BYTES_PER_STEP_ARRAY * step_arrays
    host = {
        "tape": max(STEP_HOST_BYTES, per_arrays) * kept,
        "segments": (
            max(SEGMENT_HOST_BYTES_PER_STEP, SEGMENT_HOST_BYTES_PER_STEP_ARRAY * step_arrays) * horizon
            if segment_steps
            else 0
        ),
        "graph": max(GRAPH_BYTES_PER_STEP, per_arrays) * graphed if capture and not cuda else 0,
        "history_readback": 4 * HISTORY_COLUMNS * log_every,
        "tallies": TALLY_BYTES_PER_ITERATION * iterations,
        "process": PROCESS_BYTES,
    }
    parts = {**{f"device/{k}": int(v) for k, v in device.items()}, **{f"host/{k}": int(v) for k, v in host.items()}}
    if cuda:
        return Estimate(host=int(sum(host.values())), device=int(sum(device.values())), parts=parts, floor=not probe)
    return Estimate(host=int(sum(host.values()) + sum(device.values())), device=0, parts=parts, floor=not probe)


# -- what is free ---------------------------------------------------------------------------------


def check_memory(
    cfg: Any,
    run: Any = None,
    *,
    env_config: Any = None,
    probe: bool = True,
    training: bool = True,
    error: Callable[[str], Exception] | None = None,
) -> Estimate:
    """Refuse a run whose estimated memory exceeds what is free, in one line naming the sizes,
    the estimate, what is available and what would fit; first the floor (no Newton import, no
    kernel), then, with ``probe``, the estimate with the env's own arrays measured on probe envs.

    Args:
        cfg: The composed config (``env``, ``device``; a run's loop settings come from ``run``).
        run: The validated :class:`harness.build.Run` (its task, settings and segment steps);
            None for one rollout of the env with its actions given (``harness record``).
        env_config: The env config the command builds (default: the task's training config).
        probe: Build the probe envs (else only the floor is checked).
        training: A training run (else one evaluation rollout: segments are no remedy).
        error: Makes the exception raised (default :class:`harness.config.ConfigError`).

    Returns:
        The estimate.
    """
    import warp as wp

    from harness import init_warp
    from harness.config import ConfigError, check_device, check_env_fields
    from harness.memory import shares_segment_graphs

    env_class, fields = check_env_fields(cfg)
    if env_config is None:
        env_config = run.task.training_config(fields) if run is not None else fields
    init_warp(check_environment=False)
    if run is not None:
        settings = run.settings
        device = wp.get_device(settings.device)
        steps = run.segment_steps if run.segment_steps is not None and run.segment_steps <= env_config.horizon else None
        common = {
            "shapes": run.task.flat_shapes(env_config),
            "segment_steps": steps,
            "capture": settings.capture is not False,
            "log_every": settings.log_every,
            "iterations": settings.iterations,
            "segment_graphs": steps is not None and shares_segment_graphs(env_class, run.task),
            "step_io": _observes(run.task),
        }
    else:
        from harness import devices

        device = wp.get_device(devices.resolve(check_device(cfg.get("device")), env_config.world_count)[0])
        steps = None
        shape = (env_config.horizon, env_config.world_count, env_config.action_dim())
        common = {
            "shapes": {"controls": shape},
            "segment_steps": None,
            "capture": False,
            "log_every": 1,
            "iterations": 1,
        }
    common["cuda"] = device.is_cuda
    make = error or ConfigError
    # segments help a training run whose env can run in them and does not yet
    segmentable = run is not None and steps is None and env_class.segment_blocker(env_config) is None and training
    loop = {"log_every": common["log_every"], "iterations": common["iterations"]}
    estimate = estimate_run(env_config, **common)
    _refuse_if_too_big(estimate, env_config, device, make, suggest_segments=segmentable, loop=loop)
    if probe:
        try:
            sizes, step_arrays = probe_env(env_class, dataclasses.replace(env_config, horizon=1, world_count=1), device)
        except Exception:  # an env that cannot be built this small: the floor stands, the build reports
            return estimate
        estimate = estimate_run(env_config, **common, probe=sizes, step_arrays=step_arrays)
        _refuse_if_too_big(estimate, env_config, device, make, suggest_segments=segmentable, loop=loop)
    return estimate


def _observes(task: Any) -> bool:
    """Whether ``task`` maps observations to actions (it needs a :class:`harness.env.PolicyEnv`)
    and so keeps every step's observation and action."""
    from harness.env import PolicyEnv

    return PolicyEnv in task.required_roles()


def _refuse_if_too_big(
    estimate: Estimate,
    env_config: Any,
    device: Any,
    make: Callable[[str], Exception],
    *,
    suggest_segments: bool,
    loop: dict[str, int],
) -> None:
    host_free = available_host_bytes()
    cause = max(estimate.parts, key=estimate.parts.get)
    if cause.endswith("history") or cause.endswith("history_readback"):
        sizes, accepted = f"log_every={loop['log_every']}", "accepted: a smaller log_every"
    elif cause.endswith("tallies"):
        sizes, accepted = f"iterations={loop['iterations']}", "accepted: fewer iterations"
    else:
        sizes = f"env.world_count={env_config.world_count} x env.horizon={env_config.horizon}"
        accepted = (
            "accepted: fewer worlds, a shorter horizon, or memory.segment_steps=auto"
            if suggest_segments
            else "accepted: fewer worlds or a shorter horizon"
        )
    about = "at least" if estimate.floor else "about"
    if device.is_cuda:
        free = int(device.free_memory)
        if estimate.device * MARGIN > free:
            raise make(
                f"{sizes}: the run needs {about} {format_bytes(estimate.device)} on {device.alias}, "
                f"{format_bytes(free)} is free there; {accepted}"
            )
    if host_free is not None and estimate.host * MARGIN > host_free:
        where = " of host memory" if device.is_cuda else ""
        raise make(
            f"{sizes}: the run needs {about} {format_bytes(estimate.host)}{where}, "
            f"{format_bytes(host_free)} is available; {accepted}"
        )
