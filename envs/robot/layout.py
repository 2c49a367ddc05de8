"""Reading a robot file: Newton's importers, and the joints, dofs and actions of one world.

:func:`load_robot` gives a ``newton.ModelBuilder`` holding one robot from ``env.asset`` (an MJCF,
URDF or USD file, or ``newton:NAME`` in Newton's bundled assets), or refuses the file in one line
(:class:`RobotFileError`). :func:`robot_layout` reads what the env offers from it without building
a simulation (:class:`RobotLayout`: the actuated dofs and their torques or drive gains, the root,
the joint coordinates and limits), once per file and choices. Newton is imported here only where a
file is read, so a refused command line does without it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import xml.etree.ElementTree as ElementTree
from typing import Any, Protocol

import warp as wp

__all__ = [
    "ASSET_KINDS",
    "HARNESS_ASSETS",
    "NEWTON_ASSETS",
    "RobotFileError",
    "RobotLayout",
    "asset_path",
    "joint_limit",
    "load_robot",
    "robot_layout",
]

ASSET_KINDS = {".xml": "mjcf", ".mjcf": "mjcf", ".urdf": "urdf", ".usd": "usd", ".usda": "usd", ".usdc": "usd"}
"""File extensions the robot env loads, and the Newton importer each goes to."""

NEWTON_ASSETS = "newton:"
"""Prefix of an asset path inside Newton's bundled assets (``newton:nv_ant.xml``)."""

HARNESS_ASSETS = "harness:"
"""Prefix of an asset path among the robot files the harness brings (``harness:hopper.xml``, in
``envs/robot/assets``)."""

NO_LIMIT = 1.0e9
"""Newton's 'no limit': a joint limit of this size or more is none."""

FILE_NO_LIMIT = 1.0e5
"""An effort or velocity limit of this size or more is none: Newton's importers write 1e6 where a
file gives none."""


class RobotFileError(ValueError):
    """A robot file that cannot be loaded, or names that it does not have (one line)."""


class FileChoices(Protocol):
    """What of a config reading the file takes (:class:`~envs.robot.config.RobotConfig` has it all)."""

    asset: str
    up_axis: str
    self_collisions: bool
    actuated: tuple[str, ...] | None
    torque: tuple[float, ...] | None
    default_torque: float
    root: str | None
    control: str
    target_scale: tuple[float, ...]
    target_ke: tuple[float, ...] | None
    target_kd: tuple[float, ...] | None
    effort_limit: tuple[float, ...] | None
    velocity_limit: tuple[float, ...] | None


@dataclasses.dataclass(frozen=True)
class RobotLayout:
    """One world's joints and dofs, as the file gives them (indices within a world)."""

    joint_names: tuple[str, ...]
    body_names: tuple[str, ...]
    root_body: int
    root_free: bool  # the root is a floating base (7 coordinates, 6 dofs)
    coord_count: int
    dof_count: int
    body_count: int
    shape_count: int
    actuated_dofs: tuple[int, ...]
    actuated_names: tuple[str, ...]
    torque: tuple[float, ...]
    target_coords: tuple[int, ...]  # each actuated dof's coordinate (its joint_target_q entry)
    target_scale: tuple[float, ...]  # control=position: offset per unit action, per actuated dof
    target_ke: tuple[float, ...]  # control=position: drive stiffness and damping, per actuated dof
    target_kd: tuple[float, ...]
    effort_limit: tuple[float, ...]  # control=position: the drive's torque limit (inf: none) ...
    velocity_limit: tuple[float, ...]  # ... and the speed where its torque along the motion falls to 0 (inf: none)
    drive_lower: tuple[float, ...]  # the actuated dofs' joint limits as the importer gives them (a huge
    drive_upper: tuple[float, ...]  # value where none): past one the drive is cut, as Newton's
    joint_coords: tuple[int, ...]  # every coordinate but the root's
    joint_dofs: tuple[int, ...]  # every dof but the root's
    scalar_joints: tuple[tuple[int, int], ...]  # (coordinate, dof) of every one-coordinate joint but the root
    lower: tuple[float, ...]  # their limits (-inf, inf where the file gives none)
    upper: tuple[float, ...]
    root_dofs: tuple[int, ...] = ()  # the root joint's dofs (observation piece root_qd)
    root_q_coords: tuple[int, ...] = ()  # its coordinates but the slides along the ground (piece root_q)
    root_slides: tuple[int, ...] = ()  # a root that is not a floating base: its slides' coordinates
    root_hinges: tuple[int, ...] = ()  # ... and its hinges' (start noise: position, rotation)
    root_translation: tuple[int, ...] = ()  # a floating base: its position's three coordinates (env.recenter)
    recenter_blocker: str | None = None  # why env.recenter cannot move this robot (None: it can)

    def piece_width(self, piece: str) -> int:
        widths = {
            "root_height": 1, "root_position": 3, "root_rotation": 4, "root_linear_velocity": 3,
            "root_angular_velocity": 3, "joint_q": len(self.joint_coords), "joint_qd": len(self.joint_dofs),
            "up": 1, "heading": 1, "previous_action": len(self.actuated_dofs), "root_q": len(self.root_q_coords),
            "root_qd": len(self.root_dofs),
        }  # fmt: skip
        return widths[piece]

    def observation_width(self, pieces: tuple[str, ...]) -> int:
        return sum(self.piece_width(p) for p in pieces)


