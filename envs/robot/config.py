"""The robot env's schema (``configs/env/robot.yaml``) and the names its data is made of.

Observation pieces (``observation``, in order; widths for a robot with ``n`` joint coordinates,
``m`` dofs and ``a`` actions besides the root): ``root_height`` (1), ``root_position`` (3),
``root_rotation`` (4, quaternion x y z w), ``root_linear_velocity`` (3, the centre of mass, world
frame), ``root_angular_velocity`` (3, world frame), ``joint_q`` (n), ``joint_qd`` (m),
``up`` (1: the root's up axis . world up), ``heading`` (1: the root's forward axis . world forward),
``previous_action`` (a), ``root_q`` (the root joint's coordinates but its slides along the ground:
a floating base's height and quaternion, 5; a planar root's height and pitch, 2), ``root_qd`` (the
root joint's velocities: 6 for a floating base, 3 for a planar root). ``observation_scale``
multiplies a piece (DiffRL scales joint velocities by 0.1).

Reward terms (``reward``, name -> weight; each term per world and step): ``forward_velocity``
(centre-of-mass velocity . forward [m/s]), ``upright`` (``up`` above), ``heading`` (``heading``
above), ``height`` (root height - ``height_reference`` [m]), ``action_cost`` (-sum of the squared
clipped actions), ``joint_limit_cost`` (-sum of the squared joint-limit violations [rad^2 or m^2]),
``alive`` (1), ``height_shaped`` (DiffRL's Hopper and Humanoid: with ``h`` = root height -
``height_reference`` clipped to [-1, ``height_cap``], ``height_scale h`` where it is positive,
``-height_penalty h^2`` where negative), ``pitch_cost`` (-pitch^2 [rad^2], the pitch the angle of
the root's forward axis below the horizontal, about the axis across ``forward``). ``loss: robot``
(``configs/loss/robot.yaml``) makes the cost of a step minus their sum, so ``task=shac``
maximises it.

Termination (``termination_height``, ``termination_up``): a state whose root is below the height,
or whose ``up`` is below the threshold, ends the world's episode; ``task=shac`` restarts the world
there and does not bootstrap its value (:class:`~harness.env.Terminates`).

A piece and a term are named once, in :class:`Piece` and :class:`Term`: the YAML's names are their
members' names in lower case, and the kernels (:mod:`envs.robot.kernels`) branch on the members.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import numpy as np

from envs.robot.layout import RobotLayout, robot_layout
from harness.newton_env import NewtonEnvConfig
from harness.schema import field

__all__ = ["OBSERVATION_PIECES", "REWARD_TERMS", "Piece", "RobotConfig", "Term"]


class Piece(enum.IntEnum):
    """An observation piece (module docstring): the code an observation's column carries."""

    ROOT_HEIGHT = 0
    ROOT_POSITION = 1
    ROOT_ROTATION = 2
    ROOT_LINEAR_VELOCITY = 3
    ROOT_ANGULAR_VELOCITY = 4
    JOINT_Q = 5
    JOINT_QD = 6
    UP = 7
    HEADING = 8
    PREVIOUS_ACTION = 9
    ROOT_Q = 10
    ROOT_QD = 11


class Term(enum.IntEnum):
    """A reward term (module docstring): the code a reward's column carries."""

    FORWARD_VELOCITY = 0
    UPRIGHT = 1
    HEADING = 2
    HEIGHT = 3
    ACTION_COST = 4
    JOINT_LIMIT_COST = 5
    ALIVE = 6
    HEIGHT_SHAPED = 7
    PITCH_COST = 8


OBSERVATION_PIECES = tuple(piece.name.lower() for piece in Piece)
"""The named pieces an observation is made of (module docstring), in their code order."""

