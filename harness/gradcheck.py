"""Tape gradients against central finite differences, on a sample of parameter entries.

For a sampled flat index ``i``: ``fd_i = (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)``, where
``2 eps`` is the float32 difference of the two perturbed entries actually used,
and the relative error is ``|g_i - fd_i| / (max(|g_i|, |fd_i|) + atol)`` with
``atol = atol_fraction * max_j |g_j|`` over the sample, so entries whose gradient is
numerically zero compared with the rest are judged on an absolute scale (float32
finite differences cannot resolve them).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import warp as wp

from harness.env import Env
from harness.losses import WeightedLoss
from harness.params import ParamSet
from harness.tasks import OpenLoop, Task, prepare, rollout
from harness.training.step import taped_rollout


@dataclasses.dataclass(frozen=True)
class GradcheckResult:
    """Per-entry comparison of tape and finite-difference gradients."""

    indices: np.ndarray
    tape: np.ndarray
    finite_difference: np.ndarray
    relative_error: np.ndarray
    tolerance: float

    @property
    def worst(self) -> float:
        return float(np.max(self.relative_error))

    @property
    def passed(self) -> bool:
        return bool(np.all(self.relative_error <= self.tolerance))

    def table(self, params: ParamSet) -> str:
        lines = [f"{'entry':>24} {'tape':>13} {'finite diff':>13} {'rel err':>9}"]
        for i, g, fd, err in zip(self.indices, self.tape, self.finite_difference, self.relative_error, strict=True):
            lines.append(f"{_entry_name(params, int(i)):>24} {g:13.6e} {fd:13.6e} {err:9.2e}")
        return "\n".join(lines)


def _entry_name(params: ParamSet, index: int) -> str:
    for seg in params.segments:
        if seg.offset <= index < seg.offset + seg.length:
            return f"{seg.name}[{index - seg.offset}]"
    raise IndexError(index)


def check_gradients(
    env: Env,
    loss: WeightedLoss,
    *,
    samples: int = 12,
    eps: float | None = None,
    tolerance: float = 0.01,
    atol_fraction: float = 0.01,
    seed: int = 0,
    device: wp.context.Devicelike = None,
    task: Task | None = None,
) -> tuple[GradcheckResult, ParamSet]:
    """Compare the tape gradient with central differences on ``samples`` random entries.

    Args:
        env: The simulation (its initial parameters are used).
        loss: The loss, not yet bound.
        samples: How many flat parameter entries to check.
        eps: Finite-difference step, in the parameter's units; None takes each parameter's
            own ``fd_step`` (:class:`~harness.params.ParamSpec`, set by the env or task).
        tolerance: Largest accepted relative error.
        atol_fraction: Absolute floor of the denominator, as a fraction of the largest |g|.
        seed: Which entries are sampled.
        device: Warp device.
        task: What the parameters are (default: open-loop actions).
    """
    task = task or OpenLoop()
    params = prepare(env, task, loss, device=device)

    tape, _, total = taped_rollout(env, task, loss, params)
    tape.backward(total)
    grad = params.grad.numpy().astype(np.float64)

    rng = np.random.default_rng(seed)
    indices = np.sort(rng.choice(params.size, size=min(samples, params.size), replace=False))
    base = params.data.numpy().copy()

    def loss_at(values: np.ndarray) -> float:
        params.data.assign(values)
        loss.zero()
        return float(loss(rollout(env, task, params)).numpy()[0])

    step = params.fd_steps() if eps is None else np.full(params.size, eps)  # per entry, in flat-buffer order
    fd = np.empty(len(indices))
    for n, i in enumerate(indices):
        plus, minus = base.copy(), base.copy()
        plus[i] += step[i]
        minus[i] -= step[i]
        fd[n] = (loss_at(plus) - loss_at(minus)) / (float(plus[i]) - float(minus[i]))
    params.data.assign(base)

    g = grad[indices]
    atol = atol_fraction * float(np.max(np.abs(g))) if len(g) else 0.0
    rel = np.abs(g - fd) / (np.maximum(np.abs(g), np.abs(fd)) + atol + 1e-30)
    return GradcheckResult(indices, g, fd, rel, tolerance), params
