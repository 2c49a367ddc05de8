"""The environment interface the harness talks to: a small core, optional roles, and the
capture contract every env keeps.

An environment owns a simulation and nothing else: it never sees an optimizer, a clip
policy, a logger, or what is trained. It describes itself through its config schema
(:class:`EnvConfig`, a dataclass from which the checks, the observables' widths, the
action width and the physical quantities' shapes all follow, without building anything).

The core (:class:`Env`): what every env implements, and all an open-loop task needs.

- :meth:`Env.reset` writes the initial state into state 0;
- :meth:`Env.act` hands step ``t`` its action (when the env takes actions);
- :meth:`Env.step` advances state ``t`` to state ``t + 1``;
- :meth:`Env.write_observables` writes the observables a loss reads of state ``t + 1`` into row ``t``;
- :meth:`Env.trajectory` returns them; :meth:`Env.zero_grad` zeroes every gradient the env owns.

Roles: what a task may ask for besides the core. An env plays a role by subclassing it
(``class CartpoleEnv(NewtonEnv, PolicyEnv, DrawsStarts, Segmentable)``); a task lists the
roles it needs (:attr:`harness.tasks.Task.roles`) and a run whose env lacks one stops in one
line naming it, before anything is built.

- :class:`PolicyEnv`: :meth:`~PolicyEnv.observe` writes what a policy sees (``task=policy``, ``task=shac``);
- :class:`DrawsStarts`: :meth:`~DrawsStarts.draw_initial` draws fresh initial states on the device;
- :class:`CarriesState`: a rollout continues from where the last one ended (windows);
- :class:`Restarts`: worlds whose episode ended start a fresh one inside a rollout (SHAC);
- :class:`Terminates`: a world's episode ends early where its state says so (a robot that fell);
- :class:`ContactLoad`: how hard each world presses on what it touches after a step (``task=ahac``);
- :class:`Segmentable`: save and restore what a segment needs (``memory.segment_steps``);
- :class:`Identifiable`: named physical quantities a task trains or fits (``physical``,
  ``initial``, ``sysid``, ``harness record``);
- :class:`Renderable`: a Newton model and its State after every step (``harness render``);
- :class:`Plant`: a real system beside the rollouts, advanced one control step at a time by
  what the rollouts planned (``task=mpc``).

What is trained is the task's choice (:mod:`harness.tasks`): the actions of every step
(open loop), a policy's weights, or named quantities. :func:`harness.tasks.rollout` drives
the steps. Concrete envs live outside this package (``envs/`` in this repository, or a
user's own module); ``harness`` never imports them. docs/envs.md shows the smallest env.
A command line is checked against the env's ``Config`` before anything is built, so an env
module that imports Newton inside the methods that build the simulation (as ``envs/`` does)
lets a refused command line stop without importing Newton (docs/startup.md).

The capture contract
--------------------
A training iteration is recorded once into a graph (``wp.ScopedCapture``, on the CPU as
on CUDA) and replayed with ``wp.capture_launch`` for every later iteration. Replay
re-runs the recorded launches with the arguments they had when recorded, so an env
whose :attr:`Env.capturable` is True promises, for every method a rollout calls
(:meth:`~Env.reset`, :meth:`~Env.act`, :meth:`~Env.step`, :meth:`~Env.write_observables`,
the roles' methods, :meth:`~Env.trajectory`) and :meth:`~Env.zero_grad`:

1. **Same arrays every call.** Every launch, copy and memset reads and writes arrays
   allocated before the first rollout; the same call touches the same arrays each time.
2. **No host reads.** Nothing calls ``.numpy()``, ``float(array)`` or branches in Python
   on a device value; a capture records no branch, and a read during capture returns a
   stale value without an error.
3. **No allocation per call.** Nothing allocates a Warp array (a freshly allocated
   ``Contacts``, a temporary ``wp.zeros``) inside these methods. Lazy allocation on the
   first call is fine: the trainer always runs one eager iteration before capturing.
4. **Nothing that varies as a Python value.** A Python number handed to a kernel is
   frozen into the graph; anything that changes between iterations lives in a device
   array. (Loop indices such as the step ``t`` are fine: they are the same at every replay.)

An env that cannot keep the contract sets ``capturable = False`` (and says why in
``capture_note``); ``capture=auto`` then runs eagerly after printing that reason, and
``capture=true`` refuses to start. :func:`harness.training.step.check_capture` compares
an eager and a replayed rollout bit for bit, the test every env in this repository passes.

Segments (bounded memory)
-------------------------
With ``memory.segment_steps=K`` (:mod:`harness.memory`) a rollout runs in segments of K
steps: the env keeps the states of one segment only (K + 1 of them, reused by every
segment) and a saved copy of the state at every segment start. Backward runs segment by
segment from the last, re-running each segment's forward under its own tape from its saved
start state and carrying the state's adjoint into the previous segment. An env that can do
this plays :class:`Segmentable`; :class:`harness.newton_env.NewtonEnv` implements it
generically for Newton ``State`` objects (every array of the State is saved and every
gradient carried), and a subclass whose per-step arrays (a per-step scratch copy, a
per-step control) are indexed by the step's slot in its segment
(:meth:`~harness.newton_env.NewtonEnv.slot`) lists :class:`Segmentable` among its bases.
With graph capture, an env that also sets :attr:`Segmentable.segment_graph` has one
segment's captured graph replayed for every segment (docs/memory.md).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import warp as wp

from harness import schema
from harness.schema import field

__all__ = [
    "ROLES",
    "CarriesState",
    "ContactLoad",
    "DrawsStarts",
    "Env",
    "EnvConfig",
    "Identifiable",
    "Plant",
    "PolicyEnv",
    "Quantity",
    "Renderable",
    "Restarts",
    "Segmentable",
    "StepHook",
    "Terminates",
    "Trajectory",
    "array_grads",
    "host_rng",
]

Trajectory = dict[str, wp.array]
"""Named observables of one rollout, each a float32 array of shape (rows, worlds, dim): one
row per step, or a single row holding the last step (see :meth:`Env.request`)."""

StepHook = Callable[[int, list[wp.array]], None]
"""Called by a rollout right after step ``t`` produced state ``t + 1``, before anything
reads that state (the loss recording, step ``t + 1``): ``hook(t, arrays)``, where
``arrays`` are the state's differentiable arrays as per-world views of shape
(world_count, k). Backward replays the tape in reverse, so a ``Tape.record_func``
recorded by the hook runs once the adjoint of state ``t + 1`` is complete (every later
use, the loss term included, has added to it) and before it flows into step ``t``."""


@dataclasses.dataclass(frozen=True)
class Quantity:
    """A named physical quantity an env can take from a parameter array.

    Attributes:
        shape: Shape of the array, in elements of ``dtype``.
        dtype: ``wp.float32`` or a float32 vector type (``wp.vec3``).
        lower: Smallest physical value (a bound the optimizer step keeps), -inf if none.
        upper: Largest physical value, inf if none.
        unit: SI unit, for the docs and the summary (``kg``, ``m``, ``m/s``, ``Pa``).
        doc: One line: what it is.
        fd_step: A central finite-difference step for gradient checks, in ``unit``.
        per_world: The first axis is the world (one value per world): ``task=sysid``
            may fit one value shared by every world instead (``task.shared``).
        world_major: The first axis holds every world's entries in turn, ``world_count x k``
            of them (every particle, spring or tetrahedron of world 0, then of world 1, ...),
            and each world reads only its own (``harness diagnose`` tells the worlds' gradients
            apart by it, as by ``per_world``).
    """

    shape: tuple[int, ...]
    dtype: type = wp.float32
    lower: float = -math.inf
    upper: float = math.inf
    unit: str = ""
    doc: str = ""
    fd_step: float = 1.0e-3
    per_world: bool = False
    world_major: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """The fields every env has; an env's ``Config`` extends it with its own.

    The schema is checked by :func:`harness.schema.build` (types and ranges from the
    field declarations); the methods below describe the env for these values without
    building anything, so a command line is checked before any kernel compiles.
    """

    horizon: int = field(240, minimum=1, doc="simulation steps per rollout")
    world_count: int = field(1, minimum=1, doc="independent worlds simulated at once")
    seed: int = field(0, minimum=0, doc="seed of the initial conditions")

    def observable_dims(self) -> dict[str, int]:
        """Names of the observables a rollout records, with their per-world width."""
        return {}

    def action_dim(self) -> int:
        """Width of one world's action at one step (0: the env takes no actions)."""
        return 0

    def observation_dim(self) -> int:
        """Width of one world's observation, what a policy sees (0: the env offers none)."""
        return 0

    def action_fd_step(self) -> float:
        """A central finite-difference step for an action entry, in the action's units."""
        return 1.0

    def weight_fd_step(self) -> float:
        """A central finite-difference step for a weight of a policy's network (``task=policy``,
        the actor of ``task=shac``): what ``harness gradcheck`` moves one weight by, and the
        scale of ``harness diagnose``'s central and zeroth-order differences."""
        return 1.0e-2

    def gradcheck_tolerance(self) -> float:
        """The largest relative error ``python -m harness gradcheck`` accepts for this env
        unless ``gradcheck.tolerance`` is given: 1e-2, or more for an env whose loss is too
        rough at float32 for central differences to be more exact (say why where you raise it)."""
        return 1.0e-2

    def quantities(self) -> dict[str, Quantity]:
        """The physical quantities a task may train, by name."""
        return {}

    def default_quantities(self, kind: str) -> list[str]:
        """The quantities ``task=physical`` or ``task=initial`` trains when it names none."""
        return []


