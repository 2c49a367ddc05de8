"""The task interface and the rollout loop every task shares."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import warp as wp

from harness.env import Env, EnvConfig, StepHook, Trajectory
from harness.losses import WeightedLoss
from harness.params import ParamSet, ParamSpec

__all__ = ["SINGLE_GROUP", "Task", "prepare", "prepare_groups", "rollout", "rollout_segment", "segment_bounds"]

SINGLE_GROUP = "params"
"""The name of a single-group task's parameter group."""


class Task(abc.ABC):
    """What is trained: the parameters, and how they drive an env's rollout.

    Attributes:
        name: The option name (``configs/task/<name>.yaml``).
        capturable: Whether :meth:`begin` and :meth:`act` keep the capture contract
            (:mod:`harness.env`); True unless a task says otherwise.
    """

    name: ClassVar[str]
    capturable: ClassVar[bool] = True
    capture_note: ClassVar[str] = ""
    roles: ClassVar[tuple[type, ...]] = ()
    """The env roles (:mod:`harness.env`) this task needs besides the core."""
    training_only: ClassVar[tuple[str, ...]] = ()
    """The task's config keys that only shape training (a policy's ``window``): unset when a
    run is evaluated (:func:`harness.build.evaluation_config`)."""
    window_key: ClassVar[str] = "env.horizon"
    """What sets the length of a training rollout, as ``harness diagnose`` names it in its
    recommendation: ``env.horizon``, a policy's ``task.window``, a recording's length."""
    evaluation_state: ClassVar[tuple[str, ...]] = ()
    """The keys of the task's state (:meth:`state`) that an evaluation of a checkpoint uses (SHAC's
    observation statistics); the rest (per-world bookkeeping, carried states) is training's only
    and is not loaded, so an evaluation may use another ``env.world_count``."""

    def required_roles(self) -> tuple[type, ...]:
        """The env roles this task, with its settings, needs (:attr:`roles` by default)."""
        return self.roles

    def missing_role(self, env_class: type) -> str | None:
        """One line naming the first role this task needs that ``env_class`` lacks; None when it has all."""
        for role in self.required_roles():
            if not issubclass(env_class, role):
                return (
                    f"task: {self.name} needs an env with the role {role.__name__} ({role.summary}); "
                    f"env '{env_class.name}' does not have it (harness.env, docs/envs.md)"
                )
        return None

    def check_segments(self, steps: int | None, config: EnvConfig) -> None:  # noqa: B027  (optional)
        """Refuse ``memory.segment_steps`` where this task cannot train in segments.

        Raises:
            ValueError: One line naming the field and what is accepted.
        """

    def group_settings(self) -> dict[str, str]:
        """Where the config holds the update settings (``optim``, ``clip``, ``schedule``) of
        every parameter group after the first, by group: e.g. ``{"critic": "task.critic"}``.
        The first group's are the top-level ``optim``, ``clip`` and ``schedule``."""
        return {}

    def check(self, config: EnvConfig) -> None:  # noqa: B027  (optional: no checks by default)
        """Refuse an env this task cannot train, without building it.

        Raises:
            ValueError: One line naming ``task.<field>`` (or the env) and what is accepted.
        """

    def check_env(self, env_name: str, config: EnvConfig) -> None:  # noqa: B027  (optional)
        """Checks that need the env's name too (a recorded trajectory names its env); before :meth:`check`.

        Raises:
            ValueError: One line naming ``task.<field>`` and what is accepted.
        """

    def replace_loss(self, configured: WeightedLoss) -> WeightedLoss:
        """The loss this task trains with: the configured one, unless the task defines its own
        (``task=sysid`` fits a recorded trajectory)."""
        return configured

    def check_loss(self, loss: WeightedLoss) -> None:
        """Refuse a loss this task cannot supply: terms that compare with a recorded trajectory
        need a task that brings one (``task=sysid``, whose :meth:`replace_loss` makes them).

        Raises:
            ValueError: One line naming the term and what is accepted.
        """
        if loss.reference_terms and self.replace_loss(loss) is loss:
            raise ValueError(
                f"loss.terms.{loss.reference_terms[0].name}.kind: reference compares with a recorded trajectory; "
                "accepted with task=sysid only"
            )

    def attach(self, env: Env, loss: WeightedLoss) -> None:  # noqa: B027  (optional)
        """After the loss is bound to a built env: hand it what the task supplies (a reference trajectory)."""

    def columns(self, params: ParamSet, loss: WeightedLoss) -> list[tuple[str, wp.array, int]]:
        """Further per-iteration scalars for the history, as ``(tag, device array, index)``."""
        return []

    def figures(self, env: Env, loss: WeightedLoss, trajectory: Trajectory) -> dict[str, Any]:
        """Figures of a whole rollout besides the env's own (``env.describe``), for summary.json
        and ``harness evaluate``: a policy task's mean episode return. None by default."""
        return {}

    def summary(self, values: dict[str, np.ndarray]) -> dict[str, Any]:
        """Entries for summary.json from the trained parameters' values (host arrays by name)."""
        return {}

    @abc.abstractmethod
    def parameter_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        """Shapes of the parameters for an env with this config (nothing is built)."""

    @abc.abstractmethod
    def parameter_specs(self, env: Env) -> list[ParamSpec]:
        """The parameters, with their initial values and bounds, for a built env."""

    def groups(self, env: Env) -> dict[str, list[ParamSpec]]:
        """The parameter groups this task trains for a built env, in update order, each with its
        own optimizer, schedule, clip policy and statistics (:mod:`harness.training.groups`):
        one group, ``params``, unless a task says otherwise (SHAC: ``actor`` and ``critic``)."""
        return {SINGLE_GROUP: self.parameter_specs(env)}

    def group_shapes(self, config: EnvConfig) -> dict[str, dict[str, tuple[int, ...]]]:
        """The shapes of every group's parameters for an env with this config (nothing is built)."""
        return {SINGLE_GROUP: self.parameter_shapes(config)}

    def flat_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        """:meth:`group_shapes` by flat name: ``<name>`` for one group, ``<group>/<name>`` for
        several (what a checkpoint's identity compares, :func:`harness.checkpoint.flat_identity`)."""
        groups = self.group_shapes(config)
        if len(groups) == 1:
            return dict(next(iter(groups.values())))
        return {f"{group}/{name}": shape for group, shapes in groups.items() for name, shape in shapes.items()}

    def bind(self, params: dict[str, ParamSet]) -> None:  # noqa: B027  (optional: one group needs nothing)
        """Hand a task with several groups all of them (a rollout receives the first only)."""

    @abc.abstractmethod
    def begin(self, env: Env, params: ParamSet) -> None:
        """Before step 0: write what the parameters set into the env, then reset it."""

    def act(self, env: Env, params: ParamSet, t: int) -> None:  # noqa: B027  (optional)
        """Before step ``t``: hand the env its action, if the task drives actions."""

    def end(self, env: Env, params: ParamSet) -> None:  # noqa: B027  (optional)
        """After the last step of a rollout (a windowed policy keeps the state it ended in)."""

    def training_config(self, config: EnvConfig) -> EnvConfig:
        """The env config a training run builds (a windowed policy trains on shorter
        rollouts than it is evaluated on); the config itself by default."""
        return config

    def evaluation_config(self, config: EnvConfig) -> EnvConfig:
        """The env config ``harness evaluate`` builds: the config itself (a policy is
        evaluated over whole episodes), unless the task fixes the env's size (a recording's)."""
        return config

    training_key: wp.array | None = None
    """The device iteration counter while a training rollout is recorded (:meth:`training`),
    None outside one: a task that draws initial states draws with it."""

    @contextlib.contextmanager
    def training(self, key: wp.array) -> Iterator[None]:
        """Rollouts inside this block are training rollouts; ``key`` is the device iteration
        counter, :attr:`training_key` inside the block."""
        previous = self.training_key
        self.training_key = key
        try:
            yield
        finally:
            self.training_key = previous

    def state(self, env: Env) -> dict[str, wp.array]:
        """Device arrays that carry over between iterations and belong in a checkpoint."""
        return {}

    def zero_grad(self, env: Env) -> None:  # noqa: B027  (optional: no buffers of its own by default)
        """Zero the gradients of buffers the task owns for ``env`` (a policy's per-step activations)."""

    def iterate(self, step: Any) -> None:
        """Issue one training iteration's launches on ``step`` (a
        :class:`harness.training.step.TrainStep`): by default one taped rollout and its
        backward (``step.forward_backward()``), then every parameter group's update
        (``step.apply(name)``). A task with several phases (SHAC: the actor's window, then the
        critic's epochs) issues them itself; everything stays a fixed sequence of launches, so
        the iteration is still one captured graph."""
        step.forward_backward()
        for name in step.groups:
            step.apply(name)

    def rollout_actions(self, env: Env) -> wp.array | None:
        """The actions of the latest rollout ``(horizon, world_count, action_dim)``, if the task drives actions."""
        return None

    replays: ClassVar[bool] = False
    """Whether the run's result is what its iterations did rather than a rollout at its parameters
    (``task=mpc``: a flight): the final loss is :meth:`final_evaluation`'s, and ``harness evaluate``
    and ``harness render`` run the task again from its start (the task's ``replay``)."""

    def final_evaluation(self, step: Any) -> tuple[float, dict[str, Any]] | None:
        """The final loss and figures of a run of a task that :attr:`replays`, from what its
        iterations recorded; None (every other task): the trainer rolls out at the parameters."""
        return None


