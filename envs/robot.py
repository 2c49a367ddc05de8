"""Any robot file as an env: an MJCF, URDF or USD robot on a ground plane, stepped by Featherstone.

``+env=robot env.asset=PATH`` loads the file with Newton's importers (``ModelBuilder.add_mjcf``,
``add_urdf``, ``add_usd``), replicates it over ``world_count`` worlds that overlap on one ground
plane (contacts never cross worlds: Newton's collision pipeline keeps worlds apart) and steps it
with ``SolverFeatherstone``, ``substeps`` solver steps per control step. Everything task-specific
is data in the env's YAML (docs/envs.md, "A robot of your own"): which joints are actuated and
their torque per unit action, the root body, the observation as named pieces, the reward as
weighted terms, early termination, the start and its noise. ``configs/env/ant.yaml`` (DiffRL's
Ant) and ``configs/env/quadruped.yaml`` are such YAML files and nothing else.

A file given with nothing else loads with these defaults: every non-fixed joint other than the
floating base is actuated, each degree of freedom at the asset's own torque scale (an MJCF
``<motor gear>``; a URDF ``<limit effort>``) or ``default_torque``; the root is the body of the
floating base; forward is +x and up is +z; the start height puts the asset's lowest collision
point ``clearance`` above the ground; joint coordinates start at zero clamped into their limits.
Before a run trains such a file the env simulates one world, unactuated, for ``settle_time``
seconds (:meth:`RobotEnv.settle`): a robot that leaves the ground, spins up or goes non-finite is
refused in one line saying what it did (``env.settle_time=0`` skips the check).

Every control step:

1. ``act``: the action, clipped to [-1, 1], times each actuated dof's torque scale into the
   step's ``joint_f`` (``control: torque``), or, with ``control: position``, each actuated dof's
   start coordinate plus ``target_scale`` times the action into the step's ``joint_target_q``,
   which Featherstone's joint drive tracks every substep with the torque
   ``target_ke (target - q) - target_kd qd`` (a PD drive: the way legged robots are commonly
   trained, e.g. Rudin et al. 2022; unlimited: Newton's drive has no effort limit); the clipped
   action is also written into the next state as its
   ``prev_action`` (a state field: a restart clears it, a segment saves it, an observation reads
   it, and the gradient flows from an observation of it back into the action).
2. ``step``: forward kinematics of the step's first state (its ``body_q`` from its ``joint_q``:
   a reset or a restart wrote only the joint coordinates), then ``substeps`` Featherstone steps of
   ``dt / substeps``. Every ``collide_every``-th substep runs Newton's collision pipeline on the
   substep's state into a Contacts of its own, on the tape (its narrow phase is not recorded:
   which contacts exist, their body-local points and their normals are frozen; the contact force,
   its distance and velocities are differentiated through the body poses: newton's
   ``differentiable_contacts`` model). Featherstone's mass matrix is built every
   ``mass_matrix_every``-th substep into a scratch set of its own (``M, J, P, H, L``: the solver
   rebuilds them in place, so one set shared by the tape gives backward the last matrices; the
   README's Featherstone trap), and the substeps in between read that set: holding the matrix is
   part of the forward model, and the tape differentiates what was simulated.
3. ``write_observables``: per step ``reward`` (one column per configured reward term, weighted),
   ``root_position`` [m] and ``terminated`` (1.0 where the state meets the termination rule).

Observation pieces (``observation``, in order; widths for a robot with ``n`` joint coordinates,
``m`` dofs and ``a`` actions besides the root): ``root_height`` (1), ``root_position`` (3),
``root_rotation`` (4, quaternion x y z w), ``root_linear_velocity`` (3, the centre of mass, world
frame), ``root_angular_velocity`` (3, world frame), ``joint_q`` (n), ``joint_qd`` (m),
``up`` (1: the root's up axis . world up), ``heading`` (1: the root's forward axis . world forward),
``previous_action`` (a). ``observation_scale`` multiplies a piece (DiffRL scales joint velocities
by 0.1).

Reward terms (``reward``, name -> weight; each term per world and step): ``forward_velocity``
(centre-of-mass velocity . forward [m/s]), ``upright`` (``up`` above), ``heading`` (``heading``
above), ``height`` (root height - ``height_reference`` [m]), ``action_cost`` (-sum of the squared
clipped actions), ``joint_limit_cost`` (-sum of the squared joint-limit violations [rad^2 or m^2]),
``alive`` (1). ``loss: robot`` (``configs/loss/robot.yaml``) makes the cost of a step minus their
sum, so ``task=shac`` maximises it.

Termination (``termination_height``, ``termination_up``): a state whose root is below the height,
or whose ``up`` is below the threshold, ends the world's episode; ``task=shac`` restarts the world
there and does not bootstrap its value (:class:`~harness.env.Terminates`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import xml.etree.ElementTree as ElementTree
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from harness.env import DrawsStarts, PolicyEnv, Restarts, Segmentable, Terminates, Trajectory, host_rng
from harness.newton_env import NewtonEnv, NewtonEnvConfig
from harness.schema import field

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton

__all__ = ["OBSERVATION_PIECES", "REWARD_TERMS", "RobotConfig", "RobotEnv", "RobotFileError"]

OBSERVATION_PIECES = (
    "root_height",
    "root_position",
    "root_rotation",
    "root_linear_velocity",
    "root_angular_velocity",
    "joint_q",
    "joint_qd",
    "up",
    "heading",
    "previous_action",
)
"""The named pieces an observation is made of (module docstring), in their code order."""

REWARD_TERMS = ("forward_velocity", "upright", "heading", "height", "action_cost", "joint_limit_cost", "alive")
"""The named reward terms (module docstring), in their code order."""

ASSET_KINDS = {".xml": "mjcf", ".mjcf": "mjcf", ".urdf": "urdf", ".usd": "usd", ".usda": "usd", ".usdc": "usd"}
"""File extensions the robot env loads, and the Newton importer each goes to."""

DRAW_SEED_OFFSET = 104729
"""Added to the env's seed for the device draws of ``draw_initial`` (another stream than the host
draw of the env's own starts)."""

NEWTON_ASSETS = "newton:"
"""Prefix of an asset path inside Newton's bundled assets (``newton:nv_ant.xml``)."""


