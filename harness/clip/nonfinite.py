"""Non-finite gradients: wrappers around any transformation, the error one raises, and
:class:`SkipGuard`, which undoes an update on the device.

The way optax wraps a transformation in ``apply_if_finite`` or ``zero_nans``, a wrapper
takes any transformation (:mod:`harness.transform`: a clip policy, or the trainer's whole
chain of clip, schedule, optimizer and bounds) and returns one that first looks at the
nan/inf count of ``shared.stats``, then runs the inner one:

* :func:`skip_if_nonfinite`: an iteration with nan/inf makes no update: :class:`SkipGuard`
  saves the parameters and the inner state before the inner update and puts them back
  after it when the device ``skip`` flag is set (all but the arrays that only describe the
  last update, a clip policy's ``coef`` and ``clipped``: a skipped step reads as not
  clipped); counted in ``skipped``;
* :func:`zero_nonfinite`: nan/inf entries become 0 before the inner update, which sees the
  statistics of the zeroed gradient;
* :func:`error_if_nonfinite`: as skip, and from the first bad iteration on every update is
  skipped; :meth:`NonFinite.check` (the trainer calls it at every read-back) raises
  :class:`NonFiniteGradientError` naming the iteration and the parameter.

The wrapper's own state is ``nonfinite/skip`` (1 for a skipped iteration), ``nonfinite/skipped``
(how many), ``nonfinite/iteration`` (updates seen), ``nonfinite/first_iteration`` and
``nonfinite/first_param`` (the first bad iteration and parameter index, -1 before any), int32
``(1,)`` each; the inner state keeps its keys. ``clip.nonfinite`` (``skip``, ``zero`` or
``error``) picks the wrapper of the trainer's update (:func:`with_nonfinite`).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from typing import Any

import warp as wp

from harness.chunks import ChunkTable
from harness.clip.kernels import guard_restore_kernel, nonfinite_stage_kernel, zero_nonfinite_kernel
from harness.params import ParamSet
from harness.stats import FlatStats
from harness.transform import Shared, substate

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


OWN = ("skip", "skipped", "iteration", "first_iteration", "first_param")
"""The wrapper's own state keys (under ``nonfinite/``)."""


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """A transformation run under a non-finite policy (built by the functions below).

    Attributes:
        inner: The wrapped transformation.
        mode: ``skip``, ``zero`` or ``error``.
        name: The inner transformation's name.
    """

    inner: Any
    mode: str
    name: str = ""
    _cache: weakref.WeakKeyDictionary = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary, compare=False, repr=False
    )

    def init(self, params: ParamSet, shared: Shared | None = None) -> dict[str, wp.array]:
        """The wrapper's counters (``nonfinite/...``) and the inner state; publishes ``skip``."""
        shared = shared if shared is not None else Shared()
        dev = params.device
        own = {key: wp.zeros(1, dtype=wp.int32, device=dev) for key in OWN[:3]}
        own.update({key: wp.full(1, -1, dtype=wp.int32, device=dev) for key in OWN[3:]})
        shared.publish("skip", own["skip"])
        inner = self.inner.init(params, shared)
        if any(key.startswith("nonfinite/") for key in inner):
            raise ValueError(f"{self.name}: the inner state already has nonfinite/ keys (wrapped twice?)")
        # Everything the update needs is allocated here, none of it during an update (capture):
        # per state (keyed by its skip flag), the zeroed gradient's statistics or the guard,
        # which leaves the last update's reports (a clip policy's coef, clipped) as written.
        scratch = self._cache.setdefault(params, {})
        if self.mode == "zero":
            scratch[own["skip"].ptr] = FlatStats(params)
        else:
            scratch[own["skip"].ptr] = SkipGuard(
                params, {k: v for k, v in inner.items() if not shared.is_report(v)}, own["skip"]
            )
        return {**{f"nonfinite/{key}": value for key, value in own.items()}, **inner}

    def update(self, params: ParamSet, state: dict[str, wp.array], shared: Shared) -> None:
        """The non-finite stage (one launch), then the inner update (under the guard for
        ``skip`` and ``error``, on the zeroed gradient for ``zero``)."""
        stats = shared.stats
        if stats is None:
            raise ValueError(f"{self.name}: shared.stats (the gradient's statistics) is needed")
        dev = params.device
        own = substate(state, "nonfinite")
        inner = {key: value for key, value in state.items() if not key.startswith("nonfinite/")}
        wp.launch(
            nonfinite_stage_kernel,
            dim=1,
            inputs=[
                NONFINITE_MODES.index(self.mode),
                params.segment_count,
                stats.nonfinite,
                stats.segment_nonfinite,
                own["skip"],
                own["skipped"],
                own["iteration"],
                own["first_iteration"],
                own["first_param"],
            ],
            device=dev,
        )
        prepared = self._cache[params][own["skip"].ptr]
        if self.mode == "zero":
            wp.launch(zero_nonfinite_kernel, dim=params.size, inputs=[params.grad], device=dev)
            prepared.compute(params.grad)  # the statistics of the zeroed gradient
            self.inner.update(params, inner, shared.with_stats(prepared))
            return
        guard = prepared
        guard.save()
        self.inner.update(params, inner, shared)
        guard.restore()

    def check(self, params: ParamSet, state: dict[str, wp.array]) -> None:
        """Raise :class:`NonFiniteGradientError` if the ``error`` wrapper saw nan/inf.

        One host read of two integers; call it where the host synchronises anyway (the
        trainer's log read-back). Under ``error`` every update from the bad iteration on is
        already skipped on the device, so the parameters are those before it.
        """
        if self.mode != "error":
            return
        iteration = int(state["nonfinite/first_iteration"].numpy()[0])
        if iteration >= 0:
            raise NonFiniteGradientError(iteration, params.names[int(state["nonfinite/first_param"].numpy()[0])])


