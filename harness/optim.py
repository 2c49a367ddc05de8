"""Optimizers whose whole state, step counter and learning rate included, lives in device arrays.

This module owns the update rules users know from PyTorch and from ScheduleFree, and the
one :class:`Optimizer` type that applies them, both to the trainer's flat
:class:`~harness.params.ParamSet` and to a plain list of Warp arrays (the functional API,
:func:`build`). Options, by the name of their file in ``configs/optim/``:

- ``sgd``: :func:`sgd`, ``torch.optim.SGD`` (momentum, dampening, Nesterov, L2 decay).
- ``adam``: :func:`adam`, ``torch.optim.Adam`` (L2 decay, AMSGrad).
- ``adamw``: :func:`adamw`, ``torch.optim.AdamW`` (decoupled decay, AMSGrad).
- ``adam_warp``: :func:`adam_warp`, ``warp.optim.Adam`` (what Newton's diffsim examples use).
- ``sgd_schedulefree``, ``adamw_schedulefree``: :func:`sgd_schedulefree`,
  :func:`adamw_schedulefree`, the reference classes ``SGDScheduleFreeReference`` and
  ``AdamWScheduleFreeReference`` of facebookresearch/schedule_free (Defazio et al. 2024).

One step is a single-thread *advance* launch, which increments the device step counter and
derives that step's scalars (bias corrections, the ScheduleFree averaging weight) from it
and from the device learning rate ``state["lr"]``, then one elementwise *update* launch per
flat buffer: two launches for a ``ParamSet``, ``1 + len(arrays)`` for a list (each array is
stepped through a float32 alias of its memory, no copy). Kernel arguments never change between steps and
nothing is read back to the host, so a CUDA graph that captured one step replays the next
with the right values. No rule writes the gradient: statistics read after ``step`` see the
gradient that was applied (the in-place division of the memory-efficient ScheduleFree
AdamW, schedule_free issue #68, cannot happen here).

Every buffer of the state has the layout of the flat parameter buffer (the parameters
concatenated in order, vectors as their float32 components), so a state is a plain
``dict[str, wp.array]`` that :func:`save_state` / :func:`load_state` move to and from NumPy
exactly, and the same state serves a ``ParamSet`` or the list of its views.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import warp as wp

from harness import schema, tags
from harness.params import ParamSet, flat_view
from harness.schema import field
from harness.transform import Shared

__all__ = [
    "OPTIMIZERS",
    "Optimizer",
    "adam",
    "adam_warp",
    "adamw",
    "adamw_schedulefree",
    "build",
    "load_state",
    "register_optimizer",
    "save_state",
    "sgd",
    "sgd_schedulefree",
]

Params = ParamSet | Sequence[wp.array]
"""What an optimizer steps: the trainer's flat ``ParamSet`` or a list of contiguous float32-based Warp arrays."""

State = dict[str, wp.array]


@dataclasses.dataclass(frozen=True)
class _Segment:
    """One contiguous run of parameters, as float32 aliases, at ``offset`` in the state buffers."""

    param: wp.array
    grad: wp.array
    offset: int


def _float32_alias(array: wp.array, what: str) -> wp.array:
    """A 1-d float32 view of a contiguous float32-based array (a ``vec3`` array as its 3n components)."""
    if not isinstance(array, wp.array):
        raise TypeError(f"{what} must be a Warp array, got {type(array).__name__}")
    scalar = array.dtype if array.dtype is wp.float32 else getattr(array.dtype, "_wp_scalar_type_", None)
    if scalar is not wp.float32:
        raise TypeError(f"{what} must hold float32 data (float32, vec3, ...), got {array.dtype}")
    if not array.is_contiguous:
        raise ValueError(f"{what} must be contiguous")
    if array.dtype is wp.float32 and array.ndim == 1:
        return array
    count = array.size * (1 if array.dtype is wp.float32 else int(wp.types.type_size(array.dtype)))
    components = array if array.dtype is wp.float32 else array.view(wp.float32)  # Warp's views keep `array` alive
    return components.reshape((count,))


def _flat_params(params: Params) -> list[tuple[wp.array, int]]:
    """Each parameter buffer as a float32 alias with its offset in the state buffers."""
    if isinstance(params, ParamSet):
        return [(params.data, 0)]
    if not params:
        raise ValueError("an optimizer needs at least one parameter array")
    flat, offset = [], 0
    for k, p in enumerate(params):
        alias = _float32_alias(p, f"params[{k}]")
        flat.append((alias, offset))
        offset += alias.shape[0]
    return flat


def _segments(params: Params, grads: wp.array | Sequence[wp.array] | None) -> list[_Segment]:
    if isinstance(params, ParamSet):
        grad = params.grad if grads is None else grads
        if not isinstance(grad, wp.array) or grad.dtype is not wp.float32 or grad.shape != params.data.shape:
            raise ValueError(f"grads of a ParamSet must be one float32 array of shape {params.data.shape}")
        return [_Segment(params.data, grad, 0)]
    grads = [p.grad for p in params] if grads is None else list(grads)
    if len(grads) != len(params):
        raise ValueError(f"got {len(grads)} gradient arrays for {len(params)} parameter arrays")
    segments = []
    for k, ((alias, offset), p, g) in enumerate(zip(_flat_params(params), params, grads, strict=True)):
        if g is None or g.dtype != p.dtype or g.shape != p.shape:
            raise ValueError(f"grads[{k}] must match params[{k}] ({p.dtype.__name__} {p.shape})")
        segments.append(_Segment(alias, _float32_alias(g, f"grads[{k}]"), offset))
    return segments


