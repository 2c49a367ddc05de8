"""The robot's model: the file's builder edited by the config, replicated over worlds on a ground plane.

:func:`build` is what :meth:`RobotEnv.build_model <envs.robot.env.RobotEnv.build_model>` does:
the file read once (:func:`~envs.robot.layout.load_robot`), its masses recomputed at
``env.density`` (:func:`set_density`), cylinders rounded, the joints' armature, damping, stiffness and
limits and the shapes' contact materials set where the config gives them, the start pose (the
given joint coordinates or the file's clamped into their limits, the root lifted so the lowest
collision point sits ``clearance`` above the ground), the drive's rest targets, then ``world_count``
overlapping copies on one ground plane and the collision pipeline.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from envs.robot.config import RobotConfig
from envs.robot.layout import RobotFileError, RobotLayout, joint_limit, load_robot

if TYPE_CHECKING:
    import newton

__all__ = ["RobotModel", "build"]


@dataclasses.dataclass(frozen=True)
class RobotModel:
    """What :func:`build` gives the env."""

    model: newton.Model
    pipeline: newton.CollisionPipeline
    kd_depth: float | None  # Hunt-Crossley damping per metre of depth [N s/m^2]; None: the material's kd
    base_q: np.ndarray  # float32, one world's start coordinates (the root's too)


def build(cfg: RobotConfig, layout: RobotLayout, world_count: int, device: wp.context.Devicelike) -> RobotModel:
    """``world_count`` copies of ``cfg``'s robot on one ground plane (module docstring).

    Raises:
        RobotFileError: ``env.start_joint_q`` of the wrong length, or what :func:`load_robot` refuses.
    """
    import newton

    single = load_robot(cfg)
    if cfg.density is not None:
        set_density(single, cfg.density)
    if cfg.round_cylinders:  # after the masses: only how the shapes touch changes
        round_cylinders(single)
    for d in set(layout.joint_dofs):
        for value, target in ((cfg.armature, "joint_armature"), (cfg.joint_damping, "joint_damping"),
                              (cfg.joint_stiffness, "joint_stiffness"), (cfg.limit_ke, "joint_limit_ke"),
                              (cfg.limit_kd, "joint_limit_kd")):  # fmt: skip
            if value is not None:
                getattr(single, target)[d] = value
    if cfg.limit_kd_everywhere:  # dflex: -limit_kd qd at every q; Newton's acts only past a limit
        for d in dflex_damped_dofs(single):
            single.joint_damping[d] += cfg.limit_kd if cfg.limit_kd is not None else single.joint_limit_kd[d]
            single.joint_limit_kd[d] = 0.0
    if cfg.root_armature is not None:
        for d in layout.root_dofs:
            single.joint_armature[d] = cfg.root_armature
    shapes = collision_shapes(single)
    ground = {}
    ke = cfg.contact_ke
    if ke is None:
        ke = float(np.mean([single.shape_material_ke[s] for s in shapes])) if shapes else 0.0
    kd_depth = cfg.contact_kd_depth
    if kd_depth is None and cfg.contact_kd is None and cfg.contact_kd_depth_ratio is not None:
        kd_depth = cfg.contact_kd_depth_ratio * ke  # the file's stiffness, Hunt-Crossley's damping
    kd = 0.0 if kd_depth is not None else cfg.contact_kd  # Hunt-Crossley replaces it
    materials = {"ke": cfg.contact_ke, "kd": kd, "kf": cfg.contact_kf, "mu": cfg.contact_mu}
    for value, target in ((value, f"shape_material_{name}") for name, value in materials.items()):
        values = getattr(single, target)
        for s in shapes:
            if value is not None:
                values[s] = value
        # the contact kernel averages the two shapes' materials: the ground takes the robot's
        ground[target] = float(np.mean([values[s] for s in shapes])) if shapes else None
    base_q = start_pose(cfg, layout, single)
    if cfg.control == "position":  # the env's drive kernel drives these dofs (limited): Newton's own adds
        for d, c in zip(layout.actuated_dofs, layout.target_coords, strict=True):  # nothing; its target at
            single.joint_target_ke[d], single.joint_target_kd[d] = 0.0, 0.0  # rest is the start pose
            single.joint_target_q[c] = float(base_q[c])
    builder = newton.ModelBuilder(up_axis=single.up_axis)
    builder.replicate(single, world_count, spacing=(0.0, 0.0, 0.0))  # overlapping worlds on one ground
    plane = newton.ModelBuilder.ShapeConfig(
        ke=ground["shape_material_ke"], kd=ground["shape_material_kd"], kf=ground["shape_material_kf"],
        mu=ground["shape_material_mu"],
    )  # fmt: skip
    builder.add_ground_plane(cfg=plane)
    model = builder.finalize(device=device, requires_grad=True)
    per_world = 4 * len(shapes) + 8  # a few contacts per shape against the ground
    pipeline = newton.CollisionPipeline(model, requires_grad=False, rigid_contact_max=per_world * world_count)
    return RobotModel(model=model, pipeline=pipeline, kd_depth=kd_depth, base_q=base_q.astype(np.float32))


def dflex_damped_dofs(single: Any) -> list[int]:
    """The dofs dflex's joint law damps by the limit's kd at every coordinate (``jcalc_tau``'s
    prismatic and revolute branch): those of slides and hinges, alone or joined into one of
    Newton's D6 joints, a planar root's too (DiffRL's Hopper: its torso's x, z and pitch); not a
    free or ball joint's."""
    import newton

    kinds = (newton.JointType.REVOLUTE, newton.JointType.PRISMATIC, newton.JointType.D6)
    ends = [*single.joint_qd_start[1:], single.joint_dof_count]
    return [d for j, kind in enumerate(single.joint_type) if kind in kinds
            for d in range(single.joint_qd_start[j], ends[j])]  # fmt: skip


