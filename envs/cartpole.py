"""Newton's cartpole (a cart on a rail carrying a double pendulum), stepped by Featherstone.

Trainable parameter: ``controls``, the open-loop force [N] on the cart's prismatic joint
at every step of every world, shape (horizon, world_count). Each world starts from its
own initial tilt of the two poles. Observables for the loss: ``joint_q`` (cart position
[m], pole angles [rad]) and ``joint_qd`` (their rates) after every step, and
``controls`` itself.

Differentiable rollouts keep one :class:`newton.State` per step (two states are never
swapped under a tape). ``SolverFeatherstone`` keeps its articulation matrices
``M, J, P, H, L`` as solver attributes and recomputes them in place every step, so a
taped rollout stepped by one solver replays every step's adjoint with the last step's
matrices (tape gradients about half the finite-difference values at 120 steps). With
``per_step_scratch=True`` (the default) every step gets its own copy of exactly those
five arrays (a few hundred floats per world and step) instead of a solver per step.
These are private attributes of newton 1.8; the gradcheck test guards an upgrade.
"""

from __future__ import annotations

from typing import Any

import newton
import newton.examples
import numpy as np
import warp as wp

from harness.env import (
    Env,
    StepHook,
    Trajectory,
    array_grads,
    host_rng,
    require_bool,
    require_int,
    require_number,
)
from harness.params import ParamSet, ParamSpec

FEATHERSTONE_SCRATCH = ("M", "J", "P", "H", "L")
"""Solver attributes that SolverFeatherstone overwrites every step (newton 1.8)."""

CART_DOF = 0
"""Index of the cart's prismatic joint among a world's degrees of freedom."""

DOFS_PER_WORLD = 3
"""Degrees of freedom of one world of cartpole.urdf: the cart's slider and the two pole hinges."""


@wp.kernel
def _apply_cart_force(
    controls: wp.array2d(dtype=wp.float32),
    step: int,
    dofs_per_world: int,
    cart_dof: int,
    joint_f: wp.array(dtype=wp.float32),
):
    world = wp.tid()
    joint_f[world * dofs_per_world + cart_dof] = controls[step, world]


@wp.kernel
def _record_state(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    step: int,
    dofs_per_world: int,
    q_out: wp.array3d(dtype=wp.float32),
    qd_out: wp.array3d(dtype=wp.float32),
):
    world, dof = wp.tid()
    q_out[step, world, dof] = joint_q[world * dofs_per_world + dof]
    qd_out[step, world, dof] = joint_qd[world * dofs_per_world + dof]


