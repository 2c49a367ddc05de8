"""Train named physical quantities an env exposes: masses, rest lengths, materials, initial velocities."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness import schema
from harness.env import Env, EnvConfig, Identifiable, Quantity
from harness.params import ParamSet, ParamSpec
from harness.tasks.base import Task

__all__ = ["TrainQuantities"]


class TrainQuantities(Task):
    """Each chosen quantity of the env is one parameter, starting at its value in the env.

    Before every rollout the task writes each parameter into the simulation with
    :meth:`harness.env.Env.set_quantity` (a recorded launch, so the gradient reaches the
    parameter), then resets the env. A parameter keeps the quantity's physical bounds
    (:class:`harness.env.Quantity`), tightened by ``lower``/``upper`` when given.

    Args:
        quantities: Names from the env's quantities; None trains those the env lists by default.
        lower: A further lower bound for every trained quantity (None: the env's own).
        upper: A further upper bound (None: the env's own).
        kind: ``physical`` (the model's quantities) or ``initial`` (of the initial state);
            only names the option, both train any quantity listed.
    """

    name = "physical"
    roles = (Identifiable,)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Args:
        """The task's bounds and kind, checked by :mod:`harness.schema`."""

        kind: str = schema.field(choices=("physical", "initial"))
        lower: float | None = schema.field(finite=False)
        upper: float | None = schema.field(finite=False)

    def __init__(
        self,
        *,
        quantities: Sequence[str] | None = None,
        lower: float | None = None,
        upper: float | None = None,
        kind: str = "physical",
    ):
        args = schema.check(self.Args, "task", kind=kind, lower=lower, upper=upper)
        self.name = self.kind = args.kind
        self.quantities = None if quantities is None else [str(q) for q in quantities]
        self.lower = -math.inf if args.lower is None else args.lower
        self.upper = math.inf if args.upper is None else args.upper
        if not self.lower <= self.upper:
            raise schema.SchemaError(f"task.lower: {self.lower:g} is above task.upper {self.upper:g}")

    def _names(self, config: EnvConfig) -> list[str]:
        return self.quantities if self.quantities is not None else config.default_quantities(self.kind)

    def chosen(self, config: EnvConfig) -> dict[str, Quantity]:
        """The quantities this task trains for an env with this config."""
        offered = config.quantities()
        return {name: offered[name] for name in self._names(config) if name in offered}

    def check(self, config: EnvConfig) -> None:
        offered = config.quantities()
        if not offered:
            raise ValueError(f"task: {self.name} trains physical quantities, and this env exposes none")
        names = self._names(config)
        unknown = [q for q in names if q not in offered]
        if unknown or not names:
            raise ValueError(
                f"task.quantities: {unknown[0] if unknown else 'none chosen'!r} is not a quantity of this env; "
                f"accepted: {', '.join(offered)}"
            )
        for name in names:
            q = offered[name]
            if not q.lower <= q.upper:  # also refuses nan
                raise ValueError(
                    f"env: quantity '{name}' has lower bound {q.lower:g} above its upper bound {q.upper:g}; "
                    "accepted: lower <= upper"
                )
            lo, hi = max(q.lower, self.lower), min(q.upper, self.upper)
            if not lo <= hi:
                raise ValueError(
                    f"task.lower/task.upper: [{self.lower:g}, {self.upper:g}] leaves nothing of quantity "
                    f"'{name}' [{q.lower:g}, {q.upper:g}]"
                )

    def summary(self, values: dict[str, np.ndarray]) -> dict[str, Any]:
        """``parameters``: the trained value of every quantity (name -> nested lists, in its unit)."""
        return {
            "parameters": {
                name: np.asarray(value, dtype=np.float64).round(7).tolist() for name, value in values.items()
            }
        }

    def parameter_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        return {name: q.shape for name, q in self.chosen(config).items()}

    def parameter_specs(self, env: Env) -> list[ParamSpec]:
        return [
            ParamSpec(
                name,
                q.shape,
                dtype=q.dtype,
                init=env.quantity_value(name),
                lower=max(q.lower, self.lower),
                upper=min(q.upper, self.upper),
                fd_step=q.fd_step,
                world_axis=0 if q.per_world or q.world_major else None,
            )
            for name, q in self.chosen(env.config).items()
        ]

    def begin(self, env: Env, params: ParamSet) -> None:
        for name in self.chosen(env.config):
            env.set_quantity(name, params[name])
        env.reset()
