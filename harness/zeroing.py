"""Zero many device arrays with one kernel launch instead of one memset each.

A taped rollout keeps one Newton ``State`` per step (and per substep), each with a gradient
buffer per array, plus per-step scratch: zeroing them one ``array.zero_()`` at a time costs
one memset per buffer, 27 per simulated step of the cartpole and about 400 of the Ant (16
substeps a step), and on CUDA every memset is a node of the captured graph, paid for at every
replay. :class:`FusedZero` zeroes all of them with one launch over a
:class:`~harness.chunks.ChunkTable` of their 32-bit words (the project's one chunking scheme:
one thread per chunk of at most ``CHUNK`` words): one graph node, whatever the horizon. The
bytes zeroed are exactly those the memsets zeroed (overlapping and adjacent ranges joined), so
nothing a run computes changes.

The table follows the arrays: :meth:`FusedZero.zero` compares the ranges it is handed with the
table's and builds a new table when they differ (a solver adds arrays to a State the first
time it steps into it). A capture cannot build one (its upload would be recorded, not run): a
capture that finds the table out of date zeroes with one memset per buffer, which is always
right; :meth:`FusedZero.refresh` brings the table up to date outside a capture (an env calls it
at the end of a rollout, so the capture that follows the first eager iteration finds it
current). Every table ever launched stays allocated: a captured graph keeps reading the one it
recorded.
"""

from __future__ import annotations

from collections.abc import Iterable

import warp as wp

from harness.chunks import ChunkTable, chunk_view

__all__ = ["FusedZero"]

_WORD = 4
"""Bytes per zeroed word (the gradient dtypes are made of 32-bit scalars; others get a memset)."""


_BLOCK = wp.types.vector(length=16, dtype=wp.uint32)
"""16 words written by one store: a word at a time, the CPU took 15 times as long as the memsets
(1.2 ms against 0.1 ms for the cartpole's 1.2 M words in a captured graph); a block at a time,
about as long."""


@wp.kernel(enable_backward=False)
def zero_chunks_kernel(chunk_offset: wp.array(dtype=wp.int64), chunk_length: wp.array(dtype=wp.int32)):
    # One thread per chunk of 32-bit words at an absolute address: its blocks of 16, then the rest.
    c = wp.tid()
    n = chunk_length[c]
    blocks = n // 16
    wide = chunk_view(wp.uint64(0), chunk_offset[c], blocks, _BLOCK())
    for j in range(blocks):
        wide[j] = _BLOCK()
    words = chunk_view(wp.uint64(0), chunk_offset[c], n, wp.uint32(0))
    for j in range(blocks * 16, n):
        words[j] = wp.uint32(0)


def _joined(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``(start byte, end byte)`` ranges sorted, overlapping and adjacent ones joined."""
    joined: list[list[int]] = []
    for start, end in sorted(ranges):
        if joined and start <= joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], end)
        else:
            joined.append([start, end])
    return tuple((start, end) for start, end in joined)


class FusedZero:
    """Zero a set of arrays with one launch (module docstring).

    Args:
        device: The device of the arrays (an array elsewhere is zeroed with a memset of its own).
    """

    def __init__(self, device: wp.context.Devicelike = None):
        self.device = wp.get_device(device)
        self._key: tuple[tuple[int, int], ...] | None = None  # the byte ranges of the table
        self._table: ChunkTable | None = None
        self._kept: list[ChunkTable] = []  # every table launched: a captured graph reads its own

    def _split(self, arrays: Iterable[wp.array | None]) -> tuple[list[wp.array], tuple[tuple[int, int], ...], list]:
        """The non-empty arrays, the joined byte ranges of those one launch zeroes, and the others."""
        found, ranges, loose = [], [], []
        for array in arrays:
            if array is None or array.size == 0:
                continue
            found.append(array)
            nbytes = array.size * wp.types.type_size_in_bytes(array.dtype)
            if array.device == self.device and array.is_contiguous and array.ptr % _WORD == 0 and nbytes % _WORD == 0:
                ranges.append((array.ptr, array.ptr + nbytes))
            else:
                loose.append(array)
        return found, _joined(ranges), loose

    def _build(self, key: tuple[tuple[int, int], ...]) -> None:
        self._key, self._table = key, None
        if key:
            self._table = ChunkTable.build(
                [(start, (end - start) // _WORD, 0) for start, end in key],
                scalar_type=wp.uint32,
                group_count=1,
                device=self.device,
            )
            self._kept.append(self._table)

    def refresh(self, arrays: Iterable[wp.array | None]) -> None:
        """Bring the table up to date with ``arrays`` (nothing is zeroed); nothing in a capture."""
        if self.device.is_capturing:
            return
        _, key, _ = self._split(arrays)
        if key != self._key:
            self._build(key)

    def zero(self, arrays: Iterable[wp.array | None]) -> None:
        """Zero every array: one launch for the contiguous ones on :attr:`device`, a memset for
        each other one (and for every one in a capture that finds the table out of date)."""
        found, key, loose = self._split(arrays)
        if key != self._key:
            if self.device.is_capturing:
                for array in found:
                    array.zero_()
                return
            self._build(key)
        table = self._table
        if table is not None:
            wp.launch(
                zero_chunks_kernel, dim=table.chunk_count, inputs=[table.chunk_offset, table.chunk_length],
                device=self.device, record_tape=False,
            )  # fmt: skip
        for array in loose:
            array.zero_()
