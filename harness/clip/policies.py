"""The clip policies: rules over the flat gradient after backward, each built by a factory
that can be the ``_target_`` of a Hydra config under ``configs/clip/``.

:func:`no_clip`, :func:`clip_by_value`, :func:`clip_by_global_norm`,
:func:`clip_by_norm_per_param`, :func:`adaptive_grad_clip` (AGC), :func:`autoclip`,
:func:`zclip` and :func:`chain_clips`. ``update`` rescales ``params.grad`` in place from the
pre-clip :class:`~harness.stats.FlatStats` (``shared.stats``) and keeps every number it
decides (coefficient, threshold, history) in device arrays, so a clipped step never goes
back to the host and can be captured in a graph; ``init`` allocates everything an update
uses. A policy is only its rule: what happens to a nan/inf gradient is a wrapper around
any transformation (:mod:`harness.clip.nonfinite`: ``skip_if_nonfinite(...)``), and
clipping inside backward is the trainer's own setting
(:mod:`harness.adjoint`). The kernels are in :mod:`harness.clip.kernels`.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import warp as wp

from harness import schema
from harness.chunks import ChunkTable
from harness.clip.kernels import (
    MODE_AGC,
    MODE_GLOBAL,
    MODE_PER_GROUP,
    autoclip_kernel,
    chain_combine_kernel,
    launch_clamp,
    launch_scale_groups,
    reset_coef_kernel,
    zclip_kernel,
)
from harness.params import ParamSet
from harness.schema import field
from harness.stats import FlatStats, GroupNorms
from harness.transform import Shared


@dataclasses.dataclass(frozen=True)
class ClipRule:
    """One clipping rule; :class:`ClipPolicy` wraps one rule, :func:`chain_clips` several.

    Attributes:
        name: Short name (``"global_norm"``).
        init: ``init(params)`` allocates the rule's own state arrays (besides ``coef``/``clipped``).
        prepare: ``prepare(params)`` builds its scratch (called by :meth:`ClipPolicy.init`).
        apply: ``apply(params, state, stats, skip)`` clips ``params.grad`` in place from
            ``stats`` and writes ``state["coef"]`` and ``state["clipped"]``; a stateful rule
            leaves its history untouched when the device flag ``skip[0]`` is 1.
    """

    name: str
    init: Callable[[ParamSet], dict[str, wp.array]]
    apply: Callable[[ParamSet, dict[str, wp.array], FlatStats, wp.array], None]
    prepare: Callable[[ParamSet], None] | None = None
    """Builds the rule's per-ParamSet scratch (tables, reducers) at init, so no update allocates."""


_ScratchCache = weakref.WeakKeyDictionary
"""Per-ParamSet scratch (tables, reducers, intermediate statistics): not state; built at init."""


def _scratch(cache: weakref.WeakKeyDictionary, params: ParamSet, build: Callable[[], Any]) -> Any:
    if params not in cache:
        cache[params] = build()
    return cache[params]