_LAYOUTS: dict[tuple, RobotLayout] = {}


def asset_path(asset: str) -> str:
    """The file an ``env.asset`` names: a path, ``newton:NAME`` in Newton's bundled assets, or
    ``harness:NAME`` among the harness's own (``envs/robot/assets``)."""
    if asset.startswith(HARNESS_ASSETS):
        return os.path.join(os.path.dirname(__file__), "assets", asset[len(HARNESS_ASSETS) :])
    if asset.startswith(NEWTON_ASSETS):
        import newton

        return os.path.join(os.path.dirname(newton.__file__), "examples", "assets", asset[len(NEWTON_ASSETS) :])
    return os.path.abspath(os.path.expanduser(asset))


def _short(label: str) -> str:
    return str(label).rsplit("/", 1)[-1]


def load_robot(cfg: FileChoices) -> Any:
    """A ``newton.ModelBuilder`` holding one robot from ``cfg.asset`` (no ground, no placement).

    Raises:
        RobotFileError: One line naming ``env.asset``: a missing file, an unknown kind, a file
            Newton's importer cannot read, a USD file without ``usd-core``.
    """
    import newton

    from harness import init_warp

    init_warp(check_environment=False)  # the builder's first Warp call would, with the CUDA driver warning
    path = asset_path(cfg.asset)
    kind = ASSET_KINDS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise RobotFileError(
            f"env.asset: '{cfg.asset}' is not a robot file Newton imports; "
            f"accepted: {', '.join(sorted(ASSET_KINDS))} files"
        )
    if not os.path.isfile(path):
        raise RobotFileError(
            f"env.asset: no file '{path}'; accepted: an MJCF, URDF or USD file, newton:NAME or harness:NAME"
        )
    up = {"x": newton.Axis.X, "y": newton.Axis.Y, "z": newton.Axis.Z}[cfg.up_axis]
    builder = newton.ModelBuilder(up_axis=up)
    try:
        if kind == "mjcf":
            _check_xml(path, cfg.asset, "mujoco")
            builder.add_mjcf(
                path, enable_self_collisions=cfg.self_collisions, ignore_names=_mjcf_planes(path), up_axis=up
            )
        elif kind == "urdf":
            _check_xml(path, cfg.asset, "robot")
            builder.add_urdf(path, floating=True, enable_self_collisions=cfg.self_collisions, up_axis=up)
        else:
            try:
                import pxr  # noqa: F401  (usd-core)
            except ImportError:
                raise RobotFileError(
                    f"env.asset: '{cfg.asset}' is a USD file and the package usd-core is not installed; "
                    "accepted: pip install usd-core, or an MJCF or URDF file"
                ) from None
            builder.add_usd(path, enable_self_collisions=cfg.self_collisions)
    except RobotFileError:
        raise
    except Exception as exc:  # Newton's importers raise many kinds; the user needs the file and the reason
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise RobotFileError(
            f"env.asset: Newton could not load '{cfg.asset}' ({type(exc).__name__}: {reason[:200]})"
        ) from None
    if builder.body_count == 0 or builder.joint_count == 0:
        raise RobotFileError(f"env.asset: '{cfg.asset}' holds no articulated body; accepted: a robot with joints")
    return builder


