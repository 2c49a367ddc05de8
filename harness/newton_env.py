"""A base for envs built on a Newton ``Model``: one ``State`` per step, the solver, zeroing.

:class:`NewtonEnv` does what every Newton env of this project does the same way, so a
new env writes only its scene, its solver, its observables and its quantities:

- one ``newton.State`` per step, so a taped rollout never overwrites an input that
  backward needs (``per_step_states=false`` steps two States in turn instead: the wrong
  way, kept to show what per-step States fix);
- ``reset`` copies the initial state (``self.initial``, per state field) into state 0;
- ``step`` clears forces and calls ``solver.step`` with the step's control and contacts;
- ``zero_grad`` zeroes the gradient of every array of the model, the solver and every
  State, and of what :meth:`NewtonEnv.extra_arrays` and :meth:`NewtonEnv.step_arrays` add, in
  one launch (:mod:`harness.zeroing`: one graph node where a memset per buffer took hundreds);
- observables requested with ``steps: last`` only are recorded once (one row);
- the roles it can play for any Newton model: :class:`~harness.env.CarriesState` (the
  last state kept and carried), :class:`~harness.env.Identifiable` (quantities of the
  initial state, :attr:`NewtonEnv.initial_quantities`; a subclass adds its model's own),
  :class:`~harness.env.Renderable` (the model and its States);
- segments (``memory.segment_steps``, :mod:`harness.memory`): the States of one segment
  only, every array of the State (its attribute namespaces included, as ``State.assign``
  copies them) saved at each segment start and every gradient of the State carried
  between segments, for any Newton ``State``. A subclass whose per-step arrays are indexed
  by :meth:`NewtonEnv.slot` (and listed in :meth:`NewtonEnv.step_arrays`) lists
  :class:`~harness.env.Segmentable` among its bases. The saved states are one array per State
  array (a row per segment start) and :attr:`NewtonEnv.segment_base` holds the segment's first
  step on the device, so a subclass whose kernels address per-step rows as
  ``segment_base[0] + slot`` sets ``segment_graph = True`` and one captured segment serves
  every segment (:class:`harness.memory.SegmentGraphs`, docs/memory.md).

"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import numpy as np
import warp as wp

from harness.env import CarriesState, Env, EnvConfig, Identifiable, Renderable, Trajectory, array_grads, host_rng
from harness.schema import field
from harness.zeroing import FusedZero

__all__ = ["NewtonEnv", "NewtonEnvConfig", "finalize_worlds", "world_targets"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class NewtonEnvConfig(EnvConfig):
    """Fields every Newton env has."""

    per_step_states: bool = field(
        True, doc="one State per step; false steps two States in turn (wrong gradients, kept to show it)"
    )


@wp.kernel
def _particles_to_target(
    particle_q: wp.array(dtype=wp.vec3),
    per_world: int,
    count: int,
    targets: wp.array(dtype=wp.vec3),
    base: wp.array(dtype=wp.int32),
    offset: int,
    out: wp.array3d(dtype=wp.float32),
):
    # One thread per world averages its first `count` particles in order: the same sum on
    # every run and device (count 1: the particle's own position, exactly).
    world = wp.tid()
    row = base[0] + offset
    mean = wp.vec3(0.0)
    for i in range(count):
        mean += particle_q[world * per_world + i] / float(count)
    delta = mean - targets[world]
    out[row, world, 0] = delta[0]
    out[row, world, 1] = delta[1]
    out[row, world, 2] = delta[2]


@wp.kernel
def _restart_kernel(
    done: wp.array(dtype=wp.int32),
    per_world: int,
    fresh: wp.array(dtype=Any),
    before: wp.array(dtype=Any),
    after: wp.array(dtype=Any),
):
    # A selection: its adjoint sends the gradient of `after` into `before` only where done is 0.
    i = wp.tid()
    if done[i // per_world] != 0:
        after[i] = fresh[i]
    else:
        after[i] = before[i]


@wp.kernel
def _restart4_kernel(
    done: wp.array(dtype=wp.int32),
    per_world_0: int,
    fresh_0: wp.array(dtype=wp.float32),
    before_0: wp.array(dtype=wp.float32),
    per_world_1: int,
    fresh_1: wp.array(dtype=wp.float32),
    before_1: wp.array(dtype=wp.float32),
    per_world_2: int,
    fresh_2: wp.array(dtype=wp.float32),
    before_2: wp.array(dtype=wp.float32),
    per_world_3: int,
    fresh_3: wp.array(dtype=wp.float32),
    before_3: wp.array(dtype=wp.float32),
    after_0: wp.array(dtype=wp.float32),
    after_1: wp.array(dtype=wp.float32),
    after_2: wp.array(dtype=wp.float32),
    after_3: wp.array(dtype=wp.float32),
):
    # _restart_kernel for up to four float32 fields in one launch (an unused slot has size 0).
    i = wp.tid()
    if i < after_0.shape[0]:
        if done[i // per_world_0] != 0:
            after_0[i] = fresh_0[i]
        else:
            after_0[i] = before_0[i]
    if i < after_1.shape[0]:
        if done[i // per_world_1] != 0:
            after_1[i] = fresh_1[i]
        else:
            after_1[i] = before_1[i]
    if i < after_2.shape[0]:
        if done[i // per_world_2] != 0:
            after_2[i] = fresh_2[i]
        else:
            after_2[i] = before_2[i]
    if i < after_3.shape[0]:
        if done[i // per_world_3] != 0:
            after_3[i] = fresh_3[i]
        else:
            after_3[i] = before_3[i]


RESTART_SLOTS = 4
"""Fields :func:`_restart4_kernel` selects in one launch."""


@wp.kernel
def _save_kernel(
    base: wp.array(dtype=wp.int32), steps: int, k: int, source: wp.array(dtype=Any), saved: wp.array2d(dtype=Any)
):
    # Row r of the saved states holds step (r + 1) * k; the step saved is segment_base + steps.
    i = wp.tid()
    saved[(base[0] + steps) // k - 1, i] = source[i]


@wp.kernel
def _restore_kernel(base: wp.array(dtype=wp.int32), k: int, saved: wp.array2d(dtype=Any), target: wp.array(dtype=Any)):
    i = wp.tid()
    target[i] = saved[base[0] // k - 1, i]


@wp.kernel
def _carry_kernel(
    carry: wp.array(dtype=wp.int32),
    restart: wp.array(dtype=wp.int32),
    per_world: int,
    kept: wp.array(dtype=Any),
    initial: wp.array(dtype=Any),
):
    i = wp.tid()
    if carry[0] != 0 and restart[wp.min(i // per_world, restart.shape[0] - 1)] == 0:
        initial[i] = kept[i]


class NewtonEnv(Env, CarriesState, Identifiable, Renderable):
    """An env whose simulation is a Newton model stepped by a Newton solver.

    Subclasses implement :meth:`build_model`, :meth:`build_solver` and :meth:`write_observables`
    (with :meth:`row` and :attr:`observed`), set :attr:`dt` and :attr:`state_fields`,
    and may override :meth:`control_at`, :meth:`contacts_at`, :meth:`extra_arrays`.

    Attributes:
        state_fields: The State arrays that make up the simulation state (what ``reset``
            writes, what the adjoint clip sees), e.g.
            ``("particle_q", "particle_qd")``.
        initial_quantities: Quantities that are a field of the initial state, by name, e.g.
            ``{"initial_velocity": "particle_qd"}``: their start value is the field as built,
            and ``set_quantity`` copies into :attr:`initial` (``task=initial`` trains them).
        model: The Newton model; solver: the solver; states: the States of a rollout.
        initial: The initial state, by field (quantities of the initial state write here).
        observed: The recorded observables, by name, ``(rows, world_count, dim)``.
    """

    Config: ClassVar[type[EnvConfig]] = NewtonEnvConfig
    state_fields: ClassVar[tuple[str, ...]] = ("particle_q", "particle_qd")
    initial_quantities: ClassVar[dict[str, str]] = {}
    segment_note: ClassVar[str] = "its per-step arrays are not indexed by segment slot (NewtonEnv.slot)"

    def __init__(self, config: EnvConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        super().__init__(config, device=device, **fields)  # fields may carry segment_steps (Env)
        self.model = self.build_model()
        self.solver = self.build_solver()
        count = self.steps_kept + 1 if self.config.per_step_states else 2
        self.states = [self.new_state() for _ in range(count)]
        self._starts: list[Any] = []  # per step: the state after a restart (enable_restarts)
        self._base = 0  # the step whose State is states[0] (a segment's start)
        # the step of states[0], on the device: kernels address per-step rows (actions, observables)
        # as segment_base[0] + slot, so one captured segment serves every segment (segment_graph)
        self.segment_base = wp.zeros(1, dtype=wp.int32, device=self.device)
        self._saved: dict[str, wp.array] = {}
        self._carry: dict[str, wp.array] = {}
        self._stash: list[wp.array] | None = None
        self._final: dict[str, wp.array] = {}
        self._carry_all = wp.zeros(self.world_count, dtype=wp.int32, device=self.device)  # carry_final: no restarts
        self._built_state: dict[str, wp.array] = {}
        if self.segment_steps is not None:
            k = self.segment_steps
            # values only: a saved State with gradients would double its memory, and wp.copy
            # would copy those gradients along at every save and restore. One array per State
            # array, row r the state at step (r + 1) * k, so a captured save or restore can pick
            # its row from the device step (save_segment, restore_segment).
            rows = len(range(k, self.horizon, k))
            if rows:
                template = _state_arrays(self.new_state(requires_grad=False))
                self._saved = {
                    name: wp.empty((rows, *array.shape), dtype=array.dtype, device=self.device)
                    for name, array in template.items()
                }
            self._carry = {
                name: wp.zeros_like(array.grad)
                for name, array in _state_arrays(self.states[0]).items()
                if array.grad is not None
            }
        self.initial = {name: wp.clone(getattr(self.states[0], name), requires_grad=True) for name in self.state_fields}
        self._built_initial = {name: self.initial[f].numpy().copy() for name, f in self.initial_quantities.items()}
        self.control = self.model.control()
        # zero_grad and zero_segment_grad: every gradient buffer in one launch (harness.zeroing)
        self._zero_all = FusedZero(self.device)
        self._zero_segment = FusedZero(self.device)
        self._empty = wp.empty(0, dtype=wp.float32, device=self.device)  # an unused slot of _restart4_kernel
        self.request(self._wanted)  # sets self.observed

    def new_state(self, *, requires_grad: bool = True) -> Any:
        """A fresh ``newton.State`` of the model: every State of a rollout, a restart and a saved
        segment start is made here (a subclass adds arrays of its own, as :attr:`state_fields`)."""
        return self.model.state(requires_grad=requires_grad)

    @abc.abstractmethod
    def build_model(self) -> Any:
        """The finalized ``newton.Model`` (``requires_grad=True``) for ``self.config``."""

    @abc.abstractmethod
    def build_solver(self) -> Any:
        """The solver stepping ``self.model``."""

    @classmethod
    def segment_blocker(cls, config: EnvConfig) -> str | None:
        if not getattr(config, "per_step_states", True):
            return "env.per_step_states=false steps two States in turn; accepted: env.per_step_states=true"
        return super().segment_blocker(config)

    @property
    def steps_kept(self) -> int:
        """Steps whose States and per-step arrays are kept at once: the horizon, or a segment."""
        return self.segment_steps or self.horizon

    def slot(self, t: int) -> int:
        """Where step ``t``'s per-step arrays are: ``t``, or its place in its segment."""
        return t - self._base

    def state(self, t: int) -> Any:
        """The State holding the simulation after ``t`` steps."""
        if not self.config.per_step_states:
            return self.states[t % 2]
        k = self.slot(t)
        if not 0 <= k < len(self.states):
            raise IndexError(
                f"state {t} is outside the current segment (steps {self._base} .. {self._base + len(self.states) - 1})"
            )
        return self.states[k]

    def current(self, t: int) -> Any:
        """The State step ``t`` starts from: :meth:`state` (t), or, with restarts on
        (:class:`~harness.env.Restarts`), its copy in which the worlds whose episode ended
        start afresh."""
        if not self._starts or t == 0:
            return self.state(t)
        return self._starts[self.slot(t)]

    def observe(self, t: int, out: wp.array) -> None:
        """What a policy sees at step ``t`` (:class:`~harness.env.PolicyEnv`): :meth:`observe_state`
        of :meth:`current` (t)."""
        self.observe_state(self.current(t), out)

    def observe_ended(self, t: int, out: wp.array) -> None:
        """The observation of state ``t`` before any restart (:class:`~harness.env.Restarts`)."""
        self.observe_state(self.state(t), out)

    def observe_state(self, state: Any, out: wp.array) -> None:
        """Write the observation of ``state`` into ``out`` ``(world_count, observation_dim)`` with
        a recorded launch: what a subclass that plays :class:`~harness.env.PolicyEnv` implements."""
        raise NotImplementedError(f"env '{self.name}' offers no observation")

    # -- restarts ---------------------------------------------------------------------------

    def enable_restarts(self) -> None:
        """Give every step but the first a State of its own to restart into (once)."""
        if self.segment_steps is not None:
            raise ValueError(f"env '{self.name}': restarts inside a rollout do not run in segments")
        if not self._starts:
            self._starts = [None, *(self.new_state() for _ in range(self.steps_kept))]

    def restart(self, t: int, done: wp.array, key: wp.array) -> None:
        """Worlds whose ``done`` is 1 continue from a fresh draw (``draw_initial(key)``, written into
        :attr:`initial`), the others from state ``t``; the result is :meth:`current` (t). The
        selection is a recorded launch (one for up to :data:`RESTART_SLOTS` float32 fields, one per
        field of another dtype) whose adjoint passes nothing into an ended world."""
        self.draw_initial(key)
        source, target = self.state(t), self._starts[self.slot(t)]
        fused = []  # float32 fields: up to RESTART_SLOTS of them per launch
        for name in self.state_fields:
            fresh, old, new = self.initial[name], getattr(source, name), getattr(target, name)
            if new.dtype == wp.float32 and fresh.dtype == old.dtype == wp.float32:
                fused.append((fresh.flatten(), old.flatten(), new.flatten()))
                continue
            wp.launch(
                _restart_kernel, dim=new.size, inputs=[done, new.size // self.world_count, fresh.flatten(),
                old.flatten()], outputs=[new.flatten()], device=self.device,
            )  # fmt: skip
        for first in range(0, len(fused), RESTART_SLOTS):
            group = fused[first : first + RESTART_SLOTS]
            inputs: list[Any] = [done]
            for fresh, old, new in group:
                inputs += [new.size // self.world_count, fresh, old]
            empty = self._empty
            inputs += [1, empty, empty] * (RESTART_SLOTS - len(group))
            outputs = [new for _, _, new in group] + [empty] * (RESTART_SLOTS - len(group))
            wp.launch(
                _restart4_kernel, dim=max(new.size for _, _, new in group), inputs=inputs, outputs=outputs,
                device=self.device,
            )  # fmt: skip

    def step_arrays(self) -> list[wp.array]:
        """Per-step arrays indexed by :meth:`slot` (per-step scratch, per-step controls):
        their gradients are zeroed between segments."""
        return []

    # -- segments ---------------------------------------------------------------------------

    # The walks below run at call time: a solver may put new arrays on a State it steps.

    def _all_state_arrays(self) -> list[wp.array]:
        states = [*self.states, *self._starts[1:]]
        return [array for state in states for array in _state_arrays(state).values()]

    def begin_segment(self, start: int, *, restore: bool) -> None:
        self.set_segment_base(start)
        if restore:
            self.restore_segment()

    def end_segment(self, end: int) -> None:
        self.save_segment(self.slot(end))

    def set_segment_base(self, start: int) -> None:
        """The following steps are ``start, start + 1, ...`` (:meth:`slot`); writes
        :attr:`segment_base` (a host write: outside a captured segment graph)."""
        self._base = start
        self.segment_base.fill_(start)

    def restore_segment(self) -> None:
        """Copy the state saved at step ``segment_base`` into the segment's first State; the
        row comes from the device (the same launches for every segment)."""
        first = _state_arrays(self.states[0])
        for name, saved in self._saved.items():
            target = first[name]
            if target.size:
                wp.launch(
                    _restore_kernel, dim=target.size, inputs=[self.segment_base, self.segment_steps,
                    saved.reshape((saved.shape[0], target.size))], outputs=[target.flatten()], device=self.device,
                )  # fmt: skip

    def save_segment(self, steps: int) -> None:
        """Save the state ``steps`` steps after the segment's first (step ``segment_base + steps``,
        a segment start) into its row, picked on the device."""
        state = _state_arrays(self.states[steps])
        for name, saved in self._saved.items():
            source = state[name]
            if source.size:
                wp.launch(
                    _save_kernel, dim=source.size, inputs=[self.segment_base, steps, self.segment_steps,
                    source.flatten()], outputs=[saved.reshape((saved.shape[0], source.size))], device=self.device,
                )  # fmt: skip

    def zero_segment_grad(self) -> None:
        self._zero_segment.zero(_grads(*self._all_state_arrays(), *self.step_arrays()))

    def save_adjoint(self, t: int) -> None:
        state = _state_arrays(self.state(t))
        for name, carry in self._carry.items():
            wp.copy(carry, state[name].grad)

    def load_adjoint(self, t: int) -> None:
        state = _state_arrays(self.state(t))
        for name, carry in self._carry.items():
            wp.copy(state[name].grad, carry)

    def _accumulated(self) -> list[wp.array]:
        return [*array_grads(self.model), *(a.grad for a in self.initial.values() if a.grad is not None)]

    def stash_accumulated_grad(self) -> None:
        if self._stash is None:  # allocated in the first (eager) iteration, reused by a graph
            self._stash = [wp.empty_like(grad) for grad in self._accumulated()]
        for kept, grad in zip(self._stash, self._accumulated(), strict=True):
            wp.copy(kept, grad)

    def restore_accumulated_grad(self) -> None:
        for kept, grad in zip(self._stash, self._accumulated(), strict=True):
            wp.copy(grad, kept)

    def control_at(self, t: int) -> Any:
        """The Control of step ``t`` (one shared Control by default)."""
        return self.control

    def contacts_at(self, t: int) -> Any:
        """The Contacts of step ``t`` (None: no contacts)."""
        return None

    def extra_arrays(self) -> list[wp.array]:
        """Further arrays of the env whose gradients ``zero_grad`` must zero and that are not
        per step (a contact set every step reads, inputs); per-step ones are :meth:`step_arrays`."""
        return []

    # -- Env ------------------------------------------------------------------------------

    def request(self, wanted: dict[str, str]) -> None:
        super().request(wanted)
        dims = self.observables
        self.observed = {
            name: wp.zeros(
                (self.horizon if mode == "all" else 1, self.world_count, dims[name]),
                dtype=wp.float32,
                device=self.device,
                requires_grad=True,
            )
            for name, mode in self._wanted.items()
        }

    def row(self, name: str, t: int) -> int | None:
        """The row of ``observed[name]`` that step ``t`` writes, or None when it writes none.

        A kernel that writes the row takes :attr:`segment_base` and ``row - self._base`` (the
        row relative to the segment's first step) and writes row ``segment_base[0] + offset``:
        the same launch for every segment (the offset is the slot for ``steps: all``; the
        ``steps: last`` row is written by the last segment only)."""
        mode = self._wanted.get(name)
        if mode == "all":
            return t
        if mode == "last" and t == self.horizon - 1:
            return 0
        return None

    def write_offset(self, name: str, t: int, targets: wp.array, *, per_world: int, count: int) -> None:
        """Record observable ``name`` at step ``t`` (when requested): the mean position of the
        first ``count`` particles of each world (``per_world`` particles apart) minus the
        world's target."""
        row = self.row(name, t)
        if row is not None:
            wp.launch(
                _particles_to_target,
                dim=self.world_count,
                inputs=[self.state(t + 1).particle_q, per_world, count, targets, self.segment_base, row - self._base],
                outputs=[self.observed[name]],
                device=self.device,
            )

    def quantity_value(self, name: str) -> np.ndarray:
        """The value as built of a quantity of the initial state (:attr:`initial_quantities`); a
        subclass with quantities of its model handles those and calls this for the rest."""
        if name in self._built_initial:
            return self._built_initial[name].copy()
        raise KeyError(f"env '{self.name}' has no quantity '{name}'")

    def set_quantity(self, name: str, value: wp.array) -> None:
        """Copy ``value`` into the initial state's field of a quantity of :attr:`initial_quantities`
        (a recorded copy, so the gradient reaches ``value``); a subclass handles its model's."""
        if name not in self.initial_quantities:
            raise KeyError(f"env '{self.name}' has no quantity '{name}'")
        wp.copy(self.initial[self.initial_quantities[name]], value)

    def keep_final(self) -> None:
        last = self.current(self.horizon)
        for name, kept in self.carried().items():
            wp.copy(kept, getattr(last, name))

    def carry_final(self, carry: wp.array, restart: wp.array | None = None) -> None:
        self.keep_built_initial()
        restart = self._carry_all if restart is None else restart
        for name, kept in self.carried().items():
            per_world = max(1, kept.size // self.world_count)
            wp.launch(
                _carry_kernel, dim=kept.size, inputs=[carry, restart, per_world, kept.flatten()],
                outputs=[self.initial[name].flatten()], device=self.device,
            )  # fmt: skip

    def carried(self) -> dict[str, wp.array]:
        if not self._final:  # values only, allocated on first use
            self._final = {name: wp.zeros_like(self.initial[name], requires_grad=False) for name in self.state_fields}
        return self._final

    def initial_state(self) -> dict[str, wp.array]:
        return dict(self.initial)

    def keep_built_initial(self) -> None:
        """Keep the initial state as built (once), before a draw or a carry overwrites it."""
        if not self._built_state:
            self._built_state = {name: wp.clone(self.initial[name], requires_grad=False) for name in self.state_fields}

    def restore_initial(self) -> None:
        for name, built in self._built_state.items():
            wp.copy(self.initial[name], built)

    def reset(self) -> None:
        first = self.state(0)
        for name in self.state_fields:
            wp.copy(getattr(first, name), self.initial[name])

    def step(self, t: int) -> None:
        state, following = self.current(t), self.state(t + 1)
        state.clear_forces()
        self.solver.step(state, following, self.control_at(t), self.contacts_at(t), self.dt)

    def trajectory(self) -> Trajectory:
        """The observables; also brings :meth:`zero_grad`'s table of gradient buffers up to date
        (outside a capture): the solver adds arrays to the States it steps into for the first time,
        so the capture that follows a first eager rollout finds the table current (one launch,
        not a memset per buffer; :mod:`harness.zeroing`). A subclass that overrides it calls it."""
        self._zero_all.refresh(self._grad_buffers())
        return dict(self.observed)

    def state_arrays(self, t: int) -> list[wp.array]:
        state = self.state(t)
        return [getattr(state, name).reshape((self.world_count, -1)) for name in self.state_fields]

    def _grad_buffers(self) -> list[wp.array]:
        """Every gradient buffer :meth:`zero_grad` zeroes (walked at call time)."""
        return [
            *array_grads(self.model, self.solver, self.control),
            *_grads(
                *self._all_state_arrays(),
                *self.initial.values(),
                *self.observed.values(),
                *self.extra_arrays(),
                *self.step_arrays(),
            ),
        ]

    def zero_grad(self) -> None:
        """Zero every gradient the env owns: one launch for all of them (:mod:`harness.zeroing`;
        a memset per buffer inside a capture that finds the buffers changed)."""
        self._zero_all.zero(self._grad_buffers())


def _grads(*arrays: wp.array) -> list[wp.array]:
    return [array.grad for array in arrays if array.grad is not None]


def _state_arrays(state: Any) -> dict[str, wp.array]:
    """Every Warp array of a Newton ``State`` by attribute path: its own arrays and those in
    its attribute namespaces (``mujoco.qfrc_actuator``, custom attributes), the set Newton's
    ``State.assign`` copies. What a segment start saves, restores and carries."""
    import newton

    namespace = getattr(newton.Model, "AttributeNamespace", ())
    found: dict[str, wp.array] = {}
    for name, value in vars(state).items():
        if isinstance(value, wp.array):
            found[name] = value
        elif namespace and isinstance(value, namespace):
            found.update({f"{name}.{k}": v for k, v in vars(value).items() if isinstance(v, wp.array)})
    return found


def final_distances(trajectory: Trajectory, name: str) -> list[float]:
    """Each world's distance [m] at the last recorded row of an offset observable (``to_target``,
    ``com_to_target``), rounded to 0.1 mm: what the ports report in ``summary.json``."""
    offset = trajectory[name].numpy()[-1].astype(np.float64)
    return np.round(np.linalg.norm(offset, axis=1), 4).tolist()


def finalize_worlds(scene: Any, world_count: int, device: wp.context.Devicelike) -> Any:
    """Finalize a one-world ``newton.ModelBuilder`` scene as ``world_count`` independent copies.

    The copies overlap (Newton's ``replicate`` at spacing 0), so targets, observables and
    positions read the same in every world. Newton 1.8's particle-particle contact in
    ``SolverSemiImplicit`` (its hash grid) does not know worlds: coincident particles of two
    copies would push each other (and give NaN at distance 0). With more than one world it is
    switched off (``model.particle_grid = None``); tests/test_envs.py checks, env by env, that
    every world then steps exactly as the one-world scene does.
    """
    import newton

    if world_count > 1:
        worlds = newton.ModelBuilder(up_axis=scene.up_axis)
        worlds.replicate(scene, world_count, spacing=(0.0, 0.0, 0.0))
        scene = worlds
    model = scene.finalize(device=device, requires_grad=True)
    if world_count > 1:
        model.particle_grid = None
    return model


def world_targets(
    target: tuple[float, ...], spread: float, world_count: int, seed: int, device: wp.context.Devicelike
) -> wp.array:
    """One target per world: ``target`` moved by a seeded uniform draw from ``[-spread, spread]``
    per axis (exactly ``target`` for every world when ``spread`` is 0)."""
    draw = host_rng(seed).uniform(-spread, spread, (world_count, len(target)))
    return wp.array((np.asarray(target, np.float32) + draw).astype(np.float32), dtype=wp.vec3, device=device)
