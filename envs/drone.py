"""Newton's diffsim drone: a quadrotor flown to targets by model-predictive control (``task=mpc``).

A port of ``newton/examples/diffsim/example_diffsim_drone.py`` (newton 1.8). Each drone is one
free rigid body: two crossed carbon-fibre bars (half extents 0.01 x 0.2 x 0.01 m, 1750 kg/m^3)
with four propellers at the bar ends, (0, +-0.2, 0) turning -1/+1 and (+-0.2, 0, 0) turning
+1/-1. A propeller's command ``u`` (the action, in the example's bounds [0.1, 1]) times the gain
0.8 scales its thrust along the body's z axis, ``0.109919 * 1.225 * rps^2 * 0.2286^4`` at full
command, and its torque, ``0.040164 * 1.225 * rps^2 * 0.2286^5 / (2 pi)``, with ``rps = 6396.667 /
60`` as the example computes them; the moments of the thrusts about the centre of mass add to
the torque, and the whole torque is damped by 0.8. ``SolverSemiImplicit`` at dt = 1/60 s.

A pole, a capsule of radius 0.15 m and half height 2 m standing at (0.5, 0.5, 2) m, acts only
through the cost. The cost of a rollout is the example's, accumulated after every step ``t`` of
the ``horizon`` (30) steps: ``1e3 / 1110.15 * 0.8^(H - t - 1) / H^2`` times ``1000 |p - target|^2
+ 100 (max(z - 0.75, 0) + max(0.25 - z, 0)) + 0.05 |u gain|^2 + 0.1 |v|^2 + 10 (1 - up . z)``
(``v`` the body's spatial velocity), plus ``1e4 (0.2 - d)`` where the distance ``d`` of the
drone's centre to the pole is below 0.2 m. The observable ``cost`` holds each world's running
sum after step ``t``; the env's loss (``configs/loss/drone.yaml``) reads it at the last step, so
a world's cost is the example's ``rollout_costs`` entry exactly.

The example's control cost at step ``t`` reads the controls of step ``t + 1`` (its ``control``
property indexes by the tick after the step), which this rollout has not written yet: it holds
the previous rollout's. ``env.example_control_cost=true`` reproduces that (the per-frame costs
then match the example's bit for bit, with ``task.stale_state=true``); the default reads step
``t``'s own controls.

The worlds are the rollouts of one plan (``world_count``, the example's 16); beside them the env
keeps the real drone (:class:`harness.env.Plant`): one more drone, stepped one step per frame,
which the rollouts plan from. Its target is ``target`` for the first ``switch_every`` frames,
then ``second_target``, and so on in turn (the example: every 180 frames).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from harness.env import EnvConfig, Plant, Trajectory
from harness.newton_env import NewtonEnv, NewtonEnvConfig
from harness.schema import field

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton

AIR_DENSITY = 1.225
"""kg/m^3, at sea level (the example's)."""

COST_WEIGHTS = (1000.0, 100.0, 0.05, 0.1, 10.0)
"""The example's weights of position, altitude, control, velocity and upright cost."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DroneConfig(NewtonEnvConfig):
    """``configs/env/drone.yaml``."""

    horizon: int = field(30, minimum=1, doc="steps of one planning rollout (the example: 3 control points x 10 steps)")
    world_count: int = field(16, minimum=1, doc="rollouts planned at once (the example's --num_rollouts)")
    dt: float = field(1.0 / 60.0, minimum=0.0, strict=True, doc="time step [s], of the rollouts and the real drone")
    frames: int = field(100, minimum=1, doc="control steps of the real drone (the example's --num-frames)")
    target: tuple[float, ...] = field((1.0, 0.0, 0.5), length=3, doc="first target [m]")
    second_target: tuple[float, ...] = field((0.0, 1.0, 0.5), length=3, doc="target after switch_every frames [m]")
    switch_every: int = field(180, minimum=1, doc="frames between target switches (the example: 360 / 2)")
    size: float = field(0.2, minimum=0.0, strict=True, doc="half length of a crossbar [m]; the pole's cost margin")
    gain: float = field(0.8, minimum=0.0, doc="propeller command per unit of action")
    action_lower: float = field(0.1, doc="smallest propeller action (the example's control limits)")
    action_upper: float = field(1.0, doc="largest propeller action")
    cost_weight: float = field(1.0e3, minimum=0.0, doc="scale of the tracking cost (the example's 1e3)")
    collision_weight: float = field(1.0e4, minimum=0.0, doc="cost per metre inside the pole's margin")
    example_control_cost: bool = field(
        False, doc="the control cost of step t reads step t + 1's controls as the last rollout left them (the example)"
    )

    def observable_dims(self) -> dict[str, int]:
        return {"cost": 1}

    def action_dim(self) -> int:
        return 4

    def action_bounds(self) -> tuple[float, float]:
        """The propeller actions' bounds (``task=mpc`` keeps its plans inside them)."""
        return self.action_lower, self.action_upper

    def action_fd_step(self) -> float:
        return 1.0e-2


@wp.kernel
def _scale_actions(
    actions: wp.array3d(dtype=wp.float32),
    t: int,
    gain: float,
    controls: wp.array2d(dtype=wp.float32),
):
    w, d = wp.tid()
    controls[t, w * 4 + d] = actions[t, w, d] * gain


@wp.kernel
def _prop_wrenches(
    prop_body: wp.array(dtype=wp.int32),
    prop_pos: wp.array(dtype=wp.vec3),
    prop_thrust: wp.array(dtype=wp.float32),
    prop_torque: wp.array(dtype=wp.float32),
    prop_turn: wp.array(dtype=wp.float32),
    controls: wp.array2d(dtype=wp.float32),
    t: int,
    body_q: wp.array(dtype=wp.transform),
    body_com: wp.array(dtype=wp.vec3),
    body_f: wp.array(dtype=wp.spatial_vector),
):
    # Thrust along the body's z axis and the propeller's drag torque, plus the thrust's moment
    # about the centre of mass; the whole torque damped by 0.8 (the example's model).
    p = wp.tid()
    body = prop_body[p]
    u = controls[t, p]
    tf = body_q[body]
    axis = wp.transform_vector(tf, wp.vec3(0.0, 0.0, 1.0))
    force = axis * prop_thrust[p] * u
    torque = axis * prop_torque[p] * u * prop_turn[p]
    arm = wp.transform_point(tf, prop_pos[p]) - wp.transform_point(tf, body_com[body])
    torque += wp.cross(arm, force)
    torque *= 0.8
    wp.atomic_add(body_f, body, wp.spatial_vector(force, torque))


@wp.kernel
def _tracking_cost(
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    target: wp.array(dtype=wp.vec3),
    controls: wp.array2d(dtype=wp.float32),
    row: int,
    step: int,
    horizon: int,
    weighting: float,
    cost: wp.array(dtype=wp.float32),
):
    w = wp.tid()
    tf = body_q[w]
    p = wp.transform_get_translation(tf)
    position = wp.length_sq(p - target[0])
    altitude = wp.max(p[2] - 0.75, 0.0) + wp.max(0.25 - p[2], 0.0)
    up = wp.vec3(0.0, 0.0, 1.0)
    upright = 1.0 - wp.dot(wp.transform_vector(tf, up), up)
    velocity = wp.length_sq(body_qd[w])
    u = wp.vec4(controls[row, w * 4 + 0], controls[row, w * 4 + 1], controls[row, w * 4 + 2], controls[row, w * 4 + 3])
    control = wp.dot(u, u)
    discount = 0.8 ** wp.float(horizon - step - 1) / wp.float(horizon) ** 2.0
    total_weight = 1000.0 + 100.0 + 0.05 + 0.1 + 10.0
    wp.atomic_add(
        cost,
        w,
        (position * 1000.0 + altitude * 100.0 + control * 0.05 + velocity * 0.1 + upright * 10.0)
        * (weighting / total_weight)
        * discount,
    )


@wp.func
def _capsule_distance(x: wp.vec3, radius: float, half_height: float):
    # Distance to a capsule along z (a segment of half length half_height, thickened by radius):
    # to the nearer end's centre above and below the segment, to the axis beside it.
    if x[2] > half_height:
        return wp.length(wp.vec3(x[0], x[1], x[2] - half_height)) - radius
    if x[2] < -half_height:
        return wp.length(wp.vec3(x[0], x[1], x[2] + half_height)) - radius
    return wp.length(wp.vec3(x[0], x[1], 0.0)) - radius


@wp.kernel
def _pole_cost(
    body_q: wp.array(dtype=wp.transform),
    pole: wp.array(dtype=wp.int32),
    shape_transform: wp.array(dtype=wp.transform),
    shape_scale: wp.array(dtype=wp.vec3),
    margin: float,
    weighting: float,
    cost: wp.array(dtype=wp.float32),
):
    # The pole's signed distance (a capsule along z) at the drone's centre; inside the margin
    # the cost grows linearly.
    w = wp.tid()
    shape = pole[w]
    x = wp.transform_point(wp.transform_inverse(shape_transform[shape]), wp.transform_get_translation(body_q[w]))
    scale = shape_scale[shape]
    d = wp.max(_capsule_distance(x, scale[0], scale[1]), 0.0)
    if d < margin:
        wp.atomic_add(cost, w, weighting * (margin - d))


@wp.kernel
def _write_cost(cost: wp.array(dtype=wp.float32), row: int, out: wp.array3d(dtype=wp.float32)):
    w = wp.tid()
    out[row, w, 0] = cost[w]


@wp.kernel
def _replicate(
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    keep: wp.array(dtype=wp.int32),
    q_out: wp.array(dtype=wp.transform),
    qd_out: wp.array(dtype=wp.spatial_vector),
):
    w = wp.tid()
    if keep[0] == 0:
        q_out[w] = body_q[0]
        qd_out[w] = body_qd[0]


@wp.kernel
def _choose_target(
    frame: wp.array(dtype=wp.int32), every: int, targets: wp.array(dtype=wp.vec3), current: wp.array(dtype=wp.vec3)
):
    current[0] = targets[(frame[0] // every) % targets.shape[0]]


@wp.kernel
def _distance(body_q: wp.array(dtype=wp.transform), target: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.float32)):
    out[0] = wp.length(wp.transform_get_translation(body_q[0]) - target[0])


class _Fleet:
    """``count`` drones and their pole in one Newton model, built as the example builds its
    ``Drone`` (one body, two crossbar boxes and a capsule pole per drone), with the propellers
    as device arrays."""

    def __init__(self, count: int, size: float, dt: float, device: Any, *, requires_grad: bool):
        import newton

        builder = newton.ModelBuilder()
        builder.rigid_gap = 0.05
        bar, thin, density = size, size * 0.05, 1750.0
        rps = 6396.667 / (1.0 / dt)  # the example divides the rpm by its fps
        thrust = 0.109919 * AIR_DENSITY * rps**2 * 0.2286**4
        torque = 0.040164 * AIR_DENSITY * rps**2 * 0.2286**5 / (2.0 * math.pi)
        props: list[tuple[int, tuple[float, float, float], float]] = []
        poles = []
        for i in range(count):
            # a free body without a joint: the example's add_body adds a free joint whose (zero)
            # joint forces make SolverSemiImplicit clone body_f every step, an allocation inside
            # the rollout (the capture contract); without it the arithmetic is the same
            body = builder.add_link(label=f"drone_{i}")
            cfg = newton.ModelBuilder.ShapeConfig(density=density, collision_group=i)
            builder.add_shape_box(body, hx=thin, hy=bar, hz=thin, cfg=cfg)
            builder.add_shape_box(body, hx=bar, hy=thin, hz=thin, cfg=cfg)
            props += [
                (body, (0.0, bar, 0.0), -1.0),
                (body, (0.0, -bar, 0.0), 1.0),
                (body, (bar, 0.0, 0.0), 1.0),
                (body, (-bar, 0.0, 0.0), -1.0),
            ]
            poles.append(
                builder.add_shape_capsule(
                    -1,
                    xform=wp.transform(wp.vec3(0.5, 0.5, 2.0), wp.quat_identity()),
                    radius=0.15,
                    half_height=2.0,
                    cfg=newton.ModelBuilder.ShapeConfig(collision_group=i),
                )
            )
        self.model = builder.finalize(device=device, requires_grad=requires_grad)
        n = len(props)
        self.prop_body = wp.array([p[0] for p in props], dtype=wp.int32, device=device)
        self.prop_pos = wp.array([p[1] for p in props], dtype=wp.vec3, device=device)
        self.prop_thrust = wp.array(np.full(n, thrust, np.float32), dtype=wp.float32, device=device)
        self.prop_torque = wp.array(np.full(n, torque, np.float32), dtype=wp.float32, device=device)
        self.prop_turn = wp.array([p[2] for p in props], dtype=wp.float32, device=device)
        self.poles = wp.array(poles, dtype=wp.int32, device=device)

    def wrenches(self, controls: wp.array, t: int, state: Any) -> None:
        wp.launch(
            _prop_wrenches,
            dim=self.prop_body.shape[0],
            inputs=[self.prop_body, self.prop_pos, self.prop_thrust, self.prop_torque, self.prop_turn, controls, t,
                    state.body_q, self.model.body_com],
            outputs=[state.body_f],
            device=self.model.device,
        )  # fmt: skip


class DroneEnv(NewtonEnv, Plant):
    """The diffsim drone's rollouts and its real drone; see :class:`DroneConfig` for the fields."""

    name = "drone"
    Config = DroneConfig
    state_fields = ("body_q", "body_qd")

    def __init__(self, config: EnvConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        import newton

        super().__init__(config, device=device, **fields)
        cfg = self.config
        self.dt = cfg.dt
        grad = dict(dtype=wp.float32, device=self.device, requires_grad=True)
        self.prop_controls = wp.zeros((self.horizon, 4 * self.world_count), **grad)
        self.cost_sum = wp.zeros(self.world_count, **grad)
        self.targets = wp.array([cfg.target, cfg.second_target], dtype=wp.vec3, device=self.device)
        self.current_target = wp.array([cfg.target], dtype=wp.vec3, device=self.device)
        # the real drone: two States, the current one always first (the step's result is copied back)
        self._plant = _Fleet(1, cfg.size, cfg.dt, self.device, requires_grad=False)
        self.plant_model = self._plant.model
        self._plant_solver = newton.solvers.SolverSemiImplicit(self.plant_model)
        self._plant_states = [self.plant_model.state(), self.plant_model.state()]
        self._plant_control = self.plant_model.control()
        self._plant_controls = wp.zeros((1, 4), dtype=wp.float32, device=self.device)
        self._plant_start = {name: wp.clone(getattr(self._plant_states[0], name)) for name in self.state_fields}

    def build_model(self) -> newton.Model:
        cfg = self.config
        self._fleet = _Fleet(self.world_count, cfg.size, cfg.dt, self.device, requires_grad=True)
        return self._fleet.model

    def build_solver(self) -> newton.solvers.SolverSemiImplicit:
        import newton

        return newton.solvers.SolverSemiImplicit(self.model)

    # -- the rollouts ---------------------------------------------------------------------

    def reset(self) -> None:
        super().reset()
        self.cost_sum.zero_()

    def act(self, t: int, actions: wp.array) -> None:
        wp.launch(
            _scale_actions, dim=(self.world_count, 4), inputs=[actions, t, self.config.gain],
            outputs=[self.prop_controls], device=self.device,
        )  # fmt: skip

    def step(self, t: int) -> None:
        state, following = self.state(t), self.state(t + 1)
        state.clear_forces()
        self._fleet.wrenches(self.prop_controls, t, state)
        self.solver.step(state, following, self.control, None, self.dt)

    def write_observables(self, t: int) -> None:
        cfg = self.config
        state = self.state(t + 1)
        row = min(t + 1, self.horizon - 1) if cfg.example_control_cost else t
        wp.launch(
            _tracking_cost, dim=self.world_count,
            inputs=[state.body_q, state.body_qd, self.current_target, self.prop_controls, row, t, self.horizon,
                    cfg.cost_weight],
            outputs=[self.cost_sum], device=self.device,
        )  # fmt: skip
        wp.launch(
            _pole_cost, dim=self.world_count,
            inputs=[state.body_q, self._fleet.poles, self.model.shape_transform, self.model.shape_scale, cfg.size,
                    cfg.collision_weight],
            outputs=[self.cost_sum], device=self.device,
        )  # fmt: skip
        row = self.row("cost", t)
        if row is not None:
            wp.launch(_write_cost, dim=self.world_count, inputs=[self.cost_sum, row], outputs=[self.observed["cost"]],
                      device=self.device)  # fmt: skip

    def extra_arrays(self) -> list[wp.array]:
        return [self.prop_controls, self.cost_sum]

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        costs = trajectory["cost"].numpy()[-1, :, 0].astype(np.float64) if "cost" in trajectory else None
        return {} if costs is None else {"rollout_cost_min": float(costs.min()), "rollout_cost_max": float(costs.max())}

    # -- the real drone (Plant) ----------------------------------------------------------------

    def reset_plant(self) -> None:
        for state in self._plant_states:
            for name, start in self._plant_start.items():
                wp.copy(getattr(state, name), start)

    def set_frame(self, frame: wp.array) -> None:
        wp.launch(
            _choose_target, dim=1, inputs=[frame, self.config.switch_every, self.targets],
            outputs=[self.current_target], device=self.device,
        )  # fmt: skip

    def plan_from_plant(self, keep: wp.array) -> None:
        now = self._plant_states[0]
        wp.launch(
            _replicate, dim=self.world_count, inputs=[now.body_q, now.body_qd, keep],
            outputs=[self.initial["body_q"], self.initial["body_qd"]], device=self.device,
        )  # fmt: skip

    def advance(self, action: wp.array) -> None:
        now, following = self._plant_states
        now.clear_forces()
        wp.launch(
            _scale_actions, dim=(1, 4), inputs=[action.reshape((1, 1, 4)), 0, self.config.gain],
            outputs=[self._plant_controls], device=self.device,
        )  # fmt: skip
        self._plant.wrenches(self._plant_controls, 0, now)
        self._plant_solver.step(now, following, self._plant_control, None, self.dt)
        for name in self.state_fields:
            wp.copy(getattr(now, name), getattr(following, name))

    def plant_error(self, out: wp.array) -> None:
        wp.launch(
            _distance, dim=1, inputs=[self._plant_states[0].body_q, self.current_target], outputs=[out],
            device=self.device,
        )  # fmt: skip

    def plant_state(self) -> dict[str, wp.array]:
        now = self._plant_states[0]
        return {name: getattr(now, name) for name in self.state_fields}

    def plant_pose(self) -> wp.array:
        return self._plant_states[0].body_q
