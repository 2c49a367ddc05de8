"""Non-finite gradients: wrappers around any clip policy, the error one raises, and
:class:`SkipGuard`, which makes an optimizer step a no-op on the device.

The way optax wraps a transformation in ``apply_if_finite`` or ``zero_nans``, a wrapper
takes any :class:`~harness.clip.ClipPolicy` (a chain included) and returns one that first
looks at the pre-clip statistics' nan/inf count, then runs the inner rule:

* :func:`skip_if_nonfinite`: the iteration makes no update (the device ``skip`` flag is
  set; :class:`SkipGuard` undoes the optimizer step), counted in ``skipped``;
* :func:`zero_nonfinite`: nan/inf entries become 0 before the rule, which sees the
  statistics of the zeroed gradient;
* :func:`error_if_nonfinite`: as skip, and from the first bad iteration on every update is
  skipped; the trainer raises :class:`NonFiniteGradientError` naming the iteration and the
  parameter at the next read-back.

``clip.nonfinite`` (``skip``, ``zero`` or ``error``) picks one in a config
(:func:`with_nonfinite`); the trainer runs a bare policy under :func:`skip_if_nonfinite`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import warp as wp

from harness.chunks import ChunkTable
from harness.clip.kernels import guard_copy_kernel, nonfinite_stage_kernel, zero_nonfinite_kernel
from harness.clip.policies import ClipPolicy, _scratch, _ScratchCache
from harness.params import ParamSet
from harness.stats import FlatStats

NONFINITE_MODES = ("skip", "zero", "error")
"""Accepted values of ``clip.nonfinite``, in the order ``nonfinite_stage_kernel`` numbers them."""


class NonFiniteGradientError(FloatingPointError):
    """A gradient held nan or inf under the ``error`` non-finite policy.

    Attributes:
        iteration: The first iteration (0-based count of ``update`` calls) with a non-finite entry.
        parameter: Name of the first parameter (in layout order) holding one.
    """

    def __init__(self, iteration: int, parameter: str):
        self.iteration = iteration
        self.parameter = parameter
        super().__init__(
            f"non-finite gradient (nan or inf) at iteration {iteration} in parameter '{parameter}'; "
            "parameters were left as they were before that iteration (clip.nonfinite=error)"
        )


def _wrap(inner: ClipPolicy, mode: str) -> ClipPolicy:
    if inner.nonfinite is not None:
        raise ValueError(f"clip: '{inner.name}' already handles non-finite gradients ({inner.nonfinite})")
    code = NONFINITE_MODES.index(mode)
    stats_cache = _ScratchCache()

    def init(params: ParamSet) -> dict[str, wp.array]:
        dev = params.device
        state = inner.init(params)
        state["skipped"] = wp.zeros(1, dtype=wp.int32, device=dev)
        state["iteration"] = wp.zeros(1, dtype=wp.int32, device=dev)
        state["nonfinite_iteration"] = wp.full(1, -1, dtype=wp.int32, device=dev)
        state["nonfinite_param"] = wp.full(1, -1, dtype=wp.int32, device=dev)
        return state

    def update(params: ParamSet, state: dict[str, wp.array], stats: FlatStats) -> None:
        dev = params.device
        wp.launch(
            nonfinite_stage_kernel,
            dim=1,
            inputs=[
                code,
                params.segment_count,
                stats.nonfinite,
                stats.segment_nonfinite,
                state["skip"],
                state["skipped"],
                state["iteration"],
                state["nonfinite_iteration"],
                state["nonfinite_param"],
            ],
            device=dev,
        )
        if mode == "zero":
            wp.launch(zero_nonfinite_kernel, dim=params.size, inputs=[params.grad], device=dev)
            stats = _scratch(stats_cache, params, lambda: FlatStats(params))
            stats.compute(params.grad)
        inner.update(params, state, stats)

    return dataclasses.replace(inner, init=init, update=update, nonfinite=mode)


def skip_if_nonfinite(inner: ClipPolicy) -> ClipPolicy:
    """``inner``, except that an iteration whose gradient holds nan or inf makes no update.

    Adds to the state ``skipped`` (iterations skipped), ``iteration`` (updates seen) and
    ``nonfinite_iteration``/``nonfinite_param`` (the first bad iteration and parameter, -1
    before any), int32 ``(1,)`` each, and sets ``skip`` (1 for a skipped iteration). One
    single-thread launch before the rule.

    Raises:
        ValueError: If ``inner`` is already wrapped.
    """
    return _wrap(inner, "skip")


def zero_nonfinite(inner: ClipPolicy) -> ClipPolicy:
    """``inner`` on the gradient with every nan/inf entry set to 0 (``optax.zero_nans``, with
    infinities too); the rule sees the statistics of the zeroed gradient (three launches
    more). The state is that of :func:`skip_if_nonfinite`; ``skip`` stays 0.

    Raises:
        ValueError: If ``inner`` is already wrapped.
    """
    return _wrap(inner, "zero")


def error_if_nonfinite(inner: ClipPolicy) -> ClipPolicy:
    """``inner``, and the run stops at the first nan/inf gradient: from that iteration on no
    update happens on the device, and :meth:`ClipPolicy.check` (the trainer calls it at
    every read-back) raises :class:`NonFiniteGradientError` naming the iteration and the
    parameter. The state is that of :func:`skip_if_nonfinite`.

    Raises:
        ValueError: If ``inner`` is already wrapped.
    """
    return _wrap(inner, "error")


WRAPPERS = {"skip": skip_if_nonfinite, "zero": zero_nonfinite, "error": error_if_nonfinite}
"""The wrapper of each ``clip.nonfinite`` value."""


def with_nonfinite(inner: ClipPolicy, nonfinite: str) -> ClipPolicy:
    """``inner`` wrapped as ``clip.nonfinite`` says (``skip``, ``zero`` or ``error``).

    Raises:
        ValueError: One line naming ``clip.nonfinite`` for any other value.
    """
    if nonfinite not in WRAPPERS:
        raise ValueError(f"clip.nonfinite must be one of {', '.join(NONFINITE_MODES)}, got {nonfinite!r}")
    return WRAPPERS[nonfinite](inner)


class SkipGuard:
    """Makes an optimizer step a no-op on the device when ``clip_state["skip"]`` is 1.

    Works with any optimizer, without knowing its internals: :meth:`save` copies the
    parameters and every array of the optimizer state (as raw 32-bit words, so integer
    counters and floats come back bit-identical) before the step; :meth:`restore` copies
    them back after the step when the skip flag is set. The arrays are walked as one
    :class:`~harness.chunks.ChunkTable` of 32-bit words (``ChunkTable.for_words``). One
    launch each, no host branch;
    the cost is two copies of parameters plus optimizer state per iteration. An optimizer
    that reads the flag itself (``if skip[0]: return`` in its kernels) can replace the guard.

    Args:
        params: The parameters.
        opt_state: The optimizer state; every ``wp.array`` value is covered.
        skip: The device flag, ``clip_state["skip"]``.

    Raises:
        ValueError: If an array is not on the parameters' device, not contiguous or not a
            whole number of 32-bit words.
    """

    def __init__(self, params: ParamSet, opt_state: Mapping[str, Any], skip: wp.array):
        arrays = [params.data, *(v for v in opt_state.values() if isinstance(v, wp.array))]
        if any(array.device != params.device for array in arrays):
            raise ValueError("SkipGuard: arrays must be on the parameters' device")
        self.table = ChunkTable.for_words(arrays, device=params.device)
        self.skip = skip
        self._saved = wp.zeros(max(self.table.scalar_count, 1), dtype=wp.uint32, device=params.device)
        self._arrays = arrays  # keep the covered buffers alive

    def _launch(self, restore: int) -> None:
        table = self.table
        wp.launch(
            guard_copy_kernel,
            dim=(table.chunk_count, max(table.max_chunk, 1)),
            inputs=[table.chunk_offset, table.chunk_length, table.chunk_packed, self._saved, restore, self.skip],
            device=self._saved.device,
        )

    def save(self) -> None:
        """Snapshot parameters and optimizer state (call right before the optimizer step)."""
        self._launch(0)

    def restore(self) -> None:
        """Put the snapshot back if the skip flag is set (call right after the optimizer step)."""
        self._launch(1)