REWARD_TERMS = tuple(term.name.lower() for term in Term)
"""The named reward terms (module docstring), in their code order."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RobotConfig(NewtonEnvConfig):
    """``configs/env/robot.yaml``: the fields of any robot (module docstring)."""

    asset: str = field(
        doc="the robot file: MJCF (.xml), URDF (.urdf) or USD; 'newton:NAME' for Newton's bundled assets, "
        "'harness:NAME' for the harness's (envs/robot/assets)"
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
    effort_limit: tuple[float, ...] | None = field(
        None,
        minimum=0.0,
        strict=True,
        finite=False,
        doc="control=position: the most torque [N m] (or force [N]) the drive gives on any substep, one or per "
        "dof (null: the file's, a URDF <limit effort> or MJCF actuatorfrcrange; inf (.inf in YAML) or none "
        "given: unlimited)",
    )
    velocity_limit: tuple[float, ...] | None = field(
        None,
        minimum=0.0,
        strict=True,
        finite=False,
        doc="control=position: the joint speed [rad/s or m/s] at which the drive's torque in the direction of "
        "motion falls to 0, linearly from effort_limit at rest (a DC motor; null: the file's <limit velocity>; "
        "inf or none given: no fall)",
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
    root_armature: float | None = field(
        None, minimum=0.0, doc="armature of the root joint's dofs [kg or kg m^2] (null: the file's; DiffRL's Hopper 1)"
    )
    joint_damping: float | None = field(
        None, minimum=0.0, doc="damping of every non-root dof [N m s/rad] (null: the file's)"
    )
    joint_stiffness: float | None = field(
        None,
        minimum=0.0,
        doc="passive spring of every non-root dof toward the file's rest coordinate (MJCF springref, 0 unless "
        "given) [N m/rad or N/m] (null: the file's, as DiffRL's Humanoid reads them: 2 to 20 N m/rad)",
    )
    limit_ke: float | None = field(None, minimum=0.0, doc="joint-limit stiffness [N m/rad] (null: the file's)")
    limit_kd: float | None = field(None, minimum=0.0, doc="joint-limit damping [N m s/rad] (null: the file's)")
    limit_kd_everywhere: bool = field(
        False,
        doc="dflex's joint law (DiffRL): the limit damping acts at every coordinate, not only past a limit "
        "(added to the joint damping of every slide and hinge, a planar root's too, and Newton's "
        "past-the-limit term dropped)",
    )
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
    height_reference: float = field(0.0, doc="the height terms read root height - height_reference [m]")
    height_cap: float = field(
        0.3, minimum=0.0, doc="height_shaped: the most the term gives above height_reference [m] (DiffRL's Hopper 0.3)"
    )
    height_penalty: float = field(
        200.0, minimum=0.0, doc="height_shaped: the quadratic penalty's factor below height_reference (DiffRL 200)"
    )
    height_scale: float = field(
        1.0,
        minimum=0.0,
        doc="height_shaped: the factor of the part above height_reference (DiffRL's height_rew_scale: the "
        "Hopper's 1, the Humanoid's 10)",
    )
    termination_height: float | None = field(None, doc="an episode ends when the root is below this height [m]")
    termination_up: float | None = field(
        None, minimum=-1.0, maximum=1.0, doc="an episode ends when up (root up axis . world up) is below this"
    )
    settle_time: float = field(2.0, minimum=0.0, doc="seconds an unactuated world is simulated to check the file")
    nan_guard: bool = field(
        False,
        doc="a world whose simulation goes non-finite keeps it to itself (DiffRL's nan_state_fix, its Humanoid's): "
        "its step's reward is 0, and nan or inf in the adjoint leaving each step becomes 0",
    )
    recenter: float = field(
        0.0,
        minimum=0.0,
        doc="after every control step, move each world's floating base back toward the origin along the ground "
        "by whole multiples of this [m] (0: never; 1: whole metres, exact in float32): 100 m out float32 "
        "loses the contact arithmetic's precision. Reported, observed and rendered positions add the offset back",
    )

    def check(self) -> None:
        if self.recenter > 0 and not (float(self.recenter).is_integer() or math.log2(self.recenter).is_integer()):
            raise ValueError(
                f"recenter: {self.recenter} m is not exact in float32 (the offsets would drift); accepted: 0 "
                "(never), a whole number of metres, or a power of two (0.5, 0.25, ...)"
            )
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
        dims = {"reward": len(self.reward_terms()), "root_position": 3, "terminated": 1}
        if self.control == "position":
            dims["drive"] = 3  # what the drive gave (kernels.drive_load)
        return dims

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
