"""One protocol for every gradient transformation, and the one ``chain`` that composes them.

A transformation is an ``init``/``update`` pair, as in optax:

* ``init(params, shared) -> state``: allocates its device state (a dict of Warp arrays) and
  publishes in ``shared`` the device arrays other members read (the optimizer its ``lr``
  and ``step``; a clip policy its ``clipped`` flag; a non-finite wrapper its ``skip`` flag);
* ``update(params, state, shared) -> None``: issues its launches, reading ``params.grad``
  (and ``shared.stats``, the statistics of the gradient as it stands) and writing in place.

Every update is a fixed sequence of launches with no host read, so a whole iteration is
captured in one graph. The members: a clip policy (:class:`harness.clip.ClipPolicy`), a
schedule (:class:`harness.schedules.Schedule`, which writes the optimizer's device rate),
an optimizer (:class:`harness.optim.Optimizer`), :func:`project_to_bounds`, and the
non-finite wrappers around any of them (:func:`harness.clip.skip_if_nonfinite`,
:func:`~harness.clip.zero_nonfinite`, :func:`~harness.clip.error_if_nonfinite`). The
trainer's update is one of them::

    skip_if_nonfinite(chain(("clip", clip), ("schedule", schedule), ("optim", optimizer),
                            ("bounds", project_to_bounds())))

:func:`chain` names its members: member ``name``'s state keys are ``"<name>/<key>"`` in
the chain's state, which is the layout of a checkpoint (:class:`harness.training.TrainState`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any, Protocol

import warp as wp

from harness.params import ParamSet
from harness.stats import FlatStats

__all__ = ["Shared", "Transform", "chain", "project_to_bounds", "substate"]

State = dict[str, wp.array]


class Shared:
    """What the members of one update hand to each other besides the gradient.

    Args:
        stats: The statistics of ``params.grad`` as it stands (the trainer's pre-clip
            statistics; a member that changes the gradient, such as ``zero_nonfinite``,
            hands the next ones a recomputed set).
        timing: When a dict, :func:`chain` adds each member's host seconds under its name
            (eager runs only; a captured graph runs none of this Python).
        **arrays: Named device arrays, as members publish them at init.
    """

    def __init__(self, stats: FlatStats | None = None, *, timing: dict[str, float] | None = None, **arrays: wp.array):
        self.stats = stats
        self.timing = timing
        self._arrays: dict[str, wp.array] = dict(arrays)
        self._reports: dict[int, wp.array] = {}

    def publish(self, name: str, array: wp.array) -> None:
        """Make ``array`` readable as ``shared[name]`` by every member (at init)."""
        self._arrays[name] = array

    def mark_report(self, *arrays: wp.array) -> None:
        """Declare state arrays that only describe the last update (a clip policy's ``coef``
        and ``clipped``): every update rewrites them, and a skipped update is not undone
        for them (:class:`~harness.clip.SkipGuard` leaves them as the update wrote them)."""
        for array in arrays:
            self._reports[id(array)] = array

    def is_report(self, array: wp.array) -> bool:
        return id(array) in self._reports

    def get(self, name: str, default: Any = None) -> Any:
        return self._arrays.get(name, default)

    def __getitem__(self, name: str) -> wp.array:
        try:
            return self._arrays[name]
        except KeyError:
            raise KeyError(
                f"no member of this chain publishes '{name}' (published: {', '.join(self._arrays) or 'nothing'})"
            ) from None

    def with_stats(self, stats: FlatStats) -> Shared:
        """The same arrays and timing with other statistics."""
        other = Shared(stats, timing=self.timing)
        other._arrays = self._arrays
        other._reports = self._reports
        return other


class Transform(Protocol):
    """A gradient transformation: ``name``, ``init`` and ``update`` (module docstring)."""

    name: str

    def init(self, params: ParamSet, shared: Shared) -> State: ...

    def update(self, params: ParamSet, state: State, shared: Shared) -> None: ...


@dataclasses.dataclass(frozen=True)
class Chain:
    """Transformations applied in order (:func:`chain`).

    Attributes:
        name: ``chain(<member names>)``.
        members: ``(name, transformation)`` pairs, in update order.
    """

    name: str
    members: tuple[tuple[str, Transform], ...]

    def init(self, params: ParamSet, shared: Shared | None = None) -> State:
        """Every member's state, keys prefixed ``"<member>/"``.

        Members are initialised last to first, so a member may read at init what a later
        one publishes (a schedule starts from the optimizer's rate); at update every
        member reads what any member published.
        """
        shared = shared if shared is not None else Shared()
        parts = {name: member.init(params, shared) for name, member in reversed(self.members)}
        return {f"{name}/{key}": value for name, _ in self.members for key, value in parts[name].items()}

    def update(self, params: ParamSet, state: State, shared: Shared) -> None:
        """Each member's update in order, on its part of ``state``."""
        for name, member in self.members:
            t0 = time.perf_counter()
            member.update(params, substate(state, name), shared)
            if shared.timing is not None:
                shared.timing[name] = shared.timing.get(name, 0.0) + time.perf_counter() - t0


def substate(state: Mapping[str, wp.array], name: str) -> State:
    """The part of a chain's ``state`` that belongs to member ``name`` (keys without the prefix)."""
    prefix = name + "/"
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


def chain(*members: tuple[str, Transform] | Transform) -> Chain:
    """Compose transformations in order, as ``optax.chain``.

    Members are ``(name, transformation)`` pairs or bare transformations (named by their
    ``name``). The protocol knows no member kind: a chain of clip policies that should act as
    one policy (one combined coefficient) is :func:`harness.clip.chain_clips`.

    Raises:
        ValueError: For no member, or two members with one name.
    """
    if not members:
        raise ValueError("chain: needs at least one transformation")
    named = tuple(m if isinstance(m, tuple) else (m.name, m) for m in members)
    names = [name for name, _ in named]
    if len(set(names)) != len(names) or any("/" in name for name in names):
        raise ValueError(f"chain: member names must be distinct and hold no '/', got {names}")
    return Chain(name="chain(" + ",".join(names) + ")", members=named)


@dataclasses.dataclass(frozen=True)
class _Bounds:
    name: str = "bounds"

    def init(self, params: ParamSet, shared: Shared | None = None) -> State:
        return {}

    def update(self, params: ParamSet, state: State, shared: Shared) -> None:
        params.clamp()


def project_to_bounds() -> Transform:
    """Put every parameter back inside its bounds after the step (one launch; nothing for
    unbounded parameters), as ``optax.projections``: the last member of the trainer's chain."""
    return _Bounds()
