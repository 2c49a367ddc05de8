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

__all__ = ["Task", "prepare", "rollout", "rollout_segment", "segment_bounds"]


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

    def attach(self, env: Env, loss: WeightedLoss) -> None:  # noqa: B027  (optional)
        """After the loss is bound to a built env: hand it what the task supplies (a reference trajectory)."""

    def columns(self, params: ParamSet, loss: WeightedLoss) -> list[tuple[str, wp.array, int]]:
        """Further per-iteration scalars for the history, as ``(tag, device array, index)``."""
        return []

    def summary(self, values: dict[str, np.ndarray]) -> dict[str, Any]:
        """Entries for summary.json from the trained parameters' values (host arrays by name)."""
        return {}

    @abc.abstractmethod
    def parameter_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        """Shapes of the parameters for an env with this config (nothing is built)."""

    @abc.abstractmethod
    def parameter_specs(self, env: Env) -> list[ParamSpec]:
        """The parameters, with their initial values and bounds, for a built env."""

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

    @contextlib.contextmanager
    def training(self, key: wp.array) -> Iterator[None]:
        """Rollouts inside this block are training rollouts; ``key`` is the device iteration
        counter (a task that draws initial states draws with it). Nothing by default."""
        yield

    def state(self, env: Env) -> dict[str, wp.array]:
        """Device arrays that carry over between iterations and belong in a checkpoint."""
        return {}

    def zero_grad(self, env: Env) -> None:  # noqa: B027  (optional: no buffers of its own by default)
        """Zero the gradients of buffers the task owns for ``env`` (a policy's per-step activations)."""

    def rollout_actions(self, env: Env) -> wp.array | None:
        """The actions of the latest rollout ``(horizon, world_count, action_dim)``, if the task drives actions."""
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
        env.record(t)
    if end == env.horizon:
        task.end(env, params)


def segment_bounds(horizon: int, steps: int | None) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of segments of ``steps`` steps (the last may be shorter);
    one segment ``(0, horizon)`` when ``steps`` is None."""
    if steps is None:
        return [(0, horizon)]
    return [(start, min(start + steps, horizon)) for start in range(0, horizon, steps)]


def prepare(env: Env, task: Task, loss: WeightedLoss, *, device: wp.context.Devicelike = None) -> ParamSet:
    """Make the parameters of ``task`` for ``env``, bind ``loss`` to the env's observables and
    ask the env to record what the loss reads.

    Raises:
        ValueError: One line when the task cannot train this env or the loss names an
            observable the env does not have.
    """
    task.check(env.config)
    params = ParamSet(task.parameter_specs(env), device=device if device is not None else env.device)
    loss.bind(env.observables, device=params.device)
    task.attach(env, loss)
    env.request(loss.requested())
    return params