def _check_xml(path: str, shown: str, root: str) -> None:
    try:
        tree = ElementTree.parse(path)
    except ElementTree.ParseError as exc:
        raise RobotFileError(f"env.asset: '{shown}' is not well-formed XML ({exc})") from None
    if tree.getroot().tag != root:
        raise RobotFileError(f"env.asset: '{shown}' has root element <{tree.getroot().tag}>; accepted: <{root}>")


def _mjcf_planes(path: str) -> tuple[str, ...]:
    """Names of the MJCF's plane geoms: the env brings its own ground."""
    found = []
    for geom in ElementTree.parse(path).getroot().iter("geom"):
        if geom.get("type") == "plane" and geom.get("name"):
            found.append(geom.get("name"))
    return tuple(found)


def _mjcf_gears(builder: Any) -> dict[int, float]:
    """dof -> the gear of the MJCF motor acting on it (Newton keeps MuJoCo's actuators as custom attributes)."""
    attributes = getattr(builder, "custom_attributes", {})
    if "mujoco:actuator_trnid" not in attributes or "mujoco:actuator_gear" not in attributes:
        return {}
    trn = attributes["mujoco:actuator_trnid"].values
    gear = attributes["mujoco:actuator_gear"].values
    kinds = attributes["mujoco:actuator_trntype"].values if "mujoco:actuator_trntype" in attributes else [0] * len(trn)
    found = {}
    for target, g, kind in zip(_values(trn), _values(gear), _values(kinds), strict=False):
        if int(kind) == 0:  # a joint transmission
            found[int(target[0])] = float(g[0])
    return found


def _per_dof(name: str, given: tuple[float, ...], count: int) -> tuple[float, ...]:
    """``env.<name>``: one value for every actuated dof, or one each."""
    if len(given) not in (1, count):
        raise RobotFileError(f"env.{name}: needs 1 or {count} values (one per actuated dof), got {len(given)}")
    return tuple(float(v) for v in given) * (count if len(given) == 1 else 1)


def _drive(builder: Any, cfg: FileChoices, dofs: list[int], coords: list[int]) -> dict[str, tuple[float, ...]]:
    """The drive's scale and gains per actuated dof (null gains: the file's); for ``control:
    position``, refused in one line where a dof has no coordinate of its own or no stiffness."""
    found = {"target_scale": _per_dof("target_scale", cfg.target_scale, len(dofs))}
    for name, own in (("target_ke", builder.joint_target_ke), ("target_kd", builder.joint_target_kd)):
        given = getattr(cfg, name)
        found[name] = tuple(float(own[d]) for d in dofs) if given is None else _per_dof(name, given, len(dofs))
    if cfg.control == "position":
        if -1 in coords:
            raise RobotFileError(
                f"env.control: position drives one coordinate per dof, and '{cfg.asset}' actuates a ball joint; "
                "accepted: torque, or env.actuated without it"
            )
        if not any(found["target_ke"]):
            raise RobotFileError(
                f"env.target_ke: control=position needs a drive stiffness and '{cfg.asset}' gives none; "
                "accepted: one value [N m/rad] or one per actuated dof"
            )
    for name in ("effort_limit", "velocity_limit"):
        if cfg.control != "position" and getattr(cfg, name) is not None:
            raise RobotFileError(
                f"env.{name}: limits the position drive, and env.control is {cfg.control} (an action's torque is "
                "at most env.torque); accepted: null, or env.control=position"
            )
    for name, own in (("effort_limit", "joint_effort_limit"), ("velocity_limit", "joint_velocity_limit")):
        given = getattr(cfg, name)
        if given is None:  # the file's; Newton's importers write 1e6 where it gives none
            values = list(getattr(builder, own, []))
            found[name] = tuple(float(values[d]) if d < len(values) and 0.0 < values[d] < FILE_NO_LIMIT else math.inf
                                for d in dofs)  # fmt: skip
        else:
            found[name] = _per_dof(name, given, len(dofs))
    found["drive_lower"] = tuple(float(builder.joint_limit_lower[d]) for d in dofs)
    found["drive_upper"] = tuple(float(builder.joint_limit_upper[d]) for d in dofs)
    return found


def joint_limit(value: float) -> float:
    """A joint limit, with Newton's 'no limit' (|value| >= :data:`NO_LIMIT`) as an infinity."""
    return float(value) if abs(float(value)) < NO_LIMIT else math.copysign(math.inf, float(value))


