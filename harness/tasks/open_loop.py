"""Open-loop control: the action of every step and world is a parameter."""

from __future__ import annotations

import dataclasses
import math
import weakref

import numpy as np
import warp as wp

from harness import schema
from harness.env import Env, EnvConfig
from harness.params import ParamSet, ParamSpec
from harness.tasks.base import Task

__all__ = ["OpenLoop"]


class OpenLoop(Task):
    """Train the action sequence itself: parameter ``controls``, one action per step and world.

    Shape ``(horizon, world_count)`` for an env whose action is one number (the cartpole's
    cart force), ``(horizon, world_count, action_dim)`` otherwise.

    Args:
        init: Initial value of every action.
        lower: Smallest action (kept after every optimizer step), -inf for none.
        upper: Largest action, inf for none.
        init_noise: Every initial action is ``init + U(-n, n)`` (seeded by ``seed``), kept within
            the bounds: a rollout that moves (a robot's gradient check through its contacts).
        seed: Seeds ``init_noise``.
    """

    name = "open_loop"

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Args:
        """The task's fields (``configs/task/open_loop.yaml``), checked by :mod:`harness.schema`."""

        init: float = schema.field()
        lower: float = schema.field(finite=False)
        upper: float = schema.field(finite=False)
        init_noise: float = schema.field(0.0, minimum=0.0)
        seed: int = schema.field(0)

    def __init__(
        self,
        *,
        init: float = 0.0,
        lower: float = -math.inf,
        upper: float = math.inf,
        init_noise: float = 0.0,
        seed: int = 0,
    ):
        args = schema.check(self.Args, "task", init=init, lower=lower, upper=upper, init_noise=init_noise, seed=seed)
        self.init, self.lower, self.upper = _bounds_checked(args.init, args.lower, args.upper)
        self.init_noise, self.seed = args.init_noise, args.seed
        self._views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._acted_all: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # env -> act_all took the rollout

    def check(self, config: EnvConfig) -> None:
        if config.action_dim() < 1:
            raise ValueError(
                "task: open_loop trains actions, and this env takes none; accepted: a task for its quantities "
                f"({', '.join(config.quantities()) or 'none'}) such as task=physical or task=initial"
            )

    def parameter_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        rows = (config.horizon, config.world_count)
        dim = config.action_dim()
        return {"controls": rows if dim == 1 else (*rows, dim)}

    def parameter_specs(self, env: Env) -> list[ParamSpec]:
        shape = self.parameter_shapes(env.config)["controls"]
        fd_step = env.config.action_fd_step()
        init: float | np.ndarray = self.init
        if self.init_noise > 0.0:
            draw = np.random.default_rng(self.seed).uniform(-self.init_noise, self.init_noise, shape)
            init = np.clip(self.init + draw, self.lower, self.upper).astype(np.float32)
        spec = ParamSpec(
            "controls", shape, init=init, lower=self.lower, upper=self.upper, fd_step=fd_step, world_axis=1
        )
        return [spec]

    def begin(self, env: Env, params: ParamSet) -> None:
        # every step's action is known before step 0: an env that can takes them in one launch
        self._acted_all[env] = env.act_all(self.actions(env, params))
        env.reset()

    def act(self, env: Env, params: ParamSet, t: int) -> None:
        if not self._acted_all.get(env, False):
            env.act(t, self.actions(env, params))

    def actions(self, env: Env, params: ParamSet) -> wp.array:
        """The ``controls`` parameter as ``(horizon, world_count, action_dim)`` (a view, same memory)."""
        view = self._views.get(params)
        if view is None:
            view = params["controls"].reshape((env.horizon, env.world_count, env.action_dim))
            self._views[params] = view
        return view


def _bounds_checked(init: float, lower: float, upper: float) -> tuple[float, float, float]:
    if not lower <= upper:
        raise schema.SchemaError(f"task.lower: {lower:g} is above task.upper {upper:g}; accepted: lower <= upper")
    if not lower <= init <= upper:
        raise schema.SchemaError(f"task.init: {init:g} is outside [task.lower, task.upper] = [{lower:g}, {upper:g}]")
    return init, lower, upper
