"""SHAC's cart-pole swing-up (Xu et al. 2022): one pole on a cart, built in code, stepped by Featherstone.

The benchmark of NVlabs/DiffRL (``envs/cartpole_swing_up.py`` with its ``cartpole.urdf`` and
``examples/cfg/shac/cartpole_swing_up.yaml``), rebuilt with ``newton.ModelBuilder``: a cart on
a prismatic joint along x and a pole on a revolute joint about y (z up, gravity -z). The pole
angle ``theta`` is 0 upright, as in DiffRL, and positive when the pole leans towards +x, the
direction of positive cart force (DiffRL's URDF hinge axis, mapped by its root rotation, gives
the same sign). Episodes start hanging down (``theta = -pi``).

One env step is one control step of ``dt = 1/60 s``: the action is held while
``SolverFeatherstone`` takes ``substeps = 4`` steps of ``1/240 s`` (semi-implicit Euler on the
joint coordinates, as dflex's integrator). Every substep writes its own ``newton.State`` and,
with ``per_step_scratch`` (default), its own copy of Featherstone's scratch matrices
``M, J, P, H, L`` (the solver recomputes those in place, so a taped rollout stepped through one
set replays every substep's adjoint with the last substep's matrices: envs/cartpole.py and the
README's "A trap in Featherstone").

Action: one number per world, clipped to [-1, 1] and multiplied by ``action_strength`` (1000 N)
into the force on the cart's joint, held over the step's substeps. Observation (policy input,
5 per world): ``[x, x_dot, sin(theta), cos(theta), theta_dot]``. Observables for the loss after
every step: ``joint_q`` = ``[x, wrap(theta)]`` with ``wrap(theta) = atan2(sin theta, cos theta)``
in [-pi, pi] (DiffRL's ``normalize_angle``), ``joint_qd`` = ``[x_dot, theta_dot]``, ``controls``
= the clipped action. The default loss (``configs/loss/cartpole_swingup.yaml``) has as cost of a
step and world SHAC's negative reward ``theta^2 + 0.1 theta_dot^2 + 0.05 x^2 + 0.1 x_dot^2``
(DiffRL's action penalty is 0).

Initial states (DiffRL with ``stochastic_env: True``, SHAC's setting): ``theta = -pi + U(-pi/2,
pi/2)``, ``x = U(-pi/2, pi/2)`` m (DiffRL adds ``pi (U - 0.5)`` to both joint coordinates),
``x_dot, theta_dot = U(-0.25, 0.25)`` (``0.5 (U - 0.5)``). The env's own start is drawn on the
host from ``seed`` when it is built (numpy, ``harness.env.host_rng``: one ``(world_count, 4)``
uniform draw in [-1, 1), columns angle, position, cart rate, pole rate); ``draw_initial(key)``
draws anew on the device from ``seed`` and ``key[0]`` (``_draw_starts``).

Constants. DiffRL's dflex URDF loader (``utils/load_utils.py::urdf_load``) does not read the
URDF's ``<inertial>`` elements (cart 1 kg; pole 10 kg, 1 kg m^2): dflex's ``add_link`` starts every
body at zero mass and the mass comes from the collision boxes at dflex's default density of
1000 kg/m^3. So the dynamics DiffRL simulates, and the defaults here, are:

========================  ==========================  ==========================  ===================
quantity                  DiffRL (as simulated)       here (default field)        note
========================  ==========================  ==========================  ===================
cart mass                 50 kg (box .5 x .5 x .2)    ``cart_mass`` 50 kg         same
pole mass                 2.5 kg (box .05 x .05 x 1)  ``pole_mass`` 2.5 kg        same
pivot to pole centre      0.5 m                       ``pole_com`` 0.5 m          same
pole inertia (centre,     2.5 (0.05^2 + 1) / 12       ``pole_inertia``            same; the two other
hinge axis)               = 0.20885 kg m^2            0.20885 kg m^2              axes as the box's
cart inertia              box's, (1.208, 1.208,       the same                    no effect (slides)
                          2.083) kg m^2
gravity                   9.81 m/s^2                  9.81 m/s^2                  same
joint damping             1.0 on both joints          ``joint_damping`` 1.0       see (1)
armature                  0.01 on both joints         ``armature`` 0.01           same
cart limit                +-4 m, ke 100 N/m           ``cart_limit`` 4 m,         see (1)
                                                      ``limit_ke`` 100 N/m
pole limit                +-1000 rad, ke 100          +-1000 rad, ke 100          never reached
action strength           1000 N                      ``action_strength`` 1000    same
control step, substeps    1/60 s, 4                   ``dt`` 1/60 s,              same
                                                      ``substeps`` 4
mass matrix update        every 4th substep (SHAC's   ``mass_matrix_every`` 1     see (2)
                          ``MM_caching_frequency``)
contact                   none (``ground = False``)   none                        same
========================  ==========================  ==========================  ===================

(1) dflex applies ``-limit_kd * qd`` on every joint at all times (its comment says "only when the
limit is violated", its code does not), with ``limit_kd = 1`` from the env: a viscous damping of
1 N s/m on the cart and 1 N m s/rad on the pole. Newton applies its limit damping only beyond a
limit, so that damping is Newton's always-on ``joint_damping`` here and Newton's ``limit_kd`` is
0 (beyond the limit dflex's damping is still the same 1.0: equal in and out of the limits).
(2) SHAC's config builds the joint-space mass matrix on the first substep of each control step
and reuses it for the next three. Newton's Featherstone can do the same
(``update_mass_matrix_interval``); the default here rebuilds it every substep (each substep with
its own scratch). ``mass_matrix_every: 4`` reproduces SHAC's caching: the solver's step counter is
set to the substep index before each substep, so the choice is the same at every call (and in a
captured graph), and the substeps that reuse the matrices read the scratch of the substep that
built them (no substep's matrices are overwritten before backward reads them).
Newton 1.8's Featherstone stores ``angular_damping`` but never applies it; it is 0 here.
The URDF's visual and collision boxes become shapes of density 0 without collision (for
``harness render``); they add no mass. The worlds overlap (Newton's ``replicate`` at spacing 0:
nothing collides), so a render shows every world's cart and pole in the x-z plane.

Gradient checks. The wrapped angle makes the loss kinked wherever a step's pole passes the
bottom (``theta = +-pi``, where ``wrap`` jumps and the slope of ``wrap(theta)^2`` flips from 2 pi
to -2 pi). From hanging starts such a kink is often closer than the finite-difference step
(0.01) to the sampled action (one scanned entry: at +0.0065, the loss's slope jumping from
+0.0016 to -0.008 there), so central differences straddle it and disagree with the tape
gradient, which is the correct derivative on its side; with 64 worlds the loss, averaged over
steps and worlds, also resolves one action's central difference at float32 only to about 5e-5.
tests/test_swingup.py checks the gradients from near-upright starts (no kink within the
horizon) at 2 worlds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from harness.adjoint_funcs import clamp_adjoint
from harness.env import DrawsStarts, PolicyEnv, Restarts, Segmentable, Trajectory, host_rng
from harness.newton_env import NewtonEnv, NewtonEnvConfig
from harness.schema import field

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton

FEATHERSTONE_SCRATCH = ("M", "J", "P", "H", "L")
"""Solver attributes that SolverFeatherstone overwrites when it builds the mass matrix (newton 1.8)."""

DOFS_PER_WORLD = 2
"""Degrees of freedom of one world: the cart's slider (0) and the pole's hinge (1)."""

CART_DOF, POLE_DOF = 0, 1

DRAW_SEED_OFFSET = 7919
"""Added to the env's seed for the device draws of ``draw_initial`` (another stream than the
host draw of the env's own start)."""

