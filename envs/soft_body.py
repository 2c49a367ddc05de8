"""Newton's diffsim soft body: tune a jelly cube's material so that it bounces to a target.

A port of ``newton/examples/diffsim/example_diffsim_soft_body.py`` (newton 1.8, its default
anisotropic mode): a 2 x 2 x 2 grid of 0.1 m cells (27 particles, 40 tetrahedra, 0.2 kg in
all) launched at (0, 6, -6) m/s from (-0.1, -0.5, 1) m against a wall box and the ground
(soft contacts ke = 1e3, kd = 1, kf = 0, mu = 0.2, restitution 1), ``SolverSemiImplicit`` at
dt = 1/960 s for 60 x 16 = 960 steps. Young's modulus 1.5e4 Pa and Poisson ratio 0.3 give
every tetrahedron the Lame parameters mu = 5769 Pa and lambda = 8654 Pa to start with.
The trained quantity is the per-tetrahedron (mu, lambda) (``task=physical``), kept in the
example's bounds [500, 4e6] Pa after every step; the default loss is the example's, the
squared distance of the final centre of mass to the target (0, -1, 1.5) m.

The example collides every substep into a freshly allocated ``Contacts``. Here every step
has its own ``Contacts``, allocated once at construction and refilled by ``collide()``
inside the rollout (so the contacts of step t are still there when backward reaches step
t, and nothing is allocated per rollout: the capture contract). With ``world_count`` above
1 every world is a copy of the scene (``replicate``; contacts never cross worlds) with its
own target, the example's moved by a uniform draw from [-target_spread, target_spread] m.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import warp as wp

from envs._deformable import ComToTarget
from envs.walls import ContactMaterial, add_wall_and_ground, set_soft_contact
from harness.env import EnvConfig, Quantity, Segmentable, Trajectory
from harness.newton_env import NewtonEnvConfig, finalize_worlds, world_targets
from harness.schema import field

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton

LAME_BOUNDS = (500.0, 4.0e6)
"""The example's clamp of every Lame parameter after each step [Pa]."""

