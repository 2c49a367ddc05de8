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
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from harness.adjoint_funcs import clamp_adjoint
from harness.env import DrawsStarts, PolicyEnv, Quantity, Restarts, Segmentable, Trajectory, host_rng
from harness.newton_env import NewtonEnv, NewtonEnvConfig
from harness.schema import field

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton

FEATHERSTONE_SCRATCH = ("M", "J", "P", "H", "L")
"""Solver attributes that SolverFeatherstone overwrites every step (newton 1.8)."""

CART_DOF = 0
"""Index of the cart's prismatic joint among a world's degrees of freedom."""

DRAW_SEED_OFFSET = 7919
"""Added to the env's seed for the device draws of ``draw_initial`` (another stream than the
host draw of the fixed initial tilts)."""

POLES = 2
"""Poles per world (the double pendulum), bodies ``pole1`` and ``pole2`` of cartpole.urdf."""

MIN_POLE_MASS = 1.0e-3
"""Smallest pole mass a fit may reach [kg]: a body keeps a positive mass and inertia."""

DOFS_PER_WORLD = 3
"""Degrees of freedom of one world of cartpole.urdf: the cart's slider and the two pole hinges."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CartpoleConfig(NewtonEnvConfig):
    """``configs/env/cartpole.yaml``."""

    horizon: int = field(240, minimum=1, doc="simulation steps per rollout")
    world_count: int = field(4, minimum=1, doc="independent worlds, each with its own initial tilt")
    dt: float = field(1.0 / 240.0, minimum=0.0, strict=True, doc="time step [s]")
    tilt: float = field(0.2, minimum=0.0, doc="initial pole angles drawn from [-tilt, tilt] [rad]")
    draw_cart: float = field(
        0.0, minimum=0.0, doc="training draws (draw_initial) also place the cart in [-draw_cart, draw_cart] [m]"
    )
    draw_rate: float = field(
        0.0, minimum=0.0, doc="training draws also start every joint rate in [-draw_rate, draw_rate] [m/s, rad/s]"
    )
    per_step_scratch: bool = field(
        True, doc="per-step copies of Featherstone's M, J, P, H, L (false reproduces the wrong gradients)"
    )
    angular_damping: float = field(0.05, minimum=0.0, doc="Featherstone's angular damping factor")
    force_adjoint_clamp: float | None = field(
        None,
        minimum=0.0,
        strict=True,
        doc="clamp the gradient flowing back through each cart force to [-c, c] (harness.adjoint_funcs; null: off)",
    )
    fall_angle: float | None = field(
        None,
        minimum=0.0,
        strict=True,
        doc="a state with a pole beyond this angle [rad] has fallen: task=policy's carried windows start such a "
        "world anew (null: never)",
    )
    pole_masses: tuple[float, ...] | None = field(
        None,
        length=2,
        minimum=0.0,
        strict=True,
        doc="masses of pole 1 and pole 2 [kg] in every world (null: the URDF's)",
    )

    def observable_dims(self) -> dict[str, int]:
        return {"joint_q": DOFS_PER_WORLD, "joint_qd": DOFS_PER_WORLD, "controls": 1}

    def action_dim(self) -> int:
        return 1

    def observation_dim(self) -> int:
        return 2 * DOFS_PER_WORLD

    def quantities(self) -> dict[str, Quantity]:
        return {
            "pole_masses": Quantity(
                (self.world_count, POLES),
                lower=MIN_POLE_MASS,
                unit="kg",
                doc="mass of pole 1 and pole 2 in every world (inertia scaled with it: the same shape)",
                fd_step=1.0e-3,
                per_world=True,
            )
        }

    def default_quantities(self, kind: str) -> list[str]:
        return ["pole_masses"] if kind == "physical" else []


@wp.kernel
def _apply_cart_force(
    actions: wp.array3d(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    slot: int,
    dofs_per_world: int,
    cart_dof: int,
    clamp: int,
    limit: float,
    joint_f: wp.array(dtype=wp.float32),
):
    world = wp.tid()
    force = actions[base[0] + slot, world, 0]  # step base + slot: one launch serves every segment
    if clamp != 0:  # the identity forward; backward clamps the gradient through this force
        force = clamp_adjoint(force, limit)
    joint_f[world * dofs_per_world + cart_dof] = force


@wp.kernel
def _apply_cart_forces(
    actions: wp.array3d(dtype=wp.float32),
    dofs_per_world: int,
    cart_dof: int,
    clamp: int,
    limit: float,
    joint_f: wp.array2d(dtype=wp.float32),
):
    # _apply_cart_force of every step in one launch (act_all: the rollout's rows are its steps)
    t, world = wp.tid()
    force = actions[t, world, 0]
    if clamp != 0:
        force = clamp_adjoint(force, limit)
    joint_f[t, world * dofs_per_world + cart_dof] = force


@wp.kernel
def _record_dofs(
    source: wp.array(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    offset: int,
    dofs_per_world: int,
    out: wp.array3d(dtype=wp.float32),
):
    world, dof = wp.tid()
    out[base[0] + offset, world, dof] = source[world * dofs_per_world + dof]


@wp.kernel
def _record_q_qd(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    offset_q: int,
    offset_qd: int,
    dofs_per_world: int,
    out_q: wp.array3d(dtype=wp.float32),
    out_qd: wp.array3d(dtype=wp.float32),
):
    # _record_dofs of joint_q and of joint_qd in one launch
    world, dof = wp.tid()
    out_q[base[0] + offset_q, world, dof] = joint_q[world * dofs_per_world + dof]
    out_qd[base[0] + offset_qd, world, dof] = joint_qd[world * dofs_per_world + dof]


@wp.kernel
def _observe(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    dofs_per_world: int,
    out: wp.array2d(dtype=wp.float32),
):
    world, k = wp.tid()
    if k < dofs_per_world:
        out[world, k] = joint_q[world * dofs_per_world + k]
    else:
        out[world, k] = joint_qd[world * dofs_per_world + k - dofs_per_world]


@wp.kernel
def _draw_tilts(
    seed: int,
    key: wp.array(dtype=wp.int32),
    tilt: float,
    cart: float,
    rate: float,
    dofs_per_world: int,
    cart_dof: int,
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
):
    world = wp.tid()
    stream = wp.rand_init(seed, key[0])  # one stream per key, then one per world in it
    rng = wp.rand_init(wp.int32(stream), world)
    for k in range(dofs_per_world):  # the pole angles first: the same draws whatever cart and rate are
        value = 0.0
        if k != cart_dof:
            value = wp.randf(rng, -tilt, tilt)
        joint_q[world * dofs_per_world + k] = value
    joint_q[world * dofs_per_world + cart_dof] = wp.randf(rng, -cart, cart)
    for k in range(dofs_per_world):
        joint_qd[world * dofs_per_world + k] = wp.randf(rng, -rate, rate)


@wp.kernel
def _fallen(
    joint_q: wp.array(dtype=wp.float32), dofs_per_world: int, cart_dof: int, angle: float, out: wp.array(dtype=wp.int32)
):
    # 1 where a pole of world w is beyond the angle (or not finite)
    world = wp.tid()
    fallen = wp.int32(0)
    for k in range(dofs_per_world):
        q = joint_q[world * dofs_per_world + k]
        if k != cart_dof and not (wp.abs(q) <= angle):
            fallen = 1
    out[world] = fallen


@wp.kernel
def _set_pole_masses(
    masses: wp.array2d(dtype=wp.float32),
    pole_body: wp.array2d(dtype=wp.int32),
    built_mass: wp.array(dtype=wp.float32),
    built_inertia: wp.array(dtype=wp.mat33),
    body_mass: wp.array(dtype=wp.float32),
    body_inertia: wp.array(dtype=wp.mat33),
    body_inv_mass: wp.array(dtype=wp.float32),
    body_inv_inertia: wp.array(dtype=wp.mat33),
):
    world, k = wp.tid()
    body = pole_body[world, k]
    m = masses[world, k]
    inertia = built_inertia[body] * (m / built_mass[body])  # the same shape: inertia scales with mass
    body_mass[body] = m
    body_inertia[body] = inertia
    body_inv_mass[body] = 1.0 / m
    body_inv_inertia[body] = wp.inverse(inertia)


UPRIGHT_ANGLE = 0.2
"""|pole angle| [rad] within which a pole counts as upright (``upright_fraction``)."""


def upright_fraction(joint_q: np.ndarray) -> float:
    """The fraction of worlds whose two pole angles stay within +-UPRIGHT_ANGLE over the
    last quarter of the rollout; ``joint_q`` is ``(steps, world_count, 3)``."""
    tail = joint_q[-max(1, joint_q.shape[0] // 4) :, :, 1:]
    return float(np.mean(np.all(np.abs(tail) <= UPRIGHT_ANGLE, axis=(0, 2))))


class CartpoleEnv(NewtonEnv, PolicyEnv, DrawsStarts, Restarts, Segmentable):
    """Newton's URDF cartpole with ``SolverFeatherstone``; see :class:`CartpoleConfig` for the fields."""

    name = "cartpole"
    segment_graph = True  # its kernels read the step as segment_base[0] + slot (harness.env.Segmentable)
    Config = CartpoleConfig
    state_fields = ("joint_q", "joint_qd")

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

        labels = list(self.model.body_label)
        # every world repeats the URDF's labels: the k-th body named pole1 is world k's
        pole_body = np.array(
            [[i for i, label in enumerate(labels) if label.endswith(f"pole{k + 1}")] for k in range(POLES)]
        ).T
        if pole_body.shape != (self.world_count, POLES):
            raise RuntimeError(f"cartpole.urdf: expected bodies pole1 and pole2 in each of {self.world_count} worlds")
        self._pole_body = wp.array(pole_body.astype(np.int32), dtype=wp.int32, device=self.device)
        self._built_mass = wp.clone(self.model.body_mass, requires_grad=False)
        self._built_inertia = wp.clone(self.model.body_inertia, requires_grad=False)
        urdf = self._built_mass.numpy()[pole_body]
        self._start_masses = (
            urdf if self.config.pole_masses is None else np.tile(self.config.pole_masses, (self.world_count, 1))
        )
        if self.config.pole_masses is not None:  # the model as configured (outside any tape)
            self.set_quantity("pole_masses", wp.array(self._start_masses.astype(np.float32), device=self.device))

    @classmethod
    def segment_blocker(cls, config: CartpoleConfig) -> str | None:
        if not config.per_step_scratch:
            return "env.per_step_scratch=false shares one scratch set between steps; accepted: true"
        return super().segment_blocker(config)

    def build_model(self) -> newton.Model:
        import newton.examples

        single = newton.ModelBuilder()
        single.add_urdf(newton.examples.get_asset("cartpole.urdf"), floating=False, enable_self_collisions=False)
        if single.joint_dof_count != DOFS_PER_WORLD:
            raise RuntimeError(f"cartpole.urdf has {single.joint_dof_count} dofs per world, expected {DOFS_PER_WORLD}")
        builder = newton.ModelBuilder()
        builder.replicate(single, self.world_count, spacing=(0.0, 2.0, 0.0))
        return builder.finalize(device=self.device, requires_grad=True)

    def build_solver(self) -> newton.solvers.SolverFeatherstone:
        import newton

        return newton.solvers.SolverFeatherstone(self.model, angular_damping=self.config.angular_damping)

    def quantity_value(self, name: str) -> np.ndarray:
        if name != "pole_masses":
            return super().quantity_value(name)
        return self._start_masses.astype(np.float32).copy()

    def set_quantity(self, name: str, value: wp.array) -> None:
        import newton

        if name != "pole_masses":
            super().set_quantity(name, value)
            return
        model = self.model
        wp.launch(
            _set_pole_masses,
            dim=(self.world_count, POLES),
            inputs=[value, self._pole_body, self._built_mass, self._built_inertia],
            outputs=[model.body_mass, model.body_inertia, model.body_inv_mass, model.body_inv_inertia],
            device=self.device,
        )
        # Featherstone reads mass and inertia through its spatial inertia, derived when the
        # solver is built: derive it again (two recorded launches, so the gradient reaches value).
        self.solver.notify_model_changed(newton.ModelFlags.BODY_INERTIAL_PROPERTIES)

    def observe_state(self, state: newton.State, out: wp.array) -> None:
        wp.launch(
            _observe,
            dim=(self.world_count, 2 * DOFS_PER_WORLD),
            inputs=[state.joint_q, state.joint_qd, DOFS_PER_WORLD],
            outputs=[out],
            device=self.device,
        )

    def draw_initial(self, key: wp.array) -> None:
        self.keep_built_initial()
        wp.launch(
            _draw_tilts,
            dim=self.world_count,
            inputs=[
                DRAW_SEED_OFFSET + self.config.seed,
                key,
                self.config.tilt,
                self.config.draw_cart,
                self.config.draw_rate,
                DOFS_PER_WORLD,
                CART_DOF,
            ],
            outputs=[self.initial["joint_q"], self.initial["joint_qd"]],
            device=self.device,
        )

    def ended_worlds(self, out: wp.array) -> bool:
        """With ``fall_angle`` set: 1 for every world whose kept last state has a pole beyond it."""
        if self.config.fall_angle is None:
            return False
        wp.launch(
            _fallen, dim=self.world_count,
            inputs=[self.carried()["joint_q"], DOFS_PER_WORLD, CART_DOF, self.config.fall_angle], outputs=[out],
            device=self.device,
        )  # fmt: skip
        return True

    def control_at(self, t: int) -> newton.Control:
        return self.controls[self.slot(t)]

    def step_arrays(self) -> list[wp.array]:
        return [*(array for scratch in self.scratch for array in scratch.values()), self.joint_f]

    def act(self, t: int, actions: wp.array) -> None:
        self._actions = actions
        clamp = self.config.force_adjoint_clamp
        wp.launch(
            _apply_cart_force,
            dim=self.world_count,
            inputs=[
                actions,
                self.segment_base,
                self.slot(t),
                DOFS_PER_WORLD,
                CART_DOF,
                int(clamp is not None),
                clamp or 0.0,
            ],
            outputs=[self.joint_f[self.slot(t)]],
            device=self.device,
        )

    def act_all(self, actions: wp.array) -> bool:
        """Every step's cart force in one launch (the task knows them all before step 0), unless
        the per-step rows hold one segment only, or a subclass overrides :meth:`act` (it gets
        its call at every step)."""
        if self.steps_kept != self.horizon or type(self).act is not CartpoleEnv.act:
            return False
        self._actions = actions
        clamp = self.config.force_adjoint_clamp
        wp.launch(
            _apply_cart_forces,
            dim=(self.horizon, self.world_count),
            inputs=[actions, DOFS_PER_WORLD, CART_DOF, int(clamp is not None), clamp or 0.0],
            outputs=[self.joint_f],
            device=self.device,
        )
        return True

    def step(self, t: int) -> None:
        scratch = self.scratch[self.slot(t)] if self.config.per_step_scratch else self._solver_scratch
        for name, array in scratch.items():
            setattr(self.solver, name, array)
        super().step(t)

    def write_observables(self, t: int) -> None:
        state = self.state(t + 1)
        rows = {name: self.row(name, t) for name in ("joint_q", "joint_qd")}
        if None not in rows.values():  # both in one launch
            wp.launch(
                _record_q_qd,
                dim=(self.world_count, DOFS_PER_WORLD),
                inputs=[state.joint_q, state.joint_qd, self.segment_base, rows["joint_q"] - self._base,
                        rows["joint_qd"] - self._base, DOFS_PER_WORLD],
                outputs=[self.observed["joint_q"], self.observed["joint_qd"]],
                device=self.device,
            )  # fmt: skip
            return
        for name, row in rows.items():
            if row is not None:
                wp.launch(
                    _record_dofs,
                    dim=(self.world_count, DOFS_PER_WORLD),
                    inputs=[getattr(state, name), self.segment_base, row - self._base, DOFS_PER_WORLD],
                    outputs=[self.observed[name]],
                    device=self.device,
                )

    def request(self, wanted: dict[str, str]) -> None:
        super().request(wanted)
        self.observed.pop("controls", None)  # the applied forces are the actions themselves: no buffer

    def trajectory(self) -> Trajectory:
        found = super().trajectory()
        if "controls" in self._wanted:  # the applied forces, no copy
            if self._actions is None:  # a task that applies none (task=physical): zero force
                self._actions = wp.zeros((self.horizon, self.world_count, 1), dtype=wp.float32, device=self.device)
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
            "upright_fraction": upright_fraction(q),
        }