GRAVITY = 9.81
"""[m/s^2], along -z."""

POLE_LIMIT = 1000.0
"""The hinge's limits [rad] (dflex's default for a URDF joint without limits): never reached."""

CART_BOX = (0.5, 0.5, 0.2)
POLE_BOX = (0.05, 0.05, 1.0)
"""Sizes [m] of DiffRL's collision boxes (x, y, z), from which dflex derives the masses."""

DENSITY = 1000.0
"""dflex's default shape density [kg/m^3]: what DiffRL's masses come from."""

REWARD_WEIGHTS = {"theta": 1.0, "theta_dot": 0.1, "x": 0.05, "x_dot": 0.1, "action": 0.0}
"""SHAC's reward is minus the weighted squares of the wrapped angle, the rates, the cart position
and the action (DiffRL's penalties); ``configs/loss/cartpole_swingup.yaml`` has the same weights."""

UPRIGHT_ANGLE = 0.2
"""|wrapped pole angle| [rad] within which the pole counts as upright (``upright_fraction``)."""


def box_inertia(mass: float, size: tuple[float, float, float]) -> tuple[float, float, float]:
    """The principal moments [kg m^2] about the centre of a solid box of ``size`` (x, y, z) [m]."""
    x, y, z = size
    return (mass * (y * y + z * z) / 12.0, mass * (x * x + z * z) / 12.0, mass * (x * x + y * y) / 12.0)


