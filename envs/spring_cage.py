"""Newton's diffsim spring cage: tune eight springs so that the particle they hold reaches a target.

A port of ``newton/examples/diffsim/example_diffsim_spring_cage.py`` (newton 1.8): one
particle of 1 kg at the origin held by eight springs (stiffness 100 N/m, damping 10 N s/m)
to eight fixed anchors (mass 0), ``SolverSemiImplicit`` at dt = 1/30 s for 30 steps,
gravity on. The trained quantity is the springs' rest lengths (``task=physical``), which
start at the particle-anchor distances; the default loss is the example's, the squared
distance of the particle's final position to the target (0.375, 0.125, 0.25) m.

The example keeps rest lengths free; this port keeps them positive (a lower bound of
1e-3 m), which the example's run never reaches. With ``world_count`` above 1 every world is
a copy of the cage (Newton's ``replicate``) with its own target, the example's moved by a
uniform draw from [-target_spread, target_spread] m per axis (seeded).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from harness.env import EnvConfig, Quantity, Segmentable, Trajectory
from harness.newton_env import NewtonEnv, NewtonEnvConfig, final_distances, finalize_worlds, world_targets
from harness.schema import field

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton

ANCHORS = (
    (0.2, -0.7, 0.8),
    (1.1, 0.0, 0.2),
    (-1.2, 0.1, 0.1),
    (0.4, 0.6, 0.4),
    (-0.2, 0.7, -0.9),
    (0.1, -0.8, -0.8),
    (-0.8, -0.9, 0.2),
    (-0.1, 1.0, 0.4),
)
"""The fixed ends of the springs [m], as in the example."""

MIN_REST_LENGTH = 1.0e-3
"""Smallest rest length a spring may be given [m]."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpringCageConfig(NewtonEnvConfig):
    """``configs/env/spring_cage.yaml``."""

    horizon: int = field(30, minimum=1, doc="simulation steps (the example: 30 frames of 1/30 s)")
    world_count: int = field(1, minimum=1, doc="copies of the cage, each with its own target")
    dt: float = field(1.0 / 30.0, minimum=0.0, strict=True, doc="time step [s]")
    target: tuple[float, ...] = field((0.375, 0.125, 0.25), length=3, doc="target of the particle [m]")
    target_spread: float = field(0.0, minimum=0.0, doc="per-world targets drawn from target +- spread [m]")
    stiffness: float = field(100.0, minimum=0.0, doc="spring stiffness [N/m]")
    damping: float = field(10.0, minimum=0.0, doc="spring damping [N s/m]")

    def observable_dims(self) -> dict[str, int]:
        return {"to_target": 3}

    def quantities(self) -> dict[str, Quantity]:
        shape = (self.world_count * len(ANCHORS),)
        return {
            "rest_length": Quantity(
                shape,
                lower=MIN_REST_LENGTH,
                unit="m",
                doc="rest length of every spring, world by world",
                world_major=True,
            )
        }

    def default_quantities(self, kind: str) -> list[str]:
        return ["rest_length"] if kind == "physical" else []


class SpringCageEnv(NewtonEnv, Segmentable):
    """The diffsim spring cage; see :class:`SpringCageConfig` for the fields."""

    name = "spring_cage"
    segment_graph = True  # its rows are written at segment_base[0] + slot (NewtonEnv.write_offset)
    Config = SpringCageConfig

    def __init__(self, config: EnvConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        super().__init__(config, device=device, **fields)
        self.dt = self.config.dt
        self._built_rest_length = self.model.spring_rest_length.numpy().copy()  # where training starts
        cfg = self.config
        self.targets = world_targets(cfg.target, cfg.target_spread, self.world_count, cfg.seed, self.device)

    def build_model(self) -> newton.Model:
        import newton

        scene = newton.ModelBuilder()
        scene.add_particle((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), 1.0)
        for anchor in ANCHORS:
            scene.add_particle(anchor, (0.0, 0.0, 0.0), 0.0)
        for i in range(1, scene.particle_count):
            scene.add_spring(0, i, self.config.stiffness, self.config.damping, 0)
        return finalize_worlds(scene, self.world_count, self.device)

    def build_solver(self) -> newton.solvers.SolverSemiImplicit:
        import newton

        return newton.solvers.SolverSemiImplicit(self.model)

    def quantity_value(self, name: str) -> np.ndarray:
        if name != "rest_length":
            return super().quantity_value(name)
        return self._built_rest_length.copy()

    def set_quantity(self, name: str, value: wp.array) -> None:
        if name != "rest_length":
            super().set_quantity(name, value)
            return
        wp.copy(self.model.spring_rest_length, value)

    def write_observables(self, t: int) -> None:
        self.write_offset("to_target", t, self.targets, per_world=len(ANCHORS) + 1, count=1)

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        return {
            "final_distance_to_target_m": final_distances(trajectory, "to_target"),
            "rest_length_m": np.round(self.model.spring_rest_length.numpy(), 4).tolist(),
        }