def _values(values: Any) -> list:
    return list(values.values()) if isinstance(values, dict) else list(values)


def robot_layout(cfg: FileChoices) -> RobotLayout:
    """The layout of ``cfg.asset`` with ``cfg``'s choices (cached per file and choices)."""
    path = asset_path(cfg.asset)
    key = (path, os.path.getmtime(path) if os.path.isfile(path) else 0,
           cfg.actuated, cfg.torque, cfg.default_torque, cfg.root, cfg.up_axis, cfg.self_collisions,
           cfg.control, cfg.target_scale, cfg.target_ke, cfg.target_kd, cfg.effort_limit,
           cfg.velocity_limit)  # fmt: skip
    if key not in _LAYOUTS:
        _LAYOUTS[key] = _layout(load_robot(cfg), cfg)
    return _LAYOUTS[key]


def _layout(builder: Any, cfg: FileChoices) -> RobotLayout:
    import newton

    joint_names = tuple(_short(label) for label in builder.joint_label)
    body_names = tuple(_short(label) for label in builder.body_label)
    free = [j for j, kind in enumerate(builder.joint_type) if int(kind) == int(newton.JointType.FREE)]
    if cfg.root is None:
        if not free:
            raise RobotFileError(
                f"env.root: '{cfg.asset}' has no floating base to take as the root; "
                f"accepted: one of {', '.join(body_names)}"
            )
        root_body = int(builder.joint_child[free[0]])
    else:
        if cfg.root not in body_names:
            raise RobotFileError(
                f"env.root: '{cfg.root}' is not a body of '{cfg.asset}'; accepted: {', '.join(body_names)}"
            )
        root_body = body_names.index(cfg.root)
    root_joint = next((j for j, child in enumerate(builder.joint_child) if int(child) == root_body), None)
    root_free = root_joint is not None and root_joint in free
    q_start, qd_start = list(builder.joint_q_start), list(builder.joint_qd_start)
    coord_count, dof_count = builder.joint_coord_count, builder.joint_dof_count

    def span(starts: list[int], total: int, j: int) -> range:
        return range(starts[j], starts[j + 1] if j + 1 < len(starts) else total)

    movable = [
        j for j, kind in enumerate(builder.joint_type)
        if j != root_joint and int(kind) != int(newton.JointType.FIXED) and len(span(qd_start, dof_count, j)) > 0
    ]  # fmt: skip
    if cfg.actuated is None:
        actuated_joints = movable
    else:
        names = [joint_names[j] for j in movable]
        actuated_joints = []
        for name in cfg.actuated:
            if name not in names:
                raise RobotFileError(
                    f"env.actuated: '{name}' is not a movable joint of '{cfg.asset}'; accepted: {', '.join(names)}"
                )
            actuated_joints.append(movable[names.index(name)])
    dofs = [d for j in actuated_joints for d in span(qd_start, dof_count, j)]
    if not dofs:
        raise RobotFileError(f"env.actuated: '{cfg.asset}' has no movable joint besides the root to actuate")
    gears = _mjcf_gears(builder)
    effort = list(getattr(builder, "joint_effort_limit", []))
    if cfg.torque is not None:
        torque = _per_dof("torque", cfg.torque, len(dofs))
    else:
        torque = []
        for d in dofs:
            if d in gears:
                torque.append(gears[d])
            elif d < len(effort) and 0.0 < effort[d] < FILE_NO_LIMIT:  # a URDF's effort limit
                torque.append(float(effort[d]))
            else:
                torque.append(cfg.default_torque)
        torque = tuple(torque)
    target_coords = []  # each actuated dof's coordinate: hinges, slides, D6 axes have one; a ball joint's none (-1)
    for j in actuated_joints:
        own_coords, own_dofs = span(q_start, coord_count, j), span(qd_start, dof_count, j)
        target_coords.extend(own_coords if len(own_coords) == len(own_dofs) else [-1] * len(own_dofs))
    target = _drive(builder, cfg, dofs, target_coords)
    root_coords = list(span(q_start, coord_count, root_joint)) if root_joint is not None else []
    root_dofs = list(span(qd_start, dof_count, root_joint)) if root_joint is not None else []
    joint_coords = tuple(c for c in range(coord_count) if c not in root_coords)
    joint_dofs = tuple(d for d in range(dof_count) if d not in root_dofs)
    scalar = tuple(
        (q_start[j], qd_start[j]) for j in range(builder.joint_count)
        if j != root_joint and len(span(q_start, coord_count, j)) == 1 and len(span(qd_start, dof_count, j)) == 1
    )  # fmt: skip
    lower = tuple(joint_limit(builder.joint_limit_lower[d]) for _, d in scalar)
    upper = tuple(joint_limit(builder.joint_limit_upper[d]) for _, d in scalar)
    root = _root_coordinates(builder, cfg, root_joint, root_free, root_coords, root_dofs)
    root["recenter_blocker"] = _recenter_blocker(builder, root_joint, root_free, free)
    return RobotLayout(
        joint_names=joint_names, body_names=body_names, root_body=root_body, root_free=root_free,
        coord_count=coord_count, dof_count=dof_count, body_count=builder.body_count, shape_count=builder.shape_count,
        actuated_dofs=tuple(dofs), actuated_names=tuple(joint_names[j] for j in actuated_joints), torque=torque,
        target_coords=tuple(target_coords), target_scale=target["target_scale"], target_ke=target["target_ke"],
        target_kd=target["target_kd"], effort_limit=target["effort_limit"], velocity_limit=target["velocity_limit"],
        drive_lower=target["drive_lower"], drive_upper=target["drive_upper"], joint_coords=joint_coords,
        joint_dofs=joint_dofs, scalar_joints=scalar,
        lower=lower, upper=upper, **root,
    )  # fmt: skip


