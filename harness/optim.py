"""Optimizers as small ``init``/``step`` pairs over the flat parameter buffer.

An :class:`Optimizer` is built by a factory (:func:`sgd`, :func:`adam`) whose plain
keyword arguments can come straight from a Hydra config. ``init`` allocates the state on
the parameters' device: the moment buffers, a device step counter ``"step"`` and a device
learning rate ``"lr"`` (a schedule may overwrite it in place). ``step`` reads
``params.grad``, updates ``params.data`` and the state in place, and never writes the
gradient: one launch over the flat buffer plus one single-thread counter launch, no host
round trip, so a whole training step can be captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import warp as wp

from harness.params import ParamSet

__all__ = ["Optimizer", "adam", "sgd"]


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """An optimizer.

    Attributes:
        name: Short name for logs (``"sgd"``, ``"adam"``).
        init: Allocates the state on the parameters' device. It always holds ``"step"``
            (int32 ``(1,)``, number of steps taken, incremented on the device) and ``"lr"``
            (float32 ``(1,)``, the learning rate read by every step).
        step: ``step(params, state)`` updates ``params.data`` and ``state`` in place from
            ``params.grad``, which it never writes.
    """

    name: str
    init: Callable[[ParamSet], dict[str, wp.array]]
    step: Callable[[ParamSet, dict[str, wp.array]], None]


def _check(field: str, value: object, ok: bool, rule: str) -> None:
    if not ok:
        raise ValueError(f"optim.{field} must be {rule}, got {value}")


def _counter_state(params: ParamSet, lr: float) -> dict[str, wp.array]:
    return {
        "step": wp.zeros(1, dtype=wp.int32, device=params.device),
        "lr": wp.full(1, lr, dtype=wp.float32, device=params.device),
    }


# --------------------------------------------------------------------------- SGD


@wp.kernel
def _increment_kernel(step: wp.array(dtype=wp.int32)):
    step[0] = step[0] + 1


@wp.kernel
def _sgd_kernel(
    lr: wp.array(dtype=wp.float32),
    weight_decay: float,
    grad: wp.array(dtype=wp.float32),
    param: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    p = param[i]
    g = grad[i]
    if weight_decay != 0.0:
        g = g + weight_decay * p
    param[i] = p - lr[0] * g


@wp.kernel
def _sgd_momentum_kernel(
    lr: wp.array(dtype=wp.float32),
    momentum: float,
    weight_decay: float,
    step: wp.array(dtype=wp.int32),
    grad: wp.array(dtype=wp.float32),
    param: wp.array(dtype=wp.float32),
    buf: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    p = param[i]
    g = grad[i]
    if weight_decay != 0.0:
        g = g + weight_decay * p
    # step[0] was already incremented for this step: 1 means the first step.
    if step[0] > 1:
        g = momentum * buf[i] + g
    buf[i] = g
    param[i] = p - lr[0] * g


def sgd(lr: float, *, momentum: float = 0.0, weight_decay: float = 0.0) -> Optimizer:
    """Stochastic gradient descent with optional heavy-ball momentum, as ``torch.optim.SGD``.

    With ``g = grad + weight_decay * p`` (the decay term only when ``weight_decay != 0``):
    ``buf = g`` on the first step and ``buf = momentum * buf + g`` afterwards (no
    dampening, no Nesterov), then ``p -= lr * buf``; without momentum ``p -= lr * g``.
    The momentum buffer ``"momentum_buffer"`` is only allocated when ``momentum > 0``.

    Args:
        lr: Learning rate, ``>= 0``; the initial value of the device array ``state["lr"]``.
        momentum: Momentum factor, ``>= 0``.
        weight_decay: L2 penalty coefficient added to the gradient inside the kernel, ``>= 0``.

    Returns:
        The optimizer.

    Raises:
        ValueError: If an argument is out of range.
    """
    lr, momentum, weight_decay = float(lr), float(momentum), float(weight_decay)
    _check("lr", lr, lr >= 0.0, ">= 0")
    _check("momentum", momentum, momentum >= 0.0, ">= 0")
    _check("weight_decay", weight_decay, weight_decay >= 0.0, ">= 0")

    def init(params: ParamSet) -> dict[str, wp.array]:
        state = _counter_state(params, lr)
        if momentum > 0.0:
            state["momentum_buffer"] = wp.zeros(params.size, dtype=wp.float32, device=params.device)
        return state

    def step(params: ParamSet, state: dict[str, wp.array]) -> None:
        wp.launch(_increment_kernel, dim=1, inputs=[state["step"]], device=params.device)
        if momentum > 0.0:
            wp.launch(
                _sgd_momentum_kernel,
                dim=params.size,
                inputs=[
                    state["lr"],
                    momentum,
                    weight_decay,
                    state["step"],
                    params.grad,
                    params.data,
                    state["momentum_buffer"],
                ],
                device=params.device,
            )
        else:
            wp.launch(
                _sgd_kernel,
                dim=params.size,
                inputs=[state["lr"], weight_decay, params.grad, params.data],
                device=params.device,
            )

    return Optimizer(name="sgd", init=init, step=step)


# --------------------------------------------------------------------------- Adam


@wp.kernel
def _adam_counter_kernel(
    beta1: wp.float64,
    beta2: wp.float64,
    lr: wp.array(dtype=wp.float32),
    step: wp.array(dtype=wp.int32),
    step_size: wp.array(dtype=wp.float32),
    bias_correction2_sqrt: wp.array(dtype=wp.float32),
):
    t = step[0] + 1
    step[0] = t
    # Bias corrections in float64, as PyTorch does on the host for a non-capturable Adam.
    tf = wp.float64(t)
    bc1 = wp.float64(1.0) - wp.pow(beta1, tf)
    bc2 = wp.float64(1.0) - wp.pow(beta2, tf)
    step_size[0] = wp.float32(wp.float64(lr[0]) / bc1)
    bias_correction2_sqrt[0] = wp.float32(wp.sqrt(bc2))


@wp.kernel
def _adam_kernel(
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step_size: wp.array(dtype=wp.float32),
    bias_correction2_sqrt: wp.array(dtype=wp.float32),
    grad: wp.array(dtype=wp.float32),
    param: wp.array(dtype=wp.float32),
    exp_avg: wp.array(dtype=wp.float32),
    exp_avg_sq: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    p = param[i]
    g = grad[i]
    if weight_decay != 0.0:
        g = g + weight_decay * p
    m = beta1 * exp_avg[i] + (1.0 - beta1) * g
    v = beta2 * exp_avg_sq[i] + (1.0 - beta2) * g * g
    exp_avg[i] = m
    exp_avg_sq[i] = v
    denom = wp.sqrt(v) / bias_correction2_sqrt[0] + eps
    param[i] = p - step_size[0] * m / denom


def adam(
    lr: float,
    *,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> Optimizer:
    """Adam (Kingma & Ba 2015) with the update of ``torch.optim.Adam`` (L2 decay, no AMSGrad).

    With ``g = grad + weight_decay * p`` (the decay term only when ``weight_decay != 0``),
    ``t`` the device step counter after its increment:
    ``m = b1 * m + (1 - b1) * g``, ``v = b2 * v + (1 - b2) * g^2``,
    ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.
    The bias corrections are computed on the device in float64 by a single-thread launch
    (state ``"step_size"`` and ``"bias_correction2_sqrt"``), then one launch updates every
    entry. State: ``"exp_avg"``, ``"exp_avg_sq"``, ``"step"``, ``"lr"`` and those two scalars.

    Args:
        lr: Learning rate, ``>= 0``; the initial value of the device array ``state["lr"]``.
        betas: Decay rates of the first and second moments, each in ``[0, 1)``; any
            2-sequence (tuple, list, Hydra ``ListConfig``).
        eps: Term added to the denominator, ``> 0``.
        weight_decay: L2 penalty coefficient added to the gradient inside the kernel, ``>= 0``.

    Returns:
        The optimizer.

    Raises:
        ValueError: If an argument is out of range.
    """
    lr, eps, weight_decay = float(lr), float(eps), float(weight_decay)
    try:
        beta1, beta2 = (float(b) for b in betas)
    except (TypeError, ValueError):
        raise ValueError(f"optim.betas must be a sequence of 2 floats, got {betas!r}") from None
    _check("lr", lr, lr >= 0.0, ">= 0")
    _check("betas", (beta1, beta2), 0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0, "in [0, 1)")
    _check("eps", eps, eps > 0.0 and math.isfinite(eps), "> 0 and finite")
    _check("weight_decay", weight_decay, weight_decay >= 0.0, ">= 0")

    def init(params: ParamSet) -> dict[str, wp.array]:
        state = _counter_state(params, lr)
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = wp.zeros(params.size, dtype=wp.float32, device=params.device)
        state["step_size"] = wp.zeros(1, dtype=wp.float32, device=params.device)
        state["bias_correction2_sqrt"] = wp.ones(1, dtype=wp.float32, device=params.device)
        return state

    def step(params: ParamSet, state: dict[str, wp.array]) -> None:
        wp.launch(
            _adam_counter_kernel,
            dim=1,
            inputs=[beta1, beta2, state["lr"], state["step"], state["step_size"], state["bias_correction2_sqrt"]],
            device=params.device,
        )
        wp.launch(
            _adam_kernel,
            dim=params.size,
            inputs=[
                beta1,
                beta2,
                eps,
                weight_decay,
                state["step_size"],
                state["bias_correction2_sqrt"],
                params.grad,
                params.data,
                state["exp_avg"],
                state["exp_avg_sq"],
            ],
            device=params.device,
        )

    return Optimizer(name="adam", init=init, step=step)
