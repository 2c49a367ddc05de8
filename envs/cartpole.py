"""Newton's cartpole (a cart on a rail carrying a double pendulum), stepped by Featherstone.

Action: the force [N] on the cart's prismatic joint, one number per world and step. Each
world starts from its own initial tilt of the two poles. Observables for the loss:
``joint_q`` (cart position [m], pole angles [rad]) and ``joint_qd`` (their rates) after
every step, and ``controls``, the cart forces applied.

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

import dataclasses
from typing import Any

import newton
import newton.examples
import numpy as np
import warp as wp

from harness.env import Trajectory, host_rng
from harness.newton_env import NewtonEnv, NewtonEnvConfig
from harness.schema import field

FEATHERSTONE_SCRATCH = ("M", "J", "P", "H", "L")
"""Solver attributes that SolverFeatherstone overwrites every step (newton 1.8)."""

CART_DOF = 0
"""Index of the cart's prismatic joint among a world's degrees of freedom."""

DOFS_PER_WORLD = 3
"""Degrees of freedom of one world of cartpole.urdf: the cart's slider and the two pole hinges."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CartpoleConfig(NewtonEnvConfig):
    """``configs/env/cartpole.yaml``."""

    horizon: int = field(240, minimum=1, doc="simulation steps per rollout")
    world_count: int = field(4, minimum=1, doc="independent worlds, each with its own initial tilt")
    dt: float = field(1.0 / 240.0, minimum=0.0, strict=True, doc="time step [s]")
    tilt: float = field(0.2, minimum=0.0, doc="initial pole angles drawn from [-tilt, tilt] [rad]")
    per_step_scratch: bool = field(
        True, doc="per-step copies of Featherstone's M, J, P, H, L (false reproduces the wrong gradients)"
    )
    angular_damping: float = field(0.05, minimum=0.0, doc="Featherstone's angular damping factor")

    def observable_dims(self) -> dict[str, int]:
        return {"joint_q": DOFS_PER_WORLD, "joint_qd": DOFS_PER_WORLD, "controls": 1}

    def action_dim(self) -> int:
        return 1


@wp.kernel
def _apply_cart_force(
    actions: wp.array3d(dtype=wp.float32),
    step: int,
    dofs_per_world: int,
    cart_dof: int,
    joint_f: wp.array(dtype=wp.float32),
):
    world = wp.tid()
    joint_f[world * dofs_per_world + cart_dof] = actions[step, world, 0]


@wp.kernel
def _record_dofs(
    source: wp.array(dtype=wp.float32),
    row: int,
    dofs_per_world: int,
    out: wp.array3d(dtype=wp.float32),
):
    world, dof = wp.tid()
    out[row, world, dof] = source[world * dofs_per_world + dof]