class Env(abc.ABC):
    """A differentiable simulation, stepped by the harness: the core every env implements.

    Args:
        config: The env's ``Config``; or its fields as keyword arguments (what Hydra's
            ``instantiate`` passes from ``configs/env/<name>.yaml``), checked against the
            schema with one-line errors.
        device: Warp device.
        segment_steps: Steps per segment (an env that plays :class:`Segmentable`), or None.

    Attributes:
        name: The env's identity: recorded in checkpoints, shown in logs.
        Config: The schema dataclass.
        config: This env's checked config.
        horizon: Steps per rollout; world_count: worlds simulated at once.
        dt: Simulation time step [s] (set by the env).
        capturable: Whether the rollout keeps the capture contract (module docstring).
        capture_note: Why an env is not capturable.
        segment_note: Why an env cannot run in segments (one that does not play :class:`Segmentable`).
        segment_steps: Steps per segment, or None (one segment: the whole horizon).
    """

    name: ClassVar[str]
    Config: ClassVar[type[EnvConfig]] = EnvConfig
    capturable: ClassVar[bool] = True
    capture_note: ClassVar[str] = ""
    segment_note: ClassVar[str] = "it does not play the role Segmentable (harness.env)"
    dt: float

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "record" in vars(cls) and "write_observables" not in vars(cls):
            raise TypeError(
                f"{cls.__qualname__}.record: Env.record(t) is now Env.write_observables(t) (harness.env); rename it"
            )

    def __init__(
        self,
        config: EnvConfig | None = None,
        /,
        *,
        device: wp.context.Devicelike = None,
        segment_steps: int | None = None,
        **fields: Any,
    ):
        if config is None:
            config = schema.build(self.Config, fields, prefix="env")
        elif fields:
            raise TypeError(f"{type(self).__name__}: pass a config or its fields, not both")
        self.config = config
        self.device = wp.get_device(device)
        self.horizon = config.horizon
        self.world_count = config.world_count
        if segment_steps is not None:
            why = self.segment_blocker(config)
            if why is not None:
                raise ValueError(f"memory.segment_steps: env '{self.name}' cannot run in segments: {why}")
            if not 1 <= segment_steps <= self.horizon:
                raise ValueError(f"memory.segment_steps: {segment_steps} is outside [1, env.horizon={self.horizon}]")
        self.segment_steps = segment_steps
        self._wanted: dict[str, str] = dict.fromkeys(self.observables, "all")

    @classmethod
    def segment_blocker(cls, config: EnvConfig) -> str | None:
        """Why this env, with this config, cannot run in segments; None when it can."""
        return None if issubclass(cls, Segmentable) else cls.segment_note

    # -- what the env offers, from its config -----------------------------------------

    @property
    def observables(self) -> dict[str, int]:
        """Observable name -> per-world width."""
        return self.config.observable_dims()

    @property
    def action_dim(self) -> int:
        """Width of one world's action (0: no actions)."""
        return self.config.action_dim()

    def request(self, wanted: dict[str, str]) -> None:
        """Say which observables the loss reads, and whether at ``all`` steps or the ``last``
        only; an env may then record fewer (a ``last`` observable as one row). Call before
        the first rollout."""
        unknown = set(wanted) - set(self.observables)
        if unknown:
            raise KeyError(f"unknown observables {sorted(unknown)}; this env has {sorted(self.observables)}")
        self._wanted = dict(wanted)

    # -- one rollout, step by step --------------------------------------------------------

    @abc.abstractmethod
    def reset(self) -> None:
        """Write the initial state (after any quantity set for this rollout) into state 0."""

    def act(self, t: int, actions: wp.array) -> None:
        """Hand step ``t`` its action: row ``t`` of ``actions``, float32 ``(rows, world_count, action_dim)``."""
        raise NotImplementedError(f"env '{self.name}' takes no actions")

    def act_all(self, actions: wp.array) -> bool:
        """Hand every step of the coming rollout its action at once, before step 0, where all of
        them are known then (``task=open_loop``): one launch where :meth:`act` takes one a step.
        ``actions`` as :meth:`act` takes them, a row per step of the rollout.

        Returns:
            True when done: no :meth:`act` follows in this rollout. False (the default; an env
            whose per-step storage holds one segment only; one whose subclass overrides
            :meth:`act`, which expects its call at every step): nothing was done, and the task
            calls :meth:`act` at every step.
        """
        return False

    @abc.abstractmethod
    def step(self, t: int) -> None:
        """Advance state ``t`` to state ``t + 1``."""

    @abc.abstractmethod
    def write_observables(self, t: int) -> None:
        """Write the requested observables of state ``t + 1`` (step ``t``'s result) into row ``t``."""

    @abc.abstractmethod
    def trajectory(self) -> Trajectory:
        """The requested observables of the latest rollout (device arrays the env owns)."""

    @abc.abstractmethod
    def zero_grad(self) -> None:
        """Zero the gradient of every array the env owns (states, controls, scratch, model)."""

    def state_arrays(self, t: int) -> list[wp.array]:
        """The differentiable arrays of state ``t`` as per-world views ``(world_count, k)``: what
        the in-backward adjoint clip (``clip.adjoint``) sees between steps."""
        raise NotImplementedError(f"env '{self.name}' does not expose its state arrays (clip.adjoint needs them)")

    def keep_built_initial(self) -> None:  # noqa: B027  (nothing to keep unless the env draws or carries)
        """Keep the initial state as built, once, before a draw (:class:`DrawsStarts`) or a
        carry (:class:`CarriesState`) first replaces it (what :meth:`restore_initial` puts back)."""

    def restore_initial(self) -> None:  # noqa: B027  (nothing to restore unless drawn or carried)
        """Put back the initial state the env was built with, after a draw or a carry replaced
        it (evaluation starts from the env's own states)."""

    # -- what a run reports --------------------------------------------------------------

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        """Physical figures of a rollout worth reporting (host values); empty by default."""
        return {}

    def columns(self) -> list[tuple[str, wp.array, int]]:
        """Per-iteration device scalars of the training rollout for the history, as ``(tag, device
        array, index)`` (the robot env's ``robot/nonfinite_steps`` under ``env.nan_guard``); none by default."""
        return []

    def blowup(self) -> str | None:
        """Where the latest rollout left finite numbers (the step and what blew up: one phrase a
        diverged run's message ends with), or None when the env cannot tell (the default)."""
        return None

    def component_names(self) -> dict[str, list[str]]:
        """Names of an observable's components for plots (``harness render``), by observable,
        e.g. ``{"joint_q": ["cart position [m]", ...]}``; empty by default."""
        return {}


