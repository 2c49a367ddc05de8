"""The PyTorch-style functional API: :func:`clip_grad_norm_` and :func:`clip_grad_value_`
over a list of Warp arrays of any float dtype, a fixed number of launches however many
arrays there are (parity with ``torch.nn.utils``: tests/test_clip_parity.py)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import numpy as np
import warp as wp

from harness import schema
from harness.chunks import ChunkTable
from harness.clip.kernels import MODE_GLOBAL, launch_clamp, launch_scale_groups
from harness.clip.policies import NormArgs, ValueArgs
from harness.stats import GroupNorms, norm_kind, scalar_type_of


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
    norm_kind(norm_type)  # accepts "inf" as torch does, with torch's message
    max_norm = schema.check(NormArgs, "", max_norm=max_norm, norm_type=float(norm_type)).max_norm
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
        launch_scale_groups(
            table,
            0,
            mode=MODE_GLOBAL,
            max_norm=max_norm,
            total=norms.total,
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
    clip_value = schema.check(ValueArgs, "", clip_value=clip_value).clip_value
    grads = list(grads)
    if not grads:
        return
    plan = _plan(grads, None)
    for table in plan.tables:
        launch_clamp(table, 0, clip_value, plan.coef, plan.clipped)