def rollout(env: Env, task: Task, params: ParamSet, *, after_step: StepHook | None = None) -> Trajectory:
    """Simulate ``env.horizon`` steps driven by ``task`` with ``params``.

    Every launch is recordable by a :class:`warp.Tape` (call it inside one for gradients)
    and, for a capturable env and task, by a graph capture. An env with ``segment_steps``
    set runs segment after segment, saving each segment's start state (what a segmented
    backward restores, :mod:`harness.memory`); nothing of that is differentiable, so record
    a segmented rollout under a tape only one segment at a time
    (:func:`rollout_segment`).

    Args:
        env: The simulation.
        task: What the parameters are.
        params: The parameters.
        after_step: Called with ``(t, env.state_arrays(t + 1))`` right after each step,
            before the state is recorded or stepped again (the in-backward adjoint clip).

    Returns:
        The env's trajectory of requested observables.
    """
    bounds = segment_bounds(env.horizon, env.segment_steps)
    for j, (start, end) in enumerate(bounds):
        rollout_segment(env, task, params, start, end, after_step=after_step)
        if j + 1 < len(bounds):
            env.end_segment(end)
    return env.trajectory()


def rollout_segment(
    env: Env,
    task: Task,
    params: ParamSet,
    start: int,
    end: int,
    *,
    after_step: StepHook | None = None,
    begin: bool = True,
) -> None:
    """Steps ``start .. end - 1`` of a rollout: from the task's initial state when ``start``
    is 0, else from the state saved at ``start``. ``begin=False``: the caller has already
    called ``env.begin_segment`` (outside the tape that records this call)."""
    if begin and env.segment_steps is not None:
        env.begin_segment(start, restore=start > 0)
    if start == 0:
        task.begin(env, params)
    for t in range(start, end):
        task.act(env, params, t)
        env.step(t)
        if after_step is not None:
            after_step(t, env.state_arrays(t + 1))
        env.write_observables(t)
    if end == env.horizon:
        task.end(env, params)