# -- roles --------------------------------------------------------------------------------------


class PolicyEnv(abc.ABC):
    """Role: what a policy sees (``task=policy``, ``task=shac``); the config gives its width,
    :meth:`EnvConfig.observation_dim`, and the env takes actions."""

    summary: ClassVar[str] = "observe(t, out): what a policy sees of state t"

    @abc.abstractmethod
    def observe(self, t: int, out: wp.array) -> None:
        """Write the observation of state ``t`` into ``out``, float32 ``(world_count,
        observation_dim)`` (a recorded launch, so a policy's gradient reaches the state)."""


class DrawsStarts(abc.ABC):
    """Role: fresh initial states drawn on the device (training over many starts)."""

    summary: ClassVar[str] = "draw_initial(key): fresh initial states drawn on the device"

    @abc.abstractmethod
    def draw_initial(self, key: wp.array) -> None:
        """Overwrite the initial state of every world with a fresh draw from the env's
        distribution of initial conditions, on the device: seeded by the env's seed and
        ``key[0]`` (an int32 device array, e.g. the iteration counter), so a captured graph
        draws anew at every replay and a resumed run draws what it would have drawn. Call
        :meth:`Env.keep_built_initial` first."""


class CarriesState(abc.ABC):
    """Role: a rollout continues from where the previous one ended (training in windows)."""

    summary: ClassVar[str] = "keep_final/carry_final: a rollout continues where the last one ended"

    @abc.abstractmethod
    def keep_final(self) -> None:
        """Keep a copy of the rollout's last state (values only), for :meth:`carry_final`."""

    @abc.abstractmethod
    def carry_final(self, carry: wp.array, restart: wp.array | None = None) -> None:
        """Where ``carry[0]`` is 1, make the kept last state the initial state of the next
        rollout (a truncated window continues the episode); where 0 leave the initial state.
        ``restart`` (int32 ``(world_count,)``): worlds whose entry is 1 keep their initial state
        even where ``carry[0]`` is 1 (their episode ended: :meth:`ended_worlds`)."""

    def ended_worlds(self, out: wp.array) -> bool:
        """Write 1 into ``out[w]`` (int32 ``(world_count,)``) for every world whose kept last state
        (:meth:`keep_final`) ends its episode by the env's own rule, 0 for the others, and return
        True; return False, writing nothing, where the env has no such rule (the default)."""
        return False

    @abc.abstractmethod
    def carried(self) -> dict[str, wp.array]:
        """The arrays :meth:`keep_final` writes (what a checkpoint must hold to resume mid-episode)."""


