"""Device-side statistics of flat buffers laid out like a :class:`~harness.params.ParamSet`.

This module owns :class:`FlatStats`: the per-parameter and global L2 norms, the largest
finite magnitude and the count of non-finite entries of a flat float32 array (a gradient,
the parameters themselves, or the difference of two such arrays, e.g. an update
``p_new - p_old`` for the update-to-parameter ratio ``|dp| / |p|``).

Every result stays in a small device array, so a training step that clips on the global
norm or logs it needs no host round trip and can be captured in a CUDA graph. One call to
:meth:`FlatStats.compute` is always three launches (zero, chunk reduce, finalize), whatever
the number of parameters, using the chunk table of the ``ParamSet``.
"""

from __future__ import annotations

import warp as wp

from harness.params import ParamSet

__all__ = ["FlatStats"]


@wp.kernel
def _zero_kernel(
    seg_acc: wp.array(dtype=wp.float64),
    max_abs: wp.array(dtype=wp.float32),
    nonfinite: wp.array(dtype=wp.int32),
):
    i = wp.tid()
    seg_acc[i] = wp.float64(0.0)
    if i == 0:
        max_abs[0] = wp.float32(0.0)
        nonfinite[0] = 0


@wp.kernel
def _chunk_reduce_kernel(
    flat: wp.array(dtype=wp.float32),
    minus: wp.array(dtype=wp.float32),
    has_minus: int,
    chunk_segment: wp.array(dtype=wp.int32),
    chunk_start: wp.array(dtype=wp.int32),
    chunk_end: wp.array(dtype=wp.int32),
    seg_acc: wp.array(dtype=wp.float64),
    max_abs: wp.array(dtype=wp.float32),
    nonfinite: wp.array(dtype=wp.int32),
):
    c = wp.tid()
    acc = wp.float64(0.0)
    peak = wp.float32(0.0)
    bad = wp.int32(0)
    for i in range(chunk_start[c], chunk_end[c]):
        x = flat[i]
        if has_minus != 0:
            x = x - minus[i]
        # Square in float64: the sum of squares of float32 values cannot overflow there,
        # so the norm is inf only when it really exceeds the float32 range (or an entry is inf).
        xd = wp.float64(x)
        acc += xd * xd
        if wp.isfinite(x):
            peak = wp.max(peak, wp.abs(x))
        else:
            bad += 1
    wp.atomic_add(seg_acc, chunk_segment[c], acc)
    wp.atomic_max(max_abs, 0, peak)
    if bad > 0:
        wp.atomic_add(nonfinite, 0, bad)


@wp.kernel
def _finalize_kernel(
    segment_count: int,
    seg_acc: wp.array(dtype=wp.float64),
    segment_sumsq: wp.array(dtype=wp.float32),
    segment_norm: wp.array(dtype=wp.float32),
    sumsq: wp.array(dtype=wp.float32),
    norm: wp.array(dtype=wp.float32),
):
    # A single thread walks the segments in order, so the global sum is deterministic.
    total = wp.float64(0.0)
    for s in range(segment_count):
        a = seg_acc[s]
        segment_sumsq[s] = wp.float32(a)
        segment_norm[s] = wp.float32(wp.sqrt(a))
        total += a
    sumsq[0] = wp.float32(total)
    norm[0] = wp.float32(wp.sqrt(total))


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
    * ``nonfinite`` counts nan and +-inf entries.

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
        sumsq: float32 ``(1,)``, global sum of squares.
        norm: float32 ``(1,)``, global L2 norm.
        max_abs: float32 ``(1,)``, largest finite ``|x|``.
        nonfinite: int32 ``(1,)``, number of nan or inf entries.
    """

    def __init__(self, params: ParamSet):
        self.device = params.device
        self.size = params.size
        self.names = params.names
        self.segment_count = params.segment_count
        self.chunk_count = params.chunk_count
        self._chunk_segment = params.chunk_segment
        self._chunk_start = params.chunk_start
        self._chunk_end = params.chunk_end

        n, dev = self.segment_count, self.device
        self._seg_acc = wp.zeros(n, dtype=wp.float64, device=dev)
        self.segment_sumsq = wp.zeros(n, dtype=wp.float32, device=dev)
        self.segment_norm = wp.zeros(n, dtype=wp.float32, device=dev)
        self.sumsq = wp.zeros(1, dtype=wp.float32, device=dev)
        self.norm = wp.zeros(1, dtype=wp.float32, device=dev)
        self.max_abs = wp.zeros(1, dtype=wp.float32, device=dev)
        self.nonfinite = wp.zeros(1, dtype=wp.int32, device=dev)

    def _check(self, arr: wp.array, what: str) -> None:
        if arr.dtype != wp.float32 or arr.ndim != 1 or arr.shape[0] != self.size:
            raise ValueError(
                f"FlatStats.compute: {what} must be a flat float32 array of {self.size} entries, "
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
            inputs=[self._seg_acc, self.max_abs, self.nonfinite],
            device=self.device,
        )
        wp.launch(
            _chunk_reduce_kernel,
            dim=self.chunk_count,
            inputs=[
                flat,
                flat if minus is None else minus,
                0 if minus is None else 1,
                self._chunk_segment,
                self._chunk_start,
                self._chunk_end,
                self._seg_acc,
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
            ],
            device=self.device,
        )
