"""Tape gradients against central finite differences, on a sample of parameter entries.

For a sampled flat index ``i``: ``fd_i = (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)``, where
``2 eps`` is the float32 difference of the two perturbed entries actually used,
and the relative error is ``max(|g_i - fd_i| - r_i, 0) / (max(|g_i|, |fd_i|) + atol)`` with
``atol = atol_fraction * max_j |g_j|`` over the sample, so entries whose gradient is
numerically zero compared with the rest are judged on an absolute scale, and ``r_i =
FLOAT32_QUANTA * ulp(L) / (2 eps)`` the resolution of the difference itself: the loss is a
float32 number, so a disagreement of fewer than a few of its last bits says nothing (a robot's
small entries, whose differences come out as whole multiples of that quantum). The perturbed
rollouts are one captured graph replayed, where the env and task keep the capture contract.

Through contact (an env with ``touching()``, :class:`envs.robot.RobotEnv`), every sampled action
entry gets the contact phase of the steps it acts on first (``phase_window`` steps from its own):
``touchdown`` where a body starts touching the ground in them, ``lift-off`` where one stops,
``touchdown+lift-off`` for both, ``stance`` where bodies touch throughout and ``flight`` where none
does. The table shows each entry's phase and :meth:`GradcheckResult.phase_table` the errors per
phase: where tape and differences disagree (docs/envs.md, "Gradients through contact").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import warp as wp

from harness.env import Env
from harness.losses import WeightedLoss
from harness.params import ParamSet
from harness.tasks import OpenLoop, Task, prepare, rollout
from harness.training.step import capture_blocker, taped_rollout


@dataclasses.dataclass(frozen=True)
class GradcheckResult:
    """Per-entry comparison of tape and finite-difference gradients."""

    indices: np.ndarray
    tape: np.ndarray
    finite_difference: np.ndarray
    relative_error: np.ndarray
    tolerance: float
    phases: list[str] | None = None
    coarse: np.ndarray | None = None
    coarse_error: np.ndarray | None = None
    coarse_factor: float = 0.0

    def phase_table(self) -> str:
        """Per contact phase: how many entries, the median and the worst relative error."""
        if not self.phases:
            return ""
        coarse = f" {f'x{self.coarse_factor:g} step median':>16} {'worst':>9}" if self.coarse is not None else ""
        lines = [f"{'contact phase':>20} {'entries':>8} {'median err':>11} {'worst err':>10}" + coarse]
        for phase in PHASES:
            picked = [i for i, p in enumerate(self.phases) if p == phase]
            if picked:
                errors = self.relative_error[picked]
                line = f"{phase:>20} {len(picked):8d} {np.median(errors):11.2e} {np.max(errors):10.2e}"
                if self.coarse is not None:
                    far = self.coarse_error[picked]
                    line += f" {np.median(far):16.2e} {np.max(far):9.2e}"
                lines.append(line)
        return "\n".join(lines)

    @property
    def worst(self) -> float:
        return float(np.max(self.relative_error))

    @property
    def passed(self) -> bool:
        return bool(np.all(self.relative_error <= self.tolerance))

    def table(self, params: ParamSet) -> str:
        phases = self.phases or [""] * len(self.indices)
        head = f"{'entry':>24} {'tape':>13} {'finite diff':>13} {'rel err':>9}"
        lines = [head + (f" {'contact phase':>20}" if self.phases else "")]
        rows = zip(self.indices, self.tape, self.finite_difference, self.relative_error, phases, strict=True)
        for i, g, fd, err, phase in rows:
            line = f"{_entry_name(params, int(i)):>24} {g:13.6e} {fd:13.6e} {err:9.2e}"
            lines.append(line + (f" {phase:>20}" if self.phases else ""))
        return "\n".join(lines)


FLOAT32_QUANTA = 4.0
"""Last bits of the float32 loss a central difference must exceed to be judged (module docstring):
the loss sums float32 terms, each rounded, so its last two or three bits are noise."""

PHASES = ("flight", "stance", "touchdown", "lift-off", "touchdown+lift-off")
"""Contact phases of the steps an action entry acts on first (module docstring)."""


def contact_phase(touching: np.ndarray, step: int, window: int) -> str:
    """The phase of steps ``step .. step + window - 1`` of one world, from ``touching`` (bool
    ``(steps, bodies)``: which bodies touch after each step), compared with the step before (the
    first step of a rollout with itself: the start's contacts are not recorded)."""
    seen = touching[max(step - 1, 0) : step + window]
    down = bool((seen[1:] & ~seen[:-1]).any())
    up = bool((~seen[1:] & seen[:-1]).any())
    if down and up:
        return "touchdown+lift-off"
    if down:
        return "touchdown"
    if up:
        return "lift-off"
    return "stance" if seen.any() else "flight"


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
    phase_window: int = 5,
    coarse_factor: float = 10.0,
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
        phase_window: Steps from a sampled action's own that its contact phase covers.
        coarse_factor: Through contact, the differences are also taken at this multiple of the
            step, where contacts open and close inside the difference: how far the tape's local
            derivative is from the slope at that scale, per phase (reported, not judged).
    """
    task = task or OpenLoop()
    params = prepare(env, task, loss, device=device)

    tape, _, total = taped_rollout(env, task, loss, params)
    tape.backward(total)
    grad = params.grad.numpy().astype(np.float64)
    touching = env.touching() if hasattr(env, "touching") and isinstance(task, OpenLoop) else None

    rng = np.random.default_rng(seed)
    indices = np.sort(rng.choice(params.size, size=min(samples, params.size), replace=False))
    base = params.data.numpy().copy()
    capturable = env.segment_steps is None and capture_blocker(env, env.device, {"task": task, "loss": loss}) is None
    graph = None

    def forward() -> None:
        loss.zero()
        loss(rollout(env, task, params))

    def loss_at(values: np.ndarray) -> float:
        nonlocal graph
        params.data.assign(values)
        if graph is not None:
            wp.capture_launch(graph)
        else:
            forward()
            if capturable:  # one eager run loaded every kernel: the later ones replay a graph
                with wp.ScopedCapture(device=env.device) as captured:
                    forward()
                graph = captured.graph
        return float(loss.total.numpy()[0])

    step = params.fd_steps() if eps is None else np.full(params.size, eps)  # per entry, in flat-buffer order

    quantum = float(np.spacing(np.float32(abs(loss_at(base)))))  # the loss's last bit

    def differences(scale: float) -> tuple[np.ndarray, np.ndarray]:
        found, resolution = np.empty(len(indices)), np.empty(len(indices))
        for n, i in enumerate(indices):
            plus, minus = base.copy(), base.copy()
            plus[i] += scale * step[i]
            minus[i] -= scale * step[i]
            width = float(plus[i]) - float(minus[i])
            found[n] = (loss_at(plus) - loss_at(minus)) / width
            resolution[n] = FLOAT32_QUANTA * quantum / width
        return found, resolution

    fd, resolution = differences(1.0)
    g = grad[indices]
    atol = atol_fraction * float(np.max(np.abs(g))) if len(g) else 0.0

    def error(other: np.ndarray, resolution: np.ndarray) -> np.ndarray:
        beyond = np.maximum(np.abs(g - other) - resolution, 0.0)
        return beyond / (np.maximum(np.abs(g), np.abs(other)) + atol + 1e-30)

    phases = coarse = None
    if touching is not None:
        steps, worlds = env.horizon, env.world_count
        where = [np.unravel_index(int(i), (steps, worlds, env.action_dim)) for i in indices]
        phases = [contact_phase(touching[:, w], int(t), phase_window) for t, w, _ in where]
        coarse = differences(coarse_factor) if coarse_factor > 0 else None
    params.data.assign(base)
    result = GradcheckResult(
        indices, g, fd, error(fd, resolution), tolerance, phases,
        None if coarse is None else coarse[0], None if coarse is None else error(*coarse), coarse_factor,
    )  # fmt: skip
    return result, params