class Restarts(abc.ABC):
    """Role: worlds whose episode ended start a fresh one inside a rollout, with the gradient cut
    there (SHAC's windows run across episode ends). An env that plays it also draws starts
    (:class:`DrawsStarts`)."""

    summary: ClassVar[str] = "restart(t, done, key): worlds whose episode ended start anew inside a rollout"

    @abc.abstractmethod
    def enable_restarts(self) -> None:
        """Prepare the storage restarts need (before the first rollout)."""

    @abc.abstractmethod
    def restart(self, t: int, done: wp.array, key: wp.array) -> None:
        """After step ``t - 1``, before step ``t``: every world whose ``done[w]`` (int32
        ``(world_count,)``) is 1 continues from a fresh draw (``draw_initial(key)``) instead of
        state ``t``; no gradient flows from what follows into the ended episode. Worlds with
        ``done[w] == 0`` go on unchanged. What a policy observes at step ``t`` (``observe``) is
        the state after the restart. Once :meth:`enable_restarts` ran, call it before every step
        ``t >= 1`` (with an all-zero ``done`` where no episode ends): step ``t`` starts from what
        it wrote."""

    @abc.abstractmethod
    def observe_ended(self, t: int, out: wp.array) -> None:
        """The observation of state ``t`` before its restart (an ended episode's last state, which
        a critic values), as :meth:`PolicyEnv.observe` writes it."""


