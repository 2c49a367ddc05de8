"""Learning-rate schedules that write the optimizer's device learning rate, and the clip-aware rule.

This module owns the ``schedule`` config group (``configs/schedule/``): :func:`constant`,
:func:`linear_warmup`, :func:`cosine_decay`, :func:`linear_decay` and :func:`step_decay`, each with an optional
clip-aware rule that lowers the rate when too many recent steps were clipped. A
:class:`Schedule` multiplies the optimizer's initial rate by a factor of the device step
counter: ``state["lr"] = base_lr * factor(k) * scale``, with ``k`` the number of steps
taken (the optimizer's device counter ``step``) and ``scale`` the clip-aware multiplier (1 unless it fired).

A schedule is a transformation (:mod:`harness.transform`): ``init(params, shared)`` reads
the optimizer's rate ``shared["lr"]``; one :meth:`Schedule.update` is one single-thread
launch that reads the optimizer's step counter ``shared["step"]`` (and the clip policy's
``clipped`` flag) on the device and writes ``shared["lr"]``: no host round trip, fixed
arguments, so it is captured in the same graph as the step. In the trainer's chain it runs
after the clip policy and before the optimizer, once per iteration; step ``k + 1`` then runs
at ``base_lr * factor(k)``, the rate ``torch.optim.lr_scheduler`` gives the ``k``-th step
when ``scheduler.step()`` follows ``optimizer.step()``.

Factors (``W`` = ``warmup_steps``, ``s`` = ``start_factor``, ``j = k - W``):

- warmup, ``k < W``: ``s + (1 - s) * k / W`` (``torch.optim.lr_scheduler.LinearLR``);
- constant: 1;
- cosine, ``T`` = ``decay_steps``, ``m`` = ``min_factor``:
  ``m + (1 - m) * (1 + cos(pi * min(j, T) / T)) / 2`` (``CosineAnnealingLR``, held at
  ``m`` after ``T`` instead of rising again);
- linear decay, ``T`` = ``decay_steps``, ``m`` = ``min_factor``: ``1 - (1 - m) * min(j, T) / T``
  (``LinearLR`` with ``end_factor`` m; SHAC's schedule, Xu et al. 2022);
- step: ``gamma ** (j // step_size)`` (``StepLR``).

The clip-aware rule (after the advice to lower the rate when many consecutive steps clip;
Pascanu et al. 2013 motivate clipping itself) keeps the clipped flags of the last
``clip_window`` steps. When the window is full and more than ``clip_fraction`` of it was
clipped, ``scale = max(scale * clip_factor, clip_min_scale)``, the firing is counted and
recorded with its step, and the window is emptied (the next firing needs ``clip_window``
new steps). :meth:`Schedule.read_reductions` reports firings at log intervals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import warp as wp

from harness import schema, tags
from harness.schema import field
from harness.transform import Shared

__all__ = [
    "SCHEDULES",
    "Schedule",
    "constant",
    "cosine_decay",
    "linear_decay",
    "linear_warmup",
    "register_schedule",
    "step_decay",
]

State = dict[str, wp.array]

_CONSTANT, _COSINE, _STEP, _LINEAR = 0, 1, 2, 3


@wp.kernel
def _schedule_kernel(
    kind: int,
    warmup_steps: int,
    start_factor: wp.float64,
    decay_steps: int,
    min_factor: wp.float64,
    step_size: int,
    gamma: wp.float64,
    clip_aware: int,
    clip_fraction: wp.float64,
    clip_factor: wp.float32,
    clip_min_scale: wp.float32,
    step: wp.array(dtype=wp.int32),
    clipped: wp.array(dtype=wp.int32),
    base_lr: wp.array(dtype=wp.float32),
    scale: wp.array(dtype=wp.float32),
    window: wp.array(dtype=wp.int32),
    window_seen: wp.array(dtype=wp.int32),
    window_clipped: wp.array(dtype=wp.int32),
    reductions: wp.array(dtype=wp.int32),
    last_reduction_step: wp.array(dtype=wp.int32),
    last_reduction_clipped: wp.array(dtype=wp.int32),
    lr: wp.array(dtype=wp.float32),
):
    k = step[0]
    if clip_aware != 0:
        size = window.shape[0]
        slot = window_seen[0] % size
        flag = wp.int32(0)
        if clipped[0] != 0:
            flag = wp.int32(1)
        count = window_clipped[0] - window[slot] + flag
        window[slot] = flag
        seen = window_seen[0] + 1
        if seen >= size and wp.float64(count) > clip_fraction * wp.float64(size):
            scale[0] = wp.max(scale[0] * clip_factor, clip_min_scale)
            reductions[0] = reductions[0] + 1
            last_reduction_step[0] = k
            last_reduction_clipped[0] = count
            for s in range(size):
                window[s] = 0
            count = wp.int32(0)
            seen = wp.int32(0)
        window_seen[0] = seen
        window_clipped[0] = count

    factor = wp.float64(1.0)
    if k < warmup_steps:
        factor = start_factor + (wp.float64(1.0) - start_factor) * wp.float64(k) / wp.float64(warmup_steps)
    elif kind == 1:
        j = wp.min(k - warmup_steps, decay_steps)
        cosine = wp.cos(wp.float64(wp.pi) * wp.float64(j) / wp.float64(decay_steps))
        factor = min_factor + (wp.float64(1.0) - min_factor) * (wp.float64(1.0) + cosine) / wp.float64(2.0)
    elif kind == 2:
        factor = wp.pow(gamma, wp.float64((k - warmup_steps) // step_size))
    elif kind == 3:
        j = wp.min(k - warmup_steps, decay_steps)
        factor = wp.float64(1.0) - (wp.float64(1.0) - min_factor) * wp.float64(j) / wp.float64(decay_steps)
    lr[0] = wp.float32(wp.float64(base_lr[0]) * factor * wp.float64(scale[0]))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule; built by the factories of this module.

    Attributes:
        name: The option name (``"constant"``, ``"linear_warmup"``, ``"cosine_decay"``, ``"step_decay"``): the
            factory's name, the file of ``configs/schedule/`` and what a checkpoint records.
        hyperparameters: The validated keyword arguments of the factory, for logs and hparams.
    """

    name: str
    hyperparameters: dict[str, Any]
    _kind: int
    _warmup_steps: int
    _start_factor: float
    _decay_steps: int = 1
    _min_factor: float = 0.0
    _step_size: int = 1
    _gamma: float = 1.0

    @property
    def clip_aware(self) -> bool:
        return bool(self.hyperparameters["clip_aware"])

    def init(self, params: Any, shared: Shared) -> State:
        """Allocate the schedule state (a transformation, :mod:`harness.transform`); the base
        rate is the optimizer's current rate, ``shared["lr"]`` (the optimizer publishes it).

        Args:
            params: The parameters (unused: the schedule only reads device scalars).
            shared: Holds ``lr`` (float32 ``(1,)``) and ``step`` (int32 ``(1,)``) of the optimizer,
                and, for the clip-aware rule, ``clipped`` (the clip policy's flag).

        Returns:
            ``"base_lr"`` (float32 ``(1,)``), ``"scale"`` (float32 ``(1,)``, the clip-aware
            multiplier), the window (``"window"`` int32 ``(clip_window,)``, ``"window_seen"``,
            ``"window_clipped"``) and the firing record (``"reductions"``, count;
            ``"last_reduction_step"``, ``-1`` before any; ``"last_reduction_clipped"``), all
            int32 ``(1,)`` unless stated.
        """
        del params
        lr = shared["lr"]
        device = lr.device
        state = {"base_lr": wp.clone(lr), "scale": wp.ones(1, dtype=wp.float32, device=device)}
        state["window"] = wp.zeros(self.hyperparameters["clip_window"], dtype=wp.int32, device=device)
        for key in ("window_seen", "window_clipped", "reductions", "last_reduction_clipped"):
            state[key] = wp.zeros(1, dtype=wp.int32, device=device)
        state["last_reduction_step"] = wp.full(1, -1, dtype=wp.int32, device=device)
        return state

    def update(self, params: Any, state: State, shared: Shared) -> None:
        """Write ``shared["lr"]`` for the coming step (one single-thread launch): call it after
        the clip policy and before the optimizer, once per iteration (the trainer's chain).

        Args:
            params: The parameters (unused).
            state: This schedule's state, updated in place.
            shared: ``step`` is read, ``lr`` written; ``clipped`` is read by the clip-aware rule.

        Raises:
            ValueError: If the clip-aware rule is on and no member publishes ``clipped``.
        """
        del params
        clipped = shared.get("clipped")
        if clipped is None:
            if self.clip_aware:
                raise ValueError("schedule: the clip-aware rule needs the clip state's 'clipped' flag")
            clipped = state["window_seen"]  # never read with the rule off
        hp = self.hyperparameters
        step = shared["step"]
        wp.launch(
            _schedule_kernel,
            dim=1,
            inputs=[
                self._kind,
                self._warmup_steps,
                wp.float64(self._start_factor),
                self._decay_steps,
                wp.float64(self._min_factor),
                self._step_size,
                wp.float64(self._gamma),
                int(self.clip_aware),
                wp.float64(hp["clip_fraction"]),
                wp.float32(hp["clip_factor"]),
                wp.float32(hp["clip_min_scale"]),
                step,
                clipped,
                *(state[key] for key in _STATE_ORDER),
                shared["lr"],
            ],
            device=step.device,
        )

    def stats(self, state: State) -> dict[str, wp.array]:
        """Device scalars to log every step, by statistic: ``lr_scale`` (float32 ``(1,)``)."""
        return {tags.LR_SCALE: state["scale"]}

    def scalars(self, state: State) -> dict[str, wp.array]:
        """:meth:`stats` by the TensorBoard tag of a single-group run (``optim/lr_scale``)."""
        return {tags.optim(stat): array for stat, array in self.stats(state).items()}

    def read_reductions(self, state: State) -> tuple[int, str | None]:
        """How often the clip-aware rule fired, and a line describing the latest firing.

        Host round trip: call at log intervals only.

        Returns:
            ``(count, message)``; the message is None before the first firing.
        """
        count = int(state["reductions"].numpy()[0])
        if count == 0:
            return 0, None
        hp = self.hyperparameters
        message = (
            f"clip-aware schedule: lr scale lowered to {float(state['scale'].numpy()[0]):.4g} at step "
            f"{int(state['last_reduction_step'].numpy()[0])}: {int(state['last_reduction_clipped'].numpy()[0])} of "
            f"the last {hp['clip_window']} steps were clipped (more than {hp['clip_fraction']:.0%}); "
            f"{count} reduction(s) so far"
        )
        return count, message