def _box_mass(size: tuple[float, float, float]) -> float:
    return DENSITY * size[0] * size[1] * size[2]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SwingupConfig(NewtonEnvConfig):
    """``configs/env/cartpole_swingup.yaml``; the defaults are DiffRL's (module docstring)."""

    horizon: int = field(240, minimum=1, doc="control steps per rollout (240: DiffRL's 4 s episode)")
    world_count: int = field(64, minimum=1, doc="independent worlds, each with its own start")
    dt: float = field(1.0 / 60.0, minimum=0.0, strict=True, doc="control step [s]")
    substeps: int = field(4, minimum=1, doc="Featherstone steps per control step, each dt / substeps")
    action_strength: float = field(
        1000.0, minimum=0.0, doc="cart force [N] of an action of 1 (actions clip to [-1, 1])"
    )
    cart_mass: float = field(_box_mass(CART_BOX), minimum=0.0, strict=True, doc="[kg]")
    pole_mass: float = field(_box_mass(POLE_BOX), minimum=0.0, strict=True, doc="[kg]")
    pole_com: float = field(0.5, minimum=0.0, doc="distance from the hinge to the pole's centre of mass [m]")
    pole_inertia: float = field(
        box_inertia(_box_mass(POLE_BOX), POLE_BOX)[1],
        minimum=0.0,
        strict=True,
        doc="the pole's moment of inertia about its centre of mass, about the hinge axis [kg m^2]",
    )
    joint_damping: float = field(1.0, minimum=0.0, doc="viscous damping on both joints [N s/m, N m s/rad]")
    armature: float = field(0.01, minimum=0.0, doc="armature of both joints [kg, kg m^2]")
    cart_limit: float = field(4.0, minimum=0.0, strict=True, doc="the cart's position limits +-cart_limit [m]")
    limit_ke: float = field(100.0, minimum=0.0, doc="stiffness of the joint limits [N/m, N m/rad]")
    start_angle: float = field(-math.pi, doc="pole angle every start is drawn around [rad] (-pi: hanging down)")
    angle_offset: float = field(math.pi / 2, minimum=0.0, doc="start angle + U(-a, a) [rad]")
    position_offset: float = field(math.pi / 2, minimum=0.0, doc="start cart position U(-p, p) [m]")
    rate_offset: float = field(0.25, minimum=0.0, doc="start rates U(-r, r) [m/s, rad/s]")
    mass_matrix_every: int = field(
        1, minimum=1, doc="build Featherstone's mass matrix every n-th substep of a step (SHAC's config: 4)"
    )
    per_step_scratch: bool = field(
        True, doc="per-substep copies of Featherstone's M, J, P, H, L (false reproduces the wrong gradients)"
    )
    force_adjoint_clamp: float | None = field(
        None,
        minimum=0.0,
        strict=True,
        doc="clamp the gradient flowing back through each cart force to [-c, c] (harness.adjoint_funcs; null: off)",
    )

    def observable_dims(self) -> dict[str, int]:
        return {"joint_q": DOFS_PER_WORLD, "joint_qd": DOFS_PER_WORLD, "controls": 1}

    def action_dim(self) -> int:
        return 1

    def observation_dim(self) -> int:
        return 5

    def action_fd_step(self) -> float:
        return 1.0e-2  # 10 N at the default strength; actions live in [-1, 1]