class ContactLoad(abc.ABC):
    """Role: how hard each world presses on what it touches after a step (``task=ahac`` cuts a
    world's gradient window where this passes its threshold)."""

    summary: ClassVar[str] = "contact_load(t, out): each world's contact force after step t, in its weights"

    @abc.abstractmethod
    def contact_load(self, t: int, out: wp.array) -> None:
        """Write into ``out`` (float32 ``(world_count,)``) the normal force of world ``w``'s contacts
        at the state after step ``t`` (before any restart), divided by the world's weight: a launch
        without a gradient, captured with the rollout, not on the tape."""


class Terminates(abc.ABC):
    """Role: a world's episode can end early, decided by its state (a legged robot that fell).
    ``task=shac`` restarts such a world and values its last state at 0 (no bootstrap); an env
    without it ends episodes at the horizon only."""

    summary: ClassVar[str] = "terminated(t, out): worlds whose state t ends their episode early"

    @abc.abstractmethod
    def terminated(self, t: int, out: wp.array) -> None:
        """Write 1 into ``out`` (int32 ``(world_count,)``) where state ``t`` (before any restart)
        ends its episode early, 0 elsewhere: a launch without a gradient, captured with the
        rollout; it need not be on the tape (its adjoint would do nothing)."""


class Segmentable(abc.ABC):
    """Role: a rollout in segments, backward segment by segment (``memory.segment_steps``)."""

    summary: ClassVar[str] = "segments: save and restore a segment's state (memory.segment_steps)"

    segment_graph: ClassVar[bool] = False
    """True when one captured segment serves every segment (:class:`harness.memory.SegmentGraphs`):
    every kernel of a rollout that addresses a per-step row (the action row :meth:`Env.act`
    reads, the observable row :meth:`Env.write_observables` writes) takes the device step
    :attr:`segment_base` and the row relative to the segment's first step (``t - start``,
    :meth:`harness.newton_env.NewtonEnv.slot`) and adds them on the device, so no launch of a
    segment depends on where the segment starts; the env also implements
    :meth:`set_segment_base`, :meth:`restore_segment` and :meth:`save_segment`
    (:class:`harness.newton_env.NewtonEnv` does, for any Newton ``State``). False (the
    default, and every env that does not say otherwise): a captured segmented iteration is
    one graph of all segments, which grows with the horizon."""

    segment_base: wp.array
    """int32 ``(1,)`` on the env's device: the step of the current segment's first state (with
    :attr:`segment_graph`)."""

    def set_segment_base(self, start: int) -> None:
        """The following steps are ``start, start + 1, ...``: write ``start`` into
        :attr:`segment_base` (a host write, issued outside any captured segment graph)
        (with :attr:`segment_graph`)."""
        raise NotImplementedError(f"{type(self).__name__} does not share one graph between segments")

    def restore_segment(self) -> None:
        """:meth:`begin_segment` ``(restore=True)`` without the host write: copy the state
        saved at step ``segment_base[0]`` into the segment's first state, its row picked on the
        device (with :attr:`segment_graph`)."""
        raise NotImplementedError(f"{type(self).__name__} does not share one graph between segments")

    def save_segment(self, steps: int) -> None:
        """:meth:`end_segment` of step ``segment_base[0] + steps``, its row picked on the device
        (with :attr:`segment_graph`)."""
        raise NotImplementedError(f"{type(self).__name__} does not share one graph between segments")

    @abc.abstractmethod
    def begin_segment(self, start: int, *, restore: bool) -> None:
        """Make the following steps ``start, start + 1, ...`` use the segment's storage, state
        ``start`` first; with ``restore``, copy the state saved by :meth:`end_segment` at
        ``start`` into it (outside any tape)."""

    @abc.abstractmethod
    def end_segment(self, end: int) -> None:
        """Save state ``end`` (the next segment's start) for :meth:`begin_segment`."""

    @abc.abstractmethod
    def zero_segment_grad(self) -> None:
        """Zero the gradients of the segment's storage (its states and per-step arrays), not
        those that accumulate over the whole rollout (model, inputs, observables)."""

    @abc.abstractmethod
    def save_adjoint(self, t: int) -> None:
        """Keep the adjoint (gradient) of state ``t``, the current segment's first state."""

    @abc.abstractmethod
    def load_adjoint(self, t: int) -> None:
        """Write the kept adjoint into the gradient of state ``t``, the current segment's last state."""

    @abc.abstractmethod
    def stash_accumulated_grad(self) -> None:
        """Keep a copy of the gradients that accumulate over the whole rollout and that the
        task's ``begin`` may write into (the model's, the initial state's): re-running
        segment 0 under a tape re-runs ``begin``, whose ``wp.copy`` also copies the source's
        gradient into the destination's (Warp does that in the forward pass)."""

    @abc.abstractmethod
    def restore_accumulated_grad(self) -> None:
        """Put back what :meth:`stash_accumulated_grad` kept."""