_STATE_ORDER = (
    "base_lr",
    "scale",
    "window",
    "window_seen",
    "window_clipped",
    "reductions",
    "last_reduction_step",
    "last_reduction_clipped",
)
"""Schedule state arrays in the order the kernel takes them."""


# --------------------------------------------------------------------------- arguments


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleArgs:
    """What every schedule takes: the warmup and the clip-aware rule (with its defaults,
    ``configs/base/schedule.yaml``). Types and ranges are checked by :mod:`harness.schema`."""

    warmup_steps: int = field(minimum=0)
    start_factor: float = field(minimum=0.0, maximum=1.0)
    clip_aware: bool = field(False)
    clip_window: int = field(20, minimum=1)
    clip_fraction: float = field(0.5, minimum=0.0, maximum=1.0, strict_maximum=True, doc="the rule fires above it")
    clip_factor: float = field(0.5, minimum=0.0, strict=True, maximum=1.0)
    clip_min_scale: float = field(0.01, minimum=0.0, maximum=1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CosineDecayArgs(ScheduleArgs):
    """:func:`cosine_decay`'s and :func:`linear_decay`'s arguments."""

    decay_steps: int = field(minimum=1)
    min_factor: float = field(minimum=0.0, maximum=1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepDecayArgs(ScheduleArgs):
    """:func:`step_decay`'s arguments."""

    step_size: int = field(minimum=1)
    gamma: float = field(minimum=0.0, strict=True, maximum=1.0)


def _build(name: str, kind: int, args_schema: type, **values: Any) -> Schedule:
    args = schema.check(args_schema, "schedule", **values)
    hyperparameters = dataclasses.asdict(args)
    # The schedule's own shape (decay_steps, gamma, ...): the fields beyond ScheduleArgs'.
    shared = {f.name for f in dataclasses.fields(ScheduleArgs)}
    private = {f"_{key}": value for key, value in hyperparameters.items() if key not in shared}
    return Schedule(name, hyperparameters, kind, args.warmup_steps, args.start_factor, **private)


def constant(**clip_rule: Any) -> Schedule:
    """The optimizer's rate unchanged (factor 1), optionally with the clip-aware rule.

    Args:
        **clip_rule: ``clip_aware`` (bool, default False), ``clip_window`` (int >= 1, 20),
            ``clip_fraction`` (in [0, 1), 0.5), ``clip_factor`` (in (0, 1], 0.5),
            ``clip_min_scale`` (in [0, 1], 0.01): see the module docstring.

    Returns:
        The schedule.

    Raises:
        ValueError: If an argument is out of range (the message names ``schedule.<field>``).
    """
    return _build("constant", _CONSTANT, ScheduleArgs, warmup_steps=0, start_factor=1.0, **clip_rule)


def linear_warmup(warmup_steps: int = 10, *, start_factor: float = 0.1, **clip_rule: Any) -> Schedule:
    """Linear warmup from ``start_factor`` to 1 over ``warmup_steps`` steps, then constant.

    ``factor(k) = start_factor + (1 - start_factor) * min(k, W) / W``, as
    ``torch.optim.lr_scheduler.LinearLR(start_factor, 1.0, total_iters=W)``.

    Args:
        warmup_steps: ``W``, steps until the full rate, ``>= 0`` (0: constant).
        start_factor: Factor of the first step, in ``[0, 1]`` (torch's default is 1/3).
        **clip_rule: The clip-aware rule, as in :func:`constant`.

    Returns:
        The schedule.

    Raises:
        ValueError: If an argument is out of range (the message names ``schedule.<field>``).
    """
    return _build(
        "linear_warmup", _CONSTANT, ScheduleArgs, warmup_steps=warmup_steps, start_factor=start_factor, **clip_rule
    )


def cosine_decay(
    decay_steps: int,
    *,
    min_factor: float = 0.0,
    warmup_steps: int = 0,
    start_factor: float = 0.1,
    **clip_rule: Any,
) -> Schedule:
    """Cosine decay (Loshchilov & Hutter 2017, SGDR without restarts) after an optional linear warmup.

    ``factor = m + (1 - m) * (1 + cos(pi * min(j, T) / T)) / 2`` with ``j = k - W``, as
    ``torch.optim.lr_scheduler.CosineAnnealingLR(T_max=T, eta_min=m * base_lr)``, held at
    ``m`` after ``T`` steps.

    Args:
        decay_steps: ``T``, steps from the full rate to ``min_factor``, ``>= 1``
            (``configs/schedule/cosine_decay.yaml`` sets it to the run's ``iterations``).
        min_factor: ``m``, final factor, in ``[0, 1]``.
        warmup_steps: Linear warmup steps before the decay, ``>= 0``.
        start_factor: Warmup factor of the first step, in ``[0, 1]``.
        **clip_rule: The clip-aware rule, as in :func:`constant`.

    Returns:
        The schedule.

    Raises:
        ValueError: If an argument is out of range (the message names ``schedule.<field>``).
    """
    return _decay("cosine_decay", _COSINE, decay_steps, min_factor, warmup_steps, start_factor, clip_rule)


def linear_decay(
    decay_steps: int,
    *,
    min_factor: float = 0.0,
    warmup_steps: int = 0,
    start_factor: float = 0.1,
    **clip_rule: Any,
) -> Schedule:
    """Linear decay from the full rate to ``min_factor`` of it over ``decay_steps`` steps, after an
    optional linear warmup; SHAC's schedule (Xu et al. 2022: ``lr = (lr_end - lr0) * epoch /
    epochs + lr0``, i.e. ``min_factor = lr_end / lr0``).

    ``factor = 1 - (1 - m) * min(j, T) / T`` with ``j = k - W``, as
    ``torch.optim.lr_scheduler.LinearLR(start_factor=1, end_factor=m, total_iters=T)``.
    The arguments, return value and errors are :func:`cosine_decay`'s
    (``configs/schedule/linear_decay.yaml`` sets ``decay_steps`` to the run's ``iterations``).
    """
    return _decay("linear_decay", _LINEAR, decay_steps, min_factor, warmup_steps, start_factor, clip_rule)


def _decay(
    name: str,
    kind: int,
    decay_steps: int,
    min_factor: float,
    warmup_steps: int,
    start_factor: float,
    clip_rule: dict[str, Any],
) -> Schedule:
    """The schedule of :func:`cosine_decay` or :func:`linear_decay` (``kind``: the kernel's curve)."""
    return _build(
        name,
        kind,
        CosineDecayArgs,
        decay_steps=decay_steps,
        min_factor=min_factor,
        warmup_steps=warmup_steps,
        start_factor=start_factor,
        **clip_rule,
    )


def step_decay(
    step_size: int,
    *,
    gamma: float = 0.1,
    warmup_steps: int = 0,
    start_factor: float = 0.1,
    **clip_rule: Any,
) -> Schedule:
    """Step decay: the rate is multiplied by ``gamma`` every ``step_size`` steps after an optional warmup.

    ``factor = gamma ** ((k - W) // step_size)``, as ``torch.optim.lr_scheduler.StepLR``.

    Args:
        step_size: Steps between two decays, ``>= 1``.
        gamma: Multiplier per decay, in ``(0, 1]``.
        warmup_steps, start_factor, **clip_rule: As in :func:`cosine_decay`, which also says
            what is returned and raised.
    """
    return _build(
        "step_decay",
        _STEP,
        StepDecayArgs,
        step_size=step_size,
        gamma=gamma,
        warmup_steps=warmup_steps,
        start_factor=start_factor,
        **clip_rule,
    )


SCHEDULES = {f.__name__: f for f in (constant, linear_warmup, cosine_decay, linear_decay, step_decay)}
"""Factories by option name; the same names as the files of ``configs/schedule/``, and those
:func:`register_schedule` adds. A config's ``schedule._target_`` must name one of these
factories (:mod:`harness.targets` checks it before anything is called)."""


def register_schedule(factory: Callable[..., Schedule]) -> Callable[..., Schedule]:
    """Accept ``factory`` as a ``schedule._target_`` under its ``__name__``; returns it, so it
    can decorate the factory (a module of your own calls it when imported; a config names the
    factory by its dotted path, which the check imports before it looks the factory up).

    Raises:
        ValueError: ``factory`` is not callable, or a factory of another path holds its name.
    """
    from harness.registry import register_factory

    return register_factory(SCHEDULES, factory, "register_schedule", "a Schedule")