@dataclasses.dataclass(frozen=True)
class ClipPolicy:
    """A gradient clip policy: a transformation (:mod:`harness.transform`) over the flat gradient.

    State (``init``), all device arrays:

    * ``coef`` float32 ``(1,)``: the smallest factor applied to any entry at the last update
      (the global factor for global-norm rules), 1 when nothing was clipped.
    * ``clipped`` int32 ``(1,)``: 1 when any entry was scaled down or clamped.
    * rule state, e.g. ``threshold`` (float32 ``(1,)``, the norm limit of the last update,
      inf when there was none), AutoClip's history or ZClip's EMA; in a chain each member's
      keys are prefixed ``"<index>/"``.

    ``init`` publishes ``coef`` and ``clipped`` (the clip-aware schedule reads ``clipped``).
    ``update`` rescales ``params.grad`` in place from ``shared.stats``, the statistics of
    the gradient before the policy; stateful rules (AutoClip, ZClip) leave their history
    alone when a non-finite wrapper's ``shared["skip"]`` is 1.

    Attributes:
        name: Short name, the option's name (``"global_norm"``); a checkpoint records it.
        rules: The rules applied in order (one, or a chain's members).
    """

    name: str
    rules: tuple[ClipRule, ...]
    _cache: weakref.WeakKeyDictionary = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary, compare=False, repr=False
    )

    @property
    def _prefixes(self) -> list[str]:
        return [""] if len(self.rules) == 1 else [f"{i}/" for i in range(len(self.rules))]

    def init(self, params: ParamSet, shared: Shared | None = None) -> dict[str, wp.array]:
        """Allocate the state on the parameters' device; publish ``coef`` and ``clipped``."""
        dev = params.device
        state = {
            "coef": wp.ones(1, dtype=wp.float32, device=dev),
            "clipped": wp.zeros(1, dtype=wp.int32, device=dev),
        }
        for rule, prefix in zip(self.rules, self._prefixes, strict=True):
            if prefix:
                state[prefix + "coef"] = wp.ones(1, dtype=wp.float32, device=dev)
                state[prefix + "clipped"] = wp.zeros(1, dtype=wp.int32, device=dev)
            for key, value in rule.init(params).items():
                state[prefix + key] = value
            if rule.prepare is not None:
                rule.prepare(params)
        # Everything an update uses is allocated here, none of it during an update (capture).
        scratch = _scratch(self._cache, params, lambda: {})
        scratch.setdefault("no_skip", wp.zeros(1, dtype=wp.int32, device=dev))
        if len(self.rules) > 1:
            scratch.setdefault("stats", FlatStats(params))
        if shared is not None:
            shared.publish("coef", state["coef"])
            shared.publish("clipped", state["clipped"])
            shared.mark_report(*(v for k, v in state.items() if k.rsplit("/", 1)[-1] in ("coef", "clipped")))
        return state

    def update(self, params: ParamSet, state: dict[str, wp.array], shared: Shared) -> None:
        """Clip ``params.grad`` in place (no host read: capturable)."""
        stats = shared.stats
        if stats is None or stats.size != params.size:
            raise ValueError(f"clip: shared.stats must be the FlatStats of these {params.size} parameters")
        dev = params.device
        if params not in self._cache:
            raise ValueError(f"clip: '{self.name}' was not initialised for these parameters (init first)")
        scratch = self._cache[params]
        skip = shared.get("skip")
        if skip is None:  # no non-finite wrapper: never skipped
            skip = scratch["no_skip"]
        current = stats
        if len(self.rules) > 1:
            wp.launch(reset_coef_kernel, dim=1, inputs=[state["coef"], state["clipped"]], device=dev)
        for i, (rule, prefix) in enumerate(zip(self.rules, self._prefixes, strict=True)):
            if i > 0:
                # Later members see the gradient as the earlier ones left it.
                current = scratch["stats"]
                current.compute(params.grad)
            sub = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
            rule.apply(params, sub, current, skip)
            if prefix:
                wp.launch(
                    chain_combine_kernel,
                    dim=1,
                    inputs=[sub["coef"], sub["clipped"], state["coef"], state["clipped"]],
                    device=dev,
                )


# --------------------------------------------------------------------------- policy assembly

# The arguments of each policy, as schemas (types and ranges, checked by harness.schema
# whether Hydra or Python calls the factory; the factory's signature holds the defaults).