def start_pose(cfg: RobotConfig, layout: RobotLayout, single: Any) -> np.ndarray:
    """One world's start coordinates (float64), also written into ``single``'s ``joint_q``: the
    given joint coordinates or the file's clamped into their limits, and a floating root at
    ``start_height`` or with its lowest collision point ``clearance`` above the ground."""
    import newton

    base_q = np.array(single.joint_q, dtype=np.float64)
    coords = list(layout.joint_coords)
    if cfg.start_joint_q is not None:
        if len(cfg.start_joint_q) != len(coords):
            raise RobotFileError(
                f"env.start_joint_q: needs {len(coords)} values (one per joint coordinate besides the root), "
                f"got {len(cfg.start_joint_q)}"
            )
        base_q[coords] = cfg.start_joint_q
    else:
        clamp_into_limits(layout, single, base_q)
    if not layout.root_free and cfg.start_height is not None:
        raise RobotFileError(
            f"env.start_height: '{cfg.asset}' has no floating base to place (its root body moves on joints of "
            "its own); accepted: null (the file's pose), or env.start_joint_q"
        )
    if layout.root_free:
        up = "xyz".index(cfg.up_axis)
        base_q[0:3] = 0.0
        single.joint_q[:] = base_q.tolist()
        probe = single.finalize(device="cpu", requires_grad=False)
        state = probe.state()
        newton.eval_fk(probe, probe.joint_q, probe.joint_qd, state)
        lowest = lowest_point(single, probe, state, up)
        base_q[up] = cfg.start_height if cfg.start_height is not None else cfg.clearance - lowest
    single.joint_q[:] = base_q.tolist()
    return base_q


def clamp_into_limits(layout: RobotLayout, single: Any, q: np.ndarray) -> None:
    """Joint coordinates at zero, moved into their limits (a file's zero pose may violate them)."""
    for coord, dof in layout.scalar_joints:
        lo, hi = joint_limit(single.joint_limit_lower[dof]), joint_limit(single.joint_limit_upper[dof])
        if lo <= hi:
            q[coord] = min(max(q[coord], lo), hi)


# -- builder edits ---------------------------------------------------------------------------------


def collision_shapes(builder: Any) -> list[int]:
    import newton

    return [s for s, flags in enumerate(builder.shape_flags) if int(flags) & int(newton.ShapeFlags.COLLIDE_SHAPES)]


def set_density(builder: Any, density: float) -> None:
    """Every body's mass, centre of mass and inertia recomputed from its collision shapes at ``density``
    (what DiffRL's loader does: it ignores an MJCF's densities and uses its own)."""
    from newton.geometry import compute_inertia_shape

    for body in range(builder.body_count):
        builder.body_mass[body] = 0.0
        builder.body_inertia[body] = wp.mat33()
        builder.body_com[body] = wp.vec3()
    for s in collision_shapes(builder):
        body = builder.shape_body[s]
        if body < 0:
            continue
        m, c, inertia = compute_inertia_shape(
            builder.shape_type[s], builder.shape_scale[s], builder.shape_source[s], density
        )
        X = builder.shape_transform[s]
        add_mass(builder, body, m, inertia, wp.transform_point(X, c), wp.transform_get_rotation(X))