@wp.kernel
def _apply_action(
    actions: wp.array3d(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    slot: int,
    strength: float,
    clamp: int,
    limit: float,
    applied: wp.array3d(dtype=wp.float32),
    joint_f: wp.array(dtype=wp.float32),
):
    # The step's row is base[0] + slot (the segment's first step, read on the device, and the
    # place in the segment): one captured segment serves every segment.
    world = wp.tid()
    step = base[0] + slot
    action = wp.clamp(actions[step, world, 0], -1.0, 1.0)
    applied[step, world, 0] = action
    force = action * strength
    if clamp != 0:  # the identity forward; backward clamps the gradient through this force
        force = clamp_adjoint(force, limit)
    joint_f[world * 2 + 0] = force
    joint_f[world * 2 + 1] = 0.0


@wp.kernel
def _record_q(
    joint_q: wp.array(dtype=wp.float32), base: wp.array(dtype=wp.int32), offset: int, out: wp.array3d(dtype=wp.float32)
):
    world = wp.tid()
    row = base[0] + offset
    theta = joint_q[world * 2 + 1]
    out[row, world, 0] = joint_q[world * 2 + 0]
    out[row, world, 1] = wp.atan2(wp.sin(theta), wp.cos(theta))


@wp.kernel
def _record_qd(
    joint_qd: wp.array(dtype=wp.float32), base: wp.array(dtype=wp.int32), offset: int, out: wp.array3d(dtype=wp.float32)
):
    world = wp.tid()
    row = base[0] + offset
    out[row, world, 0] = joint_qd[world * 2 + 0]
    out[row, world, 1] = joint_qd[world * 2 + 1]


@wp.kernel
def _record_q_qd(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    offset_q: int,
    offset_qd: int,
    out_q: wp.array3d(dtype=wp.float32),
    out_qd: wp.array3d(dtype=wp.float32),
):
    # _record_q and _record_qd in one launch
    world = wp.tid()
    row = base[0] + offset_q
    theta = joint_q[world * 2 + 1]
    out_q[row, world, 0] = joint_q[world * 2 + 0]
    out_q[row, world, 1] = wp.atan2(wp.sin(theta), wp.cos(theta))
    row = base[0] + offset_qd
    out_qd[row, world, 0] = joint_qd[world * 2 + 0]
    out_qd[row, world, 1] = joint_qd[world * 2 + 1]


@wp.kernel
def _observe(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    out: wp.array2d(dtype=wp.float32),
):
    world = wp.tid()
    theta = joint_q[world * 2 + 1]
    out[world, 0] = joint_q[world * 2 + 0]
    out[world, 1] = joint_qd[world * 2 + 0]
    out[world, 2] = wp.sin(theta)
    out[world, 3] = wp.cos(theta)
    out[world, 4] = joint_qd[world * 2 + 1]


@wp.kernel
def _draw_starts(
    seed: int,
    key: wp.array(dtype=wp.int32),
    start_angle: float,
    angle: float,
    position: float,
    rate: float,
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
):
    world = wp.tid()
    stream = wp.rand_init(seed, key[0])  # one stream per key, then one per world in it
    rng = wp.rand_init(wp.int32(stream), world)
    # the four draws in a fixed order: angle, position, cart rate, pole rate
    joint_q[world * 2 + 1] = start_angle + wp.randf(rng, -angle, angle)
    joint_q[world * 2 + 0] = wp.randf(rng, -position, position)
    joint_qd[world * 2 + 0] = wp.randf(rng, -rate, rate)
    joint_qd[world * 2 + 1] = wp.randf(rng, -rate, rate)


def wrap_angle(theta: np.ndarray) -> np.ndarray:
    """``theta`` wrapped to [-pi, pi] as the ``joint_q`` observable records it."""
    return np.arctan2(np.sin(theta), np.cos(theta))


def upright_fraction(joint_q: np.ndarray) -> float:
    """The fraction of worlds whose |wrapped pole angle| stays <= UPRIGHT_ANGLE over the last
    quarter of the rollout; ``joint_q`` is the ``(steps, world_count, 2)`` observable."""
    tail = joint_q[-max(1, joint_q.shape[0] // 4) :, :, POLE_DOF]
    return float(np.mean(np.all(np.abs(tail) <= UPRIGHT_ANGLE, axis=0)))


def step_rewards(joint_q: np.ndarray, joint_qd: np.ndarray, actions: np.ndarray | None = None) -> np.ndarray:
    """SHAC's reward of every step and world, ``(steps, world_count)``, from the ``joint_q``
    (wrapped angle) and ``joint_qd`` observables and the applied actions (whose penalty is 0)."""
    w = REWARD_WEIGHTS
    cost = (
        w["theta"] * joint_q[..., POLE_DOF] ** 2
        + w["theta_dot"] * joint_qd[..., POLE_DOF] ** 2
        + w["x"] * joint_q[..., CART_DOF] ** 2
        + w["x_dot"] * joint_qd[..., CART_DOF] ** 2
    )
    if actions is not None and w["action"]:
        cost = cost + w["action"] * np.sum(actions**2, axis=-1)
    return -cost


class CartpoleSwingupEnv(NewtonEnv, PolicyEnv, DrawsStarts, Restarts, Segmentable):
    """SHAC's cart-pole swing-up on Newton's Featherstone; see :class:`SwingupConfig` for the fields."""

    name = "cartpole_swingup"
    Config = SwingupConfig
    segment_graph = True  # its kernels read the step as segment_base[0] + slot (harness.env.Segmentable)
    state_fields = ("joint_q", "joint_qd")

    def __init__(self, config: SwingupConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        super().__init__(config, device=device, **fields)  # fields may carry segment_steps (Env)
        cfg = self.config
        self.dt = cfg.dt
        self.substep_dt = cfg.dt / cfg.substeps
        self._write_host_starts(host_rng(cfg.seed))

        # Per step kept (the whole horizon, or one segment: `slot(t)` says which): a row of
        # joint forces and its Control, the States of the substeps before the last (the last
        # writes state t + 1) and one scratch set per substep that builds the mass matrix.
        kept, substeps = self.steps_kept, cfg.substeps
        self.joint_f = wp.zeros(
            (kept, self.model.joint_dof_count), dtype=wp.float32, device=self.device, requires_grad=True
        )
        self.controls = []
        for t in range(kept):
            control = self.model.control(clone_variables=False)  # only joint_f is per step
            control.joint_f = self.joint_f[t]
            self.controls.append(control)
        self.substates = [[self.model.state(requires_grad=True) for _ in range(substeps - 1)] for _ in range(kept)]
        self._solver_scratch = {name: getattr(self.solver, name) for name in FEATHERSTONE_SCRATCH}
        self.builders = [k for k in range(substeps) if k % cfg.mass_matrix_every == 0]
        self.scratch = [
            {
                k: {name: wp.zeros_like(array, requires_grad=True) for name, array in self._solver_scratch.items()}
                for k in self.builders
            }
            for _ in range(kept)
        ]
        # The applied (clipped) actions of every step: the `controls` observable.
        self.applied = wp.zeros(
            (self.horizon, self.world_count, 1), dtype=wp.float32, device=self.device, requires_grad=True
        )

    def _write_host_starts(self, rng: np.random.Generator) -> None:
        cfg = self.config
        u = rng.uniform(-1.0, 1.0, size=(self.world_count, 4))
        q = np.empty((self.world_count, DOFS_PER_WORLD))
        qd = np.empty((self.world_count, DOFS_PER_WORLD))
        q[:, POLE_DOF] = cfg.start_angle + cfg.angle_offset * u[:, 0]
        q[:, CART_DOF] = cfg.position_offset * u[:, 1]
        qd[:, CART_DOF] = cfg.rate_offset * u[:, 2]
        qd[:, POLE_DOF] = cfg.rate_offset * u[:, 3]
        self.initial["joint_q"].assign(q.astype(np.float32).ravel())
        self.initial["joint_qd"].assign(qd.astype(np.float32).ravel())

    @classmethod
    def segment_blocker(cls, config: SwingupConfig) -> str | None:
        if not config.per_step_scratch:
            return "env.per_step_scratch=false shares one scratch set between steps; accepted: true"
        return super().segment_blocker(config)

    # -- the model ------------------------------------------------------------------------

    def build_model(self) -> newton.Model:
        import newton

        cfg = self.config
        if cfg.mass_matrix_every > cfg.substeps:
            raise ValueError(
                f"env.mass_matrix_every: {cfg.mass_matrix_every} is above env.substeps={cfg.substeps}; "
                "accepted: 1 .. substeps"
            )
        single = newton.ModelBuilder(up_axis=newton.Axis.Z, gravity=(0.0, 0.0, -GRAVITY))
        visual = newton.ModelBuilder.ShapeConfig(density=0.0, has_shape_collision=False, has_particle_collision=False)
        cart = single.add_link(
            mass=cfg.cart_mass,
            inertia=np.diag(box_inertia(cfg.cart_mass, CART_BOX)),
            lock_inertia=True,
            label="cart",
        )
        ixx, _, izz = box_inertia(cfg.pole_mass, POLE_BOX)
        pole = single.add_link(
            mass=cfg.pole_mass,
            com=(0.0, 0.0, cfg.pole_com),
            inertia=np.diag((ixx, cfg.pole_inertia, izz)),
            lock_inertia=True,
            label="pole",
        )
        single.add_shape_box(cart, hx=CART_BOX[0] / 2, hy=CART_BOX[1] / 2, hz=CART_BOX[2] / 2, cfg=visual)
        single.add_shape_box(
            pole,
            xform=wp.transform((0.0, 0.0, POLE_BOX[2] / 2), wp.quat_identity()),
            hx=POLE_BOX[0] / 2,
            hy=POLE_BOX[1] / 2,
            hz=POLE_BOX[2] / 2,
            cfg=visual,
        )
        common = {"damping": cfg.joint_damping, "armature": cfg.armature, "limit_ke": cfg.limit_ke, "limit_kd": 0.0}
        slider = single.add_joint_prismatic(
            -1,
            cart,
            axis=newton.Axis.X,
            limit_lower=-cfg.cart_limit,
            limit_upper=cfg.cart_limit,
            label="slider",
            **common,
        )
        hinge = single.add_joint_revolute(
            cart, pole, axis=newton.Axis.Y, limit_lower=-POLE_LIMIT, limit_upper=POLE_LIMIT, label="hinge", **common
        )
        single.add_articulation([slider, hinge], label="cartpole")
        builder = newton.ModelBuilder(up_axis=newton.Axis.Z, gravity=(0.0, 0.0, -GRAVITY))
        builder.replicate(single, self.world_count, spacing=(0.0, 0.0, 0.0))  # overlapping: no contact
        return builder.finalize(device=self.device, requires_grad=True)

    def build_solver(self) -> newton.solvers.SolverFeatherstone:
        import newton

        return newton.solvers.SolverFeatherstone(
            self.model, angular_damping=0.0, update_mass_matrix_interval=self.config.mass_matrix_every
        )

    # -- one rollout --------------------------------------------------------------------------

    def act(self, t: int, actions: wp.array) -> None:
        clamp = self.config.force_adjoint_clamp
        wp.launch(
            _apply_action,
            dim=self.world_count,
            inputs=[
                actions,
                self.segment_base,
                self.slot(t),
                self.config.action_strength,
                int(clamp is not None),
                clamp or 0.0,
            ],
            outputs=[self.applied, self.joint_f[self.slot(t)]],
            device=self.device,
        )

    def step(self, t: int) -> None:
        slot, cfg = self.slot(t), self.config
        source = self.current(t)
        for k in range(cfg.substeps):
            target = self.state(t + 1) if k == cfg.substeps - 1 else self.substates[slot][k]
            if cfg.per_step_scratch:  # the set of the substep that builds the matrices this substep reads
                scratch = self.scratch[slot][k - k % cfg.mass_matrix_every]
            else:
                scratch = self._solver_scratch
            for name, array in scratch.items():
                setattr(self.solver, name, array)
            self.solver._step = k  # build the mass matrix at substeps 0, n, 2n, ... of every step
            source.clear_forces()
            self.solver.step(source, target, self.controls[slot], None, self.substep_dt)
            source = target

    def write_observables(self, t: int) -> None:
        state = self.state(t + 1)
        row_q, row_qd = self.row("joint_q", t), self.row("joint_qd", t)
        if row_q is not None and row_qd is not None:  # both in one launch
            wp.launch(
                _record_q_qd,
                dim=self.world_count,
                inputs=[state.joint_q, state.joint_qd, self.segment_base, row_q - self._base, row_qd - self._base],
                outputs=[self.observed["joint_q"], self.observed["joint_qd"]],
                device=self.device,
            )
            return
        for name, kernel in (("joint_q", _record_q), ("joint_qd", _record_qd)):
            row = self.row(name, t)
            if row is not None:
                wp.launch(
                    kernel,
                    dim=self.world_count,
                    inputs=[getattr(state, name), self.segment_base, row - self._base],
                    outputs=[self.observed[name]],
                    device=self.device,
                )

    def request(self, wanted: dict[str, str]) -> None:
        super().request(wanted)
        self.observed.pop("controls", None)  # the applied actions have their own buffer (act writes it)

    def trajectory(self) -> Trajectory:
        found = super().trajectory()
        mode = self._wanted.get("controls")
        if mode is not None:
            found["controls"] = self.applied if mode == "all" else self.applied[self.horizon - 1 : self.horizon]
        return found

    def observe_state(self, state: newton.State, out: wp.array) -> None:
        wp.launch(
            _observe, dim=self.world_count, inputs=[state.joint_q, state.joint_qd], outputs=[out], device=self.device
        )

    def draw_initial(self, key: wp.array) -> None:
        self.keep_built_initial()
        cfg = self.config
        wp.launch(
            _draw_starts,
            dim=self.world_count,
            inputs=[
                DRAW_SEED_OFFSET + cfg.seed,
                key,
                cfg.start_angle,
                cfg.angle_offset,
                cfg.position_offset,
                cfg.rate_offset,
            ],
            outputs=[self.initial["joint_q"], self.initial["joint_qd"]],
            device=self.device,
        )

    def control_at(self, t: int) -> newton.Control:
        return self.controls[self.slot(t)]

    def step_arrays(self) -> list[wp.array]:
        # walked at call time: the solver puts its own arrays on a State it steps into
        found = [self.joint_f]
        for sets in self.scratch:
            found.extend(array for scratch in sets.values() for array in scratch.values())
        for states in self.substates:
            for state in states:
                found.extend(value for value in vars(state).values() if isinstance(value, wp.array))
        return found

    def extra_arrays(self) -> list[wp.array]:
        return [self.applied]

    # -- what a run reports -------------------------------------------------------------------

    def component_names(self) -> dict[str, list[str]]:
        return {
            "joint_q": ["cart position [m]", "pole angle, wrapped [rad]"],
            "joint_qd": ["cart velocity [m/s]", "pole rate [rad/s]"],
            "controls": ["action (cart force / action_strength)"],
        }

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        if "joint_q" not in trajectory or trajectory["joint_q"].shape[0] != self.horizon:
            return {}
        q = trajectory["joint_q"].numpy().astype(np.float64)
        first = self.initial["joint_q"].numpy().astype(np.float64).reshape(self.world_count, DOFS_PER_WORLD)
        found: dict[str, Any] = {
            "upright_fraction": upright_fraction(q),
            "initial_pole_angles_rad": np.round(wrap_angle(first[:, POLE_DOF]), 4).tolist(),
            "final_pole_angles_rad": np.round(q[-1, :, POLE_DOF], 4).tolist(),
            "final_cart_position_m": np.round(q[-1, :, CART_DOF], 4).tolist(),
            "max_abs_cart_position_m": float(np.abs(q[:, :, CART_DOF]).max()),
        }
        qd = trajectory.get("joint_qd")
        if qd is not None and qd.shape[0] == self.horizon:
            rewards = step_rewards(q, qd.numpy().astype(np.float64))
            found["episode_return"] = float(rewards.sum(axis=0).mean())
        return found