class RobotFileError(ValueError):
    """A robot file that cannot be loaded, or names that it does not have (one line)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RobotConfig(NewtonEnvConfig):
    """``configs/env/robot.yaml``: the fields of any robot (module docstring)."""

    asset: str = field(
        doc="the robot file: MJCF (.xml), URDF (.urdf) or USD; 'newton:NAME' for Newton's bundled assets"
    )
    horizon: int = field(1000, minimum=1, doc="control steps per episode")
    world_count: int = field(64, minimum=1, doc="independent worlds on one ground plane, each with its own start")
    dt: float = field(1.0 / 60.0, minimum=0.0, strict=True, doc="control step [s]")
    substeps: int = field(16, minimum=1, doc="Featherstone steps per control step, each dt / substeps")
    mass_matrix_every: int = field(
        16, minimum=1, doc="build Featherstone's mass matrix every n-th substep (<= substeps)"
    )
    collide_every: int = field(1, minimum=1, doc="run the collision pipeline every n-th substep (<= substeps)")
    actuated: tuple[str, ...] | None = field(None, doc="names of the actuated joints (null: every joint but the root)")
    torque: tuple[float, ...] | None = field(
        None,
        minimum=0.0,
        doc="torque [N m] (or force [N]) per unit action, one per actuated dof or one for all (null: the asset's)",
    )
    default_torque: float = field(
        1.0, minimum=0.0, strict=True, doc="torque per unit action where the asset gives none"
    )
    control: str = field(
        "torque",
        choices=("torque", "position"),
        doc="what an action sets: torque (torque x action) or position (a PD drive's target: the start "
        "coordinate + target_scale x action)",
    )
    target_scale: tuple[float, ...] = field(
        (0.5,), minimum=0.0, doc="control=position: target offset [rad or m] per unit action, one or per dof"
    )
    target_ke: tuple[float, ...] | None = field(
        None, minimum=0.0, doc="control=position: drive stiffness [N m/rad or N/m], one or per dof (null: the file's)"
    )
    target_kd: tuple[float, ...] | None = field(
        None, minimum=0.0, doc="control=position: drive damping [N m s/rad or N s/m], one or per dof (null: the file's)"
    )
    root: str | None = field(None, doc="name of the root body (null: the floating base's body)")
    up_axis: str = field("z", choices=("x", "y", "z"), doc="the world's up axis")
    forward: tuple[float, ...] = field(
        (1.0, 0.0, 0.0), length=3, doc="forward direction in the world (and the root's frame)"
    )
    density: float | None = field(
        None, minimum=0.0, strict=True, doc="density of every shape [kg/m^3] (null: the file's)"
    )
    armature: float | None = field(None, minimum=0.0, doc="armature of every non-root dof [kg m^2] (null: the file's)")
    joint_damping: float | None = field(
        None, minimum=0.0, doc="damping of every non-root dof [N m s/rad] (null: the file's)"
    )
    limit_ke: float | None = field(None, minimum=0.0, doc="joint-limit stiffness [N m/rad] (null: the file's)")
    limit_kd: float | None = field(None, minimum=0.0, doc="joint-limit damping [N m s/rad] (null: the file's)")
    contact_ke: float | None = field(None, minimum=0.0, doc="contact stiffness [N/m] (null: the file's)")
    contact_kd: float | None = field(None, minimum=0.0, doc="contact damping [N s/m] (null: the file's)")
    contact_kd_depth: float | None = field(
        None, minimum=0.0, doc="damping per metre of depth [N s/m^2] in place of contact_kd (Hunt-Crossley; DiffRL)"
    )
    contact_kd_depth_ratio: float | None = field(
        0.25,
        minimum=0.0,
        doc="where contact_kd_depth and contact_kd are null: Hunt-Crossley damping of this times the contact "
        "stiffness [s/m] (DiffRL's Ant: 1e4 / 4e4 = 0.25); null: the file's constant damping",
    )
    contact_kf: float | None = field(None, minimum=0.0, doc="friction stiffness [N s/m] (null: the file's)")
    contact_mu: float | None = field(None, minimum=0.0, doc="friction coefficient (null: the file's)")
    self_collisions: bool = field(False, doc="collide the robot's own shapes with each other")
    round_cylinders: bool = field(
        False,
        doc="collide each cylinder as a capsule of its radius and length (a flat end's contact points jump as it "
        "tilts; a capsule's slide: docs/robots.md)",
    )
    start_height: float | None = field(
        None, doc="root height at the start [m] (null: lowest point clearance above ground)"
    )
    clearance: float = field(
        0.0, minimum=0.0, doc="gap between the lowest collision point and the ground at the start [m]"
    )
    start_joint_q: tuple[float, ...] | None = field(
        None, doc="start coordinates of the non-root joints (null: zero, clamped into the limits)"
    )
    noise_position: float = field(0.0, minimum=0.0, doc="start root position + U(-p, p) per axis [m]")
    noise_rotation: float = field(0.0, minimum=0.0, doc="start root rotated by U(-r, r) [rad] about a random axis")
    noise_joint_q: float = field(0.0, minimum=0.0, doc="start joint coordinates + U(-q, q)")
    noise_joint_qd: float = field(0.0, minimum=0.0, doc="start velocities (root's too) U(-v, v)")
    observation: tuple[str, ...] = field(
        ("root_height", "root_rotation", "root_linear_velocity", "root_angular_velocity", "joint_q", "joint_qd",
         "up", "heading", "previous_action"),
        doc="observation pieces in order (module docstring)",
    )  # fmt: skip
    observation_scale: dict[str, float] | None = field(None, doc="piece -> factor (joint_qd: 0.1); null: none")  # noqa: RUF009
    reward: dict[str, float] | None = field(  # noqa: RUF009
        None, finite=True, doc="reward term -> weight (module docstring); null: forward_velocity 1"
    )
    height_reference: float = field(0.0, doc="the height term is root height - height_reference [m]")
    termination_height: float | None = field(None, doc="an episode ends when the root is below this height [m]")
    termination_up: float | None = field(
        None, minimum=-1.0, maximum=1.0, doc="an episode ends when up (root up axis . world up) is below this"
    )
    settle_time: float = field(2.0, minimum=0.0, doc="seconds an unactuated world is simulated to check the file")

    def check(self) -> None:
        if self.mass_matrix_every > self.substeps:
            raise ValueError(
                f"mass_matrix_every: {self.mass_matrix_every} is above substeps={self.substeps}; "
                "accepted: 1 .. substeps"
            )
        if self.collide_every > self.substeps:
            raise ValueError(
                f"collide_every: {self.collide_every} is above substeps={self.substeps}; accepted: 1 .. substeps"
            )
        for i, piece in enumerate(self.observation):
            if piece not in OBSERVATION_PIECES:
                raise ValueError(
                    f"observation[{i}]: '{piece}' is not a piece; accepted: {', '.join(OBSERVATION_PIECES)}"
                )
        for piece in self.observation_scale or {}:
            if piece not in self.observation:
                raise ValueError(
                    f"observation_scale.{piece}: not a piece of env.observation; "
                    f"accepted: {', '.join(self.observation)}"
                )
        for term in self.reward_terms():
            if term not in REWARD_TERMS:
                raise ValueError(f"reward.{term}: not a reward term; accepted: {', '.join(REWARD_TERMS)}")
        if not math.isclose(float(np.linalg.norm(self.forward)), 1.0, rel_tol=1e-3):
            raise ValueError(f"forward: must be a unit vector, got {list(self.forward)}")

    def reward_terms(self) -> dict[str, float]:
        """The reward's terms and weights (``forward_velocity: 1`` when none are configured)."""
        return dict(self.reward) if self.reward else {"forward_velocity": 1.0}

    # -- what the env offers (from the file: read without building the simulation) --------------

    def layout(self) -> RobotLayout:
        """The robot file's joints, dofs and actions (read once per config; Newton's importer)."""
        return robot_layout(self)

    def observable_dims(self) -> dict[str, int]:
        return {"reward": len(self.reward_terms()), "root_position": 3, "terminated": 1}

    def action_dim(self) -> int:
        return len(self.layout().actuated_dofs)

    def observation_dim(self) -> int:
        return self.layout().observation_width(self.observation)

    def action_fd_step(self) -> float:
        # torque: 1e-3 of the torque scale (0.2 N m on the Ant): small enough that no contact opens,
        # closes or changes friction regime inside the difference, large enough for float32; position:
        # 3e-3 of the target range (0.2 N m of drive torque on the quadruped: 150 N m/rad x 0.5 rad x
        # 3e-3; at 1e-3 float32 differences of its 30-step check part by 20%) (docs/robots.md)
        return 3.0e-3 if self.control == "position" else 1.0e-3

    def weight_fd_step(self) -> float:
        # a weight moves every step's action at once: at 1e-2 the Ant's output layer opens and closes
        # contacts inside an 8-step difference (seed-0 actor: one of 80 entries 99% off; at 1e-3 all 80
        # within 0.2%). Two of three actors pass at 1e-3, none at 1e-2; one is rough at any step float32
        # resolves (docs/robots.md, "The step of a weight's differences")
        return 1.0e-3

    def gradcheck_tolerance(self) -> float:
        # float32 central differences at that step resolve a 0.5 s rollout's gradient through contact
        # to a few percent (docs/robots.md, "Gradients through contact")
        return 1.0e-1


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
    joint_coords: tuple[int, ...]  # every coordinate but the root's
    joint_dofs: tuple[int, ...]  # every dof but the root's
    scalar_joints: tuple[tuple[int, int], ...]  # (coordinate, dof) of every one-coordinate joint but the root
    lower: tuple[float, ...]  # their limits (-inf, inf where the file gives none)
    upper: tuple[float, ...]

    def piece_width(self, piece: str) -> int:
        widths = {
            "root_height": 1, "root_position": 3, "root_rotation": 4, "root_linear_velocity": 3,
            "root_angular_velocity": 3, "joint_q": len(self.joint_coords), "joint_qd": len(self.joint_dofs),
            "up": 1, "heading": 1, "previous_action": len(self.actuated_dofs),
        }  # fmt: skip
        return widths[piece]

    def observation_width(self, pieces: tuple[str, ...]) -> int:
        return sum(self.piece_width(p) for p in pieces)