class CartpoleEnv(Env):
    """Open-loop force control of Newton's URDF cartpole with ``SolverFeatherstone``.

    Args:
        horizon: Simulation steps per rollout.
        world_count: Independent worlds, each with its own initial tilt.
        dt: Time step [s].
        tilt: Initial pole angles are drawn uniformly from [-tilt, tilt] [rad].
        seed: Seed of the initial tilts.
        per_step_scratch: Give every taped step its own Featherstone matrices. Turning it
            off reproduces the wrong-gradient behaviour; keep it on.
        angular_damping: Featherstone's angular damping factor.
        device: Warp device.
    """

    name = "cartpole"

    def __init__(
        self,
        *,
        horizon: int = 240,
        world_count: int = 4,
        dt: float = 1.0 / 240.0,
        tilt: float = 0.2,
        seed: int = 0,
        per_step_scratch: bool = True,
        angular_damping: float = 0.05,
        device: wp.context.Devicelike = None,
    ):
        self.check_config(
            horizon=horizon,
            world_count=world_count,
            dt=dt,
            tilt=tilt,
            seed=seed,
            per_step_scratch=per_step_scratch,
            angular_damping=angular_damping,
        )
        self.horizon = int(horizon)
        self.world_count = int(world_count)
        self.dt = float(dt)
        self.per_step_scratch = per_step_scratch
        self.device = wp.get_device(device)

        single = newton.ModelBuilder()
        single.add_urdf(newton.examples.get_asset("cartpole.urdf"), floating=False, enable_self_collisions=False)
        self.dofs_per_world = single.joint_dof_count
        if self.dofs_per_world != DOFS_PER_WORLD:
            raise RuntimeError(f"cartpole.urdf has {self.dofs_per_world} dofs per world, expected {DOFS_PER_WORLD}")
        builder = newton.ModelBuilder()
        builder.replicate(single, self.world_count, spacing=(0.0, 2.0, 0.0))
        self.model = builder.finalize(device=self.device, requires_grad=True)

        rng = host_rng(seed)
        q0 = self.model.joint_q.numpy().reshape(self.world_count, self.dofs_per_world)
        q0[:, 1:] = rng.uniform(-tilt, tilt, size=(self.world_count, self.dofs_per_world - 1))
        self.initial_joint_q = wp.array(q0.ravel(), dtype=wp.float32, device=self.device)
        self.initial_joint_qd = wp.zeros_like(self.model.joint_qd)

        self.solver = newton.solvers.SolverFeatherstone(self.model, angular_damping=angular_damping)
        self.states = [self.model.state(requires_grad=True) for _ in range(self.horizon + 1)]
        self.joint_f = wp.zeros(
            (self.horizon, self.model.joint_dof_count), dtype=wp.float32, device=self.device, requires_grad=True
        )
        self.controls = []
        for t in range(self.horizon):
            control = self.model.control(clone_variables=False)  # only joint_f is per step
            control.joint_f = self.joint_f[t]
            self.controls.append(control)
        self._solver_scratch = {name: getattr(self.solver, name) for name in FEATHERSTONE_SCRATCH}
        self.scratch = [
            {name: wp.zeros_like(array, requires_grad=True) for name, array in self._solver_scratch.items()}
            for _ in range(self.horizon)
        ]
        shape = (self.horizon, self.world_count, self.dofs_per_world)
        self.joint_q_traj = wp.zeros(shape, dtype=wp.float32, device=self.device, requires_grad=True)
        self.joint_qd_traj = wp.zeros(shape, dtype=wp.float32, device=self.device, requires_grad=True)

    _CHECKS: dict[str, Any] = {  # noqa: RUF012  (read-only table)
        "horizon": lambda v: require_int("horizon", v, 1),
        "world_count": lambda v: require_int("world_count", v, 1),
        "dt": lambda v: require_number("dt", v, minimum=0.0, strict=True),
        "tilt": lambda v: require_number("tilt", v, minimum=0.0),
        "seed": lambda v: require_int("seed", v, 0),
        "angular_damping": lambda v: require_number("angular_damping", v, minimum=0.0),
        "per_step_scratch": lambda v: require_bool("per_step_scratch", v),
    }

    @classmethod
    def check_config(cls, **fields: Any) -> None:
        for name, value in fields.items():
            if name not in cls._CHECKS:
                raise TypeError(f"unknown field '{name}'; accepted: {', '.join(cls._CHECKS)}")
            cls._CHECKS[name](value)

    @classmethod
    def parameter_shapes(cls, *, horizon: int = 240, world_count: int = 4, **_: Any) -> dict[str, tuple[int, ...]]:
        return {"controls": (int(horizon), int(world_count))}

    @classmethod
    def observable_dims(cls, **_: Any) -> dict[str, int]:
        return {"joint_q": DOFS_PER_WORLD, "joint_qd": DOFS_PER_WORLD, "controls": 1}

    def parameter_specs(self) -> list[ParamSpec]:
        shapes = self.parameter_shapes(horizon=self.horizon, world_count=self.world_count)
        return [ParamSpec(name, shape) for name, shape in shapes.items()]

    def observables(self) -> dict[str, int]:
        return self.observable_dims()

    def rollout(self, params: ParamSet, *, after_step: StepHook | None = None) -> Trajectory:
        controls = params["controls"]
        first = self.states[0]
        wp.copy(first.joint_q, self.initial_joint_q)
        wp.copy(first.joint_qd, self.initial_joint_qd)
        for t in range(self.horizon):
            scratch = self.scratch[t] if self.per_step_scratch else self._solver_scratch
            for name, array in scratch.items():
                setattr(self.solver, name, array)
            wp.launch(
                _apply_cart_force,
                dim=self.world_count,
                inputs=[controls, t, self.dofs_per_world, CART_DOF],
                outputs=[self.joint_f[t]],
                device=self.device,
            )
            self.states[t].clear_forces()
            self.solver.step(self.states[t], self.states[t + 1], self.controls[t], None, self.dt)
            if after_step is not None:  # before the loss reads state t + 1: see StepHook
                after_step(t, self.state_arrays(self.states[t + 1]))
            wp.launch(
                _record_state,
                dim=(self.world_count, self.dofs_per_world),
                inputs=[self.states[t + 1].joint_q, self.states[t + 1].joint_qd, t, self.dofs_per_world],
                outputs=[self.joint_q_traj, self.joint_qd_traj],
                device=self.device,
            )
        return {
            "joint_q": self.joint_q_traj,
            "joint_qd": self.joint_qd_traj,
            "controls": controls.reshape((self.horizon, self.world_count, 1)),
        }

    def state_arrays(self, state: newton.State) -> list[wp.array]:
        """The generalized state Featherstone integrates, as per-world (world_count, dofs) views."""
        shape = (self.world_count, self.dofs_per_world)
        return [state.joint_q.reshape(shape), state.joint_qd.reshape(shape)]

    def zero_grad(self) -> None:
        # The model's and the solver's own arrays receive adjoints too (gravity, joint
        # frames, inertias): nothing reads them today, but they must not accumulate.
        # One memset each: replayed from a graph, thousands of memsets cost less than one
        # kernel over a pointer table (measured: 0.14 vs 0.54 ms at 1 world, 33 vs 120 ms at 256).
        for grad in (
            *array_grads(self.model, self.solver, *self.states),
            *(array.grad for scratch in self.scratch for array in scratch.values()),
            self.joint_f.grad,
            self.joint_q_traj.grad,
            self.joint_qd_traj.grad,
        ):
            grad.zero_()

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        q = trajectory["joint_q"].numpy().astype(np.float64)
        q_first = self.initial_joint_q.numpy().astype(np.float64).reshape(self.world_count, self.dofs_per_world)
        final = q[-1]
        return {
            "initial_pole_angles_rad": np.round(q_first[:, 1:], 4).tolist(),
            "final_pole_angles_rad": np.round(final[:, 1:], 4).tolist(),
            "final_cart_position_m": np.round(final[:, CART_DOF], 4).tolist(),
            "max_abs_pole_angle_rad": float(np.abs(q[:, :, 1:]).max()),
        }
