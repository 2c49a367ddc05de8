"""The clip kernels and the launches that run them.

Device code only (Newton's split of kernels from host code): the coefficient rule of the
global norm (``torch.nn.utils.clip_grad_norm_``'s ``max_norm / (total + 1e-6)``, one
function), the per-group scale used by every norm rule (global, per parameter, AGC; the
policies and :func:`~harness.clip.clip_grad_norm_` alike), the value clamp,
the non-finite stage, AutoClip's and ZClip's device-side state updates, and
:class:`~harness.clip.nonfinite.SkipGuard`'s copy. The policies
(:mod:`harness.clip.policies`) and the functional API (:mod:`harness.clip.functional`)
launch them through :func:`launch_scale_groups` and :func:`launch_clamp`.
"""

from __future__ import annotations

from typing import Any

import warp as wp

from harness.chunks import ChunkTable, chunk_view

MODE_GLOBAL, MODE_PER_GROUP, MODE_AGC = 0, 1, 2
"""How :func:`launch_scale_groups` turns norms into a scale: one global coefficient, one per
group, or AGC's unit-wise rule."""


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
def scale_groups_kernel(
    base: wp.uint64,
    zero: Any,
    chunk_offset: wp.array(dtype=wp.int64),
    chunk_length: wp.array(dtype=wp.int32),
    chunk_group: wp.array(dtype=wp.int32),
    lanes: int,
    mode: int,
    max_norm_value: wp.float64,
    limit: wp.array(dtype=wp.float32),
    use_limit: int,
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
    max_norm = max_norm_value
    if use_limit != 0:  # a limit decided on the device (AutoClip, ZClip, the threshold state)
        max_norm = wp.float64(limit[0])
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
def reset_coef_kernel(coef: wp.array(dtype=wp.float32), clipped: wp.array(dtype=wp.int32)):
    coef[0] = wp.float32(1.0)
    clipped[0] = 0


@wp.kernel
def clamp_chunks_kernel(
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
def nonfinite_stage_kernel(
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
def zero_nonfinite_kernel(grad: wp.array(dtype=wp.float32)):
    i = wp.tid()
    if not wp.isfinite(grad[i]):
        grad[i] = wp.float32(0.0)


@wp.kernel
def chain_combine_kernel(
    member_coef: wp.array(dtype=wp.float32),
    member_clipped: wp.array(dtype=wp.int32),
    coef: wp.array(dtype=wp.float32),
    clipped: wp.array(dtype=wp.int32),
):
    coef[0] = coef[0] * member_coef[0]
    clipped[0] = wp.max(clipped[0], member_clipped[0])


@wp.kernel
def autoclip_kernel(
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


@wp.kernel
def zclip_kernel(
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


@wp.kernel
def guard_restore_kernel(
    live_offset: wp.array(dtype=wp.int64),
    saved_offset: wp.array(dtype=wp.int64),
    chunk_length: wp.array(dtype=wp.int32),
    skip: wp.array(dtype=wp.int32),
):
    # One thread per chunk; nothing to do (one read) unless the update is to be undone.
    c = wp.tid()
    if skip[0] == 0:
        return
    live = chunk_view(wp.uint64(0), live_offset[c], chunk_length[c], wp.uint32(0))
    saved = chunk_view(wp.uint64(0), saved_offset[c], chunk_length[c], wp.uint32(0))
    for j in range(chunk_length[c]):
        live[j] = saved[j]


def launch_scale_groups(
    table: ChunkTable,
    base: int,
    *,
    mode: int,
    total: wp.array,
    group_coef: wp.array,
    coef: wp.array,
    clipped: wp.array,
    max_norm: float = 0.0,
    limit: wp.array | None = None,
    group_norm: wp.array | None = None,
    use_f64: bool = False,
    eps: float = 0.0,
    param_norm: wp.array | None = None,
) -> None:
    """Scale the memory ``table`` describes (relative to ``base``) by the clip coefficient of
    each chunk's group.

    Args:
        table: The groups (a ParamSet's ``chunks``, AGC units, a list of arrays).
        base: Pointer the table's offsets are relative to.
        mode: ``MODE_GLOBAL`` (``min(1, max_norm / (total + 1e-6))`` for every group),
            ``MODE_PER_GROUP`` (the same rule on each group's norm) or ``MODE_AGC``.
        total: float64 ``(1,)``, the norm over all groups.
        group_coef: float32 ``(group_count,)``, receives each group's factor.
        coef: float32 ``(1,)``, receives the smallest factor.
        clipped: int32 ``(1,)``, receives 1 when a factor is below 1.
        max_norm: The limit (AGC: ``lambda``), unless ``limit`` is given.
        limit: float32 ``(1,)`` on the device: the limit, read when the kernel runs.
        group_norm: float64 ``(group_count,)``, each group's norm (per group, AGC).
        use_f64: Compute the factor in float64 (float64 gradients), else in float32.
        eps: AGC's floor of the parameter norm.
        param_norm: float64 ``(group_count,)``, AGC's parameter norms.
    """
    device = total.device
    lanes = table.max_chunk if device.is_cuda else 1
    wp.launch(
        scale_groups_kernel,
        dim=(table.chunk_count, max(lanes, 1)),
        inputs=[
            *table.kernel_inputs(base),
            max(lanes, 1),
            mode,
            wp.float64(max_norm),
            coef if limit is None else limit,
            int(limit is not None),
            int(use_f64),
            wp.float64(eps),
            total if group_norm is None else group_norm,
            total,
            (total if group_norm is None else group_norm) if param_norm is None else param_norm,
            table.group_count,
            group_coef,
            coef,
            clipped,
        ],
        device=device,
    )


def launch_clamp(table: ChunkTable, base: int, clip_value: float, coef: wp.array, clipped: wp.array) -> None:
    wp.launch(
        clamp_chunks_kernel,
        dim=table.chunk_count,
        inputs=[*table.kernel_inputs(base, grouped=False), wp.float64(clip_value), coef, clipped],
        device=coef.device,
    )
