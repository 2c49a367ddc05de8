"""The task interface and the rollout loop every task shares."""

from __future__ import annotations

import abc
from typing import ClassVar

import warp as wp

from harness.env import Env, EnvConfig, StepHook, Trajectory
from harness.params import ParamSet, ParamSpec

__all__ = ["Task", "prepare", "rollout"]


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


def rollout(env: Env, task: Task, params: ParamSet, *, after_step: StepHook | None = None) -> Trajectory:
    """Simulate ``env.horizon`` steps driven by ``task`` with ``params``.

    Every launch is recordable by a :class:`warp.Tape` (call it inside one for gradients)
    and, for a capturable env and task, by a graph capture.

    Args:
        env: The simulation.
        task: What the parameters are.
        params: The parameters.
        after_step: Called with ``(t, env.state_arrays(t + 1))`` right after each step,
            before the state is recorded or stepped again (the in-backward adjoint clip).

    Returns:
        The env's trajectory of requested observables.
    """
    task.begin(env, params)
    for t in range(env.horizon):
        task.act(env, params, t)
        env.step(t)
        if after_step is not None:
            after_step(t, env.state_arrays(t + 1))
        env.record(t)
    return env.trajectory()


def prepare(env: Env, task: Task, loss: object, *, device: wp.context.Devicelike = None) -> ParamSet:
    """Make the parameters of ``task`` for ``env``, bind ``loss`` to the env's observables and
    ask the env to record what the loss reads.

    Raises:
        ValueError: One line when the task cannot train this env or the loss names an
            observable the env does not have.
    """
    task.check(env.config)
    params = ParamSet(task.parameter_specs(env), device=device if device is not None else env.device)
    loss.bind(env.observables, device=params.device)
    env.request(loss.requested())
    return params