TETS_PER_CELL = 5
"""Tetrahedra Newton's ``add_soft_grid`` makes of one cell."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftBodyConfig(NewtonEnvConfig):
    """``configs/env/soft_body.yaml``."""

    horizon: int = field(960, minimum=1, doc="simulation steps (the example: 60 frames x 16 substeps)")
    world_count: int = field(1, minimum=1, doc="copies of the scene, each with its own target")
    dt: float = field(1.0 / 960.0, minimum=0.0, strict=True, doc="time step [s] (the example: 1/60 / 16)")
    target: tuple[float, ...] = field((0.0, -1.0, 1.5), length=3, doc="target of the centre of mass [m]")
    target_spread: float = field(0.0, minimum=0.0, doc="per-world targets drawn from target +- spread [m]")
    per_step_contacts: bool = field(
        True, doc="one Contacts per step; false refills one Contacts every step (wrong gradients, kept to show it)"
    )

    CELLS: ClassVar[int] = 2

    @property
    def tets_per_world(self) -> int:
        return self.CELLS**3 * TETS_PER_CELL

    @property
    def particles_per_world(self) -> int:
        return (self.CELLS + 1) ** 3

    def observable_dims(self) -> dict[str, int]:
        return {"com_to_target": 3}

    def gradcheck_tolerance(self) -> float:
        # Over 960 steps with contacts the float32 loss is rough at the scale of a central
        # difference: steps of 10, 100, 300 and 1000 Pa give worst errors of 0.35, 0.05, 1.6
        # and 1.4; at 100 Pa the entries above 20% of max|g| agree within 4e-3 (docs/envs.md).
        return 6.0e-2

    def quantities(self) -> dict[str, Quantity]:
        return {
            "materials": Quantity(
                (self.world_count * self.tets_per_world, 2),
                lower=LAME_BOUNDS[0],
                upper=LAME_BOUNDS[1],
                unit="Pa",
                doc="Lame parameters (mu, lambda) of every tetrahedron",
                fd_step=100.0,  # Pa; 10 Pa is below float32 resolution of the loss (docs/envs.md)
                world_major=True,
            )
        }

    def default_quantities(self, kind: str) -> list[str]:
        return ["materials"] if kind == "physical" else []


@wp.kernel
def _assign_materials(values: wp.array2d(dtype=wp.float32), tet_materials: wp.array2d(dtype=wp.float32)):
    tet = wp.tid()
    tet_materials[tet, 0] = values[tet, 0]
    tet_materials[tet, 1] = values[tet, 1]


class SoftBodyEnv(ComToTarget, Segmentable):
    """The diffsim soft body; see :class:`SoftBodyConfig` for the fields."""

    name = "soft_body"
    segment_graph = True  # its rows are written at segment_base[0] + slot (NewtonEnv.write_offset)
    Config = SoftBodyConfig

    CONTACT = ContactMaterial(ke=1.0e3, kd=1.0, kf=0.0, mu=0.2)

    def __init__(self, config: EnvConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        import newton

        super().__init__(config, device=device, **fields)
        self.dt = self.config.dt
        self._built_materials = self.model.tet_materials.numpy()[:, :2].copy()  # where training starts
        cfg = self.config
        self.targets = world_targets(cfg.target, cfg.target_spread, self.world_count, cfg.seed, self.device)
        self.collision_pipeline = newton.CollisionPipeline(
            self.model, broad_phase="explicit", soft_contact_gap=0.001, requires_grad=True
        )
        count = self.steps_kept if self.config.per_step_contacts else 1
        self.contacts = [self.collision_pipeline.contacts() for _ in range(count)]

    def build_model(self) -> newton.Model:
        import newton

        cells, cell_size, total_mass = self.config.CELLS, 0.1, 0.2
        particle_mass = total_mass / (cells + 1) ** 3
        young, poisson = 1.5e4, 0.3
        scene = newton.ModelBuilder()
        scene.default_particle_radius = 0.0005
        scene.add_soft_grid(
            pos=wp.vec3(-0.5 * cell_size * cells, -0.5, 1.0),
            rot=wp.quat_identity(),
            vel=wp.vec3(0.0, 6.0, -6.0),
            dim_x=cells,
            dim_y=cells,
            dim_z=cells,
            cell_x=cell_size,
            cell_y=cell_size,
            cell_z=cell_size,
            density=particle_mass / cell_size**3,
            k_mu=0.5 * young / (1.0 + poisson),
            k_lambda=young * poisson / ((1.0 + poisson) * (1.0 - 2.0 * poisson)),
            k_damp=0.0,
            tri_ke=1e-4,
            tri_ka=1e-4,
            tri_kd=1e-4,
            tri_drag=0.0,
            tri_lift=0.0,
            fix_bottom=False,
        )
        add_wall_and_ground(scene, self.CONTACT)
        model = finalize_worlds(scene, self.world_count, self.device)
        if model.tet_count != self.config.tets_per_world * self.world_count:
            raise RuntimeError(
                f"add_soft_grid made {model.tet_count} tetrahedra, expected {self.config.tets_per_world}"
            )
        set_soft_contact(model, self.CONTACT)
        return model

    def build_solver(self) -> newton.solvers.SolverSemiImplicit:
        import newton

        return newton.solvers.SolverSemiImplicit(self.model)

    @classmethod
    def segment_blocker(cls, config: EnvConfig) -> str | None:
        if not config.per_step_contacts:
            return "env.per_step_contacts=false overwrites one contact set every step; accepted: true"
        return super().segment_blocker(config)

    def contacts_at(self, t: int) -> newton.Contacts:
        return self.contacts[self.slot(t) if self.config.per_step_contacts else 0]

    def _contact_arrays(self) -> list[wp.array]:
        return [value for c in self.contacts for value in vars(c).values() if isinstance(value, wp.array)]

    def step_arrays(self) -> list[wp.array]:  # one contact set per step (kept)
        return self._contact_arrays() if self.config.per_step_contacts else []

    def step(self, t: int) -> None:
        # Collide inside the rollout, as the example does: the contact points follow the
        # current positions, and the gradient flows through them too.
        self.collision_pipeline.collide(self.state(t), self.contacts_at(t))
        super().step(t)

    def extra_arrays(self) -> list[wp.array]:  # one shared contact set
        return [] if self.config.per_step_contacts else self._contact_arrays()

    def quantity_value(self, name: str) -> np.ndarray:
        if name != "materials":
            return super().quantity_value(name)
        return self._built_materials.copy()

    def set_quantity(self, name: str, value: wp.array) -> None:
        if name != "materials":
            super().set_quantity(name, value)
            return
        wp.launch(
            _assign_materials,
            dim=self.model.tet_count,
            inputs=[value],
            outputs=[self.model.tet_materials],
            device=self.device,
        )

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        materials = self.model.tet_materials.numpy()[:, :2]
        return {
            **super().describe(trajectory),
            "mu_pa": [float(materials[:, 0].min()), float(materials[:, 0].max())],
            "lambda_pa": [float(materials[:, 1].min()), float(materials[:, 1].max())],
        }