_LAYOUTS: dict[tuple, RobotLayout] = {}


def asset_path(asset: str) -> str:
    """The file an ``env.asset`` names: a path, or ``newton:NAME`` in Newton's bundled assets."""
    if asset.startswith(NEWTON_ASSETS):
        import newton

        return os.path.join(os.path.dirname(newton.__file__), "examples", "assets", asset[len(NEWTON_ASSETS) :])
    return os.path.abspath(os.path.expanduser(asset))


def _short(label: str) -> str:
    return str(label).rsplit("/", 1)[-1]


def load_robot(cfg: RobotConfig) -> Any:
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
        raise RobotFileError(f"env.asset: no file '{path}'; accepted: an MJCF, URDF or USD file, or newton:NAME")
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


def _drive(builder: Any, cfg: RobotConfig, dofs: list[int], coords: list[int]) -> dict[str, tuple[float, ...]]:
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
    return found


def _limit(value: float) -> float:
    """A joint limit, with Newton's 'no limit' (|value| >= 1e9) as an infinity."""
    return float(value) if abs(float(value)) < 1.0e9 else math.copysign(math.inf, float(value))


def _values(values: Any) -> list:
    return list(values.values()) if isinstance(values, dict) else list(values)


def robot_layout(cfg: RobotConfig) -> RobotLayout:
    """The layout of ``cfg.asset`` with ``cfg``'s choices (cached per file and choices)."""
    path = asset_path(cfg.asset)
    key = (path, os.path.getmtime(path) if os.path.isfile(path) else 0,
           cfg.actuated, cfg.torque, cfg.default_torque, cfg.root, cfg.up_axis, cfg.self_collisions,
           cfg.control, cfg.target_scale, cfg.target_ke, cfg.target_kd)  # fmt: skip
    if key not in _LAYOUTS:
        _LAYOUTS[key] = _layout(load_robot(cfg), cfg)
    return _LAYOUTS[key]


def _layout(builder: Any, cfg: RobotConfig) -> RobotLayout:
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
            elif d < len(effort) and 0.0 < effort[d] < 1.0e5:  # a URDF's effort limit (Newton's default is 1e6)
                torque.append(float(effort[d]))
            else:
                torque.append(cfg.default_torque)
        torque = tuple(torque)
    target_coords = []  # each actuated dof's coordinate: hinges, slides, D6 axes have one; a ball joint's none (-1)
    for j in actuated_joints:
        own_coords, own_dofs = span(q_start, coord_count, j), span(qd_start, dof_count, j)
        target_coords.extend(own_coords if len(own_coords) == len(own_dofs) else [-1] * len(own_dofs))
    target = _drive(builder, cfg, dofs, target_coords)
    root_coords = set(span(q_start, coord_count, root_joint)) if root_joint is not None else set()
    root_dofs = set(span(qd_start, dof_count, root_joint)) if root_joint is not None else set()
    joint_coords = tuple(c for c in range(coord_count) if c not in root_coords)
    joint_dofs = tuple(d for d in range(dof_count) if d not in root_dofs)
    scalar = tuple(
        (q_start[j], qd_start[j]) for j in range(builder.joint_count)
        if j != root_joint and len(span(q_start, coord_count, j)) == 1 and len(span(qd_start, dof_count, j)) == 1
    )  # fmt: skip
    lower = tuple(_limit(builder.joint_limit_lower[d]) for _, d in scalar)
    upper = tuple(_limit(builder.joint_limit_upper[d]) for _, d in scalar)
    return RobotLayout(
        joint_names=joint_names, body_names=body_names, root_body=root_body, root_free=root_free,
        coord_count=coord_count, dof_count=dof_count, body_count=builder.body_count, shape_count=builder.shape_count,
        actuated_dofs=tuple(dofs), actuated_names=tuple(joint_names[j] for j in actuated_joints), torque=torque,
        target_coords=tuple(target_coords), target_scale=target["target_scale"], target_ke=target["target_ke"],
        target_kd=target["target_kd"], joint_coords=joint_coords, joint_dofs=joint_dofs, scalar_joints=scalar,
        lower=lower, upper=upper,
    )  # fmt: skip


# -- kernels ---------------------------------------------------------------------------------------

PIECE_CODES = {name: code for code, name in enumerate(OBSERVATION_PIECES)}
TERM_CODES = {name: code for code, name in enumerate(REWARD_TERMS)}


@wp.func
def _axis_of(q: wp.quat, axis: wp.vec3, world: wp.vec3) -> float:
    """``(q rotates axis) . world``: how far a body axis points along a world direction."""
    return wp.dot(wp.quat_rotate(q, axis), world)