def segment_bounds(horizon: int, steps: int | None) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of segments of ``steps`` steps (the last may be shorter);
    one segment ``(0, horizon)`` when ``steps`` is None."""
    if steps is None:
        return [(0, horizon)]
    return [(start, min(start + steps, horizon)) for start in range(0, horizon, steps)]


def prepare_groups(
    env: Env, task: Task, loss: WeightedLoss, *, device: wp.context.Devicelike = None
) -> dict[str, ParamSet]:
    """Make the parameters of every group of ``task`` for ``env``, bind ``loss`` to the env's
    observables and ask the env to record what the loss reads.

    Raises:
        ValueError: One line when the task cannot train this env or the loss names an
            observable the env does not have.
    """
    task.check(env.config)
    device = device if device is not None else env.device
    params = {name: ParamSet(specs, device=device) for name, specs in task.groups(env).items()}
    first = next(iter(params.values()))
    loss.bind(env.observables, device=first.device)
    task.attach(env, loss)
    env.request(loss.requested())
    if len(params) > 1:
        task.bind(params)
    return params


def prepare(env: Env, task: Task, loss: WeightedLoss, *, device: wp.context.Devicelike = None) -> ParamSet:
    """:func:`prepare_groups` for a task with one parameter group: its parameters."""
    params = prepare_groups(env, task, loss, device=device)
    if len(params) != 1:
        raise ValueError(f"prepare: task '{task.name}' trains {len(params)} parameter groups; use prepare_groups")
    return next(iter(params.values()))
