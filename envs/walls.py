"""The scene shared by Newton's ball and soft_body diffsim examples (newton 1.8): a fixed
box wall 2 m along +y (half extents 1 x 0.25 x 1 m, centre 1 m up) and a ground plane,
with one contact material for the shapes and for particle-shape (soft) contacts."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import warp as wp

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton


@dataclasses.dataclass(frozen=True)
class ContactMaterial:
    """Penalty contact coefficients: stiffness ``ke``, damping ``kd``, friction stiffness
    ``kf``, friction coefficient ``mu``."""

    ke: float
    kd: float
    kf: float
    mu: float


def add_wall_and_ground(scene: newton.ModelBuilder, material: ContactMaterial) -> None:
    """Add the examples' wall and ground plane to ``scene``."""
    import newton

    cfg = newton.ModelBuilder.ShapeConfig(ke=material.ke, kf=material.kf, kd=material.kd, mu=material.mu)
    scene.add_shape_box(
        body=-1, xform=wp.transform(wp.vec3(0.0, 2.0, 1.0), wp.quat_identity()), hx=1.0, hy=0.25, hz=1.0, cfg=cfg
    )
    scene.add_ground_plane(cfg=cfg)


def set_soft_contact(model: Any, material: ContactMaterial) -> None:
    """Give ``model``'s particle-shape contacts the same material, fully elastic."""
    model.soft_contact_ke = material.ke
    model.soft_contact_kf = material.kf
    model.soft_contact_kd = material.kd
    model.soft_contact_mu = material.mu
    model.soft_contact_restitution = 1.0
