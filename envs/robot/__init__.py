"""Any robot file as an env: an MJCF, URDF or USD robot on a ground plane, stepped by Featherstone.

``+env=robot env.asset=PATH`` loads the file with Newton's importers (``ModelBuilder.add_mjcf``,
``add_urdf``, ``add_usd``), replicates it over ``world_count`` worlds that overlap on one ground
plane (contacts never cross worlds: Newton's collision pipeline keeps worlds apart) and steps it
with ``SolverFeatherstone``, ``substeps`` solver steps per control step. Everything task-specific
is data in the env's YAML (docs/envs.md, "A robot of your own"): which joints are actuated and
their torque per unit action, the root body, the observation as named pieces, the reward as
weighted terms, early termination, the start and its noise (:mod:`envs.robot.config` names them
all). ``configs/env/ant.yaml``, ``hopper.yaml`` and ``humanoid.yaml`` (DiffRL's) and
``configs/env/quadruped.yaml`` are such YAML files and nothing else.

A file given with nothing else loads with these defaults: every non-fixed joint other than the
floating base is actuated, each degree of freedom at the asset's own torque scale (an MJCF
``<motor gear>``; a URDF ``<limit effort>``) or ``default_torque``; the root is the body of the
floating base; forward is +x and up is +z; the start height puts the asset's lowest collision
point ``clearance`` above the ground; joint coordinates start at zero clamped into their limits.
Before a run trains such a file the env simulates one world, unactuated, for ``settle_time``
seconds (:func:`envs.robot.settle.settle`): a robot that leaves the ground, spins up or goes
non-finite is refused in one line saying what it did (``env.settle_time=0`` skips the check).

Every control step:

1. ``act``: the action, clipped to [-1, 1], times each actuated dof's torque scale into the
   step's ``joint_f`` (``control: torque``), or, with ``control: position``, each actuated dof's
   start coordinate plus ``target_scale`` times the action into the step's ``joint_target_q``,
   which the env's drive tracks on every substep (:func:`envs.robot.kernels.drive`, on the tape)
   with the torque ``target_ke (target - q) - target_kd qd`` (a PD drive: the way legged robots
   are commonly trained, e.g. Rudin et al. 2022), cut past a joint limit as Newton's joint drive
   is, and held inside a DC motor's envelope: at most ``effort_limit`` at rest, the bound in the
   direction of motion falling linearly to 0 at ``velocity_limit`` (both the file's unless the
   YAML sets them; Newton's own drive, which has no effort limit, is off for these dofs); the
   clipped action is also written into the next state as its
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
   ``root_position`` [m] and ``terminated`` (1.0 where the state meets the termination rule);
   with ``control: position`` also ``drive`` (the step's largest torque over its effort limit,
   largest torque and largest joint speed: what ``evaluate`` reports of the motors).

The package, one concern a module:

- :mod:`~envs.robot.config`: the schema (:class:`RobotConfig`) and the names of the observation
  pieces and reward terms (:class:`Piece`, :class:`Term`), with what each means;
- :mod:`~envs.robot.layout`: reading the file (Newton's importers, one-line refusals) and one
  world's joints, dofs and actions (:class:`RobotLayout`), without building a simulation;
- :mod:`~envs.robot.model`: the builder edits the config asks for, the start pose, the worlds on
  the ground plane;
- :mod:`~envs.robot.kernels`: every Warp kernel and function, the termination rule written once;
- :mod:`~envs.robot.env`: :class:`RobotEnv`, the host class that launches them;
- :mod:`~envs.robot.settle`: the check that an unactuated robot comes to rest;
- :mod:`~envs.robot.report`: the locomotion figures of a run and where a simulation blew up.
"""

from envs.robot.config import OBSERVATION_PIECES, REWARD_TERMS, Piece, RobotConfig, Term
from envs.robot.env import RobotEnv
from envs.robot.layout import RobotFileError, RobotLayout
from envs.robot.report import episode_figures

__all__ = [
    "OBSERVATION_PIECES",
    "REWARD_TERMS",
    "Piece",
    "RobotConfig",
    "RobotEnv",
    "RobotFileError",
    "RobotLayout",
    "Term",
    "episode_figures",
]
