"""The environment interface the trainer talks to, and nothing else.

An environment owns a simulation: it declares its trainable parameters
(:class:`~harness.params.ParamSpec`), records a differentiable rollout given the
parameter views, and zeroes every gradient buffer it owns. It never sees an optimizer,
a clip policy or a logger.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np
import warp as wp

from harness.params import ParamSet, ParamSpec

Trajectory = dict[str, wp.array]
"""Named observables of one rollout, each a float32 array of shape (steps, worlds, dim)."""

StepHook = Callable[[int, list[wp.array]], None]
"""Called by a rollout after step ``t`` produced state ``t + 1`` and everything that reads
that state for the loss was recorded: ``hook(t, arrays)``, where ``arrays`` are the state's
differentiable arrays as per-world views of shape (world_count, k). Under a tape, a hook
may record a ``Tape.record_func`` that runs in backward once the adjoint of state
``t + 1`` is complete and before it flows into step ``t``."""


class Env(abc.ABC):
    """A differentiable simulation with trainable parameters.

    Attributes:
        name: Registry name, as in ``configs/env/<name>.yaml``.
        world_count: Number of independent worlds simulated at once.
        horizon: Number of simulation steps in one rollout.
        dt: Simulation time step [s].
    """

    name: str
    world_count: int
    horizon: int
    dt: float

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


def zero_array_grads(obj: object) -> int:
    """Zero ``.grad`` of every Warp array attribute of ``obj`` that has one.

    Returns:
        The number of gradient buffers zeroed.
    """
    count = 0
    for value in vars(obj).values():
        if isinstance(value, wp.array) and value.grad is not None:
            value.grad.zero_()
            count += 1
    return count


def host_rng(seed: int) -> np.random.Generator:
    """The numpy generator envs use for initial conditions, seeded from the run seed."""
    return np.random.default_rng(seed)
