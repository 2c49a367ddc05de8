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


# -- the external wrench's adjoint (newton 1.8) ------------------------------------------------------


def _rigid_tau_kernel() -> Any:
    """Featherstone's backward (RNEA) pass over each articulation, children before parents: every
    body's total wrench in the solve frame (its inertial bias, the wrenches its subtree passed up,
    and its external wrench moved from the centre of mass to the solve origin) projected on its
    joint into the joint forces ``tau`` (newton's ``jcalc_tau``: drives, limits, damping, applied
    forces), and passed on to the parent. The same arithmetic, in the same order, as newton 1.8's
    ``eval_rigid_tau``, which also writes the moved external wrench back into ``body_f_ext``: an
    input the kernel has read. A tape's backward pass replays a kernel's reads before its
    adjoint, so it then differentiates the moment arm ``x_com - solve origin`` against the moved
    wrench, whose force has the opposite sign: the gradient of every contact force with respect to
    the body poses comes out wrong (tests/test_robot.py measures it). This kernel does not write
    ``body_f_ext``; nothing after it reads that array unless ``State.body_parent_f`` is requested."""
    from newton._src.solvers.featherstone.kernels import jcalc_tau

    @wp.kernel(module="unique")
    def rigid_tau(
        articulation_mask: wp.array(dtype=bool),
        articulation_start: wp.array(dtype=int),
        articulation_end: wp.array(dtype=int),
        joint_type: wp.array(dtype=int),
        joint_parent: wp.array(dtype=int),
        joint_child: wp.array(dtype=int),
        joint_q_start: wp.array(dtype=int),
        joint_qd_start: wp.array(dtype=int),
        joint_target_q_start: wp.array(dtype=int),
        joint_dof_dim: wp.array2d(dtype=int),
        joint_target_q: wp.array(dtype=float),
        joint_target_qd: wp.array(dtype=float),
        joint_q: wp.array(dtype=float),
        joint_qd: wp.array(dtype=float),
        joint_f: wp.array(dtype=float),
        joint_target_ke: wp.array(dtype=float),
        joint_target_kd: wp.array(dtype=float),
        joint_limit_lower: wp.array(dtype=float),
        joint_limit_upper: wp.array(dtype=float),
        joint_limit_ke: wp.array(dtype=float),
        joint_limit_kd: wp.array(dtype=float),
        joint_damping: wp.array(dtype=float),
        joint_stiffness: wp.array(dtype=float),
        joint_rest_q: wp.array(dtype=float),
        joint_S_s: wp.array(dtype=wp.spatial_vector),
        body_q_com: wp.array(dtype=wp.transform),
        body_solve_origin: wp.array(dtype=wp.vec3),
        body_fb_s: wp.array(dtype=wp.spatial_vector),
        body_f_ext: wp.array(dtype=wp.spatial_vector),
        body_ft_s: wp.array(dtype=wp.spatial_vector),
        tau: wp.array(dtype=float),
    ):
        a = wp.tid()
        if articulation_mask:
            if not articulation_mask[a]:
                return
        first = articulation_start[a]
        last = articulation_end[a]
        for k in range(last - first):
            j = last - k - 1
            child = joint_child[j]
            public = body_f_ext[child]  # about the centre of mass, world axes
            force = wp.spatial_top(public)
            arm = wp.transform_get_translation(body_q_com[child]) - body_solve_origin[child]
            moved = -wp.spatial_vector(force, wp.spatial_bottom(public) + wp.cross(arm, force))
            total = body_fb_s[child] + body_ft_s[child] + moved
            jcalc_tau(
                joint_type[j], joint_target_ke, joint_target_kd, joint_limit_ke, joint_limit_kd, joint_damping,
                joint_stiffness, joint_rest_q, joint_S_s, joint_q, joint_qd, joint_f, joint_target_q,
                joint_target_qd, joint_limit_lower, joint_limit_upper, joint_q_start[j], joint_qd_start[j],
                joint_target_q_start[j], joint_dof_dim[j, 0], joint_dof_dim[j, 1], total, tau,
            )  # fmt: skip
            parent = joint_parent[j]
            if parent >= 0:
                body_ft_s[parent] = body_ft_s[parent] + total

    return rigid_tau


_FIXED: dict[str, Any] = {}


def fix_external_wrench_adjoint() -> None:
    """Make ``SolverFeatherstone`` (newton 1.8) launch :func:`_rigid_tau_kernel`'s kernel in place of
    its ``eval_rigid_tau`` (once per process; every Featherstone solver of the process). The forward
    pass is the same, bit for bit; the gradients of external and contact wrenches become right."""
    from newton._src.solvers.featherstone import solver_featherstone

    if "kernel" not in _FIXED:
        _FIXED["original"] = solver_featherstone.eval_rigid_tau
        _FIXED["kernel"] = _rigid_tau_kernel()
    solver_featherstone.eval_rigid_tau = _FIXED["kernel"]
