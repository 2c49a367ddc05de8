"""Work-arounds for Warp defects that change what a run computes (Warp 1.19), installed by
:func:`install` the moment Warp is imported (``harness/__init__.py``), before anything is
recorded or captured.

The copy adjoint under a CPU graph capture. ``wp.copy`` on a tape records an adjoint that adds
the destination's gradient into the source's with a kernel ``wp.map`` generates: one generic
kernel, key ``map_kernel`` in module ``map_add``, whose overloads (one per dtype) share that key
and their module's hash. A CPU capture registers each launched kernel's function under exactly
that pair, so the overload registered last is the one *every* replay of the graph runs: in a
graph that copies a float array and a ``spatial_vector`` one (a Featherstone step copies
``State.body_f``, a rollout copies joint coordinates), the ``spatial_vector`` adjoint replays
the float kernel and adds the first of each six components only. The first replay matches an
eager iteration wherever those gradients are zero; once a contact wrench flows through
``body_f`` (a legged robot's Hunt-Crossley damping) the replayed gradients differ. The
replacement accumulates with a kernel of its own per dtype, each in a module of its own (a
hash of its own), so no two dtypes share a registration; eager results are unchanged (the same
elementwise sum). tests/test_warp_fixes.py holds the reproduction.
"""

from typing import Any

_KERNELS: dict[Any, Any] = {}
_ORIGINAL: dict[str, Any] = {}


def _accumulate_kernel(dtype: Any) -> Any:
    import warp as wp

    kernel = _KERNELS.get(dtype)
    if kernel is None:

        @wp.kernel(module="unique", enable_backward=False)
        def accumulate(total: wp.array(dtype=dtype), part: wp.array(dtype=dtype)):
            i = wp.tid()
            total[i] = total[i] + part[i]

        kernel = _KERNELS[dtype] = accumulate
    return kernel


def _accumulate(total: Any, part: Any) -> None:
    """Add ``part`` into ``total`` elementwise (the copy adjoint's accumulation), never recorded
    on a tape; contiguous arrays of any shape, others through Warp's own path."""
    import warp as wp

    if not (total.is_contiguous and part.is_contiguous):
        _ORIGINAL["add"](total, part)
        return
    flat_total, flat_part = total.flatten(), part.flatten()
    wp.launch(
        _accumulate_kernel(total.dtype), dim=flat_total.size, inputs=[flat_total, flat_part], device=total.device,
        record_tape=False,
    )  # fmt: skip


def install() -> None:
    """Install every work-around (idempotent)."""
    from warp._src import context

    if "add" not in _ORIGINAL:
        _ORIGINAL["add"] = context._launch_adj_copy_add
        context._launch_adj_copy_add = _accumulate