def _limit(**kwargs: Any) -> Any:
    """A norm or value limit: a number >= 0, ``inf`` accepted (no clipping)."""
    return field(minimum=0.0, finite=False, **kwargs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ValueArgs:
    """:func:`clip_by_value`'s arguments."""

    clip_value: float = _limit()


@dataclasses.dataclass(frozen=True, kw_only=True)
class NormArgs:
    """:func:`clip_by_global_norm`'s and :func:`clip_by_norm_per_param`'s arguments."""

    max_norm: float = _limit()
    norm_type: float = field(minimum=0.0, strict=True, finite=False, doc="p > 0, or inf")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AGCArgs:
    """:func:`adaptive_grad_clip`'s arguments."""

    clipping: float = field(minimum=0.0, strict=True)
    eps: float = field(minimum=0.0, strict=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoClipArgs:
    """:func:`autoclip`'s arguments."""

    percentile: float = field(minimum=0.0, maximum=100.0)
    history: int = field(minimum=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZClipArgs:
    """:func:`zclip`'s arguments."""

    alpha: float = field(minimum=0.0, strict=True, maximum=1.0, strict_maximum=True)
    z_thresh: float = field(minimum=0.0, strict=True)
    eps: float = field(minimum=0.0)
    warmup: int = field(minimum=1)
    max_norm: float | None = _limit()


def _norm_rule(max_norm: float, norm_type: float | str) -> tuple[float, float, Callable[[ParamSet], GroupNorms]]:
    """A norm policy's checked ``max_norm`` and ``p``, and its cached per-ParamSet p-norm reducer."""
    args = schema.check(
        NormArgs, "clip", max_norm=max_norm, norm_type=float(norm_type) if norm_type == "inf" else norm_type
    )
    cache = _ScratchCache()
    return args.max_norm, args.norm_type, lambda params: _segment_norms(cache, params, args.norm_type)


def _threshold_state(value: float) -> Callable[[ParamSet], dict[str, wp.array]]:
    def init(params: ParamSet) -> dict[str, wp.array]:
        return {"threshold": wp.full(1, value, dtype=wp.float32, device=params.device)}

    return init


_GROUP_COEF = _ScratchCache()
"""Per-ParamSet float32 ``(segment_count,)`` scratch the global scale writes its factor to."""


def _group_coef(params: ParamSet) -> wp.array:
    """The scratch of :func:`_scale_by_threshold` (built by the rules' ``prepare``)."""
    return _scratch(_GROUP_COEF, params, lambda: wp.ones(params.segment_count, dtype=wp.float32, device=params.device))


def _scale_by_threshold(params: ParamSet, state: dict[str, wp.array], total: wp.array) -> None:
    """The global-norm rule with the limit ``state["threshold"]`` (read on the device) and the
    float64 norm ``total``: the kernel :func:`~harness.clip.clip_grad_norm_` runs too."""
    group_coef = _group_coef(params)
    launch_scale_groups(
        params.chunks,
        params.grad.ptr,
        mode=MODE_GLOBAL,
        limit=state["threshold"],
        total=total,
        group_coef=group_coef,
        coef=state["coef"],
        clipped=state["clipped"],
    )


def _segment_norms(cache: weakref.WeakKeyDictionary, params: ParamSet, p: float) -> GroupNorms:
    """The cached per-parameter p-norm reducer of ``params``."""
    return _scratch(cache, params, lambda: GroupNorms(params.chunks, norm_type=p, device=params.device))


# --------------------------------------------------------------------------- policies


def no_clip() -> ClipPolicy:
    """Leave gradients untouched: ``coef = 1``, ``clipped = 0`` forever.

    Args:

    Returns:
        The policy.
    """

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del params, state, stats, skip

    return ClipPolicy("none", (ClipRule("none", lambda params: {}, apply),))


def clip_by_value(clip_value: float) -> ClipPolicy:
    """Clamp every gradient entry to ``[-clip_value, clip_value]``.

    Same rule as ``torch.nn.utils.clip_grad_value_``: ``g = min(max(g, -v), v)``; nan
    entries pass through unchanged, ``+-inf`` become ``+-v``. ``state["coef"]`` is the
    smallest ``v / |g|`` over the clamped entries (1 when none was). Two launches (reset,
    one thread per chunk of the flat gradient).

    Args:
        clip_value: ``v >= 0``.

    Returns:
        The policy.

    Raises:
        ValueError: If ``clip_value`` is negative or nan.
    """
    clip_value = schema.check(ValueArgs, "clip", clip_value=clip_value).clip_value

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del stats, skip
        wp.launch(reset_coef_kernel, dim=1, inputs=[state["coef"], state["clipped"]], device=params.device)
        launch_clamp(params.chunks, params.grad.ptr, clip_value, state["coef"], state["clipped"])

    return ClipPolicy("value", (ClipRule("value", lambda params: {}, apply),))


def clip_by_global_norm(
    max_norm: float,
    *,
    norm_type: float | str = 2.0,
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

    For ``p = 2`` the total is ``stats.norm64`` and the policy is one launch (plus the
    non-finite wrapper's stage); other ``p`` add the three launches of a
    :class:`~harness.stats.GroupNorms` reduction.

    Args:
        max_norm: Largest allowed global norm, ``>= 0``.
        norm_type: ``p``: any number ``> 0`` or ``inf``.

    Returns:
        The policy.

    Raises:
        ValueError: If ``max_norm`` is negative or nan, or ``norm_type`` is not ``> 0``.
    """
    max_norm, p, segment_norms = _norm_rule(max_norm, norm_type)

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del skip
        if p == 2.0:
            _scale_by_threshold(params, state, stats.norm64)
            return
        norms = segment_norms(params)
        norms.compute(params.grad.ptr)
        _scale_by_threshold(params, state, norms.total)

    def prepare(params: ParamSet) -> None:
        _group_coef(params)
        if p != 2.0:
            segment_norms(params)

    rule = ClipRule("global_norm", _threshold_state(max_norm), apply, prepare)
    return ClipPolicy("global_norm", (rule,))


def clip_by_norm_per_param(
    max_norm: float,
    *,
    norm_type: float | str = 2.0,
) -> ClipPolicy:
    """Apply the :func:`clip_by_global_norm` rule to each named parameter separately.

    For every parameter ``k``: ``coef_k = min(1, max_norm / (|g_k|_p + 1e-6))`` and
    ``g_k *= coef_k`` (``torch.nn.utils.clip_grad_norm_`` called on each parameter alone).
    ``state["segment_coef"]`` (float32, one per parameter) holds the factors,
    ``state["coef"]`` the smallest. Four launches (p-norm reduction, scale).

    Args:
        max_norm: Largest allowed norm of each parameter's gradient, ``>= 0``.
        norm_type: ``p`` of each parameter's norm: any number ``> 0`` or ``inf``.

    Returns:
        The policy.

    Raises:
        ValueError: If ``max_norm`` is negative or nan, or ``norm_type`` is not ``> 0``.
    """
    max_norm, _, segment_norms = _norm_rule(max_norm, norm_type)

    def init(params: ParamSet) -> dict[str, wp.array]:
        return {"segment_coef": wp.ones(params.segment_count, dtype=wp.float32, device=params.device)}

    def apply(params: ParamSet, state: dict[str, wp.array], stats: FlatStats, skip: wp.array) -> None:
        del stats, skip
        norms = segment_norms(params)
        norms.compute(params.grad.ptr)
        launch_scale_groups(
            norms.table,
            params.grad.ptr,
            mode=MODE_PER_GROUP,
            max_norm=max_norm,
            total=norms.total,
            group_norm=norms.group_norm,
            group_coef=state["segment_coef"],
            coef=state["coef"],
            clipped=state["clipped"],
        )

    def prepare(params: ParamSet) -> None:
        segment_norms(params)

    return ClipPolicy("norm_per_param", (ClipRule("norm_per_param", init, apply, prepare),))


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

    Returns:
        The policy.

    Raises:
        ValueError: If ``clipping`` or ``eps`` is not ``> 0``.
    """
    args = schema.check(AGCArgs, "clip", clipping=clipping, eps=eps)
    clipping, eps = args.clipping, args.eps
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
        launch_scale_groups(
            grad_norms.table,
            params.grad.ptr,
            mode=MODE_AGC,
            max_norm=clipping,
            total=grad_norms.total,
            group_norm=grad_norms.group_norm,
            group_coef=unit_coef,
            coef=state["coef"],
            clipped=state["clipped"],
            eps=eps,
            param_norm=param_norms.group_norm,
        )

    def prepare(params: ParamSet) -> None:
        _scratch(cache, params, lambda: build(params))

    return ClipPolicy("agc", (ClipRule("agc", lambda params: {}, apply, prepare),))


def autoclip(
    percentile: float = 10.0,
    *,
    history: int = 10000,
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

    Returns:
        The policy.

    Raises:
        ValueError: If ``percentile`` is outside ``[0, 100]`` or ``history < 1``.
    """
    args = schema.check(AutoClipArgs, "clip", percentile=percentile, history=history)
    percentile, capacity = args.percentile, args.history

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
            autoclip_kernel,
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
        _scale_by_threshold(params, state, stats.norm64)

    return ClipPolicy("autoclip", (ClipRule("autoclip", init, apply, _group_coef),))


def zclip(
    *,
    alpha: float = 0.97,
    z_thresh: float = 2.5,
    eps: float = 1.0e-6,
    warmup: int = 25,
    max_norm: float | None = None,
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

    Returns:
        The policy.

    Raises:
        ValueError: If an argument is out of range.
    """
    args = schema.check(ZClipArgs, "clip", alpha=alpha, z_thresh=z_thresh, eps=eps, warmup=warmup, max_norm=max_norm)
    alpha, z_thresh, eps, warmup = args.alpha, args.z_thresh, args.eps, args.warmup
    cap = math.inf if args.max_norm is None else args.max_norm

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
            zclip_kernel,
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
        _scale_by_threshold(params, state, stats.norm64)

    return ClipPolicy("zclip", (ClipRule("zclip", init, apply, _group_coef),))


def chain_clips(policies: Sequence[ClipPolicy]) -> ClipPolicy:
    """One policy applying several policies' rules in order (e.g. value, then global norm):
    the ``clip=chain`` option.

    Each member after the first sees the gradient as the previous ones left it (its
    statistics are recomputed: three launches per member). Members are bare policies; the
    non-finite wrapper goes around the trainer's whole update and acts once, before the
    first member. ``state["coef"]`` is the product of the members' coefficients,
    ``state["clipped"]`` is 1 when any member clipped; member ``i``'s keys are prefixed ``"i/"``.
    (:func:`harness.transform.chain` composes transformations of any kind, each with its own
    state; this one makes one clip policy of clip policies.)

    Args:
        policies: The members, at least one (Hydra: a list of ``_target_`` nodes).

    Returns:
        The policy.

    Raises:
        ValueError: If ``policies`` is empty or a member is not a clip policy.
    """
    policies = list(policies)
    if not policies:
        raise ValueError("clip.policies: a chain needs at least one policy")
    for i, policy in enumerate(policies):
        if not isinstance(policy, ClipPolicy):
            raise ValueError(
                f"clip.policies.{i}: '{getattr(policy, 'name', policy)}' is not a bare clip policy; "
                "accepted: harness.clip policies (a non-finite wrapper goes around the whole update)"
            )
    rules = [rule for policy in policies for rule in policy.rules]
    return ClipPolicy("chain(" + ",".join(rule.name for rule in rules) + ")", tuple(rules))


CLIP_POLICIES: dict[str, Callable[..., ClipPolicy]] = {
    f.__name__: f
    for f in (
        no_clip,
        clip_by_value,
        clip_by_global_norm,
        clip_by_norm_per_param,
        adaptive_grad_clip,
        autoclip,
        zclip,
        chain_clips,
    )
}
"""The factories of clip policies by their function name, and those :func:`register_clip_policy`
adds. A config's ``clip._target_`` (and each member of ``clip.policies`` of a chain) must name
one of these factories (:mod:`harness.targets` checks it before anything is called)."""


def register_clip_policy(factory: Callable[..., ClipPolicy]) -> Callable[..., ClipPolicy]:
    """Accept ``factory`` as a ``clip._target_`` under its ``__name__``; returns it, so it can
    decorate the factory (a module of your own calls it when imported; a config names the
    factory by its dotted path, which the check imports before it looks the factory up).

    Raises:
        ValueError: ``factory`` is not callable, or a factory of another path holds its name.
    """
    from harness.registry import register_factory

    return register_factory(CLIP_POLICIES, factory, "register_clip_policy", "a ClipPolicy")
