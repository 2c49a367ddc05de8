"""Device-side statistics of flat buffers laid out like a :class:`~harness.params.ParamSet`.

This module owns the reductions every clip policy and every log line reads:

* :class:`FlatStats`: the per-parameter and global L2 norms, the largest finite magnitude
  and the count of non-finite entries (in total and per parameter) of a flat float32 array
  (a gradient, the parameters themselves, or the difference of two such arrays, e.g. an
  update ``p_new - p_old`` for the update-to-parameter ratio ``|dp| / |p|``). One call to
  :meth:`FlatStats.compute` is always three launches (zero, chunk reduce, finalize),
  whatever the number of parameters, over the ``ParamSet``'s chunk table (``params.chunks``).
* :class:`GroupNorms`: over a :class:`~harness.chunks.ChunkTable`, the p-norm (``p`` in {1, 2, inf} or any
  ``p > 0``) of every *group* of a set of memory ranges and over all groups together. A
  group is a named parameter, a unit of adaptive gradient clipping, or one array of a list
  handed to :func:`harness.clip.clip_grad_norm_`. The ranges are addressed by raw device
  pointers, so a list of unrelated Warp arrays of any float dtype (float32, vec3,
  spatial_vector, float64, ...) is reduced in three launches whatever its length (the Warp
  counterpart of PyTorch's ``foreach`` kernels).

Every result stays in a small device array, so a training step that clips on a norm or
logs it needs no host round trip and can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any

import warp as wp

from harness.chunks import ChunkTable, chunk_view
from harness.params import ParamSet

__all__ = ["FlatStats", "GroupNorms", "norm_kind", "scalar_type_of"]


@wp.kernel
def _zero_kernel(
    seg_acc: wp.array(dtype=wp.float64),
    segment_nonfinite: wp.array(dtype=wp.int32),
    max_abs: wp.array(dtype=wp.float32),
    nonfinite: wp.array(dtype=wp.int32),
):
    i = wp.tid()
    seg_acc[i] = wp.float64(0.0)
    segment_nonfinite[i] = 0
    if i == 0:
        max_abs[0] = wp.float32(0.0)
        nonfinite[0] = 0


@wp.kernel
def _chunk_reduce_kernel(
    flat: wp.uint64,
    minus: wp.uint64,
    has_minus: int,
    chunk_offset: wp.array(dtype=wp.int64),
    chunk_length: wp.array(dtype=wp.int32),
    chunk_group: wp.array(dtype=wp.int32),
    seg_acc: wp.array(dtype=wp.float64),
    segment_nonfinite: wp.array(dtype=wp.int32),
    max_abs: wp.array(dtype=wp.float32),
    nonfinite: wp.array(dtype=wp.int32),
):
    c = wp.tid()
    a = chunk_view(flat, chunk_offset[c], chunk_length[c], wp.float32(0.0))
    b = chunk_view(minus, chunk_offset[c], chunk_length[c], wp.float32(0.0))
    acc = wp.float64(0.0)
    peak = wp.float32(0.0)
    bad = wp.int32(0)
    for i in range(chunk_length[c]):
        x = a[i]
        if has_minus != 0:
            x = x - b[i]
        # Square in float64: the sum of squares of float32 values cannot overflow there,
        # so the norm is inf only when it really exceeds the float32 range (or an entry is inf).
        xd = wp.float64(x)
        acc += xd * xd
        if wp.isfinite(x):
            peak = wp.max(peak, wp.abs(x))
        else:
            bad += 1
    wp.atomic_add(seg_acc, chunk_group[c], acc)
    wp.atomic_max(max_abs, 0, peak)
    if bad > 0:
        wp.atomic_add(nonfinite, 0, bad)
        wp.atomic_add(segment_nonfinite, chunk_group[c], bad)


@wp.kernel
def _finalize_kernel(
    segment_count: int,
    seg_acc: wp.array(dtype=wp.float64),
    segment_sumsq: wp.array(dtype=wp.float32),
    segment_norm: wp.array(dtype=wp.float32),
    sumsq: wp.array(dtype=wp.float32),
    norm: wp.array(dtype=wp.float32),
    norm64: wp.array(dtype=wp.float64),
):
    # A single thread walks the segments in order, so the global sum is deterministic.
    total = wp.float64(0.0)
    for s in range(segment_count):
        a = seg_acc[s]
        segment_sumsq[s] = wp.float32(a)
        segment_norm[s] = wp.float32(wp.sqrt(a))
        total += a
    sumsq[0] = wp.float32(total)
    root = wp.sqrt(total)
    norm64[0] = root
    norm[0] = wp.float32(root)


class FlatStats:
    """Per-parameter and global statistics of flat float32 arrays shaped like a ``ParamSet``.

    The instance owns its result arrays; each :meth:`compute` overwrites them in place, so
    references taken once (e.g. by a clip policy or a logger) always see the latest values.

    Semantics of non-finite entries:

    * ``segment_norm`` and ``norm`` follow ``torch.linalg.vector_norm`` /
      ``torch.nn.utils.clip_grad_norm_``: any nan entry gives a nan norm, otherwise any
      inf entry gives an inf norm.
    * ``max_abs`` is the largest magnitude among the *finite* entries (0 if there are
      none). When debugging an explosion this tells how large the finite values had
      grown, which an inf/nan would hide; whether something non-finite appeared is what
      ``nonfinite`` and ``norm`` report.
    * ``nonfinite`` counts nan and +-inf entries; ``segment_nonfinite`` counts them per
      parameter (which parameter holds them is what the ``error`` non-finite policy names).

    Squares are accumulated in float64 (one chunk per thread, then per segment), so the
    norms only overflow to inf when they exceed the float32 range themselves. Per-segment
    sums are combined with one atomic per chunk: on a GPU a parameter larger than one chunk
    may therefore differ in the last bits between runs unless ``wp.config.deterministic``
    is set before this module is imported; the global sum over segments is always taken
    in a fixed order by a single thread.

    Args:
        params: The parameter set whose layout (segments and chunk table) the flat arrays follow.

    Attributes:
        segment_sumsq: float32 ``(segment_count,)``, sum of squares of each parameter.
        segment_norm: float32 ``(segment_count,)``, L2 norm of each parameter.
        segment_nonfinite: int32 ``(segment_count,)``, nan or inf entries of each parameter.
        sumsq: float32 ``(1,)``, global sum of squares.
        norm: float32 ``(1,)``, global L2 norm.
        norm64: float64 ``(1,)``, the same norm before rounding (what the global-norm clip reads).
        max_abs: float32 ``(1,)``, largest finite ``|x|``.
        nonfinite: int32 ``(1,)``, number of nan or inf entries.
    """

    def __init__(self, params: ParamSet):
        self.device = params.device
        self.size = params.size
        self.names = params.names
        self.segment_count = params.segment_count
        self.chunks = params.chunks

        n, dev = self.segment_count, self.device
        self._seg_acc = wp.zeros(n, dtype=wp.float64, device=dev)
        self.segment_sumsq = wp.zeros(n, dtype=wp.float32, device=dev)
        self.segment_norm = wp.zeros(n, dtype=wp.float32, device=dev)
        self.segment_nonfinite = wp.zeros(n, dtype=wp.int32, device=dev)
        self.sumsq = wp.zeros(1, dtype=wp.float32, device=dev)
        self.norm = wp.zeros(1, dtype=wp.float32, device=dev)
        self.norm64 = wp.zeros(1, dtype=wp.float64, device=dev)
        self.max_abs = wp.zeros(1, dtype=wp.float32, device=dev)
        self.nonfinite = wp.zeros(1, dtype=wp.int32, device=dev)

    def _check(self, arr: wp.array, what: str) -> None:
        if arr.dtype != wp.float32 or arr.ndim != 1 or arr.shape[0] != self.size or not arr.is_contiguous:
            raise ValueError(
                f"FlatStats.compute: {what} must be a contiguous flat float32 array of {self.size} entries, "
                f"got dtype {arr.dtype.__name__} shape {arr.shape}"
            )
        if arr.device != self.device:
            raise ValueError(f"FlatStats.compute: {what} is on {arr.device}, expected {self.device}")

    def compute(self, flat: wp.array, *, minus: wp.array | None = None) -> None:
        """Compute the statistics of ``flat`` (or of ``flat - minus``) into this object's arrays.

        Three launches (zero, chunk reduce, finalize), no allocation and no host
        synchronisation, so the call can be recorded in a CUDA graph.

        Args:
            flat: Flat float32 array of ``params.size`` entries, e.g. ``params.grad``.
            minus: Optional array of the same layout; the statistics are then those of
                the element-wise difference ``flat - minus`` (computed in float32).
        """
        self._check(flat, "flat")
        if minus is not None:
            self._check(minus, "minus")
        wp.launch(
            _zero_kernel,
            dim=self.segment_count,
            inputs=[self._seg_acc, self.segment_nonfinite, self.max_abs, self.nonfinite],
            device=self.device,
        )
        wp.launch(
            _chunk_reduce_kernel,
            dim=self.chunks.chunk_count,
            inputs=[
                wp.uint64(flat.ptr),
                wp.uint64((flat if minus is None else minus).ptr),
                0 if minus is None else 1,
                self.chunks.chunk_offset,
                self.chunks.chunk_length,
                self.chunks.chunk_group,
                self._seg_acc,
                self.segment_nonfinite,
                self.max_abs,
                self.nonfinite,
            ],
            device=self.device,
        )
        wp.launch(
            _finalize_kernel,
            dim=1,
            inputs=[
                self.segment_count,
                self._seg_acc,
                self.segment_sumsq,
                self.segment_norm,
                self.sumsq,
                self.norm,
                self.norm64,
            ],
            device=self.device,
        )


# --------------------------------------------------------------------------- p-norms over groups

NORM_L2, NORM_L1, NORM_INF, NORM_P = 0, 1, 2, 3
"""Kinds of p-norm the group kernels distinguish (``p = 2``, ``1``, ``inf``, any other ``p > 0``)."""

SCALAR_TYPES = (wp.float16, wp.float32, wp.float64)
"""Scalar types of the arrays the group reductions and the clip kernels accept."""


def norm_kind(norm_type: float | str) -> tuple[int, float]:
    """Classify a p-norm order as accepted by ``torch.nn.utils.clip_grad_norm_``.

    Args:
        norm_type: ``p``: any ``p > 0``, ``float("inf")`` or the string ``"inf"``.

    Returns:
        ``(kind, p)`` with ``kind`` one of ``NORM_L2, NORM_L1, NORM_INF, NORM_P``.

    Raises:
        ValueError: If ``p`` is not a positive number or infinity.
    """
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        raise ValueError(f"norm_type must be a number > 0 or inf, got {norm_type!r}") from None
    if not p > 0.0:
        raise ValueError(f"norm_type must be a number > 0 or inf, got {norm_type!r}")
    if math.isinf(p):
        return NORM_INF, p
    if p == 2.0:
        return NORM_L2, p
    if p == 1.0:
        return NORM_L1, p
    return NORM_P, p


def scalar_type_of(dtype: type) -> type:
    """The scalar type under a Warp dtype (``wp.vec3`` -> ``wp.float32``).

    Raises:
        TypeError: If the scalar type is not float16, float32 or float64.
    """
    scalar = getattr(dtype, "_wp_scalar_type_", dtype)
    if scalar not in SCALAR_TYPES:
        raise TypeError(f"gradients must have a float16/32/64 scalar type, got {getattr(dtype, '__name__', dtype)}")
    return scalar


@wp.kernel
def _group_zero_kernel(acc: wp.array(dtype=wp.float64), nan_count: wp.array(dtype=wp.int32)):
    g = wp.tid()
    acc[g] = wp.float64(0.0)
    nan_count[g] = 0


@wp.kernel
def _group_reduce_kernel(
    base: wp.uint64,
    zero: Any,
    chunk_offset: wp.array(dtype=wp.int64),
    chunk_length: wp.array(dtype=wp.int32),
    chunk_group: wp.array(dtype=wp.int32),
    kind: int,
    p: wp.float64,
    acc: wp.array(dtype=wp.float64),
    nan_count: wp.array(dtype=wp.int32),
):
    c = wp.tid()
    a = chunk_view(base, chunk_offset[c], chunk_length[c], zero)
    n = chunk_length[c]
    s = wp.float64(0.0)
    bad = wp.int32(0)
    # One loop per kind, so the per-entry work has no branch on the kind.
    if kind == 0:  # NORM_L2, four partial sums so consecutive adds do not wait on each other
        s1 = wp.float64(0.0)
        s2 = wp.float64(0.0)
        s3 = wp.float64(0.0)
        quads = n // 4
        for q in range(quads):
            x0 = wp.float64(a[4 * q])
            x1 = wp.float64(a[4 * q + 1])
            x2 = wp.float64(a[4 * q + 2])
            x3 = wp.float64(a[4 * q + 3])
            s += x0 * x0
            s1 += x1 * x1
            s2 += x2 * x2
            s3 += x3 * x3
        for i in range(4 * quads, n):
            x = wp.float64(a[i])
            s += x * x
        s = (s + s1) + (s2 + s3)
    elif kind == 1:  # NORM_L1
        for i in range(n):
            s += wp.abs(wp.float64(a[i]))
    elif kind == 2:  # NORM_INF
        for i in range(n):
            x = wp.abs(wp.float64(a[i]))
            if wp.isnan(x):
                bad += 1
            elif x > s:
                s = x
    else:
        for i in range(n):
            s += wp.pow(wp.abs(wp.float64(a[i])), p)
    if not (s <= wp.float64(wp.inf)):  # a sum turned nan: count the nan entries for the finalize step
        for i in range(n):
            if wp.isnan(a[i]):
                bad += 1
    g = chunk_group[c]
    if kind == 2:
        wp.atomic_max(acc, g, s)
    else:
        wp.atomic_add(acc, g, s)
    if bad > 0:
        wp.atomic_add(nan_count, g, bad)


@wp.func
def _root(a: wp.float64, kind: int, p: wp.float64) -> wp.float64:
    if kind == 0:
        return wp.sqrt(a)
    if kind == 3:
        return wp.pow(a, wp.float64(1.0) / p)
    return a


@wp.kernel
def _group_finalize_kernel(
    group_count: int,
    kind: int,
    p: wp.float64,
    acc: wp.array(dtype=wp.float64),
    nan_count: wp.array(dtype=wp.int32),
    group_norm: wp.array(dtype=wp.float64),
    total: wp.array(dtype=wp.float64),
    norm: wp.array(dtype=wp.float32),
):
    # One thread, groups in a fixed order: the total is deterministic.
    nan = wp.float64(wp.nan)
    t = wp.float64(0.0)
    any_nan = int(0)  # noqa: RUF046, UP018  (a dynamic Warp variable, mutated in the loop)
    for g in range(group_count):
        a = acc[g]
        if nan_count[g] > 0:
            any_nan = 1
            group_norm[g] = nan
        else:
            group_norm[g] = _root(a, kind, p)
            if kind == 2:
                t = wp.max(t, a)
            else:
                t += a
    r = _root(t, kind, p)
    if any_nan != 0:
        r = nan
    total[0] = r
    norm[0] = wp.float32(r)


class GroupNorms:
    """The p-norm of every group of a :class:`ChunkTable` and over all of them, on the device.

    With ``x`` the entries of a group, its norm is ``(sum_i |x_i|^p)^(1/p)`` (``max_i |x_i|``
    for ``p = inf``) and the total is the same norm over the entries of all groups, which
    equals the p-norm of the vector of group norms (how ``torch.nn.utils.clip_grad_norm_``
    combines per-tensor norms). Vector entries (``vec3``, ``spatial_vector``) count as their
    scalar components. Sums of ``|x|^p`` are accumulated in float64 (exact for the float32
    range when ``p <= 8``); any nan entry makes its group norm and the total nan, otherwise an
    inf entry makes them inf, as in ``torch.linalg.vector_norm``.

    :meth:`compute` is three launches (zero, chunk reduce, finalize), no allocation and no
    host synchronisation.

    Args:
        table: The groups.
        norm_type: ``p``, any number ``> 0`` or ``inf``.
        device: Device of the result arrays (the table's device).

    Attributes:
        group_norm: float64 ``(group_count,)``.
        total: float64 ``(1,)``, the norm over all groups.
        norm: float32 ``(1,)``, ``total`` rounded to float32 (what float32 users read).
    """

    def __init__(self, table: ChunkTable, *, norm_type: float | str = 2.0, device: wp.context.Devicelike = None):
        self.table = table
        self.kind, self.p = norm_kind(norm_type)
        self.device = wp.get_device(device)
        n = max(table.group_count, 1)
        self._acc = wp.zeros(n, dtype=wp.float64, device=self.device)
        self._nan_count = wp.zeros(n, dtype=wp.int32, device=self.device)
        self.group_norm = wp.zeros(n, dtype=wp.float64, device=self.device)
        self.total = wp.zeros(1, dtype=wp.float64, device=self.device)
        self.norm = wp.zeros(1, dtype=wp.float32, device=self.device)

    def compute(self, base: int = 0, *, zeroed: bool = False) -> None:
        """Reduce the memory the table describes, relative to the pointer ``base``.

        Args:
            base: Pointer the table's byte offsets are relative to (``params.grad.ptr``,
                ``params.data.ptr``, or 0 for absolute addresses).
            zeroed: The accumulators are already zero (a caller that reduces several tables
                of different scalar types into one set of groups zeroes once).
        """
        if not zeroed:
            self.zero()
        self.accumulate(self.table, base)
        self.finalize()

    def accumulate(self, table: ChunkTable, base: int) -> None:
        """Add the entries of ``table`` (same groups, possibly another scalar type) into the sums."""
        wp.launch(
            _group_reduce_kernel,
            dim=table.chunk_count,
            inputs=[
                *table.kernel_inputs(base),
                self.kind,
                wp.float64(self.p),
                self._acc,
                self._nan_count,
            ],
            device=self.device,
        )

    def zero(self) -> None:
        """Reset the accumulators (one launch)."""
        wp.launch(_group_zero_kernel, dim=self._acc.shape[0], inputs=[self._acc, self._nan_count], device=self.device)

    def finalize(self) -> None:
        """Turn the sums into group norms and the total (one single-thread launch)."""
        wp.launch(
            _group_finalize_kernel,
            dim=1,
            inputs=[
                self.table.group_count,
                self.kind,
                wp.float64(self.p if self.kind == NORM_P else 1.0),
                self._acc,
                self._nan_count,
                self.group_norm,
                self.total,
                self.norm,
            ],
            device=self.device,
        )
