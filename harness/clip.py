"""Gradient clipping: policies over the flat gradient, a non-finite policy, and a functional API.

This module owns every rule that rescales or clamps a gradient after backward:

* Clip policies (:class:`ClipPolicy`), each built by a factory that can be the ``_target_``
  of a Hydra config under ``configs/clip/``: :func:`no_clip`, :func:`clip_by_value`,
  :func:`clip_by_global_norm`, :func:`clip_by_norm_per_param`, :func:`adaptive_grad_clip`
  (AGC), :func:`autoclip`, :func:`zclip` and :func:`chain`. ``update`` rescales
  ``params.grad`` in place from the pre-clip :class:`~harness.stats.FlatStats` and keeps
  every number it decides (coefficient, threshold, history, skip flag) in device arrays,
  so a clipped step never goes back to the host and can be captured in a CUDA graph.
* The non-finite policy every clip policy carries (``nonfinite=``): ``skip`` (the
  iteration makes no update; see :class:`SkipGuard`), ``zero`` (nan/inf entries become 0
  before clipping) or ``error`` (stop, naming the iteration and the parameter; see
  :meth:`ClipPolicy.check`).
* The PyTorch-style functional API :func:`clip_grad_norm_` and :func:`clip_grad_value_`
  over a list of Warp arrays of any float dtype, a fixed number of launches however many
  arrays there are.

In-backward clipping of the simulation state's adjoint lives in :mod:`harness.adjoint`;
its setting travels with the policy (``ClipPolicy.adjoint``) because it is configured in
the same config group (``clip.adjoint.max_norm``).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import warp as wp

from harness.params import ParamSet
from harness.stats import ChunkTable, FlatStats, GroupNorms, chunk_view, norm_kind, scalar_type_of

__all__ = [
    "NONFINITE_MODES",
    "AdjointSettings",
    "ClipPolicy",
    "NonFiniteGradientError",
    "SkipGuard",
    "adaptive_grad_clip",
    "agc_units",
    "autoclip",
    "chain",
    "clip_by_global_norm",
    "clip_by_norm_per_param",
    "clip_by_value",
    "clip_grad_norm_",
    "clip_grad_value_",
    "no_clip",
    "zclip",
]

NONFINITE_MODES = ("skip", "zero", "error")
"""Accepted values of a policy's ``nonfinite`` setting."""

_SKIP, _ZERO, _ERROR = 0, 1, 2
_MODE_GLOBAL, _MODE_PER_GROUP, _MODE_AGC = 0, 1, 2
_EPS = 1.0e-6
"""The epsilon of ``torch.nn.utils.clip_grad_norm_``: ``coef = max_norm / (total + 1e-6)``."""


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


