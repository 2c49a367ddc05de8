"""The one chunking scheme: memory ranges cut into chunks of at most ``CHUNK`` scalars.

Every reduction and every copy over many arrays at once walks a :class:`ChunkTable`: the
statistics of a flat gradient (one group per named parameter), the p-norms of the clip
policies (per parameter, per AGC unit) and of :func:`harness.clip.clip_grad_norm_` (per
array of a list), the value clamp, :class:`harness.clip.SkipGuard`'s copy of the
parameters and the optimizer state (as 32-bit words), and :class:`harness.zeroing.FusedZero`'s
zeroing of an env's gradient buffers (32-bit words too). A chunk never straddles two ranges,
so one launch with one thread per chunk serves every group with one atomic per chunk,
however many arrays there are (the Warp counterpart of PyTorch's ``foreach`` kernels).

Ranges are addressed by a byte offset relative to a base pointer handed over at launch
time: 0 for absolute addresses (a list of unrelated arrays), or a flat buffer's pointer
(``params.grad.ptr``), so one table built once per :class:`~harness.params.ParamSet`
(``params.chunks``) serves ``params.grad``, ``params.data`` and any array laid out like them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import warp as wp

__all__ = ["CHUNK", "ChunkTable", "chunk_view"]

CHUNK = 256
"""Scalars one thread walks in a chunked reduction or copy."""


@dataclasses.dataclass(frozen=True)
class ChunkTable:
    """Memory ranges cut into chunks of at most ``CHUNK`` scalars, each tagged with its group.

    A range is ``(byte_offset, scalar_count, group)``; all ranges hold the same scalar type.

    Attributes:
        scalar_type: The scalar type (``wp.float16/32/64`` for reductions, ``wp.uint32`` for
            raw copies).
        group_count: Number of groups (ranges may share a group).
        chunk_count: Number of chunks.
        max_chunk: Length of the longest chunk (the inner width of 2-D launches).
        scalar_count: Scalars in all ranges together.
        chunk_offset: int64 ``(chunk_count,)``, byte offset of each chunk's first scalar.
        chunk_length: int32 ``(chunk_count,)``, scalars in each chunk.
        chunk_group: int32 ``(chunk_count,)``, group of each chunk.
    """

    scalar_type: type
    group_count: int
    chunk_count: int
    max_chunk: int
    scalar_count: int
    chunk_offset: wp.array
    chunk_length: wp.array
    chunk_group: wp.array

    @staticmethod
    def build(
        ranges: Sequence[tuple[int, int, int]],
        *,
        scalar_type: type,
        group_count: int,
        device: wp.context.Devicelike = None,
    ) -> ChunkTable:
        """Cut ``ranges`` (``(byte_offset, scalar_count, group)``) into chunks on ``device``."""
        itemsize = wp.types.type_size_in_bytes(scalar_type)
        table = np.array(ranges, dtype=np.int64).reshape(-1, 3)
        counts = table[:, 1]
        per_range = -(-counts // CHUNK)  # chunks of each range
        which = np.repeat(np.arange(len(table)), per_range)  # each chunk's range
        start = CHUNK * (np.arange(len(which), dtype=np.int64) - np.repeat(np.cumsum(per_range) - per_range, per_range))
        lengths = np.minimum(CHUNK, counts[which] - start)
        return ChunkTable(
            scalar_type=scalar_type,
            group_count=group_count,
            chunk_count=len(which),
            max_chunk=int(lengths.max(initial=0)),
            scalar_count=int(counts.sum()),
            chunk_offset=wp.array(table[which, 0] + start * itemsize, dtype=wp.int64, device=device),
            chunk_length=wp.array(lengths.astype(np.int32), dtype=wp.int32, device=device),
            chunk_group=wp.array(table[which, 2].astype(np.int32), dtype=wp.int32, device=device),
        )

    def kernel_inputs(self, base: int, *, grouped: bool = True) -> list[Any]:
        """The first arguments of a kernel over these chunks (``base``, ``zero``, ``chunk_offset``,
        ``chunk_length`` and, when ``grouped``, ``chunk_group``): the pointer the byte offsets are
        relative to, and a zero of the scalar type that picks the kernel's overload."""
        inputs = [wp.uint64(base), self.scalar_type(0.0), self.chunk_offset, self.chunk_length]
        if grouped:
            inputs.append(self.chunk_group)
        return inputs

    @staticmethod
    def for_ranges(params: Any, ranges: Sequence[tuple[int, int]]) -> ChunkTable:
        """One group per ``(offset, length)`` range, in float32 scalars, of a ParamSet's flat
        buffers (offsets relative to them)."""
        return ChunkTable.build(
            [(4 * offset, length, g) for g, (offset, length) in enumerate(ranges)],
            scalar_type=wp.float32,
            group_count=len(ranges),
            device=params.device,
        )

    @staticmethod
    def for_words(arrays: Sequence[wp.array], device: wp.context.Devicelike = None) -> ChunkTable:
        """The bytes of contiguous ``arrays`` as 32-bit words at absolute addresses (base 0),
        one group per array: what a raw copy of mixed float and integer state walks.

        Raises:
            ValueError: If an array is not contiguous or not a whole number of 32-bit words.
        """
        ranges = []
        for index, array in enumerate(arrays):
            nbytes = array.size * wp.types.type_size_in_bytes(array.dtype)
            if not array.is_contiguous or nbytes % 4:
                raise ValueError("ChunkTable.for_words: arrays must be contiguous and a whole number of 32-bit words")
            ranges.append((array.ptr, nbytes // 4, index))
        return ChunkTable.build(ranges, scalar_type=wp.uint32, group_count=len(ranges), device=device)


@wp.func
def chunk_view(base: wp.uint64, offset: wp.int64, length: wp.int32, zero: Any):
    """The chunk at ``base + offset`` as a 1-D array of ``length`` scalars of ``zero``'s type."""
    return wp.array(ptr=base + wp.uint64(offset), shape=(length,), dtype=type(zero))
