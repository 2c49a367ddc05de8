"""ChunkTable.build: the chunks a plain loop over the ranges gives, and tables past 2**31 scalars
(the Ant's gradient buffers at 4096 worlds, zeroed by one fused kernel, hold more than that)."""

import numpy as np
import warp as wp

from harness.chunks import CHUNK, ChunkTable


def reference(ranges, itemsize):
    """The chunks of ``ranges`` as a plain loop cuts them: (offset, length, group) each."""
    return [
        (offset + start * itemsize, min(CHUNK, count - start), group)
        for offset, count, group in ranges
        for start in range(0, count, CHUNK)
    ]


def test_build_cuts_every_range_as_a_plain_loop_does():
    ranges = [(0, 1, 0), (64, 0, 1), (1 << 40, 3 * CHUNK, 1), (8, CHUNK + 1, 2), (4096, 1000, 0)]
    table = ChunkTable.build(ranges, scalar_type=wp.float32, group_count=3, device="cpu")
    want = reference(ranges, 4)
    got = list(zip(table.chunk_offset.numpy().tolist(), table.chunk_length.numpy().tolist(),
                   table.chunk_group.numpy().tolist(), strict=True))  # fmt: skip
    assert got == want
    assert table.chunk_count == len(want)
    assert (table.chunk_offset.dtype, table.chunk_length.dtype, table.chunk_group.dtype) == (
        wp.int64,
        wp.int32,
        wp.int32,
    )
    assert table.scalar_count == sum(count for _, count, _ in ranges)
    assert table.max_chunk == CHUNK


def test_build_takes_tables_of_more_than_2_to_the_31_scalars():
    count = 2**31 + 300  # one range past int32's reach: this raised OverflowError before
    table = ChunkTable.build([(0, count, 0), (4 * count, 5, 1)], scalar_type=wp.uint32, group_count=2, device="cpu")
    offsets, lengths = table.chunk_offset.numpy(), table.chunk_length.numpy()
    assert table.chunk_count == -(-count // CHUNK) + 1
    assert table.scalar_count == count + 5
    assert offsets[-2] == 4 * (count - count % CHUNK) and lengths[-2] == count % CHUNK
    assert offsets[-1] == 4 * count and lengths[-1] == 5
    assert np.all(np.diff(offsets[:-1]) == 4 * CHUNK)


def test_build_of_no_ranges_is_empty():
    table = ChunkTable.build([], scalar_type=wp.float32, group_count=0, device="cpu")
    assert (table.chunk_count, table.max_chunk, table.scalar_count) == (0, 0, 0)
