"""harness.zeroing: one launch zeroes exactly the bytes of every array handed to it, eagerly and in
a captured graph, and a capture that finds its table out of date falls back to memsets."""

import numpy as np
import warp as wp

from harness.zeroing import FusedZero, zero_chunks_kernel


def _arrays(device="cpu"):
    """Arrays of several dtypes and sizes (blocks of 16 words and a rest), a view of a 2-D
    array's row, a strided (non-contiguous) view, an empty one, and an array none of them covers."""
    rng = np.random.default_rng(0)
    sizes = [1, 15, 16, 17, 255, 256, 257, 1000, 4099]
    arrays = [wp.array(rng.random(n).astype(np.float32) + 1.0, device=device) for n in sizes]
    arrays.append(wp.array(rng.random((7, 3)).astype(np.float32) + 1.0, dtype=wp.vec3, device=device))
    arrays.append(wp.array(rng.random((5, 7)).astype(np.float32) + 1.0, dtype=wp.transform, device=device))
    arrays.append(wp.array(np.arange(1, 38, dtype=np.int32), dtype=wp.int32, device=device))
    rows = wp.array(rng.random((4, 33)).astype(np.float32) + 1.0, device=device)
    strided = wp.array(rng.random((6, 5)).astype(np.float32) + 1.0, device=device)
    handed = [*arrays, rows[2], strided[:, 1], wp.empty(0, dtype=wp.float32, device=device), None]
    untouched = [wp.array(rng.random(300).astype(np.float32) + 1.0, device=device)]
    return handed, rows, strided, untouched


def _check(handed, rows, strided, untouched, before_rows, before_strided, before_untouched):
    for array in handed[:-4]:
        assert not array.numpy().any()
    expected_rows = before_rows.copy()
    expected_rows[2] = 0.0
    np.testing.assert_array_equal(rows.numpy(), expected_rows)
    expected_strided = before_strided.copy()
    expected_strided[:, 1] = 0.0
    np.testing.assert_array_equal(strided.numpy(), expected_strided)
    np.testing.assert_array_equal(untouched[0].numpy(), before_untouched)


def test_one_launch_zeroes_exactly_the_arrays_handed():
    handed, rows, strided, untouched = _arrays()
    before = rows.numpy().copy(), strided.numpy().copy(), untouched[0].numpy().copy()
    zero = FusedZero("cpu")
    zero.zero([*handed, handed[3]])  # an array twice: zeroed once
    _check(handed, rows, strided, untouched, *before)
    assert zero._table is not None and len(zero._kept) == 1


def _fill(array):
    array.assign(np.full(array.numpy().shape, 3, dtype=array.numpy().dtype))


def test_a_capture_replays_the_zeroing_and_a_stale_table_falls_back_to_memsets():
    handed, _, _, _ = _arrays()
    contiguous = handed[:-3]  # every array but the strided view (a CPU capture refuses its fill)
    zero = FusedZero("cpu")
    zero.zero(contiguous)  # the table, built eagerly
    for array in contiguous:
        _fill(array)
    with wp.ScopedCapture(device="cpu") as capture:
        zero.zero(contiguous)
    assert all(array.numpy().all() for array in contiguous)  # a CPU capture runs nothing
    wp.capture_launch(capture.graph)
    assert not any(array.numpy().any() for array in contiguous)
    extra = wp.array(np.ones(40, np.float32), device="cpu")
    with wp.ScopedCapture(device="cpu") as stale:  # a new array: the table is out of date
        zero.zero([*contiguous, extra])
    assert len(zero._kept) == 1  # no table built in a capture
    for array in (*contiguous, extra):
        _fill(array)
    wp.capture_launch(stale.graph)
    assert not any(array.numpy().any() for array in (*contiguous, extra))
    zero.refresh([*contiguous, extra])
    assert len(zero._kept) == 2
    for array in (*contiguous, extra):
        _fill(array)
    wp.capture_launch(capture.graph)  # the first graph still reads its own table: its arrays only
    assert not any(array.numpy().any() for array in contiguous)
    assert extra.numpy().all()


def test_the_kernel_zeroes_blocks_and_rest_of_a_chunk():
    data = wp.array(np.arange(1, 300, dtype=np.float32), device="cpu")
    offsets = wp.array(np.array([data.ptr + 4, data.ptr + 4 * 100], np.int64), dtype=wp.int64, device="cpu")
    lengths = wp.array(np.array([37, 50], np.int32), dtype=wp.int32, device="cpu")
    wp.launch(zero_chunks_kernel, dim=2, inputs=[offsets, lengths], device="cpu")
    expected = np.arange(1, 300, dtype=np.float32)
    expected[1:38] = 0.0
    expected[100:150] = 0.0
    np.testing.assert_array_equal(data.numpy(), expected)
