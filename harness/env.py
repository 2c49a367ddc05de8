"""The environment interface the trainer talks to, and the capture contract it must keep.

An environment owns a simulation: it declares its trainable parameters
(:class:`~harness.params.ParamSpec`), records a differentiable rollout given the
parameter views, and zeroes every gradient buffer it owns. It never sees an optimizer,
a clip policy or a logger. Concrete envs live outside this package (``envs/`` in this
repository, or a user's own module); ``harness`` never imports them.

The capture contract
--------------------
A training iteration is recorded once into a graph (``wp.ScopedCapture``, on the CPU as
on CUDA) and replayed with ``wp.capture_launch`` for every later iteration. Replay
re-runs the recorded launches with the arguments they had when recorded, so an env
whose :attr:`Env.capturable` is True promises, for :meth:`Env.rollout` and
:meth:`Env.zero_grad`:

1. **Same arrays every call.** Every launch, copy and memset reads and writes arrays
   allocated before the first rollout; the same call touches the same arrays each time.
2. **No host reads.** Nothing calls ``.numpy()``, ``float(array)`` or branches in Python
   on a device value; a capture records no branch, and a read during capture returns a
   stale value without an error.
3. **No allocation per call.** Nothing allocates a Warp array (a freshly allocated
   ``Contacts``, a temporary ``wp.zeros``) inside either method. Lazy allocation on the
   first call is fine: the trainer always runs one eager iteration before capturing.
4. **Nothing that varies as a Python value.** A Python number handed to a kernel is
   frozen into the graph; anything that changes between iterations lives in a device
   array. (Loop indices such as the step ``t`` are fine: they are the same at every replay.)

An env that cannot keep the contract sets ``capturable = False`` (and says why in
``capture_note``); ``capture=auto`` then runs eagerly after printing that reason, and
``capture=true`` refuses to start. :func:`harness.training.step.check_capture` compares
an eager and a replayed rollout bit for bit, the test every env in this repository passes.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import warp as wp

from harness.params import ParamSet, ParamSpec

Trajectory = dict[str, wp.array]
"""Named observables of one rollout, each a float32 array of shape (steps, worlds, dim)."""

StepHook = Callable[[int, list[wp.array]], None]
"""Called by a rollout right after step ``t`` produced state ``t + 1``, before anything
reads that state (the loss recording, step ``t + 1``): ``hook(t, arrays)``, where
``arrays`` are the state's differentiable arrays as per-world views of shape
(world_count, k). Backward replays the tape in reverse, so a ``Tape.record_func``
recorded by the hook runs once the adjoint of state ``t + 1`` is complete (every later
use, the loss term included, has added to it) and before it flows into step ``t``."""


class Env(abc.ABC):
    """A differentiable simulation with trainable parameters.

    Attributes:
        name: Registry name, as in ``configs/env/<name>.yaml``.
        world_count: Number of independent worlds simulated at once.
        horizon: Number of simulation steps in one rollout.
        dt: Simulation time step [s].
        capturable: Whether :meth:`rollout` and :meth:`zero_grad` keep the capture
            contract (module docstring); True unless an env says otherwise.
        capture_note: Why an env is not capturable (shown when ``capture=auto`` falls
            back to eager, and in the refusal of ``capture=true``).
    """

    name: str
    world_count: int
    horizon: int
    dt: float
    capturable: ClassVar[bool] = True
    capture_note: ClassVar[str] = ""

    @classmethod  # noqa: B027  (an optional hook: no checks by default)
    def check_config(cls, **fields: Any) -> None:
        """Validate constructor arguments without building anything (no kernels, no files).

        Raises:
            ValueError: one line naming the field as ``env.<field>`` and what is accepted.
            TypeError: for an unknown field.
        """

    @classmethod
    def observable_dims(cls, **fields: Any) -> dict[str, int] | None:
        """The observables' per-world widths for these constructor arguments, without
        building anything (lets the loss be checked up front); None when the env cannot tell."""
        return None

    @classmethod
    def parameter_shapes(cls, **fields: Any) -> dict[str, tuple[int, ...]] | None:
        """Shapes of the trainable parameters for these constructor arguments, without
        building anything (lets a resume be checked before any kernel compiles); None
        when the env cannot tell."""
        return None

    @abc.abstractmethod
    def parameter_specs(self) -> list[ParamSpec]:
        """The trainable parameters and their initial values."""

    @abc.abstractmethod
    def observables(self) -> dict[str, int]:
        """Names of the observables a rollout returns, with their per-world width ``dim``."""

    @abc.abstractmethod
    def rollout(self, params: ParamSet, *, after_step: StepHook | None = None) -> Trajectory:
        """Simulate ``horizon`` steps from the initial state using the parameter views.

        Every launch is recordable by a :class:`warp.Tape`; call it inside one for
        gradients. The returned arrays are owned by the env and overwritten next call.

        Args:
            params: The trainable parameters.
            after_step: Optional :data:`StepHook`, called once per step.
        """

    @abc.abstractmethod
    def zero_grad(self) -> None:
        """Zero the gradient of every array the env owns (states, controls, scratch)."""

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        """Physical figures of a rollout worth reporting (host values); empty by default."""
        return {}


def array_grads(*owners: object) -> list[wp.array]:
    """The gradient buffers of every Warp array attribute of ``owners`` (States, a Model, a
    solver) that has one: what an env's :meth:`Env.zero_grad` zeroes."""
    found = []
    for owner in owners:
        for value in vars(owner).values():
            if isinstance(value, wp.array) and value.grad is not None:
                found.append(value.grad)
    return found


def require_int(field: str, value: Any, minimum: int) -> None:
    """Raise a one-line ValueError unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"env.{field}: must be an integer >= {minimum}, got {value!r}")


def require_number(field: str, value: Any, *, minimum: float, strict: bool = False) -> None:
    """Raise a one-line ValueError unless ``value`` is a finite number >= (or >) ``minimum``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value)
    ok = ok and (value > minimum if strict else value >= minimum)
    if not ok:
        relation = ">" if strict else ">="
        raise ValueError(f"env.{field}: must be a finite number {relation} {minimum:g}, got {value!r}")


def require_bool(field: str, value: Any) -> None:
    """Raise a one-line ValueError unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"env.{field}: must be true or false, got {value!r}")


def host_rng(seed: int) -> np.random.Generator:
    """The numpy generator envs use for initial conditions, seeded from the run seed."""
    return np.random.default_rng(seed)