def _device(params: Params) -> wp.context.Device:
    return params.device if isinstance(params, ParamSet) else wp.get_device(params[0].device)


@dataclasses.dataclass(frozen=True, eq=False)
class Optimizer:
    """An update rule with its state in device arrays; built by the factories of this module.

    The rule is given by the factory through the private fields; the public methods are the
    same for every rule.

    Attributes:
        name: The option name (``"sgd"``, ``"adamw_schedulefree"``, ...), as in ``configs/optim/``.
        hyperparameters: The validated keyword arguments of the factory, for logs and hparams.
    """

    name: str
    hyperparameters: Mapping[str, Any]
    _buffers: tuple[tuple[str, bool], ...]
    """Flat per-entry buffers as ``(key, starts_as_copy_of_params)``; the others start at zero."""
    _scalars: Callable[[wp.context.Device], State]
    _advance: Callable[[State], None]
    _update: Callable[[_Segment, State], None]
    _tags: tuple[tuple[str, str], ...]
    """``(statistic, state key)`` of the device scalars logged every step."""
    _eval_buffer: str | None = None

    @property
    def lr(self) -> float:
        """The initial learning rate, i.e. the value ``init`` writes into ``state["lr"]``."""
        return float(self.hyperparameters["lr"])

    def init(self, params: Params, shared: Shared | None = None) -> State:
        """Allocate the state on the parameters' device (a transformation's init,
        :mod:`harness.transform`: ``lr`` and ``step`` are published in ``shared``, where a
        schedule reads and writes them).

        Args:
            params: A ``ParamSet`` or a list of contiguous arrays of float32 or float32
                vectors/matrices (``wp.vec3``, ...).
            shared: Where to publish ``lr`` and ``step`` (inside a chain).

        Returns:
            The state: always ``"step"`` (int32 ``(1,)``, steps taken) and ``"lr"`` (float32
            ``(1,)``, the learning rate the next step reads; a schedule may overwrite it), plus
            the rule's flat buffers (one entry per float32 parameter component) and scalars.
        """
        device = _device(params)
        flat = _flat_params(params)
        size = flat[-1][1] + flat[-1][0].shape[0]
        state = {
            "step": wp.zeros(1, dtype=wp.int32, device=device),
            "lr": wp.full(1, self.lr, dtype=wp.float32, device=device),
            **self._scalars(device),
        }
        for key, from_params in self._buffers:
            buffer = wp.zeros(size, dtype=wp.float32, device=device)
            if from_params:
                for alias, offset in flat:
                    wp.copy(buffer, alias, dest_offset=offset, count=alias.shape[0])
            state[key] = buffer
        if shared is not None:
            shared.publish("lr", state["lr"])
            shared.publish("step", state["step"])
        return state

    def update(self, params: ParamSet, state: State, shared: Shared) -> None:
        """One step from ``params.grad`` (the transformation's update; :meth:`step` for lists of arrays)."""
        del shared
        self.step(params, params.grad, state)

    def step(self, params: Params, grads: wp.array | Sequence[wp.array] | None, state: State) -> State:
        """Apply one update to ``params`` in place from ``grads``, which are never written.

        One advance launch, then one update launch per flat buffer (see the module
        docstring); no host round trip.

        Args:
            params: The parameters given to ``init`` (the same ``ParamSet``, or arrays of the
                same shapes and dtypes in the same order).
            grads: For a ``ParamSet``, one flat float32 array of its size (normally
                ``params.grad``); for a list, one array per parameter, same dtype and shape.
                None takes the parameters' own gradient buffers (``.grad``).
            state: The state from ``init`` (or a loaded one); updated in place.

        Returns:
            ``state`` itself.
        """
        segments = _segments(params, grads)
        size = segments[-1].offset + segments[-1].param.shape[0]
        for key, _ in self._buffers:
            if state[key].shape[0] != size:
                raise ValueError(f"state['{key}'] holds {state[key].shape[0]} entries, params have {size}")
        self._advance(state)
        for seg in segments:
            self._update(seg, state)
        return state

    def eval_params(self, params: Params, state: State) -> wp.array | list[wp.array]:
        """The parameters to evaluate or save.

        ScheduleFree trains at ``y`` and returns the averaged sequence ``x``; every other rule
        returns the parameters themselves.

        Args:
            params: The parameters the optimizer steps.
            state: Their state.

        Returns:
            For a ``ParamSet``, a flat float32 array (``params.data`` or ``state["x"]``); for a
            list, arrays of the parameters' dtypes and shapes (the arrays themselves, or views
            into ``state["x"]``).
        """
        if self._eval_buffer is None:
            return params.data if isinstance(params, ParamSet) else list(params)
        flat = state[self._eval_buffer]
        if isinstance(params, ParamSet):
            return flat
        views = []
        for p, (_, offset) in zip(params, _flat_params(params), strict=True):
            views.append(flat_view(flat, offset, p.shape, p.dtype))
        return views

    def stats(self, state: State) -> dict[str, wp.array]:
        """Device scalars to log every step, by statistic (:mod:`harness.tags`).

        ``lr`` is the learning rate the last step applied (for ScheduleFree, after its
        warmup); ScheduleFree adds ``avg_weight``, the weight ``c`` of the last step's
        ``x = (1 - c) x + c z``. Each value is a float32 ``(1,)`` array of ``state``.
        """
        return {stat: state[key] for stat, key in self._tags}

    def scalars(self, state: State) -> dict[str, wp.array]:
        """:meth:`stats` by the TensorBoard tag of a single-group run (``optim/lr``)."""
        return {tags.optim(stat): array for stat, array in self.stats(state).items()}


