"""Newton's diffsim ball: a particle bounces off a wall and the ground towards a target.

A port of ``newton/examples/diffsim/example_diffsim_ball.py`` (newton 1.8): one particle
(mass 1 kg) launched from (0, -0.5, 1) m, a wall box at (0, 2, 1) m (half extents 1,
0.25, 1 m) and a ground plane, soft contacts with ke = 1e4, kd = 10, kf = 0, mu = 0.2,
restitution 1, ``SolverSemiImplicit`` at dt = 1/480 s for 36 x 8 = 288 steps. The
trained quantity is the initial velocity (``task=initial``); the default loss is the
example's, the squared distance of the final position to the target (0, -2, 1.5) m.

Contacts are found once, at construction, from the initial positions (``collide()``
into one ``Contacts``), and that contact set stays frozen for every rollout, as in the
example: with a 10 m contact gap every particle-shape pair is in the set, and which of
them push is decided inside the solver step from the current positions. Only the
initial velocity is trained, so the initial positions the set was found from never change.

With ``world_count`` above 1 every world is a copy of the scene (Newton's ``replicate``;
contacts never cross worlds) with its own target: the example's target moved by a
uniform draw from [-target_spread, target_spread] m per axis (seeded).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import warp as wp

from envs.walls import ContactMaterial, add_wall_and_ground, set_soft_contact
from harness.env import EnvConfig, Quantity, Segmentable, Trajectory
from harness.newton_env import NewtonEnv, NewtonEnvConfig, final_distances, finalize_worlds, world_targets
from harness.schema import field

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton


@dataclasses.dataclass(frozen=True, kw_only=True)
class BallConfig(NewtonEnvConfig):
    """``configs/env/ball.yaml``."""

    horizon: int = field(288, minimum=1, doc="simulation steps (the example: 36 frames x 8 substeps)")
    world_count: int = field(1, minimum=1, doc="copies of the scene, each with its own target")
    dt: float = field(1.0 / 480.0, minimum=0.0, strict=True, doc="time step [s] (the example: 1/60 / 8)")
    target: tuple[float, ...] = field((0.0, -2.0, 1.5), length=3, doc="target position [m]")
    target_spread: float = field(0.0, minimum=0.0, doc="per-world targets drawn from target +- spread [m]")
    initial_velocity: tuple[float, ...] = field((0.0, 5.0, -5.0), length=3, doc="initial velocity [m/s]")

    def observable_dims(self) -> dict[str, int]:
        return {"to_target": 3}

    def quantities(self) -> dict[str, Quantity]:
        return {
            "initial_velocity": Quantity(
                (self.world_count,), wp.vec3, unit="m/s", doc="initial velocity of each world's ball", per_world=True
            )
        }

    def default_quantities(self, kind: str) -> list[str]:
        return ["initial_velocity"] if kind == "initial" else []


class BallEnv(NewtonEnv, Segmentable):
    """The diffsim ball; see :class:`BallConfig` for the fields."""

    name = "ball"
    segment_graph = True  # its rows are written at segment_base[0] + slot (NewtonEnv.write_offset)
    Config = BallConfig
    initial_quantities: ClassVar[dict[str, str]] = {"initial_velocity": "particle_qd"}  # task=initial trains it

    CONTACT = ContactMaterial(ke=1.0e4, kd=1.0e1, kf=0.0, mu=0.2)

    def __init__(self, config: EnvConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        import newton

        super().__init__(config, device=device, **fields)
        self.dt = self.config.dt
        cfg = self.config
        self.targets = world_targets(cfg.target, cfg.target_spread, self.world_count, cfg.seed, self.device)
        self.collision_pipeline = newton.CollisionPipeline(
            self.model, broad_phase="explicit", soft_contact_gap=10.0, requires_grad=True
        )
        self.contacts = self.collision_pipeline.contacts()
        self.collision_pipeline.collide(self.state(0), self.contacts)

    def build_model(self) -> newton.Model:
        import newton

        scene = newton.ModelBuilder(up_axis=newton.Axis.Z)
        scene.add_particle(pos=wp.vec3(0.0, -0.5, 1.0), vel=wp.vec3(*self.config.initial_velocity), mass=1.0)
        add_wall_and_ground(scene, self.CONTACT)
        model = finalize_worlds(scene, self.world_count, self.device)
        set_soft_contact(model, self.CONTACT)
        return model

    def build_solver(self) -> newton.solvers.SolverSemiImplicit:
        import newton

        return newton.solvers.SolverSemiImplicit(self.model)

    def contacts_at(self, t: int) -> newton.Contacts:
        return self.contacts  # one frozen contact set, read (never written) by every step

    def extra_arrays(self) -> list[wp.array]:
        return [value for value in vars(self.contacts).values() if isinstance(value, wp.array)]

    def write_observables(self, t: int) -> None:
        self.write_offset("to_target", t, self.targets, per_world=1, count=1)

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        return {
            "final_distance_to_target_m": final_distances(trajectory, "to_target"),
            "initial_velocity_m_per_s": np.round(self.initial["particle_qd"].numpy(), 4).tolist(),
        }
