"""The robot env's host class: :class:`RobotEnv` builds the model (:mod:`envs.robot.model`), keeps the
per-step storage and launches the kernels of :mod:`envs.robot.kernels` (the package docstring says
what a control step does)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import warp as wp

from envs.robot import kernels, model
from envs.robot.config import Piece, RobotConfig, Term
from envs.robot.report import blown_up, drive_figures, episode_figures
from envs.robot.settle import check_settles
from harness.adjoint import flat_grad_view, recording_tape
from harness.env import (
    ContactLoad,
    DrawsStarts,
    PolicyEnv,
    Restarts,
    Segmentable,
    Terminates,
    Trajectory,
    host_rng,
)  # fmt: skip
from harness.newton_env import NewtonEnv

if TYPE_CHECKING:
    import newton

__all__ = ["DRAW_SEED_OFFSET", "RobotEnv"]

DRAW_SEED_OFFSET = 104729
"""Added to the env's seed for the device draws of ``draw_initial`` (another stream than the host
draw of the env's own starts)."""


class RobotEnv(NewtonEnv, PolicyEnv, DrawsStarts, Restarts, ContactLoad, Terminates, Segmentable):
    """Any robot file on a ground plane; see :class:`~envs.robot.config.RobotConfig` and the package docstring."""

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
        # control=position: per step kept and substep, the drive's torques (kernels.drive writes them
        # before every substep; Newton's own drive is off for these dofs: it has no effort limit)
        self._drive_f = None
        if self.joint_target_q is not None:
            self._drive_f = wp.zeros(
                (kept, cfg.substeps, self.model.joint_dof_count), dtype=wp.float32, device=self.device,
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
        # env.recenter: per step kept, the State the last substep writes, before recenter moves it into
        # state(t + 1) (out of place: the solver's adjoint reads the poses it wrote)
        self._raw = [self.new_state() for _ in range(kept)] if cfg.recenter > 0 else []
        self._no_offset = wp.empty(0, dtype=wp.float32, device=self.device)  # the kernels' root_offset without it
        self._offset_views: dict[int, tuple[Any, wp.array]] = {}  # _offset's views, per State
        self.collide_at = [k for k in range(cfg.substeps) if k % cfg.collide_every == 0]
        self.contacts = [[self.pipeline.contacts() for _ in self.collide_at] for _ in range(kept)]
        # per step kept: which bodies touch the ground after the step (contact_mask; gradcheck's phases)
        self._touching = wp.zeros((kept, self.model.body_count), dtype=wp.int32, device=self.device)
        # world-steps after which a root was nan or inf in the rollout so far (robot/nonfinite_steps, nan_guard)
        self.nonfinite = wp.zeros(1, dtype=wp.int32, device=self.device)
        layout_mass = self.model.body_mass.numpy()[: self.layout.body_count].astype(np.float64).sum()
        gravity = float(np.linalg.norm(self.model.gravity.numpy().reshape(-1, 3)[0]))
        self._per_weight = 1.0 / max(layout_mass * gravity, 1e-12)  # 1 / a world's weight (contact_load)
        self._write_host_starts(host_rng(cfg.seed))
        # one quiet world of its own (settle.py says why not this env's worlds)
        check_settles(cfg, lambda quiet: RobotEnv(quiet, device=self.device))

    # -- the model ---------------------------------------------------------------------------------

    def new_state(self, *, requires_grad: bool = True) -> Any:
        state = self.model.state(requires_grad=requires_grad)
        # 1 until the world's episode has ended (an absorbing end: later rewards count 0)
        state.alive = wp.ones(self.world_count, dtype=wp.float32, device=self.device, requires_grad=requires_grad)
        state.prev_action = wp.zeros(
            self.world_count * len(self.layout.actuated_dofs), dtype=wp.float32, device=self.device,
            requires_grad=requires_grad,
        )  # fmt: skip
        if self.config.recenter > 0:  # how far recenter has moved each world along the ground (x, y, z) [m]
            state.root_offset = wp.zeros(self.world_count * 3, dtype=wp.float32, device=self.device,
                                         requires_grad=requires_grad)  # fmt: skip
        return state

    def build_model(self) -> newton.Model:
        self.layout = self.config.layout()
        if self.config.recenter > 0:
            if self.layout.recenter_blocker is not None:
                raise model.RobotFileError(
                    f"env.recenter: '{self.config.asset}' {self.layout.recenter_blocker}; accepted: 0 (never)"
                )
            self.state_fields = (*type(self).state_fields, "root_offset")  # carried, restarted, checkpointed
        built = model.build(self.config, self.layout, self.world_count, self.device)
        self.pipeline, self.kd_depth, self.base_q = built.pipeline, built.kd_depth, built.base_q
        return built.model

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
            entries = {"joint_q": layout.joint_coords, "joint_qd": layout.joint_dofs, "root_q": layout.root_q_coords,
                       "root_qd": layout.root_dofs}.get(piece, range(width))  # fmt: skip
            for i in entries:
                codes.append(Piece[piece.upper()])
                index.append(i)
                scale.append(scales.get(piece, 1.0))
        terms = cfg.reward_terms()

        def ints(values: Any) -> wp.array:
            return wp.array(np.asarray(values, dtype=np.int32), dtype=wp.int32, device=device)

        def floats(values: Any) -> wp.array:
            return wp.array(np.asarray(values, dtype=np.float32), dtype=wp.float32, device=device)

        self._obs_codes, self._obs_index, self._obs_scale = ints(codes), ints(index), floats(scale)
        self._terms, self._weights = ints([Term[t.upper()] for t in terms]), floats(list(terms.values()))
        limited = [(c, lo, hi) for (c, _), lo, hi in zip(layout.scalar_joints, layout.lower, layout.upper, strict=True)
                   if math.isfinite(lo) or math.isfinite(hi)]  # fmt: skip
        self._limit_coords = ints([c for c, _, _ in limited])
        self._lower = floats([max(lo, -1.0e30) for _, lo, _ in limited])
        self._upper = floats([min(hi, 1.0e30) for _, _, hi in limited])
        self._noisy = ints([c for c, _ in layout.scalar_joints])
        self._root_slides, self._root_hinges = ints(layout.root_slides), ints(layout.root_hinges)
        self._base_q = floats(self.base_q)
        # what act writes (apply_actions' index, rest, scale, stride, per-step output): the drive's
        # targets, start pose + target_scale x action, or the torques, 0 + torque x action
        if self.joint_target_q is not None:
            self._action_out = (ints(layout.target_coords), self._base_q, floats(layout.target_scale),
                                layout.coord_count, self.joint_target_q)  # fmt: skip
        else:
            self._action_out = (ints(layout.actuated_dofs), floats(np.zeros(layout.dof_count)), floats(layout.torque),
                                layout.dof_count, self.joint_f)  # fmt: skip
        if self.joint_target_q is not None:
            self._drive = kernels.Drive()
            self._drive.coords, self._drive.dofs = ints(layout.target_coords), ints(layout.actuated_dofs)
            self._drive.ke, self._drive.kd = floats(layout.target_ke), floats(layout.target_kd)
            self._drive.lower, self._drive.upper = floats(layout.drive_lower), floats(layout.drive_upper)
            self._drive.effort = floats(np.minimum(layout.effort_limit, 1.0e30))  # inf: none
            self._drive.speed = floats(np.minimum(layout.velocity_limit, 1.0e30))
            self._drive.coord_count, self._drive.dof_count = layout.coord_count, layout.dof_count
        self._up = wp.vec3(*np.eye(3)["xyz".index(cfg.up_axis)])
        self._forward = wp.vec3(*cfg.forward)
        # what ends an episode: the same for every step and every kernel that asks (kernels.ends)
        self._termination = kernels.termination(
            layout.root_body, layout.body_count, self._up, cfg.termination_height, cfg.termination_up
        )

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
        else:  # a root of slides and hinges: each moved as a floating base's position and rotation
            slides, hinges = list(layout.root_slides), list(layout.root_hinges)
            q[:, slides] += rng.uniform(-cfg.noise_position, cfg.noise_position, (worlds, len(slides)))
            q[:, hinges] += rng.uniform(-cfg.noise_rotation, cfg.noise_rotation, (worlds, len(hinges)))
        coords = [c for c, _ in layout.scalar_joints]
        q[:, coords] += rng.uniform(-cfg.noise_joint_q, cfg.noise_joint_q, (worlds, len(coords)))
        qd = rng.uniform(-cfg.noise_joint_qd, cfg.noise_joint_qd, (worlds, layout.dof_count))
        self.initial["joint_q"].assign(q.astype(np.float32).ravel())
        self.initial["joint_qd"].assign(qd.astype(np.float32).ravel())
        self.initial["prev_action"].zero_()
        self.initial["alive"].fill_(1.0)
        if cfg.recenter > 0:
            self.initial["root_offset"].zero_()

    def draw_initial(self, key: wp.array) -> None:
        self.keep_built_initial()
        cfg, layout = self.config, self.layout
        wp.launch(
            kernels.draw_starts, dim=self.world_count,
            inputs=[DRAW_SEED_OFFSET + cfg.seed, key, self._base_q, self._noisy, int(layout.root_free),
                    self._root_slides, self._root_hinges, layout.coord_count, layout.dof_count, cfg.noise_position,
                    cfg.noise_rotation, cfg.noise_joint_q, cfg.noise_joint_qd, len(layout.actuated_dofs)],
            outputs=[self.initial["joint_q"], self.initial["joint_qd"], self.initial["prev_action"],
                     self.initial["alive"]],
            device=self.device,
        )  # fmt: skip
        if cfg.recenter > 0:  # a fresh start is where the env's starts are: unmoved
            self.initial["root_offset"].zero_()

    # -- one rollout -------------------------------------------------------------------------------

    def reset(self) -> None:
        super().reset()
        self.nonfinite.zero_()
        if self.config.recenter > 0:  # a state carried from far out (a checkpoint from before env.recenter)
            first = self.state(0)
            self._recenter(first, first, record=False)  # in place, unrecorded: _pose recomputes the poses
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
            kernels.apply_actions, dim=(self.world_count, index.shape[0]),
            inputs=[actions, self.segment_base, self.slot(t), index, rest, scale, stride],
            outputs=[out[self.store(t)], self.state(t + 1).prev_action], device=self.device,
        )  # fmt: skip

    def step(self, t: int) -> None:
        slot, cfg = self.store(t), self.config
        source, last = self.current(t), self.state(t + 1)
        if cfg.nan_guard:  # the action act(t) wrote: the step's, and the previous action of state t + 1
            self._guard_adjoint(source, [self._action_out[4][slot], last.prev_action])
        contacts = None
        raw = self._raw[slot] if cfg.recenter > 0 else last  # the last substep's result
        for k in range(cfg.substeps):
            target = self.substeps.target(slot, k, raw)
            if k % cfg.collide_every == 0:
                contacts = self.contacts[slot][k // cfg.collide_every]
                self.pipeline.collide(source, contacts)
            self.substeps.prepare(slot, k)
            if self._drive_f is not None:
                self._apply_drive(slot, k, source)
            source.clear_forces()
            if self.kd_depth is not None:  # Hunt-Crossley: the contacts' damping as external wrenches
                self._damp(source, contacts)
            self.solver.step(source, target, self.controls[slot], contacts, self.substep_dt)
            source = target
        if cfg.recenter > 0:
            self._recenter(raw, last, offset=self.current(t).root_offset)
        touching = self._touching[slot]
        if self.model.body_count != self.world_count * self.layout.body_count:  # bodies survive does not clear
            touching.zero_()
        wp.launch(
            kernels.survive, dim=self.world_count, inputs=[last.body_q, self._termination, self.current(t).alive],
            outputs=[last.alive, touching, self.nonfinite], device=self.device,
        )  # fmt: skip
        # marks without a gradient: not on the tape (no adjoint launch)
        wp.launch(
            kernels.mark_contacts, dim=contacts.rigid_contact_max,
            inputs=[raw.body_q, kernels.contact_set(self.model, contacts)], outputs=[touching], device=self.device,
            record_tape=False,
        )  # fmt: skip

    def _recenter(self, source: newton.State, target: newton.State, *, offset: wp.array | None = None,
                  record: bool = True) -> None:  # fmt: skip
        """``env.recenter``: ``target`` is ``source`` with each world moved along the ground toward the
        origin by a whole multiple of ``env.recenter`` (:func:`~envs.robot.kernels.recenter`), its
        ``root_offset`` the offset ``source`` had (or ``offset``) plus the move."""
        layout, up = self.layout, "xyz".index(self.config.up_axis)
        ground = wp.vec3(*(0.0 if d == up else 1.0 for d in range(3)))
        wp.launch(
            kernels.recenter, dim=self.world_count,
            inputs=[source.joint_q, source.joint_qd, source.body_q, source.body_qd,
                    source.root_offset if offset is None else offset, wp.vec3i(*layout.root_translation), ground,
                    float(self.config.recenter), layout.coord_count, layout.dof_count, layout.body_count],
            outputs=[target.joint_q, target.joint_qd, target.body_q, target.body_qd, target.root_offset],
            device=self.device, record_tape=record,
        )  # fmt: skip

    def contact_load(self, t: int, out: wp.array) -> None:
        """Each world's contact load after step ``t`` (:class:`~harness.env.ContactLoad`): the spring
        part of every contact's normal force (stiffness x depth, at the step's result, with the step's
        last collision's points, as :meth:`touching` reads them) summed over the world, in the world's
        weight (its mass x |gravity|): 1 for a robot at rest on the ground, more at an impact."""
        contacts = self.contacts[self.store(t)][-1]
        posed = (
            self._raw[self.store(t)] if self.config.recenter > 0 else self.state(t + 1)
        )  # where the contacts were made
        out.zero_()
        wp.launch(
            kernels.contact_load, dim=contacts.rigid_contact_max,
            inputs=[posed.body_q, kernels.contact_set(self.model, contacts), self.model.shape_material_ke,
                    self.model.body_world, self._per_weight],
            outputs=[out], device=self.device, record_tape=False,
        )  # fmt: skip

    def _guard_adjoint(self, source: newton.State, actions: list[wp.array]) -> None:
        """``env.nan_guard``: on the tape before the step's launches (after ``act(t)``'s), so the
        backward pass runs it once the step's adjoint and every later one are through: nan and inf
        in the adjoint of the state the step starts from and of what ``act(t)`` wrote become 0
        before they flow into the earlier steps and the actions (DiffRL's ``nan_state_fix``: hooks
        on ``joint_q``, ``joint_qd`` and the actions). With the observation and the reward of a
        non-finite world 0 (no gradient reads its state there), the nan stays in its own steps; the
        other worlds' gradient is untouched (nothing to replace where the numbers are finite)."""
        tape = recording_tape()
        if tape is None:
            return
        arrays = [getattr(source, name, None) for name in GUARDED_FIELDS] + actions
        grads = [
            flat_grad_view(array.reshape((self.world_count, -1)), self.world_count).flatten()
            for array in arrays
            if array is not None and array.grad is not None
        ]

        def backward() -> None:
            for grad in grads:
                wp.launch(kernels.finite_adjoint, dim=grad.shape, inputs=[grad], device=self.device)

        tape.record_func(backward, [])

    def _apply_drive(self, slot: int, k: int, state: newton.State) -> None:
        """The drive's torques on substep ``k`` of the step in ``slot``, from ``state`` and the step's
        targets (:func:`~envs.robot.kernels.drive`), as the joint forces that substep applies."""
        torques = self._drive_f[slot, k]
        wp.launch(
            kernels.drive, dim=(self.world_count, len(self.layout.actuated_dofs)),
            inputs=[state.joint_q, state.joint_qd, self.joint_target_q[slot], self._drive], outputs=[torques],
            device=self.device,
        )  # fmt: skip
        self.controls[slot].joint_f = torques

    def _damp(self, state: newton.State, contacts: newton.Contacts) -> None:
        """Add the Hunt-Crossley damping of the substep from ``state`` to its external wrenches
        (:func:`~envs.robot.kernels.hunt_crossley`)."""
        wp.launch(
            kernels.hunt_crossley, dim=contacts.rigid_contact_max,
            inputs=[state.body_q, state.body_qd, self.model.body_com, kernels.contact_set(self.model, contacts),
                    self.kd_depth],
            outputs=[state.body_f], device=self.device,
        )  # fmt: skip

    def write_observables(self, t: int) -> None:
        cfg, layout, state = self.config, self.layout, self.state(t + 1)
        row = self.row("reward", t)
        if row is None:
            return
        wp.launch(
            kernels.record, dim=self.world_count,
            inputs=[state.joint_q, state.body_q, state.body_qd, state.prev_action, self._terms, self._weights,
                    self._limit_coords, self._lower, self._upper, layout.root_body, layout.body_count,
                    layout.coord_count, len(layout.actuated_dofs), self._up, self._forward, cfg.height_reference,
                    cfg.height_cap, cfg.height_penalty, cfg.height_scale, self._termination, int(cfg.nan_guard),
                    self.current(t).alive, self._offset(state), self.segment_base, row - self._base],
            outputs=[self.observed["reward"], self.observed["root_position"], self.observed["terminated"]],
            device=self.device,
        )  # fmt: skip
        if self._drive_f is not None:
            wp.launch(
                kernels.drive_load, dim=self.world_count,
                inputs=[self._drive_f[self.store(t)], state.joint_qd, self._drive, self.segment_base, row - self._base],
                outputs=[self.observed["drive"]], device=self.device, record_tape=False,
            )  # fmt: skip

    def request(self, wanted: dict[str, str]) -> None:
        # one launch writes the three observables: every one is kept, at the widest mode asked for
        super().request(wanted)
        mode = "all" if "all" in wanted.values() or not wanted else "last"
        super().request(dict.fromkeys(self.observables, mode))

    def observe_state(self, state: newton.State, out: wp.array) -> None:
        layout = self.layout
        wp.launch(
            kernels.observe, dim=(self.world_count, self._obs_codes.shape[0]),
            inputs=[state.joint_q, state.joint_qd, state.body_q, state.body_qd, state.prev_action, self._obs_codes,
                    self._obs_index, self._obs_scale, layout.root_body, layout.body_count, layout.coord_count,
                    layout.dof_count, len(layout.actuated_dofs), self._up, self._forward, int(self.config.nan_guard),
                    self._offset(state)],
            outputs=[out], device=self.device,
        )  # fmt: skip

    def _offset(self, state: newton.State) -> wp.array:
        """A State's ``root_offset`` under ``env.recenter`` (what the kernels add to a position), else
        empty: a view of its memory without a gradient, so a loss on the reported or observed position
        differentiates the simulated one only, as without recentring."""
        if self.config.recenter <= 0:
            return self._no_offset
        found = self._offset_views.get(id(state))
        if found is None:
            offset = state.root_offset
            view = wp.array(ptr=offset.ptr, dtype=offset.dtype, shape=offset.shape, device=offset.device)
            found = self._offset_views[id(state)] = (state, view)  # (the State kept: its id stays its own)
        return found[1]

    def terminated(self, t: int, out: wp.array) -> None:
        # flags without a gradient: not on the tape (no adjoint launch)
        wp.launch(
            kernels.flag_ends, dim=self.world_count, inputs=[self.state(t).body_q, self._termination], outputs=[out],
            device=self.device, record_tape=False,
        )  # fmt: skip

    def control_at(self, t: int) -> newton.Control:
        return self.controls[self.store(t)]

    def store(self, t: int) -> int:
        """Where step ``t``'s storage (substep States, scratch, Contacts, joint forces) is: its slot
        (:meth:`~harness.newton_env.NewtonEnv.slot`), or the one set with ``per_step_states=false``."""
        return self.slot(t) if self.config.per_step_states else 0

    def step_arrays(self) -> list[wp.array]:
        targets = [] if self.joint_target_q is None else [self.joint_target_q, self._drive_f]
        raw = [value for state in self._raw for value in vars(state).values() if isinstance(value, wp.array)]
        return [self.joint_f, *targets, *self.substeps.arrays(), *raw]

    # -- what a run reports ------------------------------------------------------------------------

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        """:func:`~envs.robot.report.episode_figures` of a whole-horizon rollout, and each reward term's
        mean per step."""
        needed = ("reward", "terminated", "root_position")
        if any(name not in trajectory or trajectory[name].shape[0] != self.horizon for name in needed):
            return {}
        q0 = self.initial["joint_q"].numpy().reshape(self.world_count, -1).astype(np.float64)
        start = q0[:, 0:3] if self.layout.root_free else trajectory["root_position"].numpy()[0].astype(np.float64)
        if self.config.recenter > 0:
            start = start + self.initial["root_offset"].numpy().reshape(self.world_count, 3)
        reward = trajectory["reward"].numpy().astype(np.float64)
        found = episode_figures(
            reward, trajectory["terminated"].numpy(), trajectory["root_position"].numpy().astype(np.float64), start,
            np.asarray(self.config.forward, np.float64), self.dt,
        )  # fmt: skip
        for k, term in enumerate(self.config.reward_terms()):
            found[f"reward_{term}_per_step"] = float(reward[:, :, k].mean())
        if "drive" in trajectory and trajectory["drive"].shape[0] == self.horizon:
            found.update(drive_figures(trajectory["drive"].numpy(), trajectory["terminated"].numpy()))
        return found

    def columns(self) -> list[tuple[str, wp.array, int]]:
        """``robot/nonfinite_steps`` under ``env.nan_guard``: the world-steps after which a root was nan
        or inf in the iteration's rollout (with SHAC's restarts each blow-up once: the world ends its
        episode there and starts afresh)."""
        return [("robot/nonfinite_steps", self.nonfinite, 0)] if self.config.nan_guard else []

    def component_names(self) -> dict[str, list[str]]:
        return {
            "reward": [f"{term} (weighted)" for term in self.config.reward_terms()],
            "root_position": ["root x [m]", "root y [m]", "root z [m]"],
            "terminated": ["episode ended (1)"],
            "drive": ["largest |torque| / effort limit", "largest |torque| [N m]", "largest |joint speed| [rad/s]"],
        }

    def touching(self) -> np.ndarray:
        """Which bodies touch something after every step kept of the latest rollout, bool ``(steps,
        world_count, bodies)``: a contact of the step's last collision with negative distance at the
        step's result (the distance newton's contact force reads)."""
        return self._touching.numpy().reshape(self.steps_kept, self.world_count, -1) > 0

    def body_offsets(self, state: newton.State) -> np.ndarray | None:
        """``env.recenter``: what to add to each body's position in ``state`` for where it is
        (``(body_count, 3)``: its world's ``root_offset``); None without it."""
        if self.config.recenter <= 0:
            return None
        found = np.zeros((self.model.body_count, 3), dtype=np.float32)
        per_world = np.repeat(state.root_offset.numpy().reshape(self.world_count, 3), self.layout.body_count, axis=0)
        found[: per_world.shape[0]] = per_world
        return found

    def blowup(self) -> str | None:
        """Where the latest rollout left finite numbers: the first step (of the rollout's States kept)
        with a body :func:`~envs.robot.report.blown_up`, with the body and world; None when every
        State is finite and near."""
        for k, state in enumerate(self.states[1:], start=1):
            poses = state.body_q.numpy()
            shift = self.body_offsets(state)
            if shift is not None:
                poses = poses.copy()
                poses[:, :3] += shift
            found = blown_up(poses, self.world_count, self.layout.body_count)
            if found is not None:
                world, body = found
                return (
                    f"the simulation left finite numbers at step {self._base + k} of the last rollout: body "
                    f"'{self.layout.body_names[body]}' of world {world}"
                )
        return None


GUARDED_FIELDS = ("joint_q", "joint_qd", "body_q", "body_qd", "prev_action", "alive")
"""The State arrays whose adjoint ``env.nan_guard`` cleans where a step begins (the state's fields
and the poses and twists computed from them)."""