@wp.kernel
def _apply_actions(
    actions: wp.array3d(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    slot: int,
    index: wp.array(dtype=wp.int32),
    rest: wp.array(dtype=wp.float32),
    scale: wp.array(dtype=wp.float32),
    stride: int,
    out: wp.array(dtype=wp.float32),
    prev_action: wp.array(dtype=wp.float32),
):
    # out[index] = rest[index] + scale x the clipped action: joint_f (dofs, rest 0, the torques) or
    # joint_target_q (coordinates, rest the start pose, target_scale). The step's row is
    # base[0] + slot (segment graphs: the same launch for every segment).
    w, i = wp.tid()
    a = wp.clamp(actions[base[0] + slot, w, i], -1.0, 1.0)
    out[w * stride + index[i]] = rest[index[i]] + a * scale[i]
    prev_action[w * index.shape[0] + i] = a


@wp.kernel
def _observe(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    prev_action: wp.array(dtype=wp.float32),
    codes: wp.array(dtype=wp.int32),
    index: wp.array(dtype=wp.int32),
    scale: wp.array(dtype=wp.float32),
    root: int,
    body_count: int,
    coord_count: int,
    dof_count: int,
    action_count: int,
    up: wp.vec3,
    forward: wp.vec3,
    out: wp.array2d(dtype=wp.float32),
):
    # One column of one world's observation: the piece `codes[c]`, its entry `index[c]`.
    w, c = wp.tid()
    code, i = codes[c], index[c]
    X = body_q[w * body_count + root]
    v = body_qd[w * body_count + root]
    value = wp.float32(0.0)
    if code == 0:
        value = wp.dot(wp.transform_get_translation(X), up)
    elif code == 1:
        value = wp.transform_get_translation(X)[i]
    elif code == 2:
        value = wp.transform_get_rotation(X)[i]
    elif code == 3:
        value = wp.spatial_top(v)[i]
    elif code == 4:
        value = wp.spatial_bottom(v)[i]
    elif code == 5:
        value = joint_q[w * coord_count + i]
    elif code == 6:
        value = joint_qd[w * dof_count + i]
    elif code == 7:
        value = _axis_of(wp.transform_get_rotation(X), up, up)
    elif code == 8:
        value = _axis_of(wp.transform_get_rotation(X), forward, forward)
    else:
        value = prev_action[w * action_count + i]
    out[w, c] = scale[c] * value


@wp.kernel
def _record(
    joint_q: wp.array(dtype=wp.float32),
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    prev_action: wp.array(dtype=wp.float32),
    terms: wp.array(dtype=wp.int32),
    weights: wp.array(dtype=wp.float32),
    limit_coords: wp.array(dtype=wp.int32),
    lower: wp.array(dtype=wp.float32),
    upper: wp.array(dtype=wp.float32),
    root: int,
    body_count: int,
    coord_count: int,
    action_count: int,
    up: wp.vec3,
    forward: wp.vec3,
    height_reference: float,
    termination_height: float,
    termination_up: float,
    alive: wp.array(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    offset: int,
    reward: wp.array3d(dtype=wp.float32),
    root_position: wp.array3d(dtype=wp.float32),
    terminated: wp.array3d(dtype=wp.float32),
):
    # Row base[0] + offset of the step's observables, for one world: every weighted reward term
    # (0 once the world's episode has ended before the step: alive), the root's position, and
    # whether the state ends the episode (no gradient through that).
    w = wp.tid()
    row = base[0] + offset
    X = body_q[w * body_count + root]
    p = wp.transform_get_translation(X)
    q = wp.transform_get_rotation(X)
    for k in range(terms.shape[0]):
        code = terms[k]
        value = wp.float32(0.0)
        if code == 0:
            value = wp.dot(wp.spatial_top(body_qd[w * body_count + root]), forward)
        elif code == 1:
            value = _axis_of(q, up, up)
        elif code == 2:
            value = _axis_of(q, forward, forward)
        elif code == 3:
            value = wp.dot(p, up) - height_reference
        elif code == 4:
            for i in range(action_count):
                a = prev_action[w * action_count + i]
                value = value - a * a
        elif code == 5:
            for i in range(limit_coords.shape[0]):
                x = joint_q[w * coord_count + limit_coords[i]]
                over = wp.max(x - upper[i], 0.0) + wp.max(lower[i] - x, 0.0)
                value = value - over * over
        else:
            value = 1.0
        reward[row, w, k] = weights[k] * value * alive[w]
    for d in range(3):
        root_position[row, w, d] = p[d]
    height = wp.dot(p, up)
    ended = wp.float32(0.0)
    if height < termination_height or _axis_of(q, up, up) < termination_up or not wp.isfinite(height):
        ended = 1.0
    terminated[row, w, 0] = ended


@wp.struct
class _Termination:
    """What ends a world's episode (``RobotEnv._termination``, built once): its root body (``root``, of
    ``body_count`` per world) below ``height`` along ``up``, its up axis below ``up_min`` along
    ``up``, or a height that is not finite."""

    root: int
    body_count: int
    up: wp.vec3
    height: float
    up_min: float


@wp.func
def _ends(body_q: wp.array(dtype=wp.transform), w: int, rule: _Termination) -> bool:
    """Whether world ``w``'s state ``body_q`` ends its episode."""
    X = body_q[w * rule.body_count + rule.root]
    height = wp.dot(wp.transform_get_translation(X), rule.up)
    low = height < rule.height or _axis_of(wp.transform_get_rotation(X), rule.up, rule.up) < rule.up_min
    return low or not wp.isfinite(height)


@wp.kernel
def _terminated(body_q: wp.array(dtype=wp.transform), rule: _Termination, out: wp.array(dtype=wp.int32)):
    w = wp.tid()
    out[w] = wp.where(_ends(body_q, w, rule), 1, 0)


@wp.struct
class _ContactSet:
    """The rigid contacts the contact kernels read: a ``newton.Contacts``' arrays (``count`` is
    ``rigid_contact_count``, ``shape0`` ``rigid_contact_shape0``, ...) and the model's ``shape_body``
    (:func:`_contact_set`)."""

    shape_body: wp.array(dtype=wp.int32)
    count: wp.array(dtype=wp.int32)
    shape0: wp.array(dtype=wp.int32)
    shape1: wp.array(dtype=wp.int32)
    point0: wp.array(dtype=wp.vec3)
    point1: wp.array(dtype=wp.vec3)
    normal: wp.array(dtype=wp.vec3)
    margin0: wp.array(dtype=wp.float32)
    margin1: wp.array(dtype=wp.float32)


def _contact_set(model: newton.Model, contacts: newton.Contacts) -> _ContactSet:
    found = _ContactSet()
    found.shape_body = model.shape_body
    for name in ("count", "shape0", "shape1", "point0", "point1", "normal", "margin0", "margin1"):
        setattr(found, name, getattr(contacts, f"rigid_contact_{name}"))
    return found


@wp.func
def _penetration(body_q: wp.array(dtype=wp.transform), c: _ContactSet, i: int) -> float:
    """How deep contact ``i`` is at ``body_q`` [m] (0 when apart): minus the distance newton's contact
    force reads (semi_implicit.kernels_contact: the contact's frozen points and normal)."""
    n = -c.normal[i]
    pa = c.point0[i]
    pb = c.point1[i]
    if c.shape0[i] >= 0:
        body = c.shape_body[c.shape0[i]]
        if body >= 0:
            pa = wp.transform_point(body_q[body], pa)
    if c.shape1[i] >= 0:
        body = c.shape_body[c.shape1[i]]
        if body >= 0:
            pb = wp.transform_point(body_q[body], pb)
    return wp.max(-wp.dot(n, (pa - c.margin0[i] * n) - (pb + c.margin1[i] * n)), 0.0)


@wp.kernel
def _mark_contacts(body_q: wp.array(dtype=wp.transform), c: _ContactSet, touching: wp.array(dtype=wp.int32)):
    # 1 for every body with a contact of positive depth at body_q (_penetration)
    i = wp.tid()
    if i >= c.count[0]:
        return
    if _penetration(body_q, c, i) > 0.0:
        if c.shape0[i] >= 0 and c.shape_body[c.shape0[i]] >= 0:
            touching[c.shape_body[c.shape0[i]]] = 1
        if c.shape1[i] >= 0 and c.shape_body[c.shape1[i]] >= 0:
            touching[c.shape_body[c.shape1[i]]] = 1


@wp.kernel
def _hunt_crossley(
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    body_com: wp.array(dtype=wp.vec3),
    c: _ContactSet,
    kd_depth: float,
    body_f: wp.array(dtype=wp.spatial_vector),
):
    # The damping force of contact i: kd_depth x depth x closing speed along the normal (Hunt and
    # Crossley 1975; DiffRL's dflex), zero where the contact closes, so the force has no jump there
    # (newton's contact kernel damps by a constant times the speed). Applied to both bodies as
    # wrenches about their centres of mass, in newton's public convention (its contact kernel's
    # frame and signs), so SolverFeatherstone adds it to the contact force it computes.
    i = wp.tid()
    if i >= c.count[0]:
        return
    n = -c.normal[i]
    body_a, body_b = wp.int32(-1), wp.int32(-1)
    if c.shape0[i] >= 0:
        body_a = c.shape_body[c.shape0[i]]
    if c.shape1[i] >= 0:
        body_b = c.shape_body[c.shape1[i]]
    pa = c.point0[i]
    pb = c.point1[i]
    va = wp.vec3(0.0)
    vb = wp.vec3(0.0)
    ra = wp.vec3(0.0)
    rb = wp.vec3(0.0)
    if body_a >= 0:
        X = body_q[body_a]
        pa = wp.transform_point(X, pa) - c.margin0[i] * n
        ra = pa - wp.transform_point(X, body_com[body_a])
        va = wp.spatial_top(body_qd[body_a]) + wp.cross(wp.spatial_bottom(body_qd[body_a]), ra)
    if body_b >= 0:
        X = body_q[body_b]
        pb = wp.transform_point(X, pb) + c.margin1[i] * n
        rb = pb - wp.transform_point(X, body_com[body_b])
        vb = wp.spatial_top(body_qd[body_b]) + wp.cross(wp.spatial_bottom(body_qd[body_b]), rb)
    depth = -wp.dot(n, pa - pb)
    if depth <= 0.0:
        return
    f = n * (wp.min(wp.dot(n, va - vb), 0.0) * kd_depth * depth)
    if body_a >= 0:
        wp.atomic_sub(body_f, body_a, wp.spatial_vector(f, wp.cross(ra, f)))
    if body_b >= 0:
        wp.atomic_add(body_f, body_b, wp.spatial_vector(f, wp.cross(rb, f)))


@wp.kernel
def _survive(
    body_q: wp.array(dtype=wp.transform),
    rule: _Termination,
    before: wp.array(dtype=wp.float32),
    after: wp.array(dtype=wp.float32),
    touching: wp.array(dtype=wp.int32),
):
    # alive after the step: alive before it, and the step's result does not end the episode; and
    # the world's row of the step's contact marks cleared for _mark_contacts (no gradient: an int
    # array; in this launch rather than a memset of its own)
    w = wp.tid()
    after[w] = wp.where(_ends(body_q, w, rule), 0.0, before[w])
    for b in range(rule.body_count):
        touching[w * rule.body_count + b] = 0


@wp.kernel
def _draw_starts(
    seed: int,
    key: wp.array(dtype=wp.int32),
    base_q: wp.array(dtype=wp.float32),
    noisy_coords: wp.array(dtype=wp.int32),
    root_free: int,
    coord_count: int,
    dof_count: int,
    position: float,
    rotation: float,
    joint_noise: float,
    velocity: float,
    action_count: int,
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    prev_action: wp.array(dtype=wp.float32),
    alive: wp.array(dtype=wp.float32),
):
    # One world's fresh start, seeded by (seed, key[0]) then the world: the draws in a fixed order
    # (position, rotation axis and angle, joint coordinates, velocities).
    w = wp.tid()
    stream = wp.rand_init(seed, key[0])
    rng = wp.rand_init(wp.int32(stream), w)
    q0 = w * coord_count
    for c in range(coord_count):
        joint_q[q0 + c] = base_q[c]
    if root_free != 0:
        for d in range(3):
            joint_q[q0 + d] = base_q[d] + wp.randf(rng, -position, position)
        axis = wp.vec3(wp.randf(rng, -0.5, 0.5), wp.randf(rng, -0.5, 0.5), wp.randf(rng, -0.5, 0.5))
        angle = wp.randf(rng, -rotation, rotation)
        turn = wp.quat_from_axis_angle(wp.normalize(axis), angle)
        r = wp.quat(base_q[3], base_q[4], base_q[5], base_q[6]) * turn
        for d in range(4):
            joint_q[q0 + 3 + d] = r[d]
    for i in range(noisy_coords.shape[0]):
        c = noisy_coords[i]
        joint_q[q0 + c] = base_q[c] + wp.randf(rng, -joint_noise, joint_noise)
    for d in range(dof_count):
        joint_qd[w * dof_count + d] = wp.randf(rng, -velocity, velocity)
    for i in range(action_count):
        prev_action[w * action_count + i] = 0.0
    alive[w] = 1.0


# -- the robot's build ---------------------------------------------------------------------------


def _collision_shapes(builder: Any) -> list[int]:
    import newton

    return [s for s, flags in enumerate(builder.shape_flags) if int(flags) & int(newton.ShapeFlags.COLLIDE_SHAPES)]


def _set_density(builder: Any, density: float) -> None:
    """Every body's mass, centre of mass and inertia recomputed from its collision shapes at ``density``
    (what DiffRL's loader does: it ignores an MJCF's densities and uses its own)."""
    from newton.geometry import compute_inertia_shape

    for body in range(builder.body_count):
        builder.body_mass[body] = 0.0
        builder.body_inertia[body] = wp.mat33()
        builder.body_com[body] = wp.vec3()
    for s in _collision_shapes(builder):
        body = builder.shape_body[s]
        if body < 0:
            continue
        m, c, inertia = compute_inertia_shape(
            builder.shape_type[s], builder.shape_scale[s], builder.shape_source[s], density
        )
        X = builder.shape_transform[s]
        p = wp.transform_point(X, c)
        # newton's own accumulation of a shape's mass into its body (what add_shape does)
        builder._update_body_mass(body, m, inertia, p, wp.transform_get_rotation(X))


def _round_cylinders(builder: Any) -> None:
    """Every collision cylinder becomes a capsule of the same radius and overall length."""
    import newton

    for s in _collision_shapes(builder):
        if int(builder.shape_type[s]) == int(newton.GeoType.CYLINDER):
            radius, half, _ = builder.shape_scale[s]
            builder.shape_type[s] = newton.GeoType.CAPSULE
            builder.shape_scale[s] = (radius, max(half - radius, 0.0), 0.0)


def _lowest_point(builder: Any, model: Any, state: Any, up: int) -> float:
    """The lowest point along ``up`` of the collision shapes of world 0 at ``state``'s body poses [m]."""
    import newton

    body_q = state.body_q.numpy()
    low = math.inf
    for s in _collision_shapes(builder):
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


class RobotEnv(NewtonEnv, PolicyEnv, DrawsStarts, Restarts, Terminates, Segmentable):
    """Any robot file on a ground plane; see :class:`RobotConfig` and the module docstring."""

    name = "robot"
    Config = RobotConfig
    segment_graph = True  # its kernels read the step as segment_base[0] + slot
    state_fields = ("joint_q", "joint_qd", "prev_action", "alive")

    def __init__(self, config: RobotConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        super().__init__(config, device=device, **fields)  # builds the model (build_model) and the States
        cfg = self.config
        self.dt = cfg.dt
        self.substep_dt = cfg.dt / cfg.substeps
        # per step kept (the horizon, or a segment): a taped rollout needs every step's storage; with
        # env.per_step_states=false (an evaluation: no tape) one set serves every step
        kept = self.steps_kept if cfg.per_step_states else 1
        self.joint_f = wp.zeros(
            (kept, self.model.joint_dof_count), dtype=wp.float32, device=self.device, requires_grad=True
        )
        self.joint_target_q = None  # control=position: per step kept, the drive's targets (the rest: the model's)
        if cfg.control == "position":
            self.joint_target_q = wp.array(
                np.tile(self.model.joint_target_q.numpy(), (kept, 1)), dtype=wp.float32, device=self.device,
                requires_grad=True,
            )  # fmt: skip
        self.controls = []
        for t in range(kept):
            control = self.model.control(clone_variables=False)
            control.joint_f = self.joint_f[t]
            if self.joint_target_q is not None:
                control.joint_target_q = self.joint_target_q[t]
            self.controls.append(control)
        from envs.featherstone import Substeps

        self.substeps = Substeps(
            self.solver, self.new_state, kept=kept, substeps=cfg.substeps, mass_matrix_every=cfg.mass_matrix_every
        )
        self.collide_at = [k for k in range(cfg.substeps) if k % cfg.collide_every == 0]
        self.contacts = [[self.pipeline.contacts() for _ in self.collide_at] for _ in range(kept)]
        # per step kept: which bodies touch the ground after the step (contact_mask; gradcheck's phases)
        self._touching = wp.zeros((kept, self.model.body_count), dtype=wp.int32, device=self.device)
        self._write_host_starts(host_rng(cfg.seed))
        if cfg.settle_time > 0:
            why = settle(cfg, self.device)
            if why is not None:
                raise RobotFileError(
                    f"env.asset: '{cfg.asset}' does not come to rest unactuated: {why}; "
                    "accepted: a file that does with "
                    "these settings (more env.substeps, env.armature, env.joint_damping, stiffer env.contact_ke), "
                    "or env.settle_time=0 to train it anyway"
                )

    # -- the model ---------------------------------------------------------------------------------

    def new_state(self, *, requires_grad: bool = True) -> Any:
        state = self.model.state(requires_grad=requires_grad)
        # 1 until the world's episode has ended (an absorbing end: later rewards count 0)
        state.alive = wp.ones(self.world_count, dtype=wp.float32, device=self.device, requires_grad=requires_grad)
        state.prev_action = wp.zeros(
            self.world_count * len(self.layout.actuated_dofs), dtype=wp.float32, device=self.device,
            requires_grad=requires_grad,
        )  # fmt: skip
        return state

    def build_model(self) -> newton.Model:
        import newton

        cfg = self.config
        self.layout = layout = cfg.layout()
        single = load_robot(cfg)
        if cfg.density is not None:
            _set_density(single, cfg.density)
        if cfg.round_cylinders:  # after the masses: only how the shapes touch changes
            _round_cylinders(single)
        moving = set(layout.joint_dofs)
        for d in moving:
            for value, target in ((cfg.armature, "joint_armature"), (cfg.joint_damping, "joint_damping"),
                                  (cfg.limit_ke, "joint_limit_ke"), (cfg.limit_kd, "joint_limit_kd")):  # fmt: skip
                if value is not None:
                    getattr(single, target)[d] = value
        shapes = _collision_shapes(single)
        ground = {}
        ke = cfg.contact_ke
        if ke is None:
            ke = float(np.mean([single.shape_material_ke[s] for s in shapes])) if shapes else 0.0
        self.kd_depth = cfg.contact_kd_depth
        if self.kd_depth is None and cfg.contact_kd is None and cfg.contact_kd_depth_ratio is not None:
            self.kd_depth = cfg.contact_kd_depth_ratio * ke  # the file's stiffness, Hunt-Crossley's damping
        kd = 0.0 if self.kd_depth is not None else cfg.contact_kd  # Hunt-Crossley replaces it
        materials = {"ke": cfg.contact_ke, "kd": kd, "kf": cfg.contact_kf, "mu": cfg.contact_mu}
        for value, target in ((value, f"shape_material_{name}") for name, value in materials.items()):
            values = getattr(single, target)
            for s in shapes:
                if value is not None:
                    values[s] = value
            # the contact kernel averages the two shapes' materials: the ground takes the robot's
            ground[target] = float(np.mean([values[s] for s in shapes])) if shapes else None
        up = "xyz".index(cfg.up_axis)
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
            self._clamp_into_limits(single, base_q)
        if layout.root_free:
            base_q[0:3] = 0.0
            single.joint_q[:] = base_q.tolist()
            probe = single.finalize(device="cpu", requires_grad=False)
            state = probe.state()
            newton.eval_fk(probe, probe.joint_q, probe.joint_qd, state)
            lowest = _lowest_point(single, probe, state, up)
            base_q[up] = cfg.start_height if cfg.start_height is not None else cfg.clearance - lowest
        single.joint_q[:] = base_q.tolist()
        self.base_q = base_q.astype(np.float32)
        if cfg.control == "position":  # the drive's gains; its target at rest is the start pose
            for d, c, ke, kd in zip(layout.actuated_dofs, layout.target_coords, layout.target_ke, layout.target_kd,
                                    strict=True):  # fmt: skip
                single.joint_target_ke[d], single.joint_target_kd[d] = ke, kd
                single.joint_target_q[c] = float(base_q[c])
        builder = newton.ModelBuilder(up_axis=single.up_axis)
        builder.replicate(single, self.world_count, spacing=(0.0, 0.0, 0.0))  # overlapping worlds on one ground
        plane = newton.ModelBuilder.ShapeConfig(
            ke=ground["shape_material_ke"], kd=ground["shape_material_kd"], kf=ground["shape_material_kf"],
            mu=ground["shape_material_mu"],
        )  # fmt: skip
        builder.add_ground_plane(cfg=plane)
        model = builder.finalize(device=self.device, requires_grad=True)
        per_world = 4 * len(shapes) + 8  # a few contacts per shape against the ground
        self.pipeline = newton.CollisionPipeline(
            model, requires_grad=False, rigid_contact_max=per_world * self.world_count
        )
        return model

    def _clamp_into_limits(self, single: Any, q: np.ndarray) -> None:
        """Joint coordinates at zero, moved into their limits (a file's zero pose may violate them)."""
        for coord, dof in self.layout.scalar_joints:
            lo, hi = _limit(single.joint_limit_lower[dof]), _limit(single.joint_limit_upper[dof])
            if lo <= hi:
                q[coord] = min(max(q[coord], lo), hi)

    def build_solver(self) -> newton.solvers.SolverFeatherstone:
        import newton

        from envs.featherstone import fix_external_wrench_adjoint

        fix_external_wrench_adjoint()  # newton 1.8 differentiates contact wrenches wrongly (envs/featherstone.py)
        return newton.solvers.SolverFeatherstone(
            self.model, angular_damping=0.0, update_mass_matrix_interval=self.config.mass_matrix_every
        )

    # -- starts ------------------------------------------------------------------------------------

    def _device_tables(self) -> None:
        """The index tables the kernels read (made once, on the env's device)."""
        cfg, layout, device = self.config, self.layout, self.device
        codes, index, scale = [], [], []
        scales = cfg.observation_scale or {}
        for piece in cfg.observation:
            width = layout.piece_width(piece)
            entries = {"joint_q": layout.joint_coords, "joint_qd": layout.joint_dofs}.get(piece, range(width))
            for i in entries:
                codes.append(PIECE_CODES[piece])
                index.append(i)
                scale.append(scales.get(piece, 1.0))
        terms = cfg.reward_terms()

        def ints(values: Any) -> wp.array:
            return wp.array(np.asarray(values, dtype=np.int32), dtype=wp.int32, device=device)

        def floats(values: Any) -> wp.array:
            return wp.array(np.asarray(values, dtype=np.float32), dtype=wp.float32, device=device)

        self._obs_codes, self._obs_index, self._obs_scale = ints(codes), ints(index), floats(scale)
        self._terms, self._weights = ints([TERM_CODES[t] for t in terms]), floats(list(terms.values()))
        limited = [(c, lo, hi) for (c, _), lo, hi in zip(layout.scalar_joints, layout.lower, layout.upper, strict=True)
                   if math.isfinite(lo) or math.isfinite(hi)]  # fmt: skip
        self._limit_coords = ints([c for c, _, _ in limited])
        self._lower = floats([max(lo, -1.0e30) for _, lo, _ in limited])
        self._upper = floats([min(hi, 1.0e30) for _, _, hi in limited])
        self._noisy = ints([c for c, _ in layout.scalar_joints])
        self._base_q = floats(self.base_q)
        # what act writes (_apply_actions' index, rest, scale, stride, per-step output): the drive's
        # targets, start pose + target_scale x action, or the torques, 0 + torque x action
        if self.joint_target_q is not None:
            self._action_out = (ints(layout.target_coords), self._base_q, floats(layout.target_scale),
                                layout.coord_count, self.joint_target_q)  # fmt: skip
        else:
            self._action_out = (ints(layout.actuated_dofs), floats(np.zeros(layout.dof_count)), floats(layout.torque),
                                layout.dof_count, self.joint_f)  # fmt: skip
        self._up = wp.vec3(*np.eye(3)["xyz".index(cfg.up_axis)])
        self._termination = _Termination()  # what ends an episode: the same for every step
        self._termination.root, self._termination.body_count = self.layout.root_body, self.layout.body_count
        self._termination.up = self._up
        self._termination.height = _threshold(cfg.termination_height)
        self._termination.up_min = _threshold(cfg.termination_up)
        self._forward = wp.vec3(*cfg.forward)
        self._ended = wp.zeros(self.world_count, dtype=wp.int32, device=device)

    def _write_host_starts(self, rng: np.random.Generator) -> None:
        """The env's own starts (what evaluation rolls from), drawn on the host from ``seed``."""
        self._device_tables()
        cfg, layout, worlds = self.config, self.layout, self.world_count
        q = np.tile(self.base_q.astype(np.float64), (worlds, 1))
        if layout.root_free:
            q[:, 0:3] += rng.uniform(-cfg.noise_position, cfg.noise_position, (worlds, 3))
            axes = rng.uniform(-0.5, 0.5, (worlds, 3))
            angles = rng.uniform(-cfg.noise_rotation, cfg.noise_rotation, worlds)
            for w in range(worlds):
                turn = wp.quat_from_axis_angle(wp.normalize(wp.vec3(*axes[w])), float(angles[w]))
                q[w, 3:7] = np.array(wp.quat(*q[w, 3:7]) * turn)
        coords = [c for c, _ in layout.scalar_joints]
        q[:, coords] += rng.uniform(-cfg.noise_joint_q, cfg.noise_joint_q, (worlds, len(coords)))
        qd = rng.uniform(-cfg.noise_joint_qd, cfg.noise_joint_qd, (worlds, layout.dof_count))
        self.initial["joint_q"].assign(q.astype(np.float32).ravel())
        self.initial["joint_qd"].assign(qd.astype(np.float32).ravel())
        self.initial["prev_action"].zero_()
        self.initial["alive"].fill_(1.0)

    def draw_initial(self, key: wp.array) -> None:
        self.keep_built_initial()
        cfg, layout = self.config, self.layout
        wp.launch(
            _draw_starts, dim=self.world_count,
            inputs=[DRAW_SEED_OFFSET + cfg.seed, key, self._base_q, self._noisy, int(layout.root_free),
                    layout.coord_count, layout.dof_count, cfg.noise_position, cfg.noise_rotation, cfg.noise_joint_q,
                    cfg.noise_joint_qd, len(layout.actuated_dofs)],
            outputs=[self.initial["joint_q"], self.initial["joint_qd"], self.initial["prev_action"],
                     self.initial["alive"]],
            device=self.device,
        )  # fmt: skip

    # -- one rollout -------------------------------------------------------------------------------

    def reset(self) -> None:
        super().reset()
        self._pose(self.state(0))

    def restart(self, t: int, done: wp.array, key: wp.array) -> None:
        super().restart(t, done, key)
        self._pose(self.current(t))

    def _pose(self, state: newton.State) -> None:
        """The body poses and twists of a State whose joint coordinates were just written (a reset,
        a restart): what an observation and the step's first collision read (recorded: the gradient
        reaches the joint coordinates through them)."""
        import newton

        newton.eval_fk(self.model, state.joint_q, state.joint_qd, state)

    def act(self, t: int, actions: wp.array) -> None:
        index, rest, scale, stride, out = self._action_out
        wp.launch(
            _apply_actions, dim=(self.world_count, index.shape[0]),
            inputs=[actions, self.segment_base, self.slot(t), index, rest, scale, stride],
            outputs=[out[self.store(t)], self.state(t + 1).prev_action], device=self.device,
        )  # fmt: skip

    def step(self, t: int) -> None:
        slot, cfg = self.store(t), self.config
        source, last = self.current(t), self.state(t + 1)
        contacts = None
        for k in range(cfg.substeps):
            target = self.substeps.target(slot, k, last)
            if k % cfg.collide_every == 0:
                contacts = self.contacts[slot][k // cfg.collide_every]
                self.pipeline.collide(source, contacts)
            self.substeps.prepare(slot, k)
            source.clear_forces()
            if self.kd_depth is not None:  # Hunt-Crossley: the contacts' damping as external wrenches
                self._damp(source, contacts)
            self.solver.step(source, target, self.controls[slot], contacts, self.substep_dt)
            source = target
        touching = self._touching[slot]
        if self.model.body_count != self.world_count * self.layout.body_count:  # bodies _survive does not clear
            touching.zero_()
        wp.launch(
            _survive, dim=self.world_count, inputs=[last.body_q, self._termination, self.current(t).alive],
            outputs=[last.alive, touching], device=self.device,
        )  # fmt: skip
        # marks without a gradient: not on the tape (no adjoint launch)
        wp.launch(
            _mark_contacts, dim=contacts.rigid_contact_max, inputs=[last.body_q, _contact_set(self.model, contacts)],
            outputs=[touching], device=self.device, record_tape=False,
        )  # fmt: skip

    def _damp(self, state: newton.State, contacts: newton.Contacts) -> None:
        """Add the Hunt-Crossley damping of the substep from ``state`` to its external wrenches
        (:func:`_hunt_crossley`)."""
        wp.launch(
            _hunt_crossley, dim=contacts.rigid_contact_max,
            inputs=[state.body_q, state.body_qd, self.model.body_com, _contact_set(self.model, contacts),
                    self.kd_depth],
            outputs=[state.body_f], device=self.device,
        )  # fmt: skip

    def write_observables(self, t: int) -> None:
        cfg, layout, state = self.config, self.layout, self.state(t + 1)
        row = self.row("reward", t)
        if row is None:
            return
        wp.launch(
            _record, dim=self.world_count,
            inputs=[state.joint_q, state.body_q, state.body_qd, state.prev_action, self._terms, self._weights,
                    self._limit_coords, self._lower, self._upper, layout.root_body, layout.body_count,
                    layout.coord_count, len(layout.actuated_dofs), self._up, self._forward, cfg.height_reference,
                    _threshold(cfg.termination_height), _threshold(cfg.termination_up), self.current(t).alive,
                    self.segment_base, row - self._base],
            outputs=[self.observed["reward"], self.observed["root_position"], self.observed["terminated"]],
            device=self.device,
        )  # fmt: skip

    def request(self, wanted: dict[str, str]) -> None:
        # one launch writes the three observables: every one is kept, at the widest mode asked for
        super().request(wanted)
        mode = "all" if "all" in wanted.values() or not wanted else "last"
        super().request(dict.fromkeys(self.observables, mode))

    def observe_state(self, state: newton.State, out: wp.array) -> None:
        layout = self.layout
        wp.launch(
            _observe, dim=(self.world_count, self._obs_codes.shape[0]),
            inputs=[state.joint_q, state.joint_qd, state.body_q, state.body_qd, state.prev_action, self._obs_codes,
                    self._obs_index, self._obs_scale, layout.root_body, layout.body_count, layout.coord_count,
                    layout.dof_count, len(layout.actuated_dofs), self._up, self._forward],
            outputs=[out], device=self.device,
        )  # fmt: skip

    def terminated(self, t: int, out: wp.array) -> None:
        # flags without a gradient: not on the tape (no adjoint launch)
        wp.launch(
            _terminated, dim=self.world_count, inputs=[self.state(t).body_q, self._termination], outputs=[out],
            device=self.device, record_tape=False,
        )  # fmt: skip

    def control_at(self, t: int) -> newton.Control:
        return self.controls[self.store(t)]

    def store(self, t: int) -> int:
        """Where step ``t``'s storage (substep States, scratch, Contacts, joint forces) is: its slot
        (:meth:`~harness.newton_env.NewtonEnv.slot`), or the one set with ``per_step_states=false``."""
        return self.slot(t) if self.config.per_step_states else 0

    def step_arrays(self) -> list[wp.array]:
        targets = [] if self.joint_target_q is None else [self.joint_target_q]
        return [self.joint_f, *targets, *self.substeps.arrays()]

    # -- what a run reports ------------------------------------------------------------------------

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        """:func:`episode_figures` of a whole-horizon rollout, and each reward term's mean per step."""
        needed = ("reward", "terminated", "root_position")
        if any(name not in trajectory or trajectory[name].shape[0] != self.horizon for name in needed):
            return {}
        q0 = self.initial["joint_q"].numpy().reshape(self.world_count, -1).astype(np.float64)
        start = q0[:, 0:3] if self.layout.root_free else trajectory["root_position"].numpy()[0].astype(np.float64)
        reward = trajectory["reward"].numpy().astype(np.float64)
        found = episode_figures(
            reward, trajectory["terminated"].numpy(), trajectory["root_position"].numpy().astype(np.float64), start,
            np.asarray(self.config.forward, np.float64), self.dt,
        )  # fmt: skip
        for k, term in enumerate(self.config.reward_terms()):
            found[f"reward_{term}_per_step"] = float(reward[:, :, k].mean())
        return found

    def component_names(self) -> dict[str, list[str]]:
        return {
            "reward": [f"{term} (weighted)" for term in self.config.reward_terms()],
            "root_position": ["root x [m]", "root y [m]", "root z [m]"],
            "terminated": ["episode ended (1)"],
        }

    def touching(self) -> np.ndarray:
        """Which bodies touch something after every step kept of the latest rollout, bool ``(steps,
        world_count, bodies)``: a contact of the step's last collision with negative distance at the
        step's result (the distance newton's contact force reads)."""
        return self._touching.numpy().reshape(self.steps_kept, self.world_count, -1) > 0

    def blowup(self) -> str | None:
        """Where the latest rollout left finite numbers: the first step (of the rollout's States kept)
        whose body poses are not finite or lie beyond ``BLOWUP_DISTANCE`` of the origin, with the
        body and world; None when every State is finite and near."""
        for k, state in enumerate(self.states[1:], start=1):
            body_q = state.body_q.numpy()[:, :3].reshape(self.world_count, self.layout.body_count, 3)
            bad = ~np.isfinite(body_q).all(axis=2) | (
                np.abs(np.nan_to_num(body_q, nan=0.0)).max(axis=2) > BLOWUP_DISTANCE
            )
            if bad.any():
                world, body = (int(i) for i in np.argwhere(bad)[0])
                return (
                    f"the simulation left finite numbers at step {self._base + k} of the last rollout: body "
                    f"'{self.layout.body_names[body]}' of world {world}"
                )
        return None


def _threshold(value: float | None) -> float:
    """A termination threshold as a kernel reads it (-inf: never)."""
    return -math.inf if value is None else float(value)


# -- what a run reports -------------------------------------------------------------------------------

BLOWUP_DISTANCE = 1.0e4
"""[m] a body this far from the origin has blown up (:meth:`RobotEnv.blowup`)."""

UP_TOLERANCE = 0.5
"""[m] how far above its start height the root may rise while an unactuated file settles."""

SETTLE_SPEED = 0.5
"""[m/s] the root's largest speed at the end of the settle time that counts as at rest."""


def episode_figures(
    reward: np.ndarray,
    terminated: np.ndarray,
    root_position: np.ndarray,
    start: np.ndarray,
    forward: np.ndarray,
    dt: float,
) -> dict[str, Any]:
    """What a locomotion user reads of whole-episode rollouts from the env's own starts (no restarts):
    ``episode_return`` (the summed rewards up to and including the step that ends the episode, mean
    over worlds), ``forward_speed`` (the root's forward displacement over the rollout's simulated
    time [m/s], mean over worlds), ``fall_fraction`` (the share of worlds whose episode ended early)
    and ``episode_length`` (steps, mean)."""
    steps = reward.shape[0]
    ended = terminated[:, :, 0] > 0.5
    fell = ended.any(axis=0)
    length = np.where(fell, ended.argmax(axis=0) + 1, steps)
    alive = np.arange(steps)[:, None] < length[None, :]
    returns = (reward.sum(axis=2) * alive).sum(axis=0)
    displacement = (root_position[-1] - start) @ forward
    return {
        "episode_return": float(returns.mean()),
        "forward_speed": float(displacement.mean() / (steps * dt)),
        "fall_fraction": float(fell.mean()),
        "episode_length": float(length.mean()),
    }


_SETTLED: dict[tuple, str | None] = {}


def settle(cfg: RobotConfig, device: wp.context.Devicelike = None) -> str | None:
    """Why one world of ``cfg``'s robot, unactuated and without start noise, does not come to rest
    within ``cfg.settle_time`` seconds; None when it does. It has not when its root goes non-finite,
    rises more than :data:`UP_TOLERANCE` above its start, or still moves faster than
    :data:`SETTLE_SPEED` at the end (a robot that folds up and lies down has come to rest). One
    control step is captured and replayed (cached per file and physical settings for the process)."""
    quiet = dataclasses.replace(
        cfg, world_count=1, horizon=1, settle_time=0.0, seed=0, noise_position=0.0, noise_rotation=0.0,
        noise_joint_q=0.0, noise_joint_qd=0.0,
    )  # fmt: skip
    key = (repr(quiet), asset_path(cfg.asset), cfg.settle_time)
    if key in _SETTLED:
        return _SETTLED[key]
    env = RobotEnv(quiet, device=device)
    env.request({})
    up = "xyz".index(cfg.up_axis)

    def one_step() -> None:
        env.reset()
        env.step(0)
        for name in ("joint_q", "joint_qd"):
            wp.copy(env.initial[name], getattr(env.state(1), name))

    one_step()  # eager first: kernels load, the solver allocates
    graph = None
    if env.device.is_cpu or env.device.is_cuda:
        with wp.ScopedCapture(device=env.device) as capture:
            one_step()
        graph = capture.graph
    start = float(env.base_q[up]) if env.layout.root_free else 0.0
    steps = max(1, round(cfg.settle_time / cfg.dt))
    why = None
    for t in range(1, steps):
        if graph is not None:
            wp.capture_launch(graph)
        else:
            one_step()
        root = env.state(1).body_q.numpy()[env.layout.root_body]
        speed = float(np.linalg.norm(env.state(1).body_qd.numpy()[env.layout.root_body][:3]))
        seconds = (t + 1) * cfg.dt
        if not (np.isfinite(root).all() and math.isfinite(speed)):
            why = f"its root went non-finite after {seconds:.2f} s"
            break
        if root[up] > start + UP_TOLERANCE:
            why = f"its root rose to {root[up]:.2f} m (from {start:.2f} m) after {seconds:.2f} s"
            break
        if t == steps - 1 and speed > SETTLE_SPEED:
            why = f"its root still moves at {speed:.2f} m/s after {seconds:.2f} s"
            break
    _SETTLED[key] = why
    return why