class Identifiable(abc.ABC):
    """Role: named physical quantities (:meth:`EnvConfig.quantities`) a task trains or fits,
    and the initial state a recording stores."""

    summary: ClassVar[str] = "set_quantity/quantity_value/initial_state: named physical quantities"

    @abc.abstractmethod
    def set_quantity(self, name: str, value: wp.array) -> None:
        """Write a physical quantity from ``value`` (shape and dtype of its :class:`Quantity`) into the simulation."""

    @abc.abstractmethod
    def quantity_value(self, name: str) -> np.ndarray:
        """The quantity's value as the env was built (the start point of training), whatever
        :meth:`set_quantity` wrote since."""

    @abc.abstractmethod
    def initial_state(self) -> dict[str, wp.array]:
        """The arrays :meth:`Env.reset` copies into state 0, by field (``harness record`` saves
        them per world, ``task=sysid`` writes a recording's into them)."""


class Renderable(abc.ABC):
    """Role: a Newton model and its State after every step (``harness render`` draws them)."""

    summary: ClassVar[str] = "a Newton model and state(t) (harness render)"

    model: Any

    @abc.abstractmethod
    def state(self, t: int) -> Any:
        """The Newton ``State`` holding the simulation after ``t`` steps."""

    def body_offsets(self, state: Any) -> Any:
        """What to add to each body's position in ``state`` for where it is (``(body_count, 3)``, an env
        that moves its worlds toward the origin: the robot env's ``recenter``); None: nothing."""
        return None


