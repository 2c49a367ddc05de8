"""Storage for a taped Featherstone rollout that takes several solver substeps per control step.

``SolverFeatherstone`` (newton 1.8) keeps its articulation matrices ``M, J, P, H, L`` as solver
attributes and rebuilds them in place whenever it builds the mass matrix (every
``update_mass_matrix_interval``-th call), so a tape recorded through one solver replays every
substep's adjoint with the last matrices it built (the README's Featherstone trap). Here every
substep that builds the matrices writes a scratch set of its own, and the substeps that reuse them
read that set; the solver's step counter is set to the substep index before each substep, so which
substeps build is the same at every call and in a captured graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import warp as wp

__all__ = ["FEATHERSTONE_SCRATCH", "Substeps"]

FEATHERSTONE_SCRATCH = ("M", "J", "P", "H", "L")
"""Solver attributes that SolverFeatherstone overwrites when it builds the mass matrix (newton 1.8)."""


class Substeps:
    """Per control step kept: the States of the substeps before the last (the last writes the step's
    result) and one scratch set per substep that builds the mass matrix.

    Args:
        solver: The ``SolverFeatherstone`` stepping the model.
        new_state: Makes a State with gradients (the env's :meth:`~harness.newton_env.NewtonEnv.new_state`).
        kept: Control steps kept at once (the horizon, or a segment).
        substeps: Solver steps per control step.
        mass_matrix_every: Build the mass matrix every n-th substep of a step (1 .. substeps).
    """

    def __init__(self, solver: Any, new_state: Callable[[], Any], *, kept: int, substeps: int, mass_matrix_every: int):
        self.solver = solver
        self.substeps = substeps
        self.every = mass_matrix_every
        self.states = [[new_state() for _ in range(substeps - 1)] for _ in range(kept)]
        shared = {name: getattr(solver, name) for name in FEATHERSTONE_SCRATCH}
        self.builders = [k for k in range(substeps) if k % mass_matrix_every == 0]
        self.scratch = [
            {
                k: {name: wp.zeros_like(array, requires_grad=True) for name, array in shared.items()}
                for k in self.builders
            }
            for _ in range(kept)
        ]

    def target(self, slot: int, k: int, last: Any) -> Any:
        """The State substep ``k`` of the step in ``slot`` writes (``last``, the step's result, for the last)."""
        return last if k == self.substeps - 1 else self.states[slot][k]

    def prepare(self, slot: int, k: int) -> None:
        """Point the solver at the scratch set substep ``k`` of the step in ``slot`` builds or reads,
        and make it build the matrices at substeps ``0, n, 2n, ...`` of every step."""
        for name, array in self.scratch[slot][k - k % self.every].items():
            setattr(self.solver, name, array)
        self.solver._step = k

    def arrays(self) -> list[wp.array]:
        """Every array of the substeps' States and scratch sets (walked at call time: the solver puts
        arrays of its own on a State it steps into)."""
        found = [array for sets in self.scratch for scratch in sets.values() for array in scratch.values()]
        for states in self.states:
            for state in states:
                found.extend(value for value in vars(state).values() if isinstance(value, wp.array))
        return found
