"""harness.warp_fixes: a graph captured on the CPU replays the gradients an eager pass computes."""

import numpy as np
import pytest
import warp as wp

from harness import warp_fixes


@wp.kernel
def _produce(a: wp.array(dtype=float), wrench: wp.array(dtype=wp.spatial_vector), scalar: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(wrench, i, wp.spatial_vector(a[i] * a[i], a[i], 1.0, 0.0, 2.0 * a[i], a[i]))
    scalar[i] = a[i] * a[i]


@wp.kernel
def _consume(wrench: wp.array(dtype=wp.spatial_vector), scalar: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(out, 0, 3.0 * wp.dot(wrench[i], wrench[i]) + scalar[i])


def _iteration(a, arrays, out):
    wrench, wrench_copy, scalar, scalar_copy = arrays
    for array in (a, *arrays, out):
        array.grad.zero_()
    wrench.zero_()
    out.zero_()
    tape = wp.Tape()
    with tape:  # a float copy and a spatial_vector copy in one pass: two dtypes of the copy adjoint
        wp.launch(_produce, dim=a.size, inputs=[a], outputs=[wrench, scalar], device="cpu")
        wp.copy(scalar_copy, scalar)
        wp.copy(wrench_copy, wrench)
        wp.launch(_consume, dim=a.size, inputs=[wrench_copy, scalar_copy], outputs=[out], device="cpu")
    tape.backward(out)


def _grads() -> tuple[np.ndarray, np.ndarray]:
    n = 4
    a = wp.array(np.arange(1, n + 1, dtype=np.float32), requires_grad=True, device="cpu")
    arrays = [
        wp.zeros(n, dtype=wp.spatial_vector, requires_grad=True, device="cpu"),
        wp.zeros(n, dtype=wp.spatial_vector, requires_grad=True, device="cpu"),
        wp.zeros(n, dtype=float, requires_grad=True, device="cpu"),
        wp.zeros(n, dtype=float, requires_grad=True, device="cpu"),
    ]
    out = wp.zeros(1, dtype=float, requires_grad=True, device="cpu")
    _iteration(a, arrays, out)
    eager = a.grad.numpy().copy()
    with wp.ScopedCapture(device="cpu") as capture:
        _iteration(a, arrays, out)
    wp.capture_launch(capture.graph)
    wp.capture_launch(capture.graph)
    return eager, a.grad.numpy().copy()


def test_a_captured_copy_adjoint_replays_what_an_eager_pass_computes():
    eager, replayed = _grads()
    # d/da of sum 3|w|^2 + a^2 with w = (a^2, a, 1, 0, 2a, a): 3(4a^3 + 2a + 8a + 2a) + 2a
    a = np.arange(1, 5, dtype=np.float64)
    np.testing.assert_allclose(eager, 12 * a**3 + 38 * a, rtol=1e-6)
    np.testing.assert_array_equal(replayed, eager)


def test_without_the_fix_warp_replays_the_wrong_overload(monkeypatch):
    """The defect the fix works around, as Warp 1.19 has it: when this starts failing, Warp fixed
    it and harness/warp_fixes.py can go."""
    from warp._src import context

    monkeypatch.setattr(context, "_launch_adj_copy_add", warp_fixes._ORIGINAL["add"])
    eager, replayed = _grads()
    if wp.config.version != "1.19.0":
        pytest.skip(f"the defect is recorded for Warp 1.19.0 (this is {wp.config.version})")
    assert not np.array_equal(replayed, eager)