@dataclasses.dataclass(frozen=True)
class AdjointSettings:
    """In-backward clipping of the simulation state's adjoint (``clip.adjoint``).

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


@dataclasses.dataclass(frozen=True)
class ClipRule:
    """One clipping rule; :class:`ClipPolicy` wraps one rule, :func:`chain` several.

    Attributes:
        name: Short name (``"global_norm"``).
        init: ``init(params)`` allocates the rule's own state arrays (besides ``coef``/``clipped``).
        apply: ``apply(params, state, stats, skip)`` clips ``params.grad`` in place from
            ``stats`` and writes ``state["coef"]`` and ``state["clipped"]``; a stateful rule
            leaves its history untouched when the device flag ``skip[0]`` is 1.
    """

    name: str
    init: Callable[[ParamSet], dict[str, wp.array]]
    apply: Callable[[ParamSet, dict[str, wp.array], FlatStats, wp.array], None]


@dataclasses.dataclass(frozen=True)
class ClipPolicy:
    """A gradient clip policy with its non-finite policy.

    State (``init(params)``), all device arrays:

    * ``coef`` float32 ``(1,)``: the smallest factor applied to any entry at the last update
      (the global factor for global-norm rules), 1 when nothing was clipped.
    * ``clipped`` int32 ``(1,)``: 1 when any entry was scaled down or clamped.
    * ``skip`` int32 ``(1,)``: 1 when this iteration's update must not happen (see
      :class:`SkipGuard`); ``skipped`` int32 ``(1,)``: how many iterations were skipped.
    * ``iteration`` int32 ``(1,)``: number of updates so far; ``nonfinite_iteration`` and
      ``nonfinite_param`` int32 ``(1,)``: first iteration with a nan/inf gradient and the
      index of the first parameter holding one (-1 while none was seen).
    * rule state, e.g. ``threshold`` (float32 ``(1,)``, the norm limit of the last update,
      inf when there was none), AutoClip's history or ZClip's EMA; in a chain each member's
      keys are prefixed ``"<index>/"``.

    Attributes:
        name: Short name for logs.
        init: Allocates the state on the parameters' device.
        update: ``update(params, state, stats)``: rescales ``params.grad`` in place, where
            ``stats`` are the pre-clip statistics of ``params.grad``.
        nonfinite: ``"skip"``, ``"zero"`` or ``"error"``.
        adjoint: In-backward adjoint clip settings, applied by :mod:`harness.adjoint`.
    """

    name: str
    init: Callable[[ParamSet], dict[str, wp.array]]
    update: Callable[[ParamSet, dict[str, wp.array], FlatStats], None]
    nonfinite: str = "skip"
    adjoint: AdjointSettings = dataclasses.field(default_factory=AdjointSettings)
    rules: tuple[ClipRule, ...] = ()

    def check(self, params: ParamSet, state: dict[str, wp.array]) -> None:
        """Raise :class:`NonFiniteGradientError` if the ``error`` policy saw nan/inf.

        One host read of two integers; call it where the host synchronises anyway (the
        trainer's log read-back). Under ``error`` every update from the bad iteration on is
        already skipped on the device, so the parameters are those before it.
        """
        if self.nonfinite != "error":
            return
        iteration = int(state["nonfinite_iteration"].numpy()[0])
        if iteration >= 0:
            raise NonFiniteGradientError(iteration, params.names[int(state["nonfinite_param"].numpy()[0])])


# --------------------------------------------------------------------------- kernels


@wp.func
def _clip_coef(max_norm: wp.float64, norm: wp.float64, use_f64: int) -> wp.float64:
    """``min(1, max_norm / (norm + 1e-6))`` in the gradient's precision; nan stays nan."""
    c = wp.float64(0.0)
    if use_f64 != 0:
        c = max_norm / (norm + wp.float64(1.0e-6))
    else:
        c = wp.float64(wp.float32(max_norm) / (wp.float32(norm) + wp.float32(1.0e-6)))
    if c > wp.float64(1.0):
        c = wp.float64(1.0)
    return c


@wp.func
def _group_coef(
    mode: int,
    g: int,
    max_norm: wp.float64,
    use_f64: int,
    eps: wp.float64,
    group_norm: wp.array(dtype=wp.float64),
    total: wp.array(dtype=wp.float64),
    param_norm: wp.array(dtype=wp.float64),
) -> wp.float64:
    if mode == 0:
        return _clip_coef(max_norm, total[0], use_f64)
    if mode == 1:
        return _clip_coef(max_norm, group_norm[g], use_f64)
    # AGC: clip when |G| > lambda * max(|W|, eps), to that limit (Brock et al. 2021).
    limit = max_norm * wp.max(param_norm[g], eps)
    gn = group_norm[g]
    if gn > limit:
        return limit / wp.max(gn, wp.float64(1.0e-6))
    return wp.float64(1.0)


@wp.kernel
def _scale_groups_kernel(
    base: wp.uint64,
    zero: Any,
    chunk_offset: wp.array(dtype=wp.int64),
    chunk_length: wp.array(dtype=wp.int32),
    chunk_group: wp.array(dtype=wp.int32),
    lanes: int,
    mode: int,
    max_norm: wp.float64,
    use_f64: int,
    eps: wp.float64,
    group_norm: wp.array(dtype=wp.float64),
    total: wp.array(dtype=wp.float64),
    param_norm: wp.array(dtype=wp.float64),
    group_count: int,
    group_coef: wp.array(dtype=wp.float32),
    coef_out: wp.array(dtype=wp.float32),
    clipped_out: wp.array(dtype=wp.int32),
):
    # Thread (c, j) scales entries j, j + lanes, ... of chunk c: lanes = 1 on a CPU (one
    # thread per chunk), lanes = CHUNK on a GPU (one thread per entry, coalesced).
    c, j = wp.tid()
    n = chunk_length[c]
    if j < n:
        coef = _group_coef(mode, chunk_group[c], max_norm, use_f64, eps, group_norm, total, param_norm)
        a = chunk_view(base, chunk_offset[c], n, zero)
        factor = type(zero)(coef)  # the coefficient in the gradient's precision, as torch multiplies
        for i in range(j, n, lanes):
            a[i] = a[i] * factor
    if c == 0 and j == 0:
        smallest = wp.float64(1.0)
        for g in range(group_count):
            k = _group_coef(mode, g, max_norm, use_f64, eps, group_norm, total, param_norm)
            group_coef[g] = wp.float32(k)
            if not (k >= smallest):  # keeps a nan coefficient visible
                smallest = k
        coef_out[0] = wp.float32(smallest)
        clipped_out[0] = wp.where(smallest < wp.float64(1.0), 1, 0)


@wp.kernel
def _reset_coef_kernel(coef: wp.array(dtype=wp.float32), clipped: wp.array(dtype=wp.int32)):
    coef[0] = wp.float32(1.0)
    clipped[0] = 0


@wp.kernel
def _clamp_chunks_kernel(
    base: wp.uint64,
    zero: Any,
    chunk_offset: wp.array(dtype=wp.int64),
    chunk_length: wp.array(dtype=wp.int32),
    clip_value: wp.float64,
    coef_out: wp.array(dtype=wp.float32),
    clipped_out: wp.array(dtype=wp.int32),
):
    c = wp.tid()
    a = chunk_view(base, chunk_offset[c], chunk_length[c], zero)
    v = type(zero)(clip_value)
    smallest = wp.float64(1.0)
    for i in range(chunk_length[c]):
        x = a[i]
        # Comparisons are false for nan, so nan passes through (torch.clamp).
        if x > v or x < -v:
            smallest = wp.min(smallest, wp.float64(v) / wp.abs(wp.float64(x)))
            a[i] = wp.where(x > v, v, -v)
    if smallest < wp.float64(1.0):
        wp.atomic_min(coef_out, 0, wp.float32(smallest))
        clipped_out[0] = 1


@wp.kernel
def _scale_by_global_norm_kernel(
    threshold: wp.array(dtype=wp.float32),
    norm: wp.array(dtype=wp.float32),
    grad: wp.array(dtype=wp.float32),
    coef_out: wp.array(dtype=wp.float32),
    clipped_out: wp.array(dtype=wp.int32),
):
    i = wp.tid()
    coef = threshold[0] / (norm[0] + 1.0e-6)
    # Clamp with a comparison rather than min() so that a nan coefficient stays nan.
    if coef > 1.0:
        coef = wp.float32(1.0)
    grad[i] = grad[i] * coef
    if i == 0:
        coef_out[0] = coef
        if coef < 1.0:
            clipped_out[0] = 1
        else:
            clipped_out[0] = 0


@wp.kernel
def _nonfinite_stage_kernel(
    mode: int,
    segment_count: int,
    nonfinite: wp.array(dtype=wp.int32),
    segment_nonfinite: wp.array(dtype=wp.int32),
    skip: wp.array(dtype=wp.int32),
    skipped: wp.array(dtype=wp.int32),
    iteration: wp.array(dtype=wp.int32),
    nonfinite_iteration: wp.array(dtype=wp.int32),
    nonfinite_param: wp.array(dtype=wp.int32),
):
    it = iteration[0]
    bad = nonfinite[0] > 0
    if bad and nonfinite_iteration[0] < 0:
        nonfinite_iteration[0] = it
        first = int(-1)  # noqa: RUF046, UP018  (a dynamic Warp variable, mutated in the loop)
        for k in range(segment_count):
            if first < 0 and segment_nonfinite[k] > 0:
                first = k
        nonfinite_param[0] = first
    s = 0
    if bad and mode != 1:  # skip and error: no update from non-finite gradients
        s = 1
    if mode == 2 and nonfinite_iteration[0] >= 0:  # error: freeze until the host stops the run
        s = 1
    skip[0] = s
    skipped[0] = skipped[0] + s
    iteration[0] = it + 1


@wp.kernel
def _zero_nonfinite_kernel(grad: wp.array(dtype=wp.float32)):
    i = wp.tid()
    if not wp.isfinite(grad[i]):
        grad[i] = wp.float32(0.0)


@wp.kernel
def _chain_combine_kernel(
    member_coef: wp.array(dtype=wp.float32),
    member_clipped: wp.array(dtype=wp.int32),
    coef: wp.array(dtype=wp.float32),
    clipped: wp.array(dtype=wp.int32),
):
    coef[0] = coef[0] * member_coef[0]
    clipped[0] = wp.max(clipped[0], member_clipped[0])


# --------------------------------------------------------------------------- policy assembly

_ScratchCache = weakref.WeakKeyDictionary
"""Per-ParamSet scratch (tables, intermediate statistics): not state, recomputed every update."""


def _scratch(cache: weakref.WeakKeyDictionary, params: ParamSet, build: Callable[[], Any]) -> Any:
    if params not in cache:
        cache[params] = build()
    return cache[params]


def _check_nonfinite(nonfinite: str) -> int:
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(f"clip.nonfinite must be one of {', '.join(NONFINITE_MODES)}, got {nonfinite!r}")
    return NONFINITE_MODES.index(nonfinite)


def _adjoint_settings(adjoint: Mapping[str, Any] | AdjointSettings | None) -> AdjointSettings:
    if adjoint is None:
        return AdjointSettings()
    if isinstance(adjoint, AdjointSettings):
        return adjoint
    unknown = set(adjoint) - {"max_norm", "profile"}
    if unknown:
        raise ValueError(f"clip.adjoint accepts max_norm and profile, got {sorted(unknown)}")
    max_norm = adjoint.get("max_norm")
    if max_norm is not None:
        try:
            max_norm = float(max_norm)
        except (TypeError, ValueError):
            raise ValueError(f"clip.adjoint.max_norm must be null or a number >= 0, got {max_norm!r}") from None
        if not max_norm >= 0.0:
            raise ValueError(f"clip.adjoint.max_norm must be null or >= 0, got {max_norm}")
    return AdjointSettings(max_norm=max_norm, profile=bool(adjoint.get("profile", False)))


def _policy_norm_type(norm_type: float | str) -> float:
    """The p of a policy's ``clip.norm_type``, with errors naming the config field."""
    try:
        return norm_kind(norm_type)[1]
    except ValueError as exc:
        raise ValueError(f"clip.{exc}") from None


def _check_limit(field: str, value: float, *, positive: bool = False) -> float:
    value = float(value)
    if not (value > 0.0 if positive else value >= 0.0):
        raise ValueError(f"clip.{field} must be {'> 0' if positive else '>= 0'}, got {value}")
    return value


def _build_policy(
    name: str, rules: Sequence[ClipRule], nonfinite: str, adjoint: Mapping[str, Any] | AdjointSettings | None
) -> ClipPolicy:
    mode = _check_nonfinite(nonfinite)
    settings = _adjoint_settings(adjoint)
    rules = tuple(rules)
    prefixes = [""] if len(rules) == 1 else [f"{i}/" for i in range(len(rules))]
    stats_cache: weakref.WeakKeyDictionary = _ScratchCache()

    def init(params: ParamSet) -> dict[str, wp.array]:
        dev = params.device
        state = {
            "coef": wp.ones(1, dtype=wp.float32, device=dev),
            "clipped": wp.zeros(1, dtype=wp.int32, device=dev),
            "skip": wp.zeros(1, dtype=wp.int32, device=dev),
            "skipped": wp.zeros(1, dtype=wp.int32, device=dev),
            "iteration": wp.zeros(1, dtype=wp.int32, device=dev),
            "nonfinite_iteration": wp.full(1, -1, dtype=wp.int32, device=dev),
            "nonfinite_param": wp.full(1, -1, dtype=wp.int32, device=dev),
        }
        for rule, prefix in zip(rules, prefixes, strict=True):
            if prefix:
                state[prefix + "coef"] = wp.ones(1, dtype=wp.float32, device=dev)
                state[prefix + "clipped"] = wp.zeros(1, dtype=wp.int32, device=dev)
            for key, value in rule.init(params).items():
                state[prefix + key] = value
        return state

    def update(params: ParamSet, state: dict[str, wp.array], stats: FlatStats) -> None:
        if stats.size != params.size:
            raise ValueError(f"clip: stats are for {stats.size} entries, params have {params.size}")
        dev = params.device
        wp.launch(
            _nonfinite_stage_kernel,
            dim=1,
            inputs=[
                mode,
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
        current = stats
        if mode == _ZERO:
            wp.launch(_zero_nonfinite_kernel, dim=params.size, inputs=[params.grad], device=dev)
            current = _scratch(stats_cache, params, lambda: FlatStats(params))
            current.compute(params.grad)
        if len(rules) > 1:
            wp.launch(_reset_coef_kernel, dim=1, inputs=[state["coef"], state["clipped"]], device=dev)
        for i, (rule, prefix) in enumerate(zip(rules, prefixes, strict=True)):
            if i > 0:
                # Later members see the gradient as the earlier ones left it.
                current = _scratch(stats_cache, params, lambda: FlatStats(params))
                current.compute(params.grad)
            sub = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
            rule.apply(params, sub, current, state["skip"])
            if prefix:
                wp.launch(
                    _chain_combine_kernel,
                    dim=1,
                    inputs=[sub["coef"], sub["clipped"], state["coef"], state["clipped"]],
                    device=dev,
                )

    return ClipPolicy(name=name, init=init, update=update, nonfinite=nonfinite, adjoint=settings, rules=rules)


def _threshold_state(value: float) -> Callable[[ParamSet], dict[str, wp.array]]:
    def init(params: ParamSet) -> dict[str, wp.array]:
        return {"threshold": wp.full(1, value, dtype=wp.float32, device=params.device)}

    return init


def _scale_by_threshold(params: ParamSet, state: dict[str, wp.array], norm: wp.array) -> None:
    wp.launch(
        _scale_by_global_norm_kernel,
        dim=params.size,
        inputs=[state["threshold"], norm, params.grad, state["coef"], state["clipped"]],
        device=params.device,
    )


def _segment_norms(cache: weakref.WeakKeyDictionary, params: ParamSet, p: float) -> GroupNorms:
    """The cached per-parameter p-norm reducer of ``params``."""

    def build() -> GroupNorms:
        return GroupNorms(ChunkTable.for_segments(params), norm_type=p, device=params.device)

    return _scratch(cache, params, build)


def _launch_scale_groups(
    table: ChunkTable,
    base: int,
    *,
    mode: int,
    max_norm: float,
    norms: GroupNorms,
    group_coef: wp.array,
    coef: wp.array,
    clipped: wp.array,
    use_f64: bool = False,
    eps: float = 0.0,
    param_norms: GroupNorms | None = None,
) -> None:
    lanes = table.max_chunk if norms.device.is_cuda else 1
    wp.launch(
        _scale_groups_kernel,
        dim=(table.chunk_count, max(lanes, 1)),
        inputs=[
            wp.uint64(base),
            table.scalar_type(0.0),
            table.chunk_offset,
            table.chunk_length,
            table.chunk_group,
            max(lanes, 1),
            mode,
            wp.float64(max_norm),
            int(use_f64),
            wp.float64(eps),
            norms.group_norm,
            norms.total,
            (param_norms or norms).group_norm,
            table.group_count,
            group_coef,
            coef,
            clipped,
        ],
        device=norms.device,
    )


# --------------------------------------------------------------------------- policies


def no_clip(*, nonfinite: str = "skip", adjoint: Mapping[str, Any] | None = None) -> ClipPolicy:
    """Leave gradients untouched: ``coef = 1``, ``clipped = 0`` forever.

    Args:
        nonfinite: Non-finite policy, ``skip``, ``zero`` or ``error``.
        adjoint: ``{"max_norm": float | None, "profile": bool}``, see :class:`AdjointSettings`.

    Returns:
        The policy.
    """

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del params, state, stats, skip

    return _build_policy("none", [ClipRule("none", lambda params: {}, apply)], nonfinite, adjoint)


def clip_by_value(
    clip_value: float, *, nonfinite: str = "skip", adjoint: Mapping[str, Any] | None = None
) -> ClipPolicy:
    """Clamp every gradient entry to ``[-clip_value, clip_value]``.

    Same rule as ``torch.nn.utils.clip_grad_value_``: ``g = min(max(g, -v), v)``; nan
    entries pass through unchanged, ``+-inf`` become ``+-v``. ``state["coef"]`` is the
    smallest ``v / |g|`` over the clamped entries (1 when none was). Two launches (reset,
    one thread per chunk of the flat gradient).

    Args:
        clip_value: ``v >= 0``.
        nonfinite: Non-finite policy, ``skip``, ``zero`` or ``error``.
        adjoint: See :class:`AdjointSettings`.

    Returns:
        The policy.

    Raises:
        ValueError: If ``clip_value`` is negative or nan.
    """
    clip_value = _check_limit("clip_value", clip_value)
    tables: weakref.WeakKeyDictionary = _ScratchCache()

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del stats, skip
        table = _scratch(tables, params, lambda: ChunkTable.for_segments(params))
        wp.launch(_reset_coef_kernel, dim=1, inputs=[state["coef"], state["clipped"]], device=params.device)
        _launch_clamp(table, params.grad.ptr, clip_value, state["coef"], state["clipped"])

    return _build_policy("value", [ClipRule("value", lambda params: {}, apply)], nonfinite, adjoint)


def _launch_clamp(table: ChunkTable, base: int, clip_value: float, coef: wp.array, clipped: wp.array) -> None:
    wp.launch(
        _clamp_chunks_kernel,
        dim=table.chunk_count,
        inputs=[
            wp.uint64(base),
            table.scalar_type(0.0),
            table.chunk_offset,
            table.chunk_length,
            wp.float64(clip_value),
            coef,
            clipped,
        ],
        device=coef.device,
    )


def clip_by_global_norm(
    max_norm: float,
    *,
    norm_type: float | str = 2.0,
    nonfinite: str = "skip",
    adjoint: Mapping[str, Any] | None = None,
) -> ClipPolicy:
    """Rescale all gradients together so that their global p-norm is at most ``max_norm``.

    Same rule as ``torch.nn.utils.clip_grad_norm_``: with
    ``total = (sum_i |g_i|^p)^(1/p)`` over every entry of every parameter (``max_i |g_i|``
    for ``p = inf``), ``coef = min(1, max_norm / (total + 1e-6))`` and ``g *= coef``
    applied unconditionally (a multiply by 1 when under the limit, no host branch).
    Consequences: a zero gradient stays zero; ``max_norm = 0`` zeroes every gradient; an
    infinite ``total`` zeroes the finite entries (and turns the infinite ones into nan,
    ``inf * 0``); a nan ``total`` makes every entry nan (the non-finite policy decides
    what happens to such an iteration). ``state["clipped"]`` is 1 when ``coef < 1``.

    For ``p = 2`` the total is ``stats.norm`` and the policy is one launch (plus the
    non-finite stage); other ``p`` add the three launches of a
    :class:`~harness.stats.GroupNorms` reduction.

    Args:
        max_norm: Largest allowed global norm, ``>= 0``.
        norm_type: ``p``: any number ``> 0`` or ``inf``.
        nonfinite: Non-finite policy, ``skip``, ``zero`` or ``error``.
        adjoint: See :class:`AdjointSettings`.

    Returns:
        The policy.

    Raises:
        ValueError: If ``max_norm`` is negative or nan, or ``norm_type`` is not ``> 0``.
    """
    max_norm = _check_limit("max_norm", max_norm)
    p = _policy_norm_type(norm_type)
    norms_cache: weakref.WeakKeyDictionary = _ScratchCache()

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del skip
        if p == 2.0:
            _scale_by_threshold(params, state, stats.norm)
            return
        norms = _segment_norms(norms_cache, params, p)
        norms.compute(params.grad.ptr)
        _scale_by_threshold(params, state, norms.norm)

    rule = ClipRule("global_norm", _threshold_state(max_norm), apply)
    return _build_policy("global_norm", [rule], nonfinite, adjoint)


def clip_by_norm_per_param(
    max_norm: float,
    *,
    norm_type: float | str = 2.0,
    nonfinite: str = "skip",
    adjoint: Mapping[str, Any] | None = None,
) -> ClipPolicy:
    """Apply the :func:`clip_by_global_norm` rule to each named parameter separately.

    For every parameter ``k``: ``coef_k = min(1, max_norm / (|g_k|_p + 1e-6))`` and
    ``g_k *= coef_k`` (``torch.nn.utils.clip_grad_norm_`` called on each parameter alone).
    ``state["segment_coef"]`` (float32, one per parameter) holds the factors,
    ``state["coef"]`` the smallest. Four launches (p-norm reduction, scale).

    Args:
        max_norm: Largest allowed norm of each parameter's gradient, ``>= 0``.
        norm_type: ``p``: any number ``> 0`` or ``inf``.
        nonfinite: Non-finite policy, ``skip``, ``zero`` or ``error``.
        adjoint: See :class:`AdjointSettings`.

    Returns:
        The policy.

    Raises:
        ValueError: If ``max_norm`` is negative or nan, or ``norm_type`` is not ``> 0``.
    """
    max_norm = _check_limit("max_norm", max_norm)
    p = _policy_norm_type(norm_type)
    norms_cache: weakref.WeakKeyDictionary = _ScratchCache()

    def init(params: ParamSet) -> dict[str, wp.array]:
        return {"segment_coef": wp.ones(params.segment_count, dtype=wp.float32, device=params.device)}

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del stats, skip
        norms = _segment_norms(norms_cache, params, p)
        norms.compute(params.grad.ptr)
        _launch_scale_groups(
            norms.table,
            params.grad.ptr,
            mode=_MODE_PER_GROUP,
            max_norm=max_norm,
            norms=norms,
            group_coef=state["segment_coef"],
            coef=state["coef"],
            clipped=state["clipped"],
        )

    return _build_policy("norm_per_param", [ClipRule("norm_per_param", init, apply)], nonfinite, adjoint)


def agc_units(params: ParamSet) -> list[tuple[int, int]]:
    """The units of adaptive gradient clipping, as ``(offset, length)`` ranges of the flat buffer.

    Following the unit-wise norm of Brock et al. (2021) (every output unit of a layer is a
    unit; vectors such as biases and gains are one unit each), with a parameter's full
    shape being ``spec.shape`` followed by the dtype's own shape:

    * a parameter whose full shape has one axis or none (a float32 vector ``(n,)``, a
      single scalar ``(1,)``) is one unit;
    * otherwise every index of the leading axis is one unit holding everything below it:
      a float32 matrix ``(rows, cols)`` has ``rows`` units (a weight matrix laid out
      ``(out, in)`` gets one unit per output, as in the paper; the cartpole's
      ``controls (horizon, world_count)`` get one unit per time step), a ``vec3`` array
      ``(n,)`` has ``n`` units of 3 (one per body or particle), a ``mat33`` array ``(n,)``
      has ``n`` units of 9.
    """
    units = []
    for spec, seg in zip(params.specs, params.segments, strict=True):
        inner = () if spec.dtype in (wp.float32, float) else tuple(spec.dtype._shape_)
        full = tuple(spec.shape) + inner
        if len(full) <= 1 or full[0] == 0:
            units.append((seg.offset, seg.length))
            continue
        width = seg.length // full[0]
        units.extend((seg.offset + i * width, width) for i in range(full[0]))
    return units


def adaptive_grad_clip(
    clipping: float = 0.01,
    *,
    eps: float = 1.0e-3,
    nonfinite: str = "skip",
    adjoint: Mapping[str, Any] | None = None,
) -> ClipPolicy:
    """Adaptive gradient clipping (AGC, Brock et al. 2021, "High-Performance Large-Scale
    Image Recognition Without Normalization", Sec. 4), unit-wise.

    For every unit ``u`` (see :func:`agc_units`) with gradient ``G_u`` and parameters
    ``W_u``, ``limit = clipping * max(|W_u|_2, eps)``; when ``|G_u|_2 > limit``,
    ``G_u <- G_u * limit / max(|G_u|_2, 1e-6)``, otherwise ``G_u`` is unchanged (the
    rule of the paper's reference code; a nan unit norm compares false and is left
    alone). ``state["coef"]`` is the smallest unit factor. Seven launches (two unit-norm
    reductions and one scale), however many units.

    Args:
        clipping: ``lambda > 0``, the largest allowed ratio ``|G_u| / |W_u|``.
        eps: Floor of the parameter norm, so zero-initialised units can still move.
        nonfinite: Non-finite policy, ``skip``, ``zero`` or ``error``.
        adjoint: See :class:`AdjointSettings`.

    Returns:
        The policy.

    Raises:
        ValueError: If ``clipping`` or ``eps`` is not ``> 0``.
    """
    clipping = _check_limit("clipping", clipping, positive=True)
    eps = _check_limit("eps", eps, positive=True)
    cache: weakref.WeakKeyDictionary = _ScratchCache()

    def build(params: ParamSet) -> tuple[GroupNorms, GroupNorms, wp.array]:
        table = ChunkTable.for_ranges(params, agc_units(params))
        return (
            GroupNorms(table, device=params.device),
            GroupNorms(table, device=params.device),
            wp.ones(table.group_count, dtype=wp.float32, device=params.device),
        )

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del stats, skip
        grad_norms, param_norms, unit_coef = _scratch(cache, params, lambda: build(params))
        grad_norms.compute(params.grad.ptr)
        param_norms.compute(params.data.ptr)
        _launch_scale_groups(
            grad_norms.table,
            params.grad.ptr,
            mode=_MODE_AGC,
            max_norm=clipping,
            norms=grad_norms,
            group_coef=unit_coef,
            coef=state["coef"],
            clipped=state["clipped"],
            eps=eps,
            param_norms=param_norms,
        )

    return _build_policy("agc", [ClipRule("agc", lambda params: {}, apply)], nonfinite, adjoint)


@wp.kernel
def _autoclip_kernel(
    percentile: wp.float64,
    capacity: int,
    norm: wp.array(dtype=wp.float32),
    skip: wp.array(dtype=wp.int32),
    history: wp.array(dtype=wp.float32),
    ordered: wp.array(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    cursor: wp.array(dtype=wp.int32),
    threshold: wp.array(dtype=wp.float32),
):
    g = norm[0]
    n = count[0]
    if skip[0] == 0 and wp.isfinite(g):
        if n == capacity:
            # Drop the oldest norm from the sorted copy, then from the ring.
            old = history[cursor[0]]
            k = int(0)  # noqa: RUF046, UP018  (a dynamic Warp variable, mutated in the loop)
            while ordered[k] != old:
                k += 1
            for i in range(k, n - 1):
                ordered[i] = ordered[i + 1]
            n -= 1
        k = n
        while k > 0 and ordered[k - 1] > g:
            ordered[k] = ordered[k - 1]
            k -= 1
        ordered[k] = g
        n += 1
        history[cursor[0]] = g
        cursor[0] = (cursor[0] + 1) % capacity
        count[0] = n
    if n == 0:
        threshold[0] = wp.float32(wp.inf)
    else:
        # numpy.percentile's default ("linear"): interpolate between the order statistics.
        rank = percentile / wp.float64(100.0) * wp.float64(n - 1)
        lo = int(wp.floor(rank))
        hi = wp.min(lo + 1, n - 1)
        frac = rank - wp.float64(lo)
        a = wp.float64(ordered[lo])
        b = wp.float64(ordered[hi])
        threshold[0] = wp.float32(a + (b - a) * frac)


def autoclip(
    percentile: float = 10.0,
    *,
    history: int = 10000,
    nonfinite: str = "skip",
    adjoint: Mapping[str, Any] | None = None,
) -> ClipPolicy:
    """AutoClip (Seetharaman et al. 2020, "AutoClip: Adaptive Gradient Clipping for Source
    Separation Networks"): clip to a percentile of the history of gradient norms.

    Each update appends the pre-clip global L2 norm ``|g|`` to the history, sets
    ``threshold`` to the ``percentile``-th percentile of the history (numpy's default
    linear interpolation between order statistics), then applies the
    :func:`clip_by_global_norm` rule with ``max_norm = threshold``. The reference keeps the
    whole history, including the current step; here it holds the last ``history`` norms
    (a device ring plus a sorted copy, updated in O(history) by one thread), which equals
    the reference while the run is shorter than ``history``. Skipped iterations and
    non-finite norms are not recorded. Two launches.

    Args:
        percentile: ``p`` in ``[0, 100]``; the paper's default is 10.
        history: Number of most recent norms kept, ``>= 1``.
        nonfinite: Non-finite policy, ``skip``, ``zero`` or ``error``.
        adjoint: See :class:`AdjointSettings`.

    Returns:
        The policy.

    Raises:
        ValueError: If ``percentile`` is outside ``[0, 100]`` or ``history < 1``.
    """
    percentile = float(percentile)
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"clip.percentile must be in [0, 100], got {percentile}")
    if isinstance(history, bool) or int(history) != history or history < 1:
        raise ValueError(f"clip.history must be an integer >= 1, got {history!r}")
    capacity = int(history)

    def init(params: ParamSet) -> dict[str, wp.array]:
        dev = params.device
        return {
            "threshold": wp.full(1, math.inf, dtype=wp.float32, device=dev),
            "history": wp.zeros(capacity, dtype=wp.float32, device=dev),
            "history_sorted": wp.zeros(capacity, dtype=wp.float32, device=dev),
            "history_count": wp.zeros(1, dtype=wp.int32, device=dev),
            "history_cursor": wp.zeros(1, dtype=wp.int32, device=dev),
        }

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        wp.launch(
            _autoclip_kernel,
            dim=1,
            inputs=[
                wp.float64(percentile),
                capacity,
                stats.norm,
                skip,
                state["history"],
                state["history_sorted"],
                state["history_count"],
                state["history_cursor"],
                state["threshold"],
            ],
            device=params.device,
        )
        _scale_by_threshold(params, state, stats.norm)

    return _build_policy("autoclip", [ClipRule("autoclip", init, apply)], nonfinite, adjoint)


@wp.kernel
def _zclip_kernel(
    alpha: wp.float64,
    z_thresh: wp.float64,
    eps: wp.float64,
    warmup: int,
    max_norm: wp.float64,
    norm: wp.array(dtype=wp.float32),
    skip: wp.array(dtype=wp.int32),
    warm_buffer: wp.array(dtype=wp.float64),
    warm_count: wp.array(dtype=wp.int32),
    mean: wp.array(dtype=wp.float64),
    var: wp.array(dtype=wp.float64),
    threshold: wp.array(dtype=wp.float32),
):
    g = wp.float64(norm[0])
    inf = wp.float64(wp.inf)
    limit = inf
    if skip[0] != 0 or not wp.isfinite(g):
        threshold[0] = wp.float32(wp.min(limit, max_norm))
        return
    n = warm_count[0]
    if n < warmup:
        # Warmup: collect norms, clip only to the optional max_norm; then start the EMA.
        warm_buffer[n] = g
        n += 1
        warm_count[0] = n
        if n == warmup:
            m = wp.float64(0.0)
            for i in range(n):
                m += warm_buffer[i]
            m = m / wp.float64(n)
            v = wp.float64(0.0)
            for i in range(n):
                d = warm_buffer[i] - m
                v += d * d
            mean[0] = m
            var[0] = v / wp.float64(n)
        threshold[0] = wp.float32(max_norm)
        return
    m = mean[0]
    std = wp.sqrt(var[0])
    z = (g - m) / (std + eps)
    seen = g
    if z > z_thresh:
        # Adaptive scaling: the farther the outlier, the lower the limit.
        clip_val = m + z_thresh * z_thresh * std / z
        limit = clip_val
        seen = clip_val
    effective = wp.min(wp.min(limit, g), max_norm)
    threshold[0] = wp.float32(wp.where(g > effective, effective, inf))
    # The EMA sees the clipped value, not the spike.
    m = alpha * m + (wp.float64(1.0) - alpha) * seen
    d = seen - m
    mean[0] = m
    var[0] = alpha * var[0] + (wp.float64(1.0) - alpha) * d * d


def zclip(
    *,
    alpha: float = 0.97,
    z_thresh: float = 2.5,
    eps: float = 1.0e-6,
    warmup: int = 25,
    max_norm: float | None = None,
    nonfinite: str = "skip",
    adjoint: Mapping[str, Any] | None = None,
) -> ClipPolicy:
    """ZClip (Kumar et al. 2025, "ZClip: Adaptive Spike Mitigation for LLM Pre-Training"),
    z-score mode with adaptive scaling.

    With ``g`` the pre-clip global L2 norm:

    * warmup (the first ``warmup`` updates): ``g`` is stored; no adaptive clipping (only
      ``max_norm``, if given, with the :func:`clip_by_global_norm` rule). At the end,
      ``mu = mean(g)``, ``var = mean((g - mu)^2)`` (population variance) over the stored norms.
    * afterwards: ``z = (g - mu) / (sqrt(var) + eps)``; when ``z > z_thresh`` the limit is
      ``clip = mu + z_thresh^2 * sqrt(var) / z`` and the gradient is scaled by
      ``clip / (g + 1e-6)``; ``max_norm``, if given, caps the limit. The EMA then sees
      ``v = clip`` for a spike and ``v = g`` otherwise, not the spike itself:
      ``mu <- alpha mu + (1 - alpha) v``, ``var <- alpha var + (1 - alpha) (v - mu)^2``
      with the updated ``mu`` (the reference implementation's order).

    ``state["threshold"]`` is the limit applied (inf when none was), EMA in float64
    (``zclip_mean``, ``zclip_var``). Skipped iterations and non-finite norms leave the EMA
    and the warmup untouched. Two launches.

    Args:
        alpha: EMA decay in ``(0, 1)``.
        z_thresh: z-score above which a norm is a spike, ``> 0``.
        eps: Added to the standard deviation, ``>= 0``.
        warmup: Number of updates that only collect norms, ``>= 1``.
        max_norm: Optional absolute cap on the norm, ``>= 0``.
        nonfinite: Non-finite policy, ``skip``, ``zero`` or ``error``.
        adjoint: See :class:`AdjointSettings`.

    Returns:
        The policy.

    Raises:
        ValueError: If an argument is out of range.
    """
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"clip.alpha must be in (0, 1), got {alpha}")
    z_thresh = _check_limit("z_thresh", z_thresh, positive=True)
    eps = _check_limit("eps", eps)
    if isinstance(warmup, bool) or int(warmup) != warmup or warmup < 1:
        raise ValueError(f"clip.warmup must be an integer >= 1, got {warmup!r}")
    warmup = int(warmup)
    cap = math.inf if max_norm is None else _check_limit("max_norm", max_norm)

    def init(params: ParamSet) -> dict[str, wp.array]:
        dev = params.device
        return {
            "threshold": wp.full(1, cap, dtype=wp.float32, device=dev),
            "zclip_warmup": wp.zeros(warmup, dtype=wp.float64, device=dev),
            "zclip_count": wp.zeros(1, dtype=wp.int32, device=dev),
            "zclip_mean": wp.zeros(1, dtype=wp.float64, device=dev),
            "zclip_var": wp.zeros(1, dtype=wp.float64, device=dev),
        }

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        wp.launch(
            _zclip_kernel,
            dim=1,
            inputs=[
                wp.float64(alpha),
                wp.float64(z_thresh),
                wp.float64(eps),
                warmup,
                wp.float64(cap),
                stats.norm,
                skip,
                state["zclip_warmup"],
                state["zclip_count"],
                state["zclip_mean"],
                state["zclip_var"],
                state["threshold"],
            ],
            device=params.device,
        )
        _scale_by_threshold(params, state, stats.norm)

    return _build_policy("zclip", [ClipRule("zclip", init, apply)], nonfinite, adjoint)


def chain(
    policies: Sequence[ClipPolicy], *, nonfinite: str = "skip", adjoint: Mapping[str, Any] | None = None
) -> ClipPolicy:
    """Apply several policies' rules in order (e.g. value, then global norm), as ``optax.chain``.

    Each member after the first sees the gradient as the previous ones left it (its
    statistics are recomputed: three launches per member). The members' own non-finite
    and adjoint settings are ignored; the chain's apply, once, before the first member.
    ``state["coef"]`` is the product of the members' coefficients, ``state["clipped"]`` is
    1 when any member clipped; member ``i``'s keys are prefixed ``"i/"``.

    Args:
        policies: The members, at least one (Hydra: a list of ``_target_`` nodes).
        nonfinite: Non-finite policy, ``skip``, ``zero`` or ``error``.
        adjoint: See :class:`AdjointSettings`.

    Returns:
        The policy.

    Raises:
        ValueError: If ``policies`` is empty.
    """
    policies = list(policies)
    if not policies:
        raise ValueError("clip.policies: a chain needs at least one policy")
    rules = [rule for policy in policies for rule in policy.rules]
    name = "chain(" + ",".join(rule.name for rule in rules) + ")"
    return _build_policy(name, rules, nonfinite, adjoint)


# --------------------------------------------------------------------------- skipping an update


@wp.kernel
def _guard_copy_kernel(
    chunk_offset: wp.array(dtype=wp.int64),
    chunk_length: wp.array(dtype=wp.int32),
    chunk_saved: wp.array(dtype=wp.int32),
    saved: wp.array(dtype=wp.uint32),
    restore: int,
    skip: wp.array(dtype=wp.int32),
):
    c, j = wp.tid()
    if j >= chunk_length[c]:
        return
    live = chunk_view(wp.uint64(0), chunk_offset[c], chunk_length[c], wp.uint32(0))
    k = chunk_saved[c] + j
    if restore == 0:
        saved[k] = live[j]
    elif skip[0] != 0:
        live[j] = saved[k]


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
            _guard_copy_kernel,
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


# --------------------------------------------------------------------------- functional API


@dataclasses.dataclass
class _Plan:
    tables: list[ChunkTable]
    norms: GroupNorms | None
    result: wp.array | None
    use_f64: bool
    group_coef: wp.array
    coef: wp.array
    clipped: wp.array


_PLANS: collections.OrderedDict[tuple, _Plan] = collections.OrderedDict()
_PLAN_LIMIT = 64


def _plan(grads: Sequence[wp.array], norm_type: float | None) -> _Plan:
    """Chunk tables for a list of arrays (one per scalar type), cached by address and layout."""
    device = grads[0].device
    key_parts = []
    for g in grads:
        if not isinstance(g, wp.array):
            raise TypeError(f"grads must be Warp arrays, got {type(g).__name__}")
        if g.device != device:
            raise ValueError(f"all gradients must be on one device, got {device} and {g.device}")
        if not g.is_contiguous:
            raise ValueError("gradients must be contiguous arrays")
        key_parts.append((g.ptr, g.size, g.dtype))
    key = (device.alias, norm_type, tuple(key_parts))
    plan = _PLANS.get(key)
    if plan is not None:
        _PLANS.move_to_end(key)
        return plan
    by_type: dict[type, list[tuple[int, int, int]]] = {}
    for index, g in enumerate(grads):
        scalar = scalar_type_of(g.dtype)
        count = g.size * wp.types.type_size(g.dtype) if scalar is not g.dtype else g.size
        if count:
            by_type.setdefault(scalar, []).append((g.ptr, count, index))
    tables = [
        ChunkTable.build(ranges, scalar_type=scalar, group_count=len(grads), device=device)
        for scalar, ranges in by_type.items()
    ]
    use_f64 = wp.float64 in by_type
    norms = None
    result = None
    if norm_type is not None:
        norms = GroupNorms(
            tables[0]
            if tables
            else ChunkTable.build([], scalar_type=wp.float32, group_count=len(grads), device=device),
            norm_type=norm_type,
            device=device,
        )
        result = norms.total if use_f64 else norms.norm
    plan = _Plan(
        tables=tables,
        norms=norms,
        result=result,
        use_f64=use_f64,
        group_coef=wp.ones(len(grads), dtype=wp.float32, device=device),
        coef=wp.ones(1, dtype=wp.float32, device=device),
        clipped=wp.zeros(1, dtype=wp.int32, device=device),
    )
    _PLANS[key] = plan
    if len(_PLANS) > _PLAN_LIMIT:
        _PLANS.popitem(last=False)
    return plan


def clip_grad_norm_(
    grads: Sequence[wp.array],
    max_norm: float,
    norm_type: float | str = 2.0,
    error_if_nonfinite: bool = False,
    *,
    device: wp.context.Devicelike = None,
) -> wp.array:
    """Clip a list of gradient arrays by their total p-norm, as ``torch.nn.utils.clip_grad_norm_``.

    ``total = (sum over all entries of all arrays of |g|^p)^(1/p)`` (``max |g|`` for
    ``p = inf``; the components of ``vec3``, ``spatial_vector``, ... count as entries),
    ``coef = min(1, max_norm / (total + 1e-6))`` computed in the gradients' precision, and
    every array is multiplied by ``coef`` in place, unconditionally. Hence: a zero total
    leaves the gradients unchanged, ``max_norm = 0`` zeroes them, an inf total zeroes the
    finite entries (inf entries become nan), a nan total makes everything nan; an empty
    list returns 0.

    Four launches per call (zero, reduce, finalize, scale) for gradients of one scalar
    type (one more reduce and scale per further scalar type), whatever the number of
    arrays; no host synchronisation unless ``error_if_nonfinite``, so the call can be
    captured in a CUDA graph. The chunk tables are built once per list of arrays (keyed by
    their addresses and layouts) and cached.

    Args:
        grads: Contiguous Warp arrays on one device, of float16/32/64 scalar type.
        max_norm: Largest allowed total norm, ``>= 0`` (``torch`` accepts negative values
            and flips the gradients; this raises).
        norm_type: ``p``: any number ``> 0``, ``inf`` or ``"inf"``.
        error_if_nonfinite: Raise if the total is nan or inf (reads the total on the host),
            leaving the gradients unchanged.
        device: Device of the returned zero for an empty list (default: Warp's default).

    Returns:
        The pre-clip total norm as a one-element device array (float32, or float64 when
        any gradient is float64). It belongs to the cached plan for these arrays and is
        overwritten by the next call on them; copy it to keep it.

    Raises:
        ValueError: For a negative or nan ``max_norm``, a bad ``norm_type``, mixed devices
            or non-contiguous arrays.
        RuntimeError: If ``error_if_nonfinite`` and the total is nan or inf.
    """
    max_norm = _check_limit("max_norm", max_norm)
    norm_kind(norm_type)
    grads = list(grads)
    if not grads:
        return wp.zeros(1, dtype=wp.float32, device=device)
    plan = _plan(grads, float(norm_type))
    norms = plan.norms
    norms.zero()
    for table in plan.tables:
        norms.accumulate(table, 0)
    norms.finalize()
    if error_if_nonfinite and not np.isfinite(plan.result.numpy()[0]):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients is non-finite, so it cannot be clipped. "
            "To disable this error and scale the gradients by the non-finite norm anyway, "
            "set error_if_nonfinite=False"
        )
    for table in plan.tables:
        _launch_scale_groups(
            table,
            0,
            mode=_MODE_GLOBAL,
            max_norm=max_norm,
            norms=norms,
            group_coef=plan.group_coef,
            coef=plan.coef,
            clipped=plan.clipped,
            use_f64=plan.use_f64,
        )
    return plan.result


def clip_grad_value_(grads: Sequence[wp.array], clip_value: float) -> None:
    """Clamp every entry of a list of gradient arrays to ``[-clip_value, clip_value]`` in place.

    As ``torch.nn.utils.clip_grad_value_``: nan passes through, ``+-inf`` becomes
    ``+-clip_value``. One launch per scalar type present, whatever the number of arrays.

    Args:
        grads: Contiguous Warp arrays on one device, of float16/32/64 scalar type.
        clip_value: ``v >= 0`` (``torch`` accepts negative values; this raises).

    Raises:
        ValueError: For a negative or nan ``clip_value``, mixed devices or non-contiguous arrays.
    """
    clip_value = _check_limit("clip_value", clip_value)
    grads = list(grads)
    if not grads:
        return
    plan = _plan(grads, None)
    for table in plan.tables:
        _launch_clamp(table, 0, clip_value, plan.coef, plan.clipped)