class CartpoleEnv(NewtonEnv):
    """Newton's URDF cartpole with ``SolverFeatherstone``; see :class:`CartpoleConfig` for the fields."""

    name = "cartpole"
    Config = CartpoleConfig
    state_fields = ("joint_q", "joint_qd")
    segmentable = True  # its per-step arrays (forces, controls, scratch) are indexed by slot

    def __init__(self, config: CartpoleConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        super().__init__(config, device=device, **fields)  # fields may carry segment_steps (Env)
        self.dt = self.config.dt
        rng = host_rng(self.config.seed)
        q0 = self.initial["joint_q"].numpy().reshape(self.world_count, DOFS_PER_WORLD)
        q0[:, 1:] = rng.uniform(-self.config.tilt, self.config.tilt, size=(self.world_count, DOFS_PER_WORLD - 1))
        self.initial["joint_q"].assign(q0.ravel())
        self.initial["joint_qd"].zero_()

        # One row of joint forces, one Control and one scratch set per step kept (the whole
        # horizon, or one segment: `slot(t)` says which).
        self.joint_f = wp.zeros(
            (self.steps_kept, self.model.joint_dof_count), dtype=wp.float32, device=self.device, requires_grad=True
        )
        self.controls = []
        for t in range(self.steps_kept):
            control = self.model.control(clone_variables=False)  # only joint_f is per step
            control.joint_f = self.joint_f[t]
            self.controls.append(control)
        self._solver_scratch = {name: getattr(self.solver, name) for name in FEATHERSTONE_SCRATCH}
        self.scratch = [
            {name: wp.zeros_like(array, requires_grad=True) for name, array in self._solver_scratch.items()}
            for _ in range(self.steps_kept)
        ]
        self._actions: wp.array | None = None

    @classmethod
    def segment_blocker(cls, config: CartpoleConfig) -> str | None:
        if not config.per_step_scratch:
            return "env.per_step_scratch=false shares one scratch set between steps; accepted: true"
        return super().segment_blocker(config)

    def build_model(self) -> newton.Model:
        single = newton.ModelBuilder()
        single.add_urdf(newton.examples.get_asset("cartpole.urdf"), floating=False, enable_self_collisions=False)
        if single.joint_dof_count != DOFS_PER_WORLD:
            raise RuntimeError(f"cartpole.urdf has {single.joint_dof_count} dofs per world, expected {DOFS_PER_WORLD}")
        builder = newton.ModelBuilder()
        builder.replicate(single, self.world_count, spacing=(0.0, 2.0, 0.0))
        return builder.finalize(device=self.device, requires_grad=True)

    def build_solver(self) -> newton.solvers.SolverFeatherstone:
        return newton.solvers.SolverFeatherstone(self.model, angular_damping=self.config.angular_damping)

    def control_at(self, t: int) -> newton.Control:
        return self.controls[self.slot(t)]

    def step_arrays(self) -> list[wp.array]:
        return [*(array for scratch in self.scratch for array in scratch.values()), self.joint_f]

    def act(self, t: int, actions: wp.array) -> None:
        self._actions = actions
        wp.launch(
            _apply_cart_force,
            dim=self.world_count,
            inputs=[actions, t, DOFS_PER_WORLD, CART_DOF],
            outputs=[self.joint_f[self.slot(t)]],
            device=self.device,
        )

    def step(self, t: int) -> None:
        scratch = self.scratch[self.slot(t)] if self.config.per_step_scratch else self._solver_scratch
        for name, array in scratch.items():
            setattr(self.solver, name, array)
        super().step(t)

    def record(self, t: int) -> None:
        state = self.state(t + 1)
        for name in ("joint_q", "joint_qd"):
            row = self.row(name, t)
            if row is not None:
                wp.launch(
                    _record_dofs,
                    dim=(self.world_count, DOFS_PER_WORLD),
                    inputs=[getattr(state, name), row, DOFS_PER_WORLD],
                    outputs=[self.observed[name]],
                    device=self.device,
                )

    def request(self, wanted: dict[str, str]) -> None:
        super().request(wanted)
        self.observed.pop("controls", None)  # the applied forces are the actions themselves: no buffer

    def trajectory(self) -> Trajectory:
        found = dict(self.observed)
        if "controls" in self._wanted and self._actions is not None:  # the applied forces, no copy
            mode = self._wanted["controls"]
            found["controls"] = self._actions if mode == "all" else self._actions[self.horizon - 1 : self.horizon]
        return found

    def component_names(self) -> dict[str, list[str]]:
        """Names of the observables' components, for plots (``harness render``)."""
        return {
            "joint_q": ["cart position [m]", "pole 1 angle [rad]", "pole 2 angle [rad]"],
            "joint_qd": ["cart velocity [m/s]", "pole 1 rate [rad/s]", "pole 2 rate [rad/s]"],
            "controls": ["cart force [N]"],
        }

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        if "joint_q" not in trajectory or trajectory["joint_q"].shape[0] != self.horizon:
            return {}
        q = trajectory["joint_q"].numpy().astype(np.float64)
        q_first = self.initial["joint_q"].numpy().astype(np.float64).reshape(self.world_count, DOFS_PER_WORLD)
        final = q[-1]
        return {
            "initial_pole_angles_rad": np.round(q_first[:, 1:], 4).tolist(),
            "final_pole_angles_rad": np.round(final[:, 1:], 4).tolist(),
            "final_cart_position_m": np.round(final[:, CART_DOF], 4).tolist(),
            "max_abs_pole_angle_rad": float(np.abs(q[:, :, 1:]).max()),
        }
