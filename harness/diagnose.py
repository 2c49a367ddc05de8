"""Can this gradient be trusted, over how many steps, and where should it be clipped?

``python -m harness diagnose`` (:mod:`harness.commands.diagnose`) measures, at a geometric
set of horizons, the gradient a task would train with, over ``samples`` independent starts
simulated as the worlds of one batched rollout (the starts training uses: the env's own
initial states, or, for a task that draws fresh starts in training, one device draw):

- **per-start gradients** ``g_i``: the gradient of one start's loss (the loss of world ``i``
  alone, as a one-world run would compute it) with respect to one world's parameters. A
  parameter with a world axis (:attr:`harness.params.ParamSpec.world_axis`: open-loop
  controls, per-world quantities) gives every world's in one backward pass; parameters that
  every world shares (a policy's weights) need one backward pass per start, each with the
  adjoint of the other worlds' observables zeroed before it enters the simulation (the
  worlds do not interact, so what reaches the parameters is start ``i``'s alone). The
  backward pass is captured once and replayed.
- ``grad_norm_median``, ``grad_norm_p90``: percentiles of ``|g_i|``.
- ``snr = |mean g| / sqrt(mean |g_i - mean g|^2)``: the signal-to-noise ratio of one start's
  gradient as an estimate of the mean one. Below 1 a single start's gradient points
  anywhere; Metz et al. 2021 ("Gradients are Not All You Need") show this variance growing
  exponentially with the horizon through chaotic dynamics.
- ``snr_batch``: the same ratio for the gradient training steps along where the worlds share
  the parameters, the mean ``m`` of a batch of ``B`` starts (training's ``world_count``). Over
  the :data:`BOOTSTRAP_BATCHES` batches the clip recommendation draws (``B`` starts each, with
  replacement), ``snr_batch = |mean_k m_k| / sqrt(mean_k |m_k - mean_k m_k|^2)``, in the
  shared entries. A mean of ``B`` independent draws keeps their mean and has ``1 / B`` of their
  covariance, so its expectation is ``sqrt(B) * snr``, and ``snr_batch^2`` estimates
  ``B / B_simple`` with ``B_simple = tr(Sigma) / |G|^2`` the simple gradient noise scale of
  McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"): at ``snr_batch = 1``
  the batch is as large as the noise scale. nan where no parameter is shared.
- ``zo_cosine``: the first-order gradient against a zeroth-order estimate of the gradient
  of the Gaussian-smoothed loss ``F_s(x) = E_z F(x + s * z)`` (Suh et al., ICML 2022, "Do
  Differentiable Simulators Give Better Policy Gradients?"), from ``zo_pairs`` antithetic
  pairs ``F(x + s z_j) - F(x - s z_j)`` (``F``: the batch's loss; ``x``: every world's
  parameters; ``s``: ``zo_scale`` times each parameter's finite-difference step). A
  zeroth-order estimate from ``N`` directions only sees the gradient inside their span, so
  the cosine is taken there: between the ``N`` zeroth-order directional differences
  ``(F(x + s z_j) - F(x - s z_j)) / 2`` and the first-order ones ``g . (s z_j)``. (The cosine
  in the whole parameter space is about ``sqrt(N / d)`` for ``d`` parameters even for an
  exact gradient; it is reported too, as ``zo_cosine_full``.) Near 1 the gradient describes
  the loss at the smoothing scale; low or negative values are Suh et al.'s empirical bias
  (stiff contact, discontinuities) or a landscape too rough for any local gradient.
- ``fd_rel_error``: central differences along ``fd_directions`` random unit directions
  (each parameter scaled by its finite-difference step, times ``fd_scale``) against the
  tape's directional derivative, ``|fd - tape| / max(|fd|, |tape|)``, the median over the
  directions: is the tape the derivative of the simulated loss at all.
- ``trusted``: ``snr_batch >= snr_min`` and ``zo_cosine >= zo_cosine_min`` (1 and 0.5) where
  the worlds share a parameter (a training batch averages its starts' gradients: the rule
  judges that average, not one start); where every parameter has a world axis, each world
  trains its own and a batch averages nothing, so ``zo_cosine >= zo_cosine_min`` alone
  (``snr`` is reported, :data:`TRUST_PER_WORLD`).

The growth rate is the least-squares slope of ``log(grad_norm_median)`` against the
simulated time ``steps * dt`` of the horizons [1/s], and of the log of the state adjoint's
norm (median over the starts) against the time before the end of the longest horizon
(:class:`harness.adjoint.AdjointClipper`'s profile). For a linear system ``x' = a x`` the
adjoint's rate is ``a`` exactly; for a chaotic one it estimates the largest Lyapunov exponent.

The recommendation: ``window`` is the longest trusted horizon; ``clip_max_norm`` is the 90th
percentile of the norm of the gradient training would compute at that window (training's
``world_count`` starts per batch, drawn from the measured per-start gradients with
replacement; a shared parameter averages its starts' gradients, a per-world one stacks them),
so about one step in ten is clipped: the percentile rule of AutoClip (Seetharaman et al.,
2020, "AutoClip: Adaptive Gradient Clipping for Source Separation Networks") fixed before
training. docs/diagnose.md has the reasons for each choice and worked examples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

from harness import tags
from harness.adjoint import AdjointClipper
from harness.env import CarriesState, DrawsStarts, Env
from harness.losses import WeightedLoss
from harness.memory import SegmentGraphs, segment_graph_blocker, segmented_forward_backward
from harness.params import ParamSet
from harness.tasks import Task, prepare_groups, rollout
from harness.training.loop import Callback
from harness.training.step import capture_blocker, zero_grads

__all__ = [
    "DiagnoseLog",
    "Diagnosis",
    "HorizonResult",
    "Probe",
    "WorldLayout",
    "diagnose",
    "draw_diagnosis",
    "geometric_horizons",
    "growth_rate",
    "measure_trained",
    "table_header",
    "table_row",
    "training_probe",
]

TRUST_SHARED = "snr_batch >= snr_min and zo_cosine >= zo_cosine_min"
"""The trust rule where the worlds share a parameter (a batch averages its starts' gradients:
the snr of that average, ``snr_batch``, is judged; one start's ``snr`` is reported beside it)."""

TRUST_PER_WORLD = "zo_cosine >= zo_cosine_min (every world trains its own parameters: a batch averages no starts)"
"""The trust rule where every parameter has a world axis (snr is reported, not used)."""

TRUST_ONE_START = "zo_cosine >= zo_cosine_min (one start: no snr to compare)"
"""The trust rule with a single start (a one-world recording): there is no spread to measure."""

FD_WARNING = 0.1
"""A median relative error of the central differences above this is called out in the verdict."""

BOOTSTRAP_BATCHES = 400
"""Training batches drawn from the per-start gradients for the clip recommendation and ``snr_batch``."""


@wp.kernel
def _keep_one_world(enabled: wp.array(dtype=wp.int32), world: wp.array(dtype=wp.int32), grad: wp.array3d(dtype=float)):
    t, w, d = wp.tid()
    if enabled[0] != 0 and w != world[0]:
        grad[t, w, d] = 0.0


def geometric_horizons(horizon: int, *, shortest: int = 8, factor: float = 2.0, divisors: bool = False) -> list[int]:
    """``horizon``, ``horizon / 2``, ``horizon / 4``, ... down to ``shortest`` (rounded,
    ascending, no repeats): the default set of horizons. With ``divisors``, each is the divisor
    of ``horizon`` nearest to it on a log scale (a policy's window must divide its episode)."""
    found = {int(horizon)}
    h = float(horizon)
    options = [d for d in range(1, int(horizon) + 1) if horizon % d == 0]
    while h / factor >= shortest:
        h /= factor
        found.add(min(options, key=lambda d: abs(math.log(d / h))) if divisors else round(h))
    return sorted(found)


def growth_rate(times: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope of ``log(values)`` against ``times`` (finite, positive values
    only); nan with fewer than two such points."""
    times, values = np.asarray(times, np.float64), np.asarray(values, np.float64)
    ok = np.isfinite(values) & (values > 0) & np.isfinite(times)
    if ok.sum() < 2 or np.ptp(times[ok]) == 0:
        return math.nan
    return float(np.polyfit(times[ok], np.log(values[ok]), 1)[0])


class WorldLayout:
    """How a parameter set for ``world_count`` worlds maps to one world's parameters.

    A parameter with a world axis holds one slice per world (one start's parameters is that
    slice); one without is read by every world. One world's parameter vector is the
    concatenation, in layout order, of every parameter's single-world part.
    """

    def __init__(self, params: ParamSet, world_count: int):
        self.world_count = int(world_count)
        self.size = params.size
        self.parts: list[tuple[int, tuple[int, ...], int | None]] = []  # (offset, full shape, world axis)
        lengths = []  # of every parameter's one-world part
        for spec, seg in zip(params.specs, params.segments, strict=True):
            count = int(np.prod(spec.shape, dtype=np.int64))
            width = seg.length // max(count, 1)
            shape = (*spec.shape, width) if width > 1 else tuple(spec.shape)
            axis = spec.world_axis
            if axis is not None and spec.shape[axis] % self.world_count:
                raise ValueError(
                    f"parameter '{spec.name}': world axis {axis} has {spec.shape[axis]} entries, "
                    f"not a multiple of the env's {self.world_count} worlds"
                )
            if axis is not None and axis > 0 and spec.shape[axis] != self.world_count:
                raise ValueError(f"parameter '{spec.name}': world axis {axis} must have one entry per world")
            self.parts.append((seg.offset, shape, axis))
            lengths.append(seg.length // self.world_count if axis is not None else seg.length)
        self.one_world_size = sum(lengths)
        self.shared = any(axis is None for _, _, axis in self.parts)
        self.per_world = any(axis is not None for _, _, axis in self.parts)
        self.shared_entries = np.repeat([axis is None for _, _, axis in self.parts], lengths).astype(bool)
        self.uses_snr = self.shared and self.world_count >= 2
        """Whether the trust rule uses the snr: a batch averages its starts' gradients (a shared
        parameter), and there are two starts or more to compare."""

    def start(self, flat: np.ndarray, world: int, *, shared_from: np.ndarray | None = None) -> np.ndarray:
        """One world's part of a flat gradient: the world's slice of every per-world
        parameter, and every shared parameter (from ``shared_from`` when given)."""
        pieces = []
        for offset, shape, axis in self.parts:
            size = int(np.prod(shape, dtype=np.int64))
            if axis is None:
                source = flat if shared_from is None else shared_from
                pieces.append(source[offset : offset + size])
            elif axis == 0:  # world-major: each world's entries are one contiguous block
                pieces.append(flat[offset : offset + size].reshape(self.world_count, -1)[world])
            else:
                pieces.append(np.take(flat[offset : offset + size].reshape(shape), world, axis=axis).ravel())
        return np.concatenate(pieces).astype(np.float64) if pieces else np.zeros(0)


@dataclasses.dataclass
class HorizonResult:
    """What :func:`diagnose` measured at one horizon (module docstring)."""

    steps: int
    grad_norm_median: float
    grad_norm_p90: float
    snr: float  # of one start's gradient (the name of the files written before snr_batch)
    snr_batch: float  # of the mean of a training batch's starts (nan where no parameter is shared)
    zo_cosine: float
    fd_rel_error: float
    trusted: bool
    zo_cosine_full: float = math.nan
    batch_grad_norm_p90: float = math.nan
    loss: float = math.nan
    seconds: float = 0.0
    segment_steps: int | None = None  # the rollout ran in captured segments of this many steps

    def as_json(self) -> dict[str, Any]:
        return {k: _json_float(v) for k, v in dataclasses.asdict(self).items()}


def _json_float(value: Any) -> Any:
    """A non-finite float as None (JSON has no inf or nan); anything else unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Probe:
    """One built env at one horizon: ``world_count`` starts, the task's parameters for it,
    per-start gradients, and the loss at perturbed parameters, each a captured graph
    replayed as often as needed (eager when ``capture`` is False).

    Args:
        env: The env, built at this horizon with one world per start.
        task: What is trained (its first parameter group is diagnosed).
        loss: The loss (bound here to the env).
        key: The device draw key of a task that draws its starts in training (the rollouts
            run inside :meth:`harness.tasks.Task.training` with it); None: the env's own starts.
        capture: Record the forward pass and the backward pass once each and replay them.
        values: Flat values of the parameters to measure at (default: the task's initial ones).
        adjoint_max_norm: Clip the state adjoint inside the backward pass as training does
            (``clip.adjoint.max_norm``, :class:`harness.adjoint.AdjointClipper`); None: measure only.
    """

    def __init__(
        self,
        env: Env,
        task: Task,
        loss: WeightedLoss,
        *,
        key: wp.array | None = None,
        capture: bool = True,
        values: np.ndarray | None = None,
        adjoint_max_norm: float | None = None,
    ):
        self.env, self.task, self.loss, self.key, self.capture = env, task, loss, key, capture
        if env.segment_steps is not None:
            why = segment_graph_blocker(env, task)
            if why is not None:
                raise ValueError(f"diagnose: the {env.horizon}-step rollout cannot run in captured segments: {why}")
        groups = prepare_groups(env, task, loss)
        self.all_params = list(groups.values())
        self.params = self.all_params[0]
        if values is not None:
            self.params.data.assign(np.asarray(values, dtype=np.float32))
        self.base = self.params.data.numpy().astype(np.float64)
        self.layout = WorldLayout(self.params, env.world_count)
        device = self.params.device
        self._mask_on = wp.zeros(1, dtype=wp.int32, device=device)
        self._world = wp.zeros(1, dtype=wp.int32, device=device)
        self.adjoint = AdjointClipper(
            horizon=env.horizon,
            world_count=env.world_count,
            max_norm=math.inf if adjoint_max_norm is None else adjoint_max_norm,
            device=device,
        )
        self._forward_graph: Any = None
        self._backward_graph: Any = None
        self._tapes: list[Any] = []
        self._segments: SegmentGraphs | None = None
        self._tape: wp.Tape | None = None
        self._total: wp.array | None = None

    def _training(self) -> contextlib.AbstractContextManager:
        return self.task.training(self.key) if self.key is not None else contextlib.nullcontext()

    # -- the loss, no tape ----------------------------------------------------------------

    def _forward(self) -> None:
        self.loss.zero()
        with self._training():
            trajectory = rollout(self.env, self.task, self.params)
        self.loss(trajectory)

    def loss_at(self, delta: np.ndarray | None = None) -> float:
        """The loss (the mean over the starts of each start's loss) at the measured
        parameters plus ``delta`` (flat, every world's parameters)."""
        values = self.base if delta is None else self.base + delta
        self.params.data.assign(values.astype(np.float32))
        if self.env.segment_steps is not None:
            self.loss.zero()
            self._launch_segments(through_loss=True)
        elif self._forward_graph is None:
            self._forward()
            if self.capture:  # kernels are loaded and lazy buffers exist after one eager run
                with wp.ScopedCapture(device=self.params.device) as captured:
                    self._forward()
                self._forward_graph = captured.graph
        else:
            wp.capture_launch(self._forward_graph)
        value = float(self.loss.total.numpy()[0])
        self.params.data.assign(self.base.astype(np.float32))
        return value

    # -- gradients -------------------------------------------------------------------------

    def _zero_grads(self) -> None:
        zero_grads(self.env, self.loss, self.all_params, self.task)

    def _record(self) -> None:
        self._zero_grads()
        tape = wp.Tape()
        with tape, self._training():
            hook = self.adjoint.step_hook(tape)
            trajectory = rollout(self.env, self.task, self.params, after_step=hook)
            observed = [array for array in trajectory.values() if array.grad is not None]
            tape.record_func(lambda: self._keep_one_world(observed), observed)
            self._total = self.loss(trajectory)
        self._tape = tape

    def _keep_one_world(self, observed: list[wp.array]) -> None:
        for array in observed:
            wp.launch(
                _keep_one_world, dim=array.shape, inputs=[self._mask_on, self._world], outputs=[array.grad],
                device=array.device,
            )  # fmt: skip

    def _backward(self) -> None:
        self._zero_grads()
        self.adjoint.reset()
        self._tape.backward(self._total)

    def _run_backward(self) -> None:
        if self._backward_graph is not None:
            wp.capture_launch(self._backward_graph)
            return
        self._backward()
        if self.capture:
            with wp.ScopedCapture(device=self.params.device) as captured:
                self._backward()
            self._tapes.append(self._tape)  # the graph replays launches that reference it
            self._backward_graph = captured.graph

    def set_values(self, values: np.ndarray) -> None:
        """Measure at these flat parameter values from now on (the graphs stay valid)."""
        self.base = np.asarray(values, dtype=np.float64).copy()

    def gradients(self) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        """Per-start gradients ``(starts, one-world parameters)``, each of its start's own
        loss; the flat gradient of the loss (every world's parameters); the loss; the state
        adjoint's norm per step and start ``(horizon, starts)``."""
        self.params.data.assign(self.base.astype(np.float32))
        starts = self.env.world_count
        self._mask_on.fill_(0)
        if self.env.segment_steps is not None:  # eager: compiles and allocates what the segment graphs replay
            self._zero_grads()
            self.adjoint.reset()
            with self._training():
                _, _, total = segmented_forward_backward(
                    self.env, self.task, self.loss, self.params, adjoint=self.adjoint, keep=False
                )
            value = float(total.numpy()[0])
        else:
            self._record()  # eager: the captured backward replays on what it writes
            value = float(self._total.numpy()[0])
            self._run_backward()
        full = self.params.grad.numpy().astype(np.float64)
        profile = self.adjoint.profile()
        rows = []
        for world in range(starts):
            shared = None
            if self.layout.shared:
                self._world.fill_(world)
                self._mask_on.fill_(1)
                if self.env.segment_steps is not None:
                    self._zero_grads()
                    self._launch_segments(through_loss=False)
                else:
                    self._run_backward()
                shared = self.params.grad.numpy().astype(np.float64)
            rows.append(self.layout.start(full, world, shared_from=shared))
        self._mask_on.fill_(0)
        # The loss averages the starts: one start's own loss is world_count times its share.
        return np.stack(rows) * starts, full, value, profile * starts

    def _launch_segments(self, *, through_loss: bool) -> None:
        """Replay the env's segment graphs (:class:`harness.memory.SegmentGraphs`, captured on
        first use): every segment's forward and the loss (``through_loss``), or also every
        segment's backward, with the other worlds' observables' adjoint zeroed after the loss's
        backward as the taped path's hook does."""
        if self._segments is None:
            with self._training():
                self._segments = SegmentGraphs(self.env, self.task, self.loss, self.params)
        observed = [a for a in self._segments.trajectory.values() if a.grad is not None]
        for base, graph in self._segments.steps:
            if base is not None:
                self.env.set_segment_base(base)
            wp.capture_launch(graph)
            if base is None:  # the loss and its backward
                if through_loss:
                    return
                self._keep_one_world(observed)

    def release(self) -> None:
        """Drop the tape and the graphs (their memory) once this horizon is measured."""
        self._tape = self._forward_graph = self._backward_graph = self._total = self._segments = None
        self._tapes = []


@dataclasses.dataclass
class Diagnosis:
    """Every horizon's measurement, the growth rates and the recommendation."""

    env: str
    task: str
    dt: float
    samples: int
    training_worlds: int
    horizons: list[HorizonResult]
    growth_rate_per_s: float
    adjoint_growth_rate_per_s: float
    window: int | None
    clip_max_norm: float | None
    adjoint_profile: np.ndarray  # (steps, starts) of the longest horizon
    settings: dict[str, Any]
    parameters: int = 0
    seconds: float = 0.0
    window_key: str = "env.horizon"  # what sets a training rollout's length (a policy's task.window)
    trust_rule: str = TRUST_SHARED

    def as_json(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "task": self.task,
            "dt": _json_float(self.dt),
            "samples": self.samples,
            "training_worlds": self.training_worlds,
            "parameters_per_start": self.parameters,
            "horizons": [h.as_json() for h in self.horizons],
            "trust_rule": self.trust_rule,
            "growth_rate_per_s": _json_float(self.growth_rate_per_s),
            "adjoint_growth_rate_per_s": _json_float(self.adjoint_growth_rate_per_s),
            "recommended": {
                "window": self.window,
                "clip_max_norm": _json_float(self.clip_max_norm),
                "window_key": self.window_key,
            },
            "settings": self.settings,
            "seconds": round(self.seconds, 2),
        }

    def table(self) -> str:
        """One row per horizon (:func:`table_header`, :func:`table_row`)."""
        return "\n".join([table_header(), *(table_row(h, self.dt) for h in self.horizons)])

    def verdict(self) -> str:
        """One paragraph in plain words."""
        th = self.settings
        uses_snr = self.trust_rule == TRUST_SHARED
        rate = self.growth_rate_per_s
        text = (
            f"The gradient norm grows about e^({rate:.3g} t) with the simulated time t [s] "
            f"(x{math.exp(rate * self.dt * 100):.3g} per 100 steps)"
            if math.isfinite(rate)
            else "The gradient norm's growth could not be fitted"
        )
        if math.isfinite(self.adjoint_growth_rate_per_s):
            text += f"; the state adjoint grows at {self.adjoint_growth_rate_per_s:.3g} per second backwards in time"
        text += "."
        batch = self.training_worlds
        if self.window is None:
            h = self.horizons[0]
            why = _why_untrusted(h, th, uses_snr, batch)
            return (
                f"{text} No horizon can be trusted, not even the shortest ({h.steps} steps): {why}. "
                "Train over shorter horizons than these, smooth the dynamics (softer contact, a smaller time "
                "step), or average more starts per batch; a zeroth-order or actor-critic method may do better here."
            )
        agrees = f"the gradient agrees with the smoothed loss (zo_cosine >= {th['zo_cosine_min']:g})"
        if uses_snr:
            agrees = (
                f"the mean gradient of a {batch}-world batch stands out of its sampling noise "
                f"(snr_batch >= {th['snr_min']:g}) and " + agrees
            )
        text += f" Gradients can be trusted up to {self.window} steps ({self.window * self.dt:.3g} s): {agrees}."
        shorter = [h for h in self.horizons if h.steps < self.window and not h.trusted]
        if shorter:
            why = _why_untrusted(shorter[0], th, uses_snr, batch)
            text += f" Shorter horizons are not all trusted: at {shorter[0].steps} steps {why}."
        longer = next((h for h in self.horizons if h.steps > self.window), None)
        if longer is not None:
            text += f" At {longer.steps} steps {_why_untrusted(longer, th, uses_snr, batch)}."
        else:
            text += " The longest horizon measured is trusted."
        if self.clip_max_norm is not None:
            text += (
                f" Train over at most {self.window} steps ({self.window_key}={self.window}) and clip the global "
                f"gradient norm at {self.clip_max_norm:.3g} (clip.max_norm={self.clip_max_norm:.3g}): about one "
                f"step in ten of a {self.training_worlds}-world batch is then clipped."
            )
        bad_fd = [h.steps for h in self.horizons if h.fd_rel_error > FD_WARNING]
        if bad_fd:
            text += (
                f" Central differences disagree with the tape by more than {FD_WARNING:.0%} at {bad_fd} steps: "
                "check the gradient itself (python -m harness gradcheck) before trusting any number above."
            )
        return text


def table_header() -> str:
    """The header of the printed table: ``snr/start`` is one start's snr (``snr`` in the
    JSON), ``snr/batch`` the snr of a training batch's mean gradient (``snr_batch``; ``-``
    where every world trains its own parameters)."""
    return (
        f"{'steps':>7} {'sim time':>9} {'|g| median':>11} {'|g| p90':>10} {'snr/start':>9} {'snr/batch':>9} "
        f"{'zo_cos':>7} {'fd_err':>8} {'trusted':>7} {'seconds':>7}"
    )


def table_row(h: HorizonResult, dt: float) -> str:
    """One horizon's row of the printed table."""
    batch = "-" if math.isnan(h.snr_batch) else f"{h.snr_batch:.3g}"
    return (
        f"{h.steps:>7d} {h.steps * dt:>8.3g}s {h.grad_norm_median:>11.3e} {h.grad_norm_p90:>10.3e} "
        f"{h.snr:>9.3g} {batch:>9} {h.zo_cosine:>7.3f} {h.fd_rel_error:>8.1e} "
        f"{'yes' if h.trusted else 'no':>7} {h.seconds:>7.1f}"
    )


def _why_untrusted(h: HorizonResult, th: dict[str, Any], uses_snr: bool, batch: int) -> str:
    """Why a horizon is not trusted, naming each measure that failed (snr_batch, zo_cosine or both)."""
    if not (math.isfinite(h.loss) and math.isfinite(h.grad_norm_median)):
        return "the loss or its gradient is not finite (the rollout blew up)"
    reasons = []
    if uses_snr and not h.snr_batch >= th["snr_min"]:
        need = ""
        if h.snr > 0 and math.isfinite(h.snr):  # snr_batch ~ sqrt(B) snr: the batch that reaches snr_min
            need = f", about {math.ceil((th['snr_min'] / h.snr) ** 2)} starts per batch would reach {th['snr_min']:g}"
        reasons.append(
            f"the mean gradient of a {batch}-world batch is mostly sampling noise "
            f"(snr_batch {h.snr_batch:.3g} < {th['snr_min']:g}; one start's snr {h.snr:.3g}{need})"
        )
    if not h.zo_cosine >= th["zo_cosine_min"]:
        low = f"zo_cosine {h.zo_cosine:.3g} < {th['zo_cosine_min']:g}"
        reasons.append(f"the gradient no longer describes the smoothed loss ({low})")
    return " and ".join(reasons) or "it is trusted"


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if not (na > 0 and nb > 0 and math.isfinite(na) and math.isfinite(nb)):
        return math.nan
    return float(np.dot(a, b) / (na * nb))


def measure(
    probe: Probe, settings: Any, rng: np.random.Generator, *, training_worlds: int
) -> tuple[HorizonResult, np.ndarray]:
    """Every number of one horizon (module docstring); also the adjoint profile ``(steps, starts)``.
    A rollout that blew up gives nan and inf without numpy's warnings (they are the result)."""
    with np.errstate(all="ignore"):
        return _measure(probe, settings, rng, training_worlds=training_worlds)


def _measure(
    probe: Probe, settings: Any, rng: np.random.Generator, *, training_worlds: int
) -> tuple[HorizonResult, np.ndarray]:
    t0 = time.perf_counter()
    grads, full, value, profile = probe.gradients()
    norms = np.linalg.norm(grads, axis=1)
    layout = probe.layout
    step = probe.params.fd_steps()
    sigma = settings.zo_scale * step
    snr = _snr(grads)

    zo, fo, zo_grad = [], [], np.zeros_like(full)
    for _ in range(settings.zo_pairs):
        z = rng.standard_normal(len(full))
        delta = sigma * z
        diff = 0.5 * (probe.loss_at(delta) - probe.loss_at(-delta))
        zo.append(diff)
        fo.append(float(np.dot(full, delta)))
        zo_grad += diff * z / sigma
    zo_cos = _cosine(np.array(zo), np.array(fo))
    zo_full = _cosine(zo_grad, full)

    errors = []
    for _ in range(settings.fd_directions):
        z = rng.standard_normal(len(full))
        v = settings.fd_scale * step * z / max(float(np.linalg.norm(z)), 1e-30)
        fd = 0.5 * (probe.loss_at(v) - probe.loss_at(-v))
        tape = float(np.dot(full, v))
        errors.append(_relative_error(fd, tape))
    fd_err = float(np.median(errors)) if errors else math.nan

    batch, batch_means = _batches(grads, training_worlds, layout.shared_entries, rng)
    snr_batch = _snr(batch_means) if layout.uses_snr else math.nan
    finite = math.isfinite(value) and bool(np.all(np.isfinite(full)))
    trusted = finite and bool(
        (snr_batch >= settings.snr_min or not layout.uses_snr) and zo_cos >= settings.zo_cosine_min
    )
    result = HorizonResult(
        steps=probe.env.horizon,
        grad_norm_median=float(np.median(norms)),
        grad_norm_p90=float(np.percentile(norms, 90)),
        snr=float(snr),
        snr_batch=float(snr_batch),
        zo_cosine=zo_cos,
        fd_rel_error=fd_err,
        trusted=trusted,
        zo_cosine_full=zo_full,
        batch_grad_norm_p90=float(np.percentile(batch, 90)) if len(batch) else math.nan,
        loss=value,
        seconds=round(time.perf_counter() - t0, 3),
        segment_steps=probe.env.segment_steps,
    )
    return result, profile


def _snr(samples: np.ndarray) -> float:
    """``|mean| / sqrt(mean |g_i - mean|^2)`` of the rows; inf when they are all equal, nan
    with fewer than two."""
    if samples.shape[0] < 2:
        return math.nan
    mean = samples.mean(axis=0)
    spread = math.sqrt(float(np.mean(np.sum((samples - mean) ** 2, axis=1))))
    mean_norm = float(np.linalg.norm(mean))
    if spread > 0:
        return mean_norm / spread
    return math.inf if mean_norm > 0 else math.nan


def _relative_error(fd: float, tape: float) -> float:
    """``|fd - tape| / max(|fd|, |tape|)``: 0 when both are 0, nan when either is not finite."""
    if not (math.isfinite(fd) and math.isfinite(tape)):
        return math.nan
    scale = max(abs(fd), abs(tape))
    return abs(fd - tape) / scale if scale > 0 else 0.0


def _batches(
    grads: np.ndarray, worlds: int, shared: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The gradients a training batch of ``worlds`` starts would give, for
    :data:`BOOTSTRAP_BATCHES` batches drawn from the measured starts with replacement: their
    norms, and their shared entries ``(batches, shared entries)``. In the entries of shared
    parameters (``shared``, a mask of one world's entries) a batch's gradient is the mean of
    its starts' gradients (the loss averages the worlds); in those of per-world parameters
    their stack divided by ``worlds`` (each world's slice gets its own start's gradient over
    ``worlds``). The clip threshold is the norms' p90; ``snr_batch`` is the means' snr."""
    picks = rng.integers(0, grads.shape[0], size=(BOOTSTRAP_BATCHES, worlds))
    mean = grads[:, shared][picks].mean(axis=1)
    own = np.sum(grads[:, ~shared] ** 2, axis=1)[picks].sum(axis=1) / worlds**2
    return np.sqrt(np.sum(mean**2, axis=1) + own), mean


def recommend(horizons: list[HorizonResult]) -> tuple[int | None, float | None]:
    """The window (the longest trusted horizon) and the clip threshold at it (module docstring)."""
    trusted = [h for h in horizons if h.trusted]
    if not trusted:
        return None, None
    best = max(trusted, key=lambda h: h.steps)
    clip = best.batch_grad_norm_p90
    return best.steps, clip if math.isfinite(clip) else None


def diagnose(
    make_env: Callable[[int, bool], Env],
    task: Task,
    loss: WeightedLoss,
    settings: Any,
    *,
    horizons: list[int],
    training_worlds: int,
    env_name: str = "",
    capture: bool = True,
    values: np.ndarray | None = None,
    report: Callable[[HorizonResult], None] | None = None,
    adjoint_max_norm: float | None = None,
) -> Diagnosis:
    """Measure every horizon (ascending) and fit and recommend (module docstring).

    Args:
        make_env: Builds the env at a horizon, with one world per start, in segments of about
            ``sqrt(horizon)`` steps when asked to and the env can (``settings.segment_from``:
            the longest horizons, captured segment by segment, :class:`harness.memory.SegmentGraphs`).
        task: What is trained.
        loss: The loss (bound to each env in turn).
        settings: :class:`harness.config.DiagnoseSettings`.
        horizons: Steps of every horizon measured.
        training_worlds: ``world_count`` of a training batch (the clip recommendation).
        env_name: For the JSON.
        capture: Replay captured graphs (an env that cannot be captured runs eagerly).
        values: Parameter values to measure at (default: the task's initial ones).
        report: Called with each horizon's result as soon as it is measured.
        adjoint_max_norm: The in-backward clip training applies (``clip.adjoint.max_norm``): every
            gradient is measured with it, the gradient training steps along; None: none.
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng(settings.seed)
    results, profile, dt, size, starts, shared, uses_snr = [], np.zeros((0, 0)), math.nan, 0, 0, True, True
    for steps in sorted(set(horizons)):
        env = _built(make_env, steps, task, loss, settings, capture)
        dt = float(getattr(env, "dt", math.nan))
        with _draw_key(task, env, settings.seed) as key:
            probe = Probe(
                env, task, loss, key=key, capture=capture and _capturable(env, task, loss), values=values,
                adjoint_max_norm=adjoint_max_norm,
            )  # fmt: skip
            result, profile = measure(probe, settings, rng, training_worlds=training_worlds)
        size, starts = probe.layout.one_world_size, env.world_count
        shared, uses_snr = probe.layout.shared, probe.layout.uses_snr
        probe.release()
        results.append(result)
        if report is not None:
            report(result)
    times = np.array([h.steps * dt for h in results])
    norm_rate = growth_rate(times, np.array([h.grad_norm_median for h in results]))
    adjoint = np.median(profile, axis=1) if profile.size else np.zeros(0)
    before_end = (len(adjoint) - 1 - np.arange(len(adjoint))) * dt
    adjoint_rate = growth_rate(before_end, adjoint)
    window, clip = recommend(results)
    return Diagnosis(
        env=env_name,
        task=task.name,
        dt=dt,
        samples=starts,
        training_worlds=training_worlds,
        horizons=results,
        growth_rate_per_s=norm_rate,
        adjoint_growth_rate_per_s=adjoint_rate,
        window=window,
        clip_max_norm=clip,
        adjoint_profile=profile,
        settings={**dataclasses.asdict(settings), "adjoint_max_norm": adjoint_max_norm},
        parameters=size,
        seconds=time.perf_counter() - t0,
        window_key=task.window_key,
        trust_rule=TRUST_SHARED if uses_snr else TRUST_PER_WORLD if not shared else TRUST_ONE_START,
    )


def _capturable(env: Env, task: Task, loss: WeightedLoss) -> bool:
    """Whether the env, the task and the loss keep the capture contract on this device
    (:func:`harness.training.step.capture_blocker`)."""
    return capture_blocker(env, env.device, {"task": task, "loss": loss}) is None


def _built(
    make_env: Callable[[int, bool], Env], steps: int, task: Task, loss: WeightedLoss, settings: Any, capture: bool
) -> Env:
    """The env of one horizon: in segments from ``settings.segment_from`` steps on when its
    segments can share their captured graphs, else on one tape."""
    segmented = capture and settings.segment_from is not None and steps >= settings.segment_from
    env = make_env(steps, segmented)
    if env.segment_steps is not None and (
        segment_graph_blocker(env, task) is not None or not _capturable(env, task, loss)
    ):
        env = make_env(steps, False)
    return env


@contextlib.contextmanager
def _draw_key(task: Task, env: Env, seed: int) -> Iterator[wp.array | None]:
    """The draw key of a task that draws fresh starts in training and does not carry a state
    from one rollout to the next (a policy): its rollouts draw from ``seed``; None otherwise
    (the env's own starts: open loop, quantities; SHAC's actor from the env's starts)."""
    roles = task.required_roles()
    if DrawsStarts in roles and CarriesState not in roles and isinstance(env, DrawsStarts):
        yield wp.array([seed], dtype=wp.int32, device=env.device)
    else:
        yield None


def draw_diagnosis(diagnosis: Diagnosis, path: str | Path) -> None:
    """``diagnose.png``: norm (median, p90 band), snr and zo_cosine against the horizon on log
    axes with the trusted horizons shaded; the state adjoint through the longest horizon."""
    from matplotlib.figure import Figure

    from harness.runs import atomic_output

    hs = diagnosis.horizons
    steps = np.array([h.steps for h in hs], dtype=np.float64)
    fig = Figure(figsize=(11, 7.5), dpi=110)
    axes = fig.subplots(2, 2)
    (ax_norm, ax_snr), (ax_zo, ax_adj) = axes
    # Each trusted horizon shades the band between the geometric midpoints to its neighbours.
    edges = np.sqrt(steps[1:] * steps[:-1]) if len(steps) > 1 else np.zeros(0)
    lows = np.concatenate([[steps[0] / 1.2], edges])
    highs = np.concatenate([edges, [steps[-1] * 1.2]])

    def shade(ax: Any) -> None:
        label = "trusted"
        for h, lo, hi in zip(hs, lows, highs, strict=True):
            if h.trusted:
                ax.axvspan(lo, hi, color="tab:green", alpha=0.12, lw=0, label=label)
                label = None

    median = np.array([h.grad_norm_median for h in hs])
    p90 = np.array([h.grad_norm_p90 for h in hs])
    shade(ax_norm)
    ax_norm.fill_between(steps, median, p90, color="tab:blue", alpha=0.25, lw=0, label="median to p90")
    ax_norm.plot(steps, median, "o-", color="tab:blue", label="median |g| of one start")
    batch = np.array([h.batch_grad_norm_p90 for h in hs])
    ax_norm.plot(
        steps, batch, "s--", color="tab:purple", ms=4, label=f"p90 |g| of a {diagnosis.training_worlds}-world batch"
    )
    if diagnosis.clip_max_norm is not None:
        ax_norm.axhline(
            diagnosis.clip_max_norm, color="tab:red", ls=":", lw=1, label=f"clip_max_norm {diagnosis.clip_max_norm:.3g}"
        )
    _log_axes(ax_norm, median, p90, batch)
    ax_norm.set_title("gradient norm")
    ax_norm.set_ylabel("|g|")

    snr = np.array([h.snr for h in hs])
    snr_batch = np.array([h.snr_batch for h in hs])
    judged = diagnosis.trust_rule == TRUST_SHARED
    shade(ax_snr)
    if judged:
        ax_snr.plot(
            steps, np.where(np.isfinite(snr_batch), snr_batch, np.nan), "o-", color="tab:orange",
            label=f"snr_batch: mean of a {diagnosis.training_worlds}-world batch (judged)",
        )  # fmt: skip
    ax_snr.plot(
        steps, np.where(np.isfinite(snr), snr, np.nan), "^:" if judged else "o-", color="tab:orange",
        alpha=0.6 if judged else 1.0, label="snr of one start" + (" (reported)" if judged else ""),
    )  # fmt: skip
    ax_snr.axhline(
        diagnosis.settings["snr_min"], color="gray", ls="--", lw=1, label=f"snr_min {diagnosis.settings['snr_min']:g}"
    )
    _log_axes(ax_snr, snr, *([snr_batch] if judged else []))
    title = "signal-to-noise ratio |mean g| / rms(g - mean g)"
    if not judged:
        title += "\n(reported, not in the rule: every world trains its own parameters)"
    ax_snr.set_title(title, fontsize=10 if not judged else None)

    zo = np.array([h.zo_cosine for h in hs])
    full = np.array([h.zo_cosine_full for h in hs])
    shade(ax_zo)
    ax_zo.plot(steps, zo, "o-", color="tab:green", label="zo_cosine (in the sampled directions)")
    ax_zo.plot(steps, full, "x:", color="gray", label="cosine in all parameters")
    ax_zo.axhline(
        diagnosis.settings["zo_cosine_min"],
        color="gray",
        ls="--",
        lw=1,
        label=f"zo_cosine_min {diagnosis.settings['zo_cosine_min']:g}",
    )
    ax_zo.set_xscale("log")
    ax_zo.set_ylim(-1.05, 1.05)
    ax_zo.set_title("first-order vs zeroth-order (smoothed loss)")
    ax_zo.set_xlabel("horizon [steps]")
    ax_zo.set_ylabel("cosine")

    profile = diagnosis.adjoint_profile
    if profile.size:
        t = (np.arange(profile.shape[0]) + 1) * diagnosis.dt
        lo, mid, hi = np.percentile(profile, [10, 50, 90], axis=1)
        ax_adj.fill_between(t, lo, hi, color="tab:brown", alpha=0.25, lw=0, label="10% to 90% of starts")
        ax_adj.plot(t, mid, color="tab:brown", lw=1.2, label="median")
        if np.any(mid > 0) and np.nanmax(mid) / max(np.nanmin(mid[mid > 0]), 1e-300) > 20:
            ax_adj.set_yscale("log")
        rate = diagnosis.adjoint_growth_rate_per_s
        ax_adj.set_title(
            f"state adjoint |dL/ds_t|, {profile.shape[0]} steps"
            + (f": x e^({rate:.3g}/s) backwards" if math.isfinite(rate) else "")
        )
        ax_adj.set_xlabel("simulated time t [s]")
        ax_adj.legend(fontsize=7, loc="best")
    for ax in (ax_norm, ax_snr, ax_zo):
        ax.set_xticks(steps, [str(int(h)) for h in steps], minor=False)  # the horizons measured
        ax.set_xticks([], minor=True)
        if len(steps) > 8:  # many horizons: their labels would run into each other
            ax.tick_params(axis="x", labelsize=8, labelrotation=35)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    ax_snr.set_xlabel("horizon [steps]")
    ax_norm.set_xlabel("horizon [steps]")
    fig.suptitle(
        f"harness diagnose: {diagnosis.env}, task {diagnosis.task}, {diagnosis.samples} starts"
        + (f"; trusted up to {diagnosis.window} steps" if diagnosis.window else "; no horizon trusted")
    )
    fig.tight_layout()
    with atomic_output(path) as partial:
        fig.savefig(partial, format="png")


def _log_axes(ax: Any, *series: np.ndarray) -> None:
    ax.set_xscale("log")
    values = np.concatenate([np.asarray(s, np.float64) for s in series])
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) and values.max() / values.min() > 3:
        ax.set_yscale("log")


def training_probe(
    make: Callable[[int], tuple[Callable[[int, bool], Env], Task, WeightedLoss]],
    steps: int,
    worlds: list[int],
    settings: Any,
) -> tuple[Probe, int]:
    """The measurement a training run takes of itself (``diagnose.every``, ``task.window=auto``):
    a :class:`Probe` of ``steps``-step rollouts on an env, task and loss ``make(count)`` builds,
    with the first of ``worlds`` the task accepts (SHAC's critic minibatches must divide steps x
    worlds); returns it and that count.

    Raises:
        ValueError: The task refuses every count: its first refusal's first line.
    """
    tried: dict[int, str] = {}
    for count in dict.fromkeys(worlds):
        make_env, task, loss = make(count)
        env = _built(make_env, steps, task, loss, settings, True)
        try:
            with _draw_key(task, env, settings.seed) as key:
                return Probe(env, task, loss, key=key, capture=_capturable(env, task, loss)), count
        except ValueError as exc:
            tried[count] = str(exc).splitlines()[0]
    raise ValueError(next(iter(tried.values())))


def measure_trained(
    probe: Probe,
    values: np.ndarray,
    trained: dict[str, wp.array],
    keys: tuple[str, ...],
    settings: Any,
    rng: np.random.Generator,
    *,
    training_worlds: int,
) -> HorizonResult:
    """:func:`measure` at the flat parameter values ``values`` training has reached, the probe's
    task given the training task's state ``trained`` under ``keys`` first (its evaluation state:
    SHAC's observation statistics), so it measures the actor training has."""
    own = probe.task.state(probe.env)
    for key in keys:
        wp.copy(own[key], trained[key])
    probe.set_values(values)
    result, _ = measure(probe, settings, rng, training_worlds=training_worlds)
    return result


class DiagnoseLog(Callback):
    """``diagnose.every=N``: every N iterations of a training run, the measures of one horizon
    (the training rollout's) at the parameters training has reached, as TensorBoard scalars
    ``diagnose/*`` and one printed line: a user sees the gradient degrade as a policy improves.

    The measurement runs on an env, task and loss of its own (:meth:`prepare`, before training
    starts), so training's arrays, graph and random draws are untouched: a run logs the same
    curves with and without it. Before each measurement the probe's task takes the training
    task's evaluation state (SHAC's observation statistics), so it measures the actor training has.

    Args:
        settings: :class:`harness.config.DiagnoseSettings` (``every``, and what is measured).
        make: ``make(worlds)`` builds ``(make_env, task, loss)`` for the measurement with that
            many worlds (``make_env(steps, segmented)``).
        horizon: Steps of the measured rollout (training's).
        worlds: Worlds of the measured rollout, then training's as a fallback when the task
            refuses the first (SHAC's critic minibatches must divide steps x worlds).
        training_worlds: ``world_count`` of a training batch (``diagnose/batch_grad_norm_p90``).
    """

    def __init__(
        self,
        settings: Any,
        make: Callable[[int], tuple[Callable[[int, bool], Env], Task, WeightedLoss]],
        *,
        horizon: int,
        worlds: int,
        training_worlds: int,
    ):
        self.settings, self.make, self.horizon = settings, make, horizon
        self.worlds, self.training_worlds = worlds, training_worlds
        self.every = int(settings.every)
        self._probe: Probe | None = None

    def prepare(self) -> None:
        """Build the probe (its env, task and loss) at the task's initial parameters.

        Raises:
            ValueError: One line: the task refuses the probe's env (with either world count).
        """
        try:
            self._probe, _ = training_probe(self.make, self.horizon, [self.worlds, self.training_worlds], self.settings)
        except ValueError as exc:
            raise ValueError(f"diagnose.every: the measurement's env is refused: {exc}") from None

    def on_iteration(self, loop: Any, iteration: int) -> None:
        done = iteration + 1
        if self.every <= 0 or done % self.every:
            return
        if self._probe is None:
            self.prepare()
        probe = self._probe
        rng = np.random.default_rng([self.settings.seed, done])
        step = loop.step
        result = measure_trained(
            probe, step.params.data.numpy(), step.task.state(step.env), step.task.evaluation_state, self.settings, rng,
            training_worlds=self.training_worlds,
        )  # fmt: skip
        scalars = {
            tags.DIAGNOSE_SNR: result.snr,
            **({tags.DIAGNOSE_SNR_BATCH: result.snr_batch} if probe.layout.uses_snr else {}),
            tags.DIAGNOSE_ZO_COSINE: result.zo_cosine,
            tags.DIAGNOSE_GRAD_NORM_MEDIAN: result.grad_norm_median,
            tags.DIAGNOSE_FD_REL_ERROR: result.fd_rel_error,
            tags.DIAGNOSE_BATCH_GRAD_NORM_P90: result.batch_grad_norm_p90,
            tags.DIAGNOSE_TRUSTED: float(result.trusted),
        }
        for callback in loop.callbacks:
            if callback is not self:
                callback.on_scalars(loop, iteration, scalars)
        snr = f"snr {result.snr:.3g}"
        if probe.layout.uses_snr:
            snr = f"snr_batch {result.snr_batch:.3g} ({self.training_worlds} worlds; one start's snr {result.snr:.3g})"
        print(
            f"diagnose at iteration {done}: {result.steps} steps, {snr}, "
            f"zo_cosine {result.zo_cosine:.3f}, |g| median {result.grad_norm_median:.3e}, "
            f"{'trusted' if result.trusted else 'NOT trusted'} ({result.seconds:.1f} s)",
            flush=True,
        )
