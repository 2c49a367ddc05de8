"""Trainable parameters: one flat float32 buffer, one flat gradient buffer, named views.

Every named parameter (``controls``, ``policy/w1``, ``pole_mass``) is a typed Warp view
into the flat ``data`` array, and its ``.grad`` is the matching view into the flat
``grad`` array. A global norm, a clip, a statistic or an optimizer step is therefore one
kernel launch over the whole buffer, whatever the number of parameter arrays (the Warp
counterpart of PyTorch's multi-tensor apply), and zeroing every gradient is one memset.

Per-parameter reductions walk one chunk table built with the set (``chunks``, the
project's one chunking scheme, :mod:`harness.chunks`): chunks of at most ``CHUNK`` entries
that never straddle two parameters, so one launch with one thread per chunk reduces every
parameter at once with one atomic per chunk.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import warp as wp

from harness.chunks import CHUNK, ChunkTable

__all__ = ["CHUNK", "ParamSet", "ParamSpec", "Segment", "flat_view"]


@wp.kernel
def _clamp_kernel(lower: wp.array(dtype=wp.float32), upper: wp.array(dtype=wp.float32), x: wp.array(dtype=wp.float32)):
    i = wp.tid()
    # Comparisons are false for nan: a nan entry stays nan (the non-finite policy sees it).
    if x[i] < lower[i]:
        x[i] = lower[i]
    elif x[i] > upper[i]:
        x[i] = upper[i]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """Declares one named trainable array.

    Attributes:
        name: Unique name, used in logs and checkpoints (``controls``, ``policy/w1``).
        shape: Shape of the typed array, in elements of ``dtype``.
        dtype: Warp dtype of the view: ``wp.float32`` or a float32 vector/matrix type.
        init: Initial values, broadcastable to ``shape + dtype's own shape``; zeros if None.
        lower: Smallest value any entry may take; after every optimizer step entries below
            are set to it, on the device (-inf: unbounded).
        upper: Largest value any entry may take (inf: unbounded).
        fd_step: A central finite-difference step suited to this parameter, in its units
            (what ``python -m harness gradcheck`` uses unless ``gradcheck.eps`` is given).
        world_axis: The axis of ``shape`` that indexes the env's worlds, when each world has
            its own entries (open-loop controls: 1; a per-world quantity: 0, where the axis may
            also hold each world's entries in turn, ``world_count x k`` of them, world-major);
            None when every world reads the same entries (a policy's weights).
            ``harness diagnose`` uses it to tell one start's gradient from another's.
    """

    name: str
    shape: tuple[int, ...]
    dtype: type = wp.float32
    init: np.ndarray | None = None
    lower: float = -math.inf
    upper: float = math.inf
    fd_step: float = 1.0
    world_axis: int | None = None

    def __post_init__(self) -> None:
        if not self.lower <= self.upper:  # also refuses nan
            raise ValueError(f"parameter '{self.name}': lower bound {self.lower} is above upper bound {self.upper}")

    @property
    def bounded(self) -> bool:
        """Whether either bound is finite."""
        return math.isfinite(self.lower) or math.isfinite(self.upper)

    @property
    def scalar_count(self) -> int:
        """Number of float32 scalars the parameter occupies in the flat buffer."""
        return int(np.prod(self.shape, dtype=np.int64)) * _dtype_width(self.dtype)


@dataclasses.dataclass(frozen=True)
class Segment:
    """Where one named parameter lives in the flat buffer, in float32 scalars."""

    name: str
    offset: int
    length: int


def _dtype_width(dtype: type) -> int:
    if dtype in (wp.float32, float):
        return 1
    if getattr(dtype, "_wp_scalar_type_", None) is not wp.float32:
        raise TypeError(f"ParamSet stores float32 data only, got dtype {dtype}")
    return int(wp.types.type_size(dtype))


class ParamSet:
    """Flat float32 parameter and gradient buffers with typed, named views.

    Args:
        specs: The parameters, in the order they are laid out in the buffer.
        device: Warp device for every array.
    """

    def __init__(self, specs: list[ParamSpec], *, device: wp.context.Devicelike = None):
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"parameter names must be unique, got {names}")
        if not specs:
            raise ValueError("a ParamSet needs at least one parameter")
        self.device = wp.get_device(device)
        self.specs = list(specs)
        self.segments: list[Segment] = []
        offset = 0
        for spec in specs:
            self.segments.append(Segment(spec.name, offset, spec.scalar_count))
            offset += spec.scalar_count
        self.size = offset

        host = np.zeros(self.size, dtype=np.float32)
        for spec, seg in zip(specs, self.segments, strict=True):
            if spec.init is not None:
                full_shape = spec.shape + _inner_shape(spec.dtype)
                host[seg.offset : seg.offset + seg.length] = np.broadcast_to(
                    np.asarray(spec.init, dtype=np.float32), full_shape
                ).ravel()
        self.grad = wp.zeros(self.size, dtype=wp.float32, device=self.device)
        self.data = wp.array(host, dtype=wp.float32, device=self.device)
        self.data.grad = self.grad
        self.views: dict[str, wp.array] = {
            spec.name: self._view(spec, seg) for spec, seg in zip(specs, self.segments, strict=True)
        }

        # One group per parameter, offsets relative to the flat buffers: every per-parameter
        # reduction and the per-parameter clips walk this one table.
        self.chunks = ChunkTable.for_ranges(self, [(seg.offset, seg.length) for seg in self.segments])

        # Bounds, entry by entry (one clamp launch over the flat buffer after each step).
        self.bounded = any(spec.bounded for spec in specs)
        self.lower = self.upper = None
        if self.bounded:
            lower = np.full(self.size, -np.inf, dtype=np.float32)
            upper = np.full(self.size, np.inf, dtype=np.float32)
            for spec, seg in zip(specs, self.segments, strict=True):
                lower[seg.offset : seg.offset + seg.length] = spec.lower
                upper[seg.offset : seg.offset + seg.length] = spec.upper
            self.data.assign(np.clip(host, lower, upper))
            self.lower = wp.array(lower, dtype=wp.float32, device=self.device)
            self.upper = wp.array(upper, dtype=wp.float32, device=self.device)

    def clamp(self) -> None:
        """Put every entry back inside its parameter's bounds (one launch; nothing when unbounded)."""
        if self.bounded:
            wp.launch(_clamp_kernel, dim=self.size, inputs=[self.lower, self.upper, self.data], device=self.device)

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    def fd_steps(self) -> np.ndarray:
        """Every flat entry's finite-difference step (its parameter's ``fd_step``), float64 ``(size,)``."""
        return np.concatenate(
            [
                np.full(seg.length, spec.fd_step, dtype=np.float64)
                for spec, seg in zip(self.specs, self.segments, strict=True)
            ]
        )

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.segments]

    def _view(self, spec: ParamSpec, seg: Segment) -> wp.array:
        return flat_view(self.data, seg.offset, spec.shape, spec.dtype)  # its .grad views self.grad

    def __getitem__(self, name: str) -> wp.array:
        return self.views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.views)

    def zero_grad(self) -> None:
        """Zero every gradient entry (one memset over the flat buffer)."""
        self.grad.zero_()

    def split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Host copies of every parameter's part of a flat host array laid out like ``data``, by name."""
        return {
            spec.name: flat[seg.offset : seg.offset + seg.length].reshape(spec.shape + _inner_shape(spec.dtype)).copy()
            for spec, seg in zip(self.specs, self.segments, strict=True)
        }

    def numpy(self) -> dict[str, np.ndarray]:
        """Host copies of every parameter, by name, in the view's full shape."""
        return self.split(self.data.numpy())

    def grad_numpy(self) -> dict[str, np.ndarray]:
        """Host copies of every gradient, by name, in the view's full shape."""
        return self.split(self.grad.numpy())


def flat_view(flat: wp.array, offset: int, shape: tuple[int, ...], dtype: type) -> wp.array:
    """A zero-copy view of ``flat[offset:]`` (float32) as an array of ``shape`` and ``dtype``,
    with the matching view of ``flat.grad`` when ``flat`` has one. Built from Warp's own
    slicing, ``reshape`` and ``view``, so the view keeps ``flat`` alive."""
    full = (*shape, *_inner_shape(dtype))
    view = flat[offset : offset + math.prod(full)].reshape(full)
    return view if dtype in (wp.float32, float) else view.view(dtype)


def _inner_shape(dtype: type) -> tuple[int, ...]:
    if dtype in (wp.float32, float):
        return ()
    return tuple(dtype._shape_)