def add_mass(builder: Any, body: int, m: float, inertia: wp.mat33, p: wp.vec3, q: wp.quat) -> None:
    """Add a shape's mass ``m`` [kg] to ``body`` of ``builder``: its centre of mass at ``p`` (body
    frame), its inertia about it ``inertia`` in a frame turned by ``q`` from the body's. The body's
    centre of mass moves to the mass-weighted mean and both inertias are shifted there (the
    parallel-axis theorem, ``newton.geometry.transform_inertia``), in the order and precision
    Newton's own ``add_shape`` accumulates a shape's mass, with Newton's public builder fields and
    functions only (its own accumulation is a private method)."""
    from newton.geometry import transform_inertia

    mass = builder.body_mass[body]
    total = mass + m
    if total == 0.0:
        return
    com = (builder.body_com[body] * mass + p * m) / total
    inertia = transform_inertia(
        mass, builder.body_inertia[body], com - builder.body_com[body], wp.quat_identity()
    ) + transform_inertia(m, inertia, com - p, q)
    builder.body_mass[body] = total
    builder.body_inertia[body] = inertia
    builder.body_com[body] = com
    # the builder's inverses (finalize computes the model's own from the mass and inertia above)
    builder.body_inv_mass[body] = 1.0 / total
    builder.body_inv_inertia[body] = _inverse(inertia)


def _inverse(inertia: wp.mat33) -> wp.mat33:
    """``inertia``'s inverse, in float64 on the host; zero for a singular one."""
    matrix = np.array(inertia, dtype=np.float64).reshape(3, 3)
    try:
        return wp.mat33(np.linalg.inv(matrix)) if matrix.any() else wp.mat33()
    except np.linalg.LinAlgError:
        return wp.mat33()


def round_cylinders(builder: Any) -> None:
    """Every collision cylinder becomes a capsule of the same radius and overall length."""
    import newton

    for s in collision_shapes(builder):
        if int(builder.shape_type[s]) == int(newton.GeoType.CYLINDER):
            radius, half, _ = builder.shape_scale[s]
            builder.shape_type[s] = newton.GeoType.CAPSULE
            builder.shape_scale[s] = (radius, max(half - radius, 0.0), 0.0)


def lowest_point(builder: Any, model: Any, state: Any, up: int) -> float:
    """The lowest point along ``up`` of the collision shapes of world 0 at ``state``'s body poses [m]."""
    import newton

    body_q = state.body_q.numpy()
    low = math.inf
    for s in collision_shapes(builder):
        body = builder.shape_body[s]
        X = wp.transform(*body_q[body]) if body >= 0 else wp.transform_identity()
        X = X * builder.shape_transform[s]
        center = np.array(wp.transform_get_translation(X))
        rot = wp.transform_get_rotation(X)
        axes = np.array([wp.quat_rotate(rot, wp.vec3(*e)) for e in np.eye(3)])  # local x, y, z in the world
        kind, scale = int(builder.shape_type[s]), np.array(builder.shape_scale[s], dtype=np.float64)
        if kind == int(newton.GeoType.SPHERE):
            low = min(low, center[up] - scale[0])
        elif kind == int(newton.GeoType.CAPSULE):
            ends = center[up] + np.array([1.0, -1.0]) * scale[1] * axes[2][up]
            low = min(low, ends.min() - scale[0])
        elif kind == int(newton.GeoType.BOX):
            corners = [center[up] + sum(sx * scale[i] * axes[i][up] for i, sx in enumerate(signs))
                       for signs in np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).T.reshape(-1, 3)]  # fmt: skip
            low = min(low, min(corners))
        elif kind == int(newton.GeoType.CYLINDER):
            rim = scale[0] * math.sqrt(max(0.0, 1.0 - axes[2][up] ** 2))
            ends = center[up] + np.array([1.0, -1.0]) * scale[1] * axes[2][up]
            low = min(low, ends.min() - rim)
        elif kind == int(newton.GeoType.PLANE):
            continue
        else:  # meshes, cones, ellipsoids: the shape's bounding sphere (conservative)
            radius = float(model.shape_collision_radius.numpy()[s])
            low = min(low, center[up] - radius)
    return low