def _wrap(inner: Any, mode: str) -> NonFinite:
    if isinstance(inner, NonFinite):
        raise ValueError(f"clip: '{inner.name}' already handles non-finite gradients ({inner.mode})")
    return NonFinite(inner=inner, mode=mode, name=inner.name)


def skip_if_nonfinite(inner: Any) -> NonFinite:
    """``inner``, except that an iteration whose gradient holds nan or inf makes no update:
    the parameters and the inner state are put back as they were (``optax.apply_if_finite``
    without its tolerance of a few bad steps). Besides the inner update: the stage (one
    launch), the save (one memory copy per covered array) and the restore (one launch).

    Raises:
        ValueError: If ``inner`` is already wrapped.
    """
    return _wrap(inner, "skip")


def zero_nonfinite(inner: Any) -> NonFinite:
    """``inner`` on the gradient with every nan/inf entry set to 0 (``optax.zero_nans``, with
    infinities too); it sees the statistics of the zeroed gradient (four launches more).
    ``nonfinite/skip`` stays 0.

    Raises:
        ValueError: If ``inner`` is already wrapped.
    """
    return _wrap(inner, "zero")


def error_if_nonfinite(inner: Any) -> NonFinite:
    """``inner``, and the run stops at the first nan/inf gradient: from that iteration on no
    update happens on the device, and :meth:`NonFinite.check` raises
    :class:`NonFiniteGradientError` naming the iteration and the parameter.

    Raises:
        ValueError: If ``inner`` is already wrapped.
    """
    return _wrap(inner, "error")


def check_mode(nonfinite: Any) -> str:
    """``nonfinite`` if it is a ``clip.nonfinite`` value (``skip``, ``zero`` or ``error``).

    Raises:
        ValueError: One line naming ``clip.nonfinite`` for any other value.
    """
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(f"clip.nonfinite must be one of {', '.join(NONFINITE_MODES)}, got {nonfinite!r}")
    return nonfinite


def with_nonfinite(inner: Any, nonfinite: str) -> NonFinite:
    """``inner`` wrapped as ``clip.nonfinite`` says (``skip``, ``zero`` or ``error``).

    Raises:
        ValueError: One line naming ``clip.nonfinite`` for any other value.
    """
    return _wrap(inner, check_mode(nonfinite))


class SkipGuard:
    """Makes an update a no-op on the device when the flag ``skip`` is 1.

    Works with any transformation, without knowing its internals: :meth:`save` copies the
    parameters and every array of its state into a snapshot of the same arrays (``wp.copy``,
    one memory copy per array, bit for bit) before the update; :meth:`restore` copies them
    back after it when the skip flag is set: one launch over the arrays as a
    :class:`~harness.chunks.ChunkTable` of 32-bit words (``ChunkTable.for_words``), one thread
    per chunk, which reads the flag and returns when it is 0. No host branch; the cost is one
    copy of parameters plus state per update (two when it is undone).

    Args:
        params: The parameters.
        state: The state to cover; every ``wp.array`` value is covered.
        skip: The device flag (``nonfinite/skip``).

    Raises:
        ValueError: If an array is not on the parameters' device, not contiguous or not a
            whole number of 32-bit words.
    """

    def __init__(self, params: ParamSet, state: Mapping[str, Any], skip: wp.array):
        arrays = [params.data, *(v for v in state.values() if isinstance(v, wp.array))]
        if any(array.device != params.device for array in arrays):
            raise ValueError("SkipGuard: arrays must be on the parameters' device")
        self.table = ChunkTable.for_words(arrays, device=params.device)
        self.skip = skip
        self._arrays = arrays  # keep the covered buffers alive
        self._saved = [wp.empty_like(array, requires_grad=False) for array in arrays]
        self._saved_table = ChunkTable.for_words(self._saved, device=params.device)  # the same chunks

    def save(self) -> None:
        """Snapshot the parameters and the covered state (call right before the update)."""
        for live, saved in zip(self._arrays, self._saved, strict=True):
            wp.copy(saved, live)

    def restore(self) -> None:
        """Put the snapshot back if the skip flag is set (call right after the update)."""
        table = self.table
        wp.launch(
            guard_restore_kernel,
            dim=table.chunk_count,
            inputs=[table.chunk_offset, self._saved_table.chunk_offset, table.chunk_length, self.skip],
            device=self.skip.device,
        )