def _recenter_blocker(builder: Any, joint: int | None, free: bool, floating: list[int]) -> str | None:
    """Why ``env.recenter`` cannot move the robot by its root's coordinates alone: a root that is not
    a floating base, another floating body (its coordinates would stay where they are), a floating
    base whose joint frame is turned in the world (its coordinates are not along the world's axes)."""
    import newton

    if not free:
        return "has no floating base to move (its root body moves on joints of its own)"
    others = [j for j, kind in enumerate(builder.joint_type)
              if int(kind) in (int(newton.JointType.FREE), int(newton.JointType.DISTANCE)) and j != joint]  # fmt: skip
    if others:
        return f"has {len(others) + 1} floating bodies (recenter moves the root's coordinates alone)"
    turn = [float(v) for v in builder.joint_X_p[joint][3:7]]
    if max(abs(turn[0]), abs(turn[1]), abs(turn[2])) > 1e-7:
        return "has its floating base's joint frame turned in the world (its coordinates are not along the world axes)"
    return None


def _root_coordinates(
    builder: Any, cfg: FileChoices, joint: int | None, free: bool, coords: list[int], dofs: list[int]
) -> dict[str, tuple[int, ...]]:
    """The root joint's dofs, the coordinates an observation's ``root_q`` reads (all but the slides
    along the ground: a floating base's height and quaternion; a planar root's height slide and
    hinge), and, for a root that is not a floating base, its slides' and hinges' coordinates
    (``coords``, ``dofs``: the root joint's own)."""
    if joint is None:
        return {}
    up = "xyz".index(cfg.up_axis)
    found: dict[str, tuple[int, ...]] = {"root_dofs": tuple(dofs)}
    if free:
        found["root_q_coords"] = (coords[up], *coords[3:7])
        found["root_translation"] = tuple(coords[0:3])
    elif len(coords) == len(dofs):  # one coordinate per dof: the slides first, then the hinges
        linear = int(builder.joint_dof_dim[joint][0])
        turn = builder.joint_X_p[joint][3:7]  # the joint frame's rotation in its parent (the world)
        slides, hinges, kept = [], [], []
        for i, (c, d) in enumerate(zip(coords, dofs, strict=True)):
            if i < linear:
                slides.append(c)
                axis = wp.quat_rotate(wp.quat(*turn), wp.vec3(*builder.joint_axis[d]))
                if abs(float(axis[up])) > 0.5:  # a slide along up (one along the ground is not observed)
                    kept.append(c)
            else:
                hinges.append(c)
                kept.append(c)
        found.update(root_q_coords=tuple(kept), root_slides=tuple(slides), root_hinges=tuple(hinges))
    else:  # a ball joint: its quaternion
        found["root_q_coords"] = tuple(coords)
    return found