# --------------------------------------------------------------------------- validation


# The arguments of each optimizer, as schemas (types and ranges, checked by harness.schema
# whether Hydra or Python calls the factory; the factory's signature holds the defaults).


def _lr() -> Any:
    return field(minimum=0.0, doc="learning rate")


def _decay() -> Any:
    return field(minimum=0.0, doc="weight decay coefficient")


def _betas() -> Any:
    return field(minimum=0.0, maximum=1.0, strict_maximum=True, length=2, doc="(b1, b2), each in [0, 1)")


def _eps() -> Any:
    return field(minimum=0.0, strict=True, doc="added to the denominator")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SGDArgs:
    """:func:`sgd`'s arguments."""

    lr: float = _lr()
    momentum: float = field(minimum=0.0)
    dampening: float = field(minimum=0.0, maximum=1.0)
    nesterov: bool = field()
    weight_decay: float = _decay()

    def check(self) -> None:
        if self.nesterov and not (self.momentum > 0.0 and self.dampening == 0.0):
            raise ValueError("nesterov: must be false unless momentum > 0 and dampening = 0, got True")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdamWarpArgs:
    """:func:`adam_warp`'s arguments."""

    lr: float = _lr()
    betas: tuple[float, ...] = _betas()
    eps: float = _eps()


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdamArgs:
    """:func:`adam`'s and :func:`adamw`'s arguments."""

    lr: float = _lr()
    betas: tuple[float, ...] = _betas()
    eps: float = _eps()
    weight_decay: float = _decay()
    amsgrad: bool = field()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleFreeArgs:
    """What :func:`sgd_schedulefree` and :func:`adamw_schedulefree` share."""

    lr: float = _lr()
    weight_decay: float = _decay()
    warmup_steps: int = field(minimum=0)
    r: float = field(minimum=0.0)
    weight_lr_power: float = field(minimum=0.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SGDScheduleFreeArgs(ScheduleFreeArgs):
    """:func:`sgd_schedulefree`'s arguments."""

    momentum: float = field(minimum=0.0, strict=True, maximum=1.0, strict_maximum=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdamWScheduleFreeArgs(ScheduleFreeArgs):
    """:func:`adamw_schedulefree`'s arguments."""

    betas: tuple[float, ...] = _betas()
    eps: float = _eps()
    decay_at_z: bool = field()


# --------------------------------------------------------------------------- SGD


@wp.kernel
def _advance_step_kernel(step: wp.array(dtype=wp.int32)):
    step[0] = step[0] + 1


@wp.kernel
def _sgd_kernel(
    offset: int,
    momentum: float,
    dampening: float,
    weight_decay: float,
    nesterov: int,
    lr: wp.array(dtype=wp.float32),
    step: wp.array(dtype=wp.int32),
    grad: wp.array(dtype=wp.float32),
    param: wp.array(dtype=wp.float32),
    momentum_buffer: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    p = param[i]
    g = grad[i]
    if weight_decay != 0.0:
        g = g + weight_decay * p
    if momentum != 0.0:
        j = offset + i
        b = g
        # The counter was advanced before this launch: 1 is the first step, when torch
        # initialises the buffer with the gradient itself.
        if step[0] > 1:
            b = momentum * momentum_buffer[j] + (1.0 - dampening) * g
        momentum_buffer[j] = b
        if nesterov != 0:
            g = g + momentum * b
        else:
            g = b
    param[i] = p - lr[0] * g


@schema.checked(SGDArgs, "optim")
def sgd(
    lr: float = 1e-3,
    *,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> Optimizer:
    """Stochastic gradient descent with ``torch.optim.SGD`` semantics (Sutskever et al. 2013 for Nesterov).

    With ``g = grad + weight_decay * p`` (L2 penalty), ``t`` the step number from 1:
    ``b = g`` if ``t = 1`` else ``b = momentum * b + (1 - dampening) * g``; the direction is
    ``g + momentum * b`` with Nesterov, ``b`` otherwise (``g`` when ``momentum = 0``);
    ``p -= lr * direction``. State: ``"momentum_buffer"`` (only when ``momentum > 0``).

    Args:
        lr: Learning rate, ``>= 0`` (torch's default 1e-3); the initial ``state["lr"]``.
        momentum: Momentum factor, ``>= 0``.
        dampening: Dampening of the gradient in the momentum buffer, in ``[0, 1]``.
        nesterov: Nesterov momentum; needs ``momentum > 0`` and ``dampening = 0`` (as torch).
        weight_decay: L2 penalty coefficient added to the gradient, ``>= 0``.

    Returns:
        The optimizer.

    Raises:
        ValueError: If an argument is out of range (the message names ``optim.<field>``).
    """

    def advance(state: State) -> None:
        wp.launch(_advance_step_kernel, dim=1, inputs=[state["step"]], device=state["step"].device)

    def update(seg: _Segment, state: State) -> None:
        wp.launch(
            _sgd_kernel,
            dim=seg.param.shape[0],
            inputs=[
                seg.offset,
                momentum,
                dampening,
                weight_decay,
                int(nesterov),
                state["lr"],
                state["step"],
                seg.grad,
                seg.param,
                # Never read without momentum: any float32 array stands in.
                state["momentum_buffer"] if momentum > 0.0 else state["lr"],
            ],
            device=seg.param.device,
        )

    return Optimizer(
        name="sgd",
        hyperparameters={
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "nesterov": nesterov,
            "weight_decay": weight_decay,
        },
        _buffers=(("momentum_buffer", False),) if momentum > 0.0 else (),
        _scalars=lambda device: {},
        _advance=advance,
        _update=update,
        _tags=((tags.LR, "lr"),),
    )


# --------------------------------------------------------------------------- Adam, AdamW


@wp.kernel
def _adam_advance_kernel(
    beta1: wp.float64,
    beta2: wp.float64,
    weight_decay: wp.float64,
    lr: wp.array(dtype=wp.float32),
    step: wp.array(dtype=wp.int32),
    step_size: wp.array(dtype=wp.float32),
    bias_correction2_sqrt: wp.array(dtype=wp.float32),
    decay_factor: wp.array(dtype=wp.float32),
):
    t = step[0] + 1
    step[0] = t
    # In float64, as torch computes these on the host for a non-capturable Adam.
    tf = wp.float64(t)
    lr64 = wp.float64(lr[0])
    step_size[0] = wp.float32(lr64 / (wp.float64(1.0) - wp.pow(beta1, tf)))
    bias_correction2_sqrt[0] = wp.float32(wp.sqrt(wp.float64(1.0) - wp.pow(beta2, tf)))
    decay_factor[0] = wp.float32(wp.float64(1.0) - lr64 * weight_decay)


@wp.kernel
def _adam_kernel(
    offset: int,
    beta1_weight: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled: int,
    amsgrad: int,
    step_size: wp.array(dtype=wp.float32),
    bias_correction2_sqrt: wp.array(dtype=wp.float32),
    decay_factor: wp.array(dtype=wp.float32),
    grad: wp.array(dtype=wp.float32),
    param: wp.array(dtype=wp.float32),
    exp_avg: wp.array(dtype=wp.float32),
    exp_avg_sq: wp.array(dtype=wp.float32),
    max_exp_avg_sq: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    j = offset + i
    p = param[i]
    g = grad[i]
    if weight_decay != 0.0:
        if decoupled != 0:
            p = p * decay_factor[0]
        else:
            g = g + weight_decay * p
    # m.lerp(g, 1 - beta1), in the two-sided form torch's lerp uses.
    m = exp_avg[j]
    if beta1_weight < 0.5:
        m = m + beta1_weight * (g - m)
    else:
        m = g - (g - m) * (1.0 - beta1_weight)
    v = beta2 * exp_avg_sq[j] + (1.0 - beta2) * g * g
    exp_avg[j] = m
    exp_avg_sq[j] = v
    if amsgrad != 0:
        v = wp.max(max_exp_avg_sq[j], v)
        max_exp_avg_sq[j] = v
    denom = wp.sqrt(v) / bias_correction2_sqrt[0] + eps
    param[i] = p - step_size[0] * m / denom


def _adam_family(
    name: str, lr: object, betas: object, eps: object, weight_decay: object, amsgrad: object, *, decoupled: bool
) -> Optimizer:
    beta1, beta2 = betas

    def scalars(device: wp.context.Device) -> State:
        return {key: wp.zeros(1, dtype=wp.float32, device=device) for key in _ADAM_SCALARS}

    def advance(state: State) -> None:
        wp.launch(
            _adam_advance_kernel,
            dim=1,
            inputs=[
                wp.float64(beta1),
                wp.float64(beta2),
                wp.float64(weight_decay if decoupled else 0.0),
                state["lr"],
                state["step"],
                *(state[key] for key in _ADAM_SCALARS),
            ],
            device=state["step"].device,
        )

    def update(seg: _Segment, state: State) -> None:
        wp.launch(
            _adam_kernel,
            dim=seg.param.shape[0],
            inputs=[
                seg.offset,
                1.0 - beta1,
                beta2,
                eps,
                weight_decay,
                int(decoupled),
                int(amsgrad),
                *(state[key] for key in _ADAM_SCALARS),
                seg.grad,
                seg.param,
                state["exp_avg"],
                state["exp_avg_sq"],
                # Never read without AMSGrad: any float32 array stands in.
                state["max_exp_avg_sq"] if amsgrad else state["lr"],
            ],
            device=seg.param.device,
        )

    buffers = ("exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if amsgrad else ()))
    return Optimizer(
        name=name,
        hyperparameters={
            "lr": lr,
            "betas": (beta1, beta2),
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
        },
        _buffers=tuple((key, False) for key in buffers),
        _scalars=scalars,
        _advance=advance,
        _update=update,
        _tags=((tags.LR, "lr"),),
    )


_ADAM_SCALARS = ("step_size", "bias_correction2_sqrt", "decay_factor")
"""Per-step scalars the Adam advance kernel derives from the counter and the learning rate."""


@schema.checked(AdamArgs, "optim")
def adam(
    lr: float = 1e-3,
    *,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    amsgrad: bool = False,
) -> Optimizer:
    """Adam (Kingma & Ba 2015) with ``torch.optim.Adam`` semantics: L2 decay, optional AMSGrad.

    With ``g = grad + weight_decay * p`` and ``t`` the step number from 1:
    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``, ``v' = max(v', v)`` with AMSGrad
    (Reddi et al. 2018, the maximum of the raw ``v`` as torch keeps it) else ``v' = v``,
    ``p -= lr / (1 - b1^t) * m / (sqrt(v') / sqrt(1 - b2^t) + eps)``.
    The bias corrections come from the device counter, in float64, in the advance launch.
    State: ``"exp_avg"``, ``"exp_avg_sq"``, ``"max_exp_avg_sq"`` (AMSGrad only) and the
    derived scalars ``"step_size"``, ``"bias_correction2_sqrt"``, ``"decay_factor"``.

    Args:
        lr: Learning rate, ``>= 0`` (torch's default 1e-3); the initial ``state["lr"]``.
        betas: Decay rates ``(b1, b2)`` of the moments, each in ``[0, 1)``; any 2-sequence
            (tuple, list, Hydra ``ListConfig``).
        eps: Added to the denominator, ``> 0``.
        weight_decay: L2 penalty coefficient added to the gradient, ``>= 0``.
        amsgrad: Normalise by the running maximum of the second moment.

    Returns:
        The optimizer.

    Raises:
        ValueError: If an argument is out of range (the message names ``optim.<field>``).
    """
    return _adam_family("adam", lr, betas, eps, weight_decay, amsgrad, decoupled=False)


@schema.checked(AdamArgs, "optim")
def adamw(
    lr: float = 1e-3,
    *,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    amsgrad: bool = False,
) -> Optimizer:
    """AdamW (Loshchilov & Hutter 2019) with ``torch.optim.AdamW`` semantics: decoupled decay.

    As :func:`adam` with ``g = grad`` and, before the update, ``p *= 1 - lr * weight_decay``
    (the decay scales with the learning rate but not with the moments).

    Args:
        lr: Learning rate, ``>= 0`` (torch's default 1e-3); the initial ``state["lr"]``.
        betas: Decay rates ``(b1, b2)`` of the moments, each in ``[0, 1)``.
        eps: Added to the denominator, ``> 0``.
        weight_decay: Decoupled decay coefficient, ``>= 0`` (torch's default 1e-2).
        amsgrad: Normalise by the running maximum of the second moment.

    Returns:
        The optimizer.

    Raises:
        ValueError: If an argument is out of range (the message names ``optim.<field>``).
    """
    return _adam_family("adamw", lr, betas, eps, weight_decay, amsgrad, decoupled=True)


# --------------------------------------------------------------------------- ScheduleFree

_SCHEDULEFREE_SCALARS = (
    ("scheduled_lr", wp.float32, 0.0),
    ("avg_weight", wp.float32, 0.0),
    ("bias_correction2", wp.float32, 1.0),
    ("lr_max", wp.float64, -1.0),
    ("weight_sum", wp.float64, 0.0),
)
"""ScheduleFree scalars: the per-step values of the advance kernel and the running lr_max and weight sum."""


@wp.kernel
def _schedulefree_advance_kernel(
    warmup_steps: int,
    r: wp.float64,
    weight_lr_power: wp.float64,
    beta2: wp.float64,
    lr: wp.array(dtype=wp.float32),
    step: wp.array(dtype=wp.int32),
    scheduled_lr: wp.array(dtype=wp.float32),
    avg_weight: wp.array(dtype=wp.float32),
    bias_correction2: wp.array(dtype=wp.float32),
    lr_max: wp.array(dtype=wp.float64),
    weight_sum: wp.array(dtype=wp.float64),
):
    k = step[0]
    kp1 = wp.float64(k + 1)
    sched = wp.float64(1.0)
    if k < warmup_steps:
        sched = kp1 / wp.float64(warmup_steps)
    lr_k = wp.float64(lr[0]) * sched
    top = wp.max(lr_k, lr_max[0])
    weight = wp.pow(kp1, r) * wp.pow(top, weight_lr_power)
    total = weight_sum[0] + weight
    c = wp.float64(0.0)
    # A zero sum (lr = 0 so far) gives c = 0, as the reference's ZeroDivisionError branch.
    if total != wp.float64(0.0):
        c = weight / total
    scheduled_lr[0] = wp.float32(lr_k)
    avg_weight[0] = wp.float32(c)
    bias_correction2[0] = wp.float32(wp.float64(1.0) - wp.pow(beta2, kp1))
    lr_max[0] = top
    weight_sum[0] = total
    step[0] = k + 1


@wp.kernel
def _sgd_schedulefree_kernel(
    offset: int,
    momentum: float,
    weight_decay: float,
    scheduled_lr: wp.array(dtype=wp.float32),
    avg_weight: wp.array(dtype=wp.float32),
    grad: wp.array(dtype=wp.float32),
    param: wp.array(dtype=wp.float32),
    z: wp.array(dtype=wp.float32),
    x: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    j = offset + i
    y = param[i]
    g = grad[i]
    if weight_decay != 0.0:
        g = g + weight_decay * y
    c = avg_weight[0]
    z_new = z[j] - scheduled_lr[0] * g
    x_new = x[j] * (1.0 - c) + c * z_new
    z[j] = z_new
    x[j] = x_new
    param[i] = momentum * x_new + (1.0 - momentum) * z_new


@wp.kernel
def _adamw_schedulefree_kernel(
    offset: int,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decay_at_z: int,
    scheduled_lr: wp.array(dtype=wp.float32),
    avg_weight: wp.array(dtype=wp.float32),
    bias_correction2: wp.array(dtype=wp.float32),
    grad: wp.array(dtype=wp.float32),
    param: wp.array(dtype=wp.float32),
    z: wp.array(dtype=wp.float32),
    x: wp.array(dtype=wp.float32),
    exp_avg_sq: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    j = offset + i
    y = param[i]
    g = grad[i]
    lr = scheduled_lr[0]
    z_new = z[j]
    if weight_decay != 0.0:
        point = y
        if decay_at_z != 0:
            point = z_new
        z_new = z_new - lr * weight_decay * point
    v = beta2 * exp_avg_sq[j] + (1.0 - beta2) * g * g
    exp_avg_sq[j] = v
    z_new = z_new - lr * g / (wp.sqrt(v / bias_correction2[0]) + eps)
    c = avg_weight[0]
    x_new = x[j] * (1.0 - c) + c * z_new
    z[j] = z_new
    x[j] = x_new
    param[i] = beta1 * x_new + (1.0 - beta1) * z_new


def _schedulefree(
    name: str,
    lr: float,
    hyperparameters: dict[str, Any],
    beta2: float,
    warmup_steps: int,
    r: float,
    weight_lr_power: float,
    buffers: tuple[str, ...],
    update: Callable[[_Segment, State], None],
) -> Optimizer:
    def scalars(device: wp.context.Device) -> State:
        return {key: wp.full(1, value, dtype=dtype, device=device) for key, dtype, value in _SCHEDULEFREE_SCALARS}

    def advance(state: State) -> None:
        wp.launch(
            _schedulefree_advance_kernel,
            dim=1,
            inputs=[
                warmup_steps,
                wp.float64(r),
                wp.float64(weight_lr_power),
                wp.float64(beta2),
                state["lr"],
                state["step"],
                *(state[key] for key, _, _ in _SCHEDULEFREE_SCALARS),
            ],
            device=state["step"].device,
        )

    return Optimizer(
        name=name,
        hyperparameters={
            "lr": lr,
            **hyperparameters,
            "warmup_steps": warmup_steps,
            "r": r,
            "weight_lr_power": weight_lr_power,
        },
        _buffers=tuple((key, key in ("z", "x")) for key in buffers),
        _scalars=scalars,
        _advance=advance,
        _update=update,
        _tags=((tags.LR, "scheduled_lr"), (tags.AVG_WEIGHT, "avg_weight")),
        _eval_buffer="x",
    )


@schema.checked(SGDScheduleFreeArgs, "optim")
def sgd_schedulefree(
    lr: float = 1.0,
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    r: float = 0.0,
    weight_lr_power: float = 2.0,
) -> Optimizer:
    """Schedule-Free SGD (Defazio et al. 2024, "The Road Less Scheduled"), as ``SGDScheduleFreeReference``.

    With ``k`` the number of steps taken, ``lr_k = lr * min(1, (k + 1) / warmup_steps)``,
    ``lr_max = max(lr_max, lr_k)``, ``w = (k + 1)^r * lr_max^weight_lr_power``,
    ``c = w / sum(w)`` (0 while the sum is 0) and ``g = grad + weight_decay * y``:
    ``z -= lr_k * g``, ``x = (1 - c) x + c z``, ``y = momentum * x + (1 - momentum) z``.
    The parameters hold ``y``, where gradients are taken; :meth:`Optimizer.eval_params`
    returns the average ``x``. Unlike the reference, the decay is added to a local copy of
    the gradient, never to the gradient buffer. State: ``"z"``, ``"x"`` (both start at the
    parameters) and the scalars ``"scheduled_lr"``, ``"avg_weight"`` (``c``), ``"lr_max"``,
    ``"weight_sum"`` (float64), ``"bias_correction2"`` (unused, 1).

    Args:
        lr: Base learning rate, ``>= 0`` (the reference's default 1.0); the initial ``state["lr"]``.
        momentum: Interpolation ``beta`` between ``x`` and ``z``, in ``(0, 1)``.
        weight_decay: L2 penalty coefficient evaluated at ``y``, ``>= 0``.
        warmup_steps: Steps of linear warmup, ``>= 0``.
        r: Power of the polynomial weighting ``(k + 1)^r`` of the average, ``>= 0``.
        weight_lr_power: Power of ``lr_max`` in the averaging weight, ``>= 0``.

    Returns:
        The optimizer.

    Raises:
        ValueError: If an argument is out of range (the message names ``optim.<field>``).
    """

    def update(seg: _Segment, state: State) -> None:
        wp.launch(
            _sgd_schedulefree_kernel,
            dim=seg.param.shape[0],
            inputs=[
                seg.offset,
                momentum,
                weight_decay,
                state["scheduled_lr"],
                state["avg_weight"],
                seg.grad,
                seg.param,
                state["z"],
                state["x"],
            ],
            device=seg.param.device,
        )

    return _schedulefree(
        "sgd_schedulefree",
        lr,
        {"momentum": momentum, "weight_decay": weight_decay},
        0.0,
        warmup_steps,
        r,
        weight_lr_power,
        ("z", "x"),
        update,
    )


@schema.checked(AdamWScheduleFreeArgs, "optim")
def adamw_schedulefree(
    lr: float = 0.0025,
    *,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    r: float = 0.0,
    weight_lr_power: float = 2.0,
    decay_at_z: bool = False,
) -> Optimizer:
    """Schedule-Free AdamW (Defazio et al. 2024), as ``AdamWScheduleFreeReference``.

    With ``k``, ``lr_k``, ``c`` as in :func:`sgd_schedulefree` and ``g = grad``:
    ``z -= lr_k * weight_decay * y`` (at ``z`` when ``decay_at_z``),
    ``v = b2 v + (1 - b2) g^2``, ``z -= lr_k * g / (sqrt(v / (1 - b2^(k+1))) + eps)``,
    ``x = (1 - c) x + c z``, ``y = b1 x + (1 - b1) z``. There is no first moment (``b1``
    is the interpolation) and no first-moment bias correction. The parameters hold ``y``;
    :meth:`Optimizer.eval_params` returns ``x``. The gradient buffer is only read (schedule_free
    issue #68 is about the memory-efficient variant dividing it in place).
    State: ``"z"``, ``"x"``, ``"exp_avg_sq"`` and the scalars of :func:`sgd_schedulefree`,
    with ``"bias_correction2"`` ``= 1 - b2^(k+1)``.

    Args:
        lr: Base learning rate, ``>= 0`` (the reference's default 0.0025); the initial ``state["lr"]``.
        betas: ``(b1, b2)``: interpolation and second-moment decay, each in ``[0, 1)``.
        eps: Added to the denominator, ``> 0``.
        weight_decay: Decoupled decay coefficient, ``>= 0``.
        warmup_steps: Steps of linear warmup, ``>= 0``.
        r: Power of the polynomial weighting ``(k + 1)^r`` of the average, ``>= 0``.
        weight_lr_power: Power of ``lr_max`` in the averaging weight, ``>= 0``.
        decay_at_z: Evaluate the weight decay at ``z`` instead of ``y``.

    Returns:
        The optimizer.

    Raises:
        ValueError: If an argument is out of range (the message names ``optim.<field>``).
    """
    beta1, beta2 = betas

    def update(seg: _Segment, state: State) -> None:
        wp.launch(
            _adamw_schedulefree_kernel,
            dim=seg.param.shape[0],
            inputs=[
                seg.offset,
                beta1,
                beta2,
                eps,
                weight_decay,
                int(decay_at_z),
                state["scheduled_lr"],
                state["avg_weight"],
                state["bias_correction2"],
                seg.grad,
                seg.param,
                state["z"],
                state["x"],
                state["exp_avg_sq"],
            ],
            device=seg.param.device,
        )

    return _schedulefree(
        "adamw_schedulefree",
        lr,
        {"betas": (beta1, beta2), "eps": eps, "weight_decay": weight_decay, "decay_at_z": decay_at_z},
        beta2,
        warmup_steps,
        r,
        weight_lr_power,
        ("z", "x", "exp_avg_sq"),
        update,
    )


# --------------------------------------------------------------------------- Warp's Adam


@wp.kernel
def _adam_warp_kernel(
    offset: int,
    beta1: float,
    beta2: float,
    eps: float,
    lr: wp.array(dtype=wp.float32),
    step: wp.array(dtype=wp.int32),
    grad: wp.array(dtype=wp.float32),
    param: wp.array(dtype=wp.float32),
    exp_avg: wp.array(dtype=wp.float32),
    exp_avg_sq: wp.array(dtype=wp.float32),
):
    # warp.optim.Adam's arithmetic, in float32: its t counts from 0 (step is already advanced)
    i = wp.tid()
    j = offset + i
    g = grad[i]
    t = float(step[0] - 1)
    m = beta1 * exp_avg[j] + (1.0 - beta1) * g
    v = beta2 * exp_avg_sq[j] + (1.0 - beta2) * g * g
    exp_avg[j] = m
    exp_avg_sq[j] = v
    mhat = m / (1.0 - wp.pow(beta1, (t + 1.0)))
    vhat = v / (1.0 - wp.pow(beta2, (t + 1.0)))
    param[i] = param[i] - lr[0] * mhat / (wp.sqrt(vhat) + eps)


@schema.checked(AdamWarpArgs, "optim")
def adam_warp(lr: float = 1e-3, *, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8) -> Optimizer:
    """Adam (Kingma & Ba 2015) with the arithmetic of ``warp.optim.Adam``, which Newton's diffsim
    examples use (the bear): the bias corrections in float32 inside the update, ``p -= lr * m_hat /
    (sqrt(v_hat) + eps)`` with ``m_hat = m / (1 - b1^t)``, ``v_hat = v / (1 - b2^t)``. The same
    algorithm as :func:`adam` without decay; the two differ in the last bits of each step, so a
    port trains bit for bit as its example with this one. State: ``"exp_avg"``, ``"exp_avg_sq"``.

    Args:
        lr: Learning rate, ``>= 0``; the initial ``state["lr"]``.
        betas: ``(b1, b2)``, each in ``[0, 1)``.
        eps: Added to the denominator, ``> 0``.

    Returns:
        The optimizer.
    """
    beta1, beta2 = betas

    def advance(state: State) -> None:
        wp.launch(_advance_step_kernel, dim=1, inputs=[state["step"]], device=state["step"].device)

    def update(seg: _Segment, state: State) -> None:
        wp.launch(
            _adam_warp_kernel,
            dim=seg.param.shape[0],
            inputs=[seg.offset, beta1, beta2, eps, state["lr"], state["step"], seg.grad, seg.param,
                    state["exp_avg"], state["exp_avg_sq"]],
            device=seg.param.device,
        )  # fmt: skip

    return Optimizer(
        name="adam_warp",
        hyperparameters={"lr": lr, "betas": (beta1, beta2), "eps": eps},
        _buffers=(("exp_avg", False), ("exp_avg_sq", False)),
        _scalars=lambda device: {},
        _advance=advance,
        _update=update,
        _tags=((tags.LR, "lr"),),
    )


# --------------------------------------------------------------------------- functional API

OPTIMIZERS: dict[str, Callable[..., Optimizer]] = {
    "sgd": sgd,
    "adam": adam,
    "adamw": adamw,
    "adam_warp": adam_warp,
    "sgd_schedulefree": sgd_schedulefree,
    "adamw_schedulefree": adamw_schedulefree,
}
"""Factories by option name; the same names as the files of ``configs/optim/``, and those
:func:`register_optimizer` adds. A config's ``optim._target_`` must name one of these factories
(:mod:`harness.targets` checks it before anything is called)."""


def register_optimizer(factory: Callable[..., Optimizer]) -> Callable[..., Optimizer]:
    """Accept ``factory`` as an ``optim._target_`` (and as :func:`build`'s ``name``) under its
    ``__name__``; returns it, so it can decorate the factory.

    A module of your own calls it when imported (``@register_optimizer`` above ``def
    lion(...)``); a config then names the factory by its dotted path, ``_target_:
    my_module.lion``, and the check imports ``my_module`` before it looks the factory up.

    Raises:
        ValueError: ``factory`` is not callable, or a factory of another path holds its name.
    """
    from harness.registry import register_factory

    return register_factory(OPTIMIZERS, factory, "register_optimizer", "an Optimizer")


def build(name: str, **hyperparameters: Any) -> Optimizer:
    """Build an optimizer by its option name, for use with or without the trainer.

    Example::

        opt = harness.optim.build("adamw", lr=1e-2, weight_decay=0.1)
        state = opt.init([w, b])          # Warp arrays: float32, vec3, ...
        for _ in range(steps):
            ...                           # backward fills w.grad, b.grad
            state = opt.step([w, b], [w.grad, b.grad], state)
        final = opt.eval_params([w, b], state)

    Args:
        name: One of :data:`OPTIMIZERS` (``sgd``, ``adam``, ``adamw``, ``sgd_schedulefree``,
            ``adamw_schedulefree``).
        **hyperparameters: Keyword arguments of that factory.

    Returns:
        The optimizer.

    Raises:
        ValueError: For an unknown name or a bad hyperparameter.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optim: unknown optimizer '{name}'; accepted: {', '.join(OPTIMIZERS)}")
    factory = OPTIMIZERS[name]
    try:
        return factory(**hyperparameters)
    except TypeError as exc:
        raise ValueError(f"optim: {name} does not take these hyperparameters ({exc})") from None


def save_state(state: Mapping[str, wp.array]) -> dict[str, np.ndarray]:
    """Host copies of every array of a state (optimizer or schedule), for a checkpoint.

    Host round trip: call at checkpoint time, never inside the training step.
    """
    return {key: array.numpy().copy() for key, array in state.items()}


def load_state(state: Mapping[str, wp.array], arrays: Mapping[str, np.ndarray]) -> None:
    """Overwrite a freshly initialised state in place with saved arrays (exact: a bit copy).

    Args:
        state: The state from ``init`` of the same optimizer (or schedule) on the same parameters.
        arrays: Arrays from :func:`save_state`.

    Raises:
        ValueError: If the keys, shapes or dtypes differ (a state of another optimizer or
            other parameters).
    """
    if set(state) != set(arrays):
        missing, extra = sorted(set(state) - set(arrays)), sorted(set(arrays) - set(state))
        raise ValueError(f"saved state does not match: missing {missing}, unexpected {extra}")
    for key, target in state.items():
        source = np.asarray(arrays[key])
        want = np.dtype(wp.dtype_to_numpy(target.dtype))
        if source.shape != target.shape or source.dtype != want:
            raise ValueError(
                f"saved state['{key}'] is {source.dtype} {source.shape}, expected {want} {tuple(target.shape)}"
            )
        target.assign(source)