class Plant(abc.ABC):
    """Role: a real system beside the rollouts (``task=mpc``). The rollouts plan from its current
    state; it advances one control step at a time under the first action of the best plan, and
    it has a goal whose distance the task reports. Its time is the frame, a device counter, so a
    captured control step replays for every frame."""

    summary: ClassVar[str] = "plan_from_plant/advance/plant_error: a real system the rollouts plan for (task=mpc)"

    plant_model: Any
    """The Newton model of the real system (``harness render`` draws the flight)."""

    @abc.abstractmethod
    def reset_plant(self) -> None:
        """Put the real system back at its initial state (before frame 0)."""

    @abc.abstractmethod
    def set_frame(self, frame: wp.array) -> None:
        """The real system's time is frame ``frame[0]`` (int32 device array): update what depends on
        it (the drone's current target), on the device."""

    @abc.abstractmethod
    def plan_from_plant(self, keep: wp.array) -> None:
        """Make the real system's current state the initial state of every world of the next
        rollouts, except where ``keep[0]`` is 1 (int32 device array): the initial state stays as it was."""

    @abc.abstractmethod
    def advance(self, action: wp.array) -> None:
        """Step the real system one control step under ``action``, float32 ``(action_dim,)``."""

    @abc.abstractmethod
    def plant_error(self, out: wp.array) -> None:
        """Write the distance of the real system to its goal [m] into ``out[0]`` (float32 device array)."""

    @abc.abstractmethod
    def plant_state(self) -> dict[str, wp.array]:
        """The arrays that hold the real system (a checkpoint keeps them, so a run resumes mid-flight)."""

    @abc.abstractmethod
    def plant_pose(self) -> wp.array:
        """The real system's body transforms now, ``(bodies,)`` of ``wp.transform`` (a flight is drawn from them)."""


ROLES = (
    PolicyEnv, DrawsStarts, CarriesState, Restarts, ContactLoad, Terminates, Segmentable, Identifiable, Renderable,
    Plant,
)  # fmt: skip
"""Every role an env may play, besides the core."""


def array_grads(*owners: object) -> list[wp.array]:
    """The gradient buffers of every Warp array attribute of ``owners`` (States, a Model, a
    solver) that has one: what an env's :meth:`Env.zero_grad` zeroes."""
    found = []
    for owner in owners:
        for value in vars(owner).values():
            if isinstance(value, wp.array) and value.grad is not None:
                found.append(value.grad)
    return found


def host_rng(seed: int) -> np.random.Generator:
    """The numpy generator envs use for initial conditions, seeded from the run seed."""
    return np.random.default_rng(seed)
