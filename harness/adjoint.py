"""Clipping inside the backward pass: the simulation state's adjoint, step by step.

This module owns :class:`AdjointClipper`. Handed to a rollout as its ``after_step`` hook
(:data:`harness.env.StepHook`), it records one ``Tape.record_func`` per simulation step.
When ``Tape.backward`` reaches it (after the adjoint of state ``t + 1`` has been
accumulated from everything later in the tape, before it flows into step ``t``), the
callback

1. measures, per world ``w``, the norm of the state adjoint
   ``a_t[w] = sqrt(sum over the state arrays and their entries of (dL/ds_{t+1}[w])^2)``
   into the profile (the gradient-through-time profile: where along the horizon the
   gradient grows), and
2. when ``max_norm`` is finite, rescales that world's adjoint by
   ``min(1, max_norm / (a_t[w] + 1e-6))`` (the ``clip_grad_norm_`` rule per world and step).

With ``max_norm = inf`` (or None with profiling on) nothing is rescaled, so the final
gradient is bit-identical to a backward pass without the clipper. Each step costs one
launch (one thread per world over up to ``MAX_STATE_ARRAYS`` float32-based state arrays);
the sums are float64, so the profile shows growth up to the float32 range exactly. A nan
adjoint gives a nan norm and is left unscaled.

The profile stays on the device; :meth:`AdjointClipper.profile` reads it back (log
iterations only), :func:`profile_summary` and :func:`profile_image` turn it into
TensorBoard scalars and an image.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import warp as wp

from harness import tags

__all__ = [
    "AdjointClipper",
    "AdjointSettings",
    "flat_grad_view",
    "profile_histogram_values",
    "profile_image",
    "profile_summary",
]


@dataclasses.dataclass(frozen=True)
class AdjointSettings:
    """In-backward clipping of the simulation state's adjoint: the trainer's ``adjoint``
    argument, configured as ``clip.adjoint`` (``configs/base/clip.yaml``).

    Attributes:
        max_norm: Largest per-world norm of a state adjoint between two simulation steps;
            None turns the clip off, ``inf`` measures without scaling.
        profile: Record the per-step pre-clip adjoint norms even when ``max_norm`` is None.
    """

    max_norm: float | None = None
    profile: bool = False

    @property
    def active(self) -> bool:
        """Whether the trainer must hook the rollout (clip or profile)."""
        return self.max_norm is not None or self.profile

    @classmethod
    def parse(cls, value: Mapping[str, Any] | AdjointSettings | None) -> AdjointSettings:
        """The settings from ``clip.adjoint`` (a mapping with ``max_norm`` and ``profile``), or None (off).

        Raises:
            ValueError: One line naming ``clip.adjoint.<field>`` and what is accepted.
        """
        if value is None:
            return cls()
        if isinstance(value, AdjointSettings):
            return value
        unknown = set(value) - {"max_norm", "profile"}
        if unknown:
            raise ValueError(f"clip.adjoint accepts max_norm and profile, got {sorted(unknown)}")
        max_norm = value.get("max_norm")
        if max_norm is not None:
            if isinstance(max_norm, bool):
                raise ValueError(f"clip.adjoint.max_norm must be null or a number >= 0, got {max_norm!r}")
            try:
                max_norm = float(max_norm)
            except (TypeError, ValueError):
                raise ValueError(f"clip.adjoint.max_norm must be null or a number >= 0, got {max_norm!r}") from None
            if not max_norm >= 0.0:
                raise ValueError(f"clip.adjoint.max_norm must be null or >= 0, got {max_norm}")
        profile = value.get("profile", False)
        if not isinstance(profile, bool):
            raise ValueError(f"clip.adjoint.profile must be true or false, got {profile!r}")
        return cls(max_norm=max_norm, profile=profile)


MAX_STATE_ARRAYS = 8
"""State arrays one hook call may hand over (joint_q, joint_qd, body_q, body_qd, particle_q, ...)."""


@wp.func
def _sumsq_row(a: wp.array2d(dtype=wp.float32), w: int) -> wp.float64:
    s = wp.float64(0.0)
    for j in range(a.shape[1]):
        x = wp.float64(a[w, j])
        s += x * x
    return s


@wp.func
def _scale_row(a: wp.array2d(dtype=wp.float32), w: int, coef: wp.float32):
    for j in range(a.shape[1]):
        a[w, j] = a[w, j] * coef


@wp.kernel
def _adjoint_clip_kernel(
    base: wp.array(dtype=wp.int32),
    slot: int,
    count: int,
    max_norm: wp.float64,
    scale: int,
    a0: wp.array2d(dtype=wp.float32),
    a1: wp.array2d(dtype=wp.float32),
    a2: wp.array2d(dtype=wp.float32),
    a3: wp.array2d(dtype=wp.float32),
    a4: wp.array2d(dtype=wp.float32),
    a5: wp.array2d(dtype=wp.float32),
    a6: wp.array2d(dtype=wp.float32),
    a7: wp.array2d(dtype=wp.float32),
    sumsq: wp.array2d(dtype=wp.float64),
    rescaled: wp.array(dtype=wp.float32),
):
    # One thread per world: its whole state adjoint is small (a few dofs or bodies). The
    # profile row is base[0] + slot: the step, read on the device so that one captured
    # segment serves every segment (harness.memory.SegmentGraphs).
    w = wp.tid()
    s = _sumsq_row(a0, w)
    if count > 1:
        s += _sumsq_row(a1, w)
    if count > 2:
        s += _sumsq_row(a2, w)
    if count > 3:
        s += _sumsq_row(a3, w)
    if count > 4:
        s += _sumsq_row(a4, w)
    if count > 5:
        s += _sumsq_row(a5, w)
    if count > 6:
        s += _sumsq_row(a6, w)
    if count > 7:
        s += _sumsq_row(a7, w)
    sumsq[base[0] + slot, w] = s
    if scale == 0:
        return
    coef = max_norm / (wp.sqrt(s) + wp.float64(1.0e-6))
    if coef < wp.float64(1.0):  # false for a nan coefficient: a nan adjoint is left as it is
        rescaled[0] = wp.float32(1.0)  # every writer writes the same value
        c = wp.float32(coef)
        _scale_row(a0, w, c)
        if count > 1:
            _scale_row(a1, w, c)
        if count > 2:
            _scale_row(a2, w, c)
        if count > 3:
            _scale_row(a3, w, c)
        if count > 4:
            _scale_row(a4, w, c)
        if count > 5:
            _scale_row(a5, w, c)
        if count > 6:
            _scale_row(a6, w, c)
        if count > 7:
            _scale_row(a7, w, c)


def recording_tape() -> wp.Tape | None:
    """The tape recording the launches now (inside ``with tape:``), or None: what a ``Tape.record_func``
    made during a rollout is recorded on (Warp keeps it in its runtime only)."""
    from warp._src import context

    return context.runtime.tape


def flat_grad_view(array: wp.array, world_count: int) -> wp.array:
    """``array.grad`` as a (world_count, scalars per world) array of its scalar type."""
    if array.grad is None:
        raise ValueError("AdjointClipper: every state array needs a gradient (requires_grad=True)")
    grad = array.grad
    if not grad.is_contiguous or grad.shape[0] != world_count:
        raise ValueError(
            f"AdjointClipper: state arrays must be contiguous per-world views of shape ({world_count}, k), "
            f"got shape {grad.shape}"
        )
    scalar = getattr(grad.dtype, "_wp_scalar_type_", grad.dtype)
    if scalar is not wp.float32:
        raise TypeError(f"AdjointClipper: state arrays must be float32-based, got {grad.dtype.__name__}")
    width = grad.size * (wp.types.type_size(grad.dtype) if scalar is not grad.dtype else 1) // world_count
    return wp.array(ptr=grad.ptr, dtype=scalar, shape=(world_count, width), device=grad.device, copy=False)


class AdjointClipper:
    """Per-step, per-world clip of the state adjoint during ``Tape.backward``, with its profile.

    Usage (what the trainer does each iteration)::

        tape = wp.Tape()
        hook = clipper.step_hook(tape)          # zeroes the profile and the rescaled flag
        with tape:
            trajectory = rollout(env, task, params, after_step=hook)
            loss = loss_fn(trajectory)
        tape.backward(loss)                     # clips; clipper.profile() holds the norms

    Args:
        horizon: Simulation steps per rollout (rows of the profile).
        world_count: Worlds per rollout.
        max_norm: Largest per-world adjoint norm between two steps; None or inf only
            measure (no rescaling).
        device: Warp device.

    Attributes:
        sumsq: float64 ``(horizon, world_count)``: the squared pre-clip adjoint norm of
            state ``t + 1`` of every world, written during the last backward.
        rescaled: float32 ``(1,)``: 1 when the last backward rescaled any step's adjoint, else 0.
        elapsed_s: Host time spent in the backward callbacks since construction [s] (on a
            CPU device the launches are synchronous, so this is their cost).
    """

    def __init__(
        self, *, horizon: int, world_count: int, max_norm: float | None = None, device: wp.context.Devicelike = None
    ):
        if max_norm is not None and not float(max_norm) >= 0.0:
            raise ValueError(f"clip.adjoint.max_norm must be null or >= 0, got {max_norm}")
        self.horizon = int(horizon)
        self.world_count = int(world_count)
        self.max_norm = None if max_norm is None else float(max_norm)
        self.device = wp.get_device(device)
        self.sumsq = wp.zeros((self.horizon, self.world_count), dtype=wp.float64, device=self.device)
        self.rescaled = wp.zeros(1, dtype=wp.float32, device=self.device)
        self.elapsed_s = 0.0
        self._no_base = wp.zeros(1, dtype=wp.int32, device=self.device)  # the row is the host step

    @property
    def scales(self) -> bool:
        """Whether the callbacks rescale (a finite ``max_norm``) or only measure."""
        return self.max_norm is not None and np.isfinite(self.max_norm)

    def step_hook(self, tape: wp.Tape):
        """Zero the profile and the rescaled flag, and return the ``after_step`` hook that
        records into ``tape``."""
        self.reset()
        return self.hook(tape)

    def reset(self) -> None:
        """Zero the profile and the rescaled flag (once per iteration, before its backward)."""
        self.sumsq.zero_()
        self.rescaled.zero_()

    def hook(self, tape: wp.Tape, *, base: wp.array | None = None, start: int = 0):
        """The ``after_step`` hook that records into ``tape`` (a segmented backward makes one
        per segment's tape, :mod:`harness.memory`).

        Args:
            tape: The tape the rollout (or one segment of it) is recorded on.
            base: An int32 ``(1,)`` device array holding the first step of the segment being
                recorded (``env.segment_base``), or None: the profile row of step ``t`` is then
                ``base[0] + t - start``, read on the device, so the launch is the same in every
                segment and one captured segment's graph serves them all.
            start: The first step of the segment being recorded (with ``base``).
        """

        def hook(step: int, arrays: list[wp.array]) -> None:
            if not 0 <= step < self.horizon:
                raise ValueError(f"AdjointClipper: step {step} outside the horizon {self.horizon}")
            if not 1 <= len(arrays) <= MAX_STATE_ARRAYS:
                raise ValueError(f"AdjointClipper: 1 to {MAX_STATE_ARRAYS} state arrays per step, got {len(arrays)}")
            views = [flat_grad_view(array, self.world_count) for array in arrays]
            views += [views[0]] * (MAX_STATE_ARRAYS - len(views))
            row = (self._no_base, step) if base is None else (base, step - start)
            tape.record_func(lambda: self._backward(*row, len(arrays), views), arrays)

        return hook

    def _backward(self, base: wp.array, slot: int, count: int, views: list[wp.array]) -> None:
        start = time.perf_counter()
        wp.launch(
            _adjoint_clip_kernel,
            dim=self.world_count,
            inputs=[
                base, slot, count, wp.float64(self.max_norm or 0.0), int(self.scales), *views, self.sumsq,
                self.rescaled,
            ],
            device=self.device,
        )  # fmt: skip
        self.elapsed_s += time.perf_counter() - start

    def profile(self) -> np.ndarray:
        """Host copy of the per-step, per-world pre-clip adjoint norms, ``(horizon, world_count)``.

        Row ``t`` is the adjoint of state ``t + 1`` when it reached the hook of step ``t``.
        One device read: call it at log iterations only.
        """
        return np.sqrt(self.sumsq.numpy())


def profile_summary(profile: np.ndarray, *, max_norm: float | None = None) -> dict[str, float]:
    """Scalars of a profile for TensorBoard (``through_time/...`` tags).

    Returns:
        ``through_time/norm_max`` (largest per-world step norm), ``through_time/norm_first`` (the
        largest over worlds at the first step, i.e. the adjoint reaching state 1),
        ``through_time/growth_per_100_steps`` (the mean increase of ``log10`` of the
        world-maximum norm per 100 steps backwards in time, from a least-squares line over
        the finite non-zero entries), and ``through_time/clipped_fraction`` (share of step and
        world pairs above ``max_norm``; 0 without a finite ``max_norm``).
    """
    profile = np.asarray(profile, dtype=np.float64)
    peak = profile.max(axis=1)
    steps = np.arange(profile.shape[0])
    ok = np.isfinite(peak) & (peak > 0)
    growth = 0.0
    if ok.sum() >= 2:
        slope = np.polyfit(steps[ok], np.log10(peak[ok]), 1)[0]
        growth = float(-100.0 * slope)
    clipped = 0.0
    if max_norm is not None and np.isfinite(max_norm):
        clipped = float(np.mean(profile > max_norm))
    return {
        tags.ADJOINT_NORM_MAX: float(np.nanmax(profile)) if profile.size else 0.0,
        tags.ADJOINT_NORM_FIRST: float(peak[0]) if profile.size else 0.0,
        tags.ADJOINT_GROWTH: growth,
        tags.ADJOINT_CLIPPED_FRACTION: clipped,
    }


def profile_image(
    profile: np.ndarray, *, max_norm: float | None = None, dt: float | None = None, title: str = ""
) -> np.ndarray:
    """Plot a profile (``log10`` adjoint norm against the step, one line per world) as an image.

    Args:
        profile: ``(horizon, world_count)`` norms, as from :meth:`AdjointClipper.profile`.
        max_norm: Drawn as a horizontal line when finite.
        dt: Time step [s]; the x axis is then time [s] instead of the step index.
        title: Figure title.

    Returns:
        An RGB image, uint8 ``(height, width, 3)`` (height x width x channels).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    profile = np.asarray(profile, dtype=np.float64)
    x = np.arange(profile.shape[0]) * (dt if dt else 1.0)
    fig = Figure(figsize=(6.4, 3.2), dpi=100)
    FigureCanvasAgg(fig)  # the figure draws on its own Agg canvas (no pyplot)
    ax = fig.add_subplot(1, 1, 1)
    with np.errstate(divide="ignore"):
        for w in range(profile.shape[1]):
            ax.plot(x, np.log10(profile[:, w]), linewidth=1.0, label=f"world {w}" if profile.shape[1] <= 8 else None)
    if max_norm is not None and np.isfinite(max_norm) and max_norm > 0:
        ax.axhline(np.log10(max_norm), color="k", linestyle="--", linewidth=1.0, label="max_norm")
    ax.set_xlabel("time [s]" if dt else "step")
    ax.set_ylabel("log10 |adjoint of state t+1|")
    if title:
        ax.set_title(title)
    if profile.shape[1] <= 8 or max_norm is not None:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    from harness.events import figure_rgb  # TensorBoard's protobufs: only when a profile is drawn

    return figure_rgb(fig)


def profile_histogram_values(profile: np.ndarray) -> dict[str, np.ndarray]:
    """The values to histogram: ``log10`` of every finite, non-zero per-step, per-world norm."""
    flat = np.asarray(profile, dtype=np.float64).ravel()
    flat = flat[np.isfinite(flat) & (flat > 0)]
    return {tags.ADJOINT_HISTOGRAM: np.log10(flat)}
