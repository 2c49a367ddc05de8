"""Non-finite gradients: the ``nonfinite`` setting every clip policy carries, the error it
raises, and :class:`SkipGuard`, which makes an optimizer step a no-op on the device.

``skip`` (the iteration makes no update), ``zero`` (nan/inf entries become 0 before the
rule) or ``error`` (stop, naming the iteration and the parameter at the next read-back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import warp as wp

from harness.clip.kernels import guard_copy_kernel
from harness.params import ParamSet

NONFINITE_MODES = ("skip", "zero", "error")
"""Accepted values of a policy's ``nonfinite`` setting."""

ZERO = NONFINITE_MODES.index("zero")
"""The ``zero`` mode's index, as ``nonfinite_stage_kernel`` receives it (skip 0, zero 1, error 2)."""


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


def check_nonfinite(nonfinite: str) -> int:
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(f"clip.nonfinite must be one of {', '.join(NONFINITE_MODES)}, got {nonfinite!r}")
    return NONFINITE_MODES.index(nonfinite)


class SkipGuard:
    """Makes an optimizer step a no-op on the device when ``clip_state["skip"]`` is 1.

    Works with any optimizer, without knowing its internals: :meth:`save` copies the
    parameters and every array of the optimizer state (as raw 32-bit words, so integer
    counters and floats come back bit-identical) before the step; :meth:`restore` copies
    them back after the step when the skip flag is set. One launch each, no host branch;
    the cost is two copies of parameters plus optimizer state per iteration. An optimizer
    that reads the flag itself (``if skip[0]: return`` in its kernels) can replace the guard.

    Args:
        params: The parameters.
        opt_state: The optimizer state; every ``wp.array`` value is covered.
        skip: The device flag, ``clip_state["skip"]``.

    Raises:
        ValueError: If an array is not contiguous, not on the parameters' device, or not a
            whole number of 32-bit words.
    """

    def __init__(self, params: ParamSet, opt_state: Mapping[str, Any], skip: wp.array):
        arrays = [params.data, *(v for v in opt_state.values() if isinstance(v, wp.array))]
        offsets, lengths, saved_starts = [], [], []
        total = 0
        for array in arrays:
            nbytes = array.size * wp.types.type_size_in_bytes(array.dtype)
            if not array.is_contiguous or array.device != params.device or nbytes % 4:
                raise ValueError("SkipGuard: arrays must be contiguous, 32-bit aligned and on the parameters' device")
            words = nbytes // 4
            for start in range(0, words, 256):
                offsets.append(array.ptr + 4 * start)
                lengths.append(min(256, words - start))
                saved_starts.append(total + start)
            total += words
        dev = params.device
        self.skip = skip
        self._chunk_offset = wp.array(np.array(offsets, np.int64), dtype=wp.int64, device=dev)
        self._chunk_length = wp.array(np.array(lengths, np.int32), dtype=wp.int32, device=dev)
        self._chunk_saved = wp.array(np.array(saved_starts, np.int32), dtype=wp.int32, device=dev)
        self._saved = wp.zeros(max(total, 1), dtype=wp.uint32, device=dev)
        self._dim = (len(offsets), max(lengths, default=0))
        self._arrays = arrays  # keep the covered buffers alive

    def _launch(self, restore: int) -> None:
        wp.launch(
            guard_copy_kernel,
            dim=self._dim,
            inputs=[self._chunk_offset, self._chunk_length, self._chunk_saved, self._saved, restore, self.skip],
            device=self._saved.device,
        )

    def save(self) -> None:
        """Snapshot parameters and optimizer state (call right before the optimizer step)."""
        self._launch(0)

    def restore(self) -> None:
        """Put the snapshot back if the skip flag is set (call right after the optimizer step)."""
        self._launch(1)
