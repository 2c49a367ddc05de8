"""A system with a known answer for ``harness diagnose``: ``x' = a x + f``, one scalar per world.

Stepped exactly, ``x_{t+1} = alpha x_t + u_t + f`` with ``alpha = exp(a dt)``, so the adjoint of
``x_t`` grows by ``alpha`` per step backwards: at the rate ``a`` per second, exactly. Each world
starts from its own ``x_0`` drawn uniformly from ``[-spread, spread]`` (``seed``). ``u_t`` is the
action of step t (open loop); ``f`` is a constant force every world shares (``task=physical``).
Observable ``x``: the state after every step. Warp kernels only, no Newton.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import warp as wp

from harness.env import Env, EnvConfig, Identifiable, Quantity, Trajectory, host_rng
from harness.schema import field


@wp.kernel
def _reset(initial: wp.array(dtype=float), states: wp.array2d(dtype=float)):
    w = wp.tid()
    states[0, w] = initial[w]


@wp.kernel
def _step(
    states: wp.array2d(dtype=float),
    t: int,
    alpha: float,
    actions: wp.array3d(dtype=float),
    force: wp.array(dtype=float),
):
    w = wp.tid()
    states[t + 1, w] = alpha * states[t, w] + actions[t, w, 0] + force[0]


@wp.kernel
def _observe(states: wp.array2d(dtype=float), t: int, x: wp.array3d(dtype=float)):
    w = wp.tid()
    x[t, w, 0] = states[t + 1, w]


@wp.kernel
def _set_force(value: wp.array(dtype=float), force: wp.array(dtype=float)):
    force[0] = value[0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearConfig(EnvConfig):
    horizon: int = field(40, minimum=1, doc="steps per rollout")
    world_count: int = field(16, minimum=1, doc="worlds, each with its own start")
    rate: float = field(2.0, doc="a in x' = a x + f [1/s]")
    dt: float = field(0.05, minimum=0.0, strict=True, doc="time step [s]")
    spread: float = field(1.0, minimum=0.0, doc="starts uniform in [-spread, spread]")

    def observable_dims(self) -> dict[str, int]:
        return {"x": 1}

    def action_dim(self) -> int:
        return 1

    def action_fd_step(self) -> float:
        return 1.0e-2

    def quantities(self) -> dict[str, Quantity]:
        return {"force": Quantity((1,), doc="constant force every world shares", fd_step=1.0e-2)}

    def default_quantities(self, kind: str) -> list[str]:
        return ["force"]


class LinearEnv(Env, Identifiable):
    name = "linear"
    Config = LinearConfig

    def __init__(self, config: LinearConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields):
        super().__init__(config, device=device, **fields)
        c = self.config
        self.dt = c.dt
        self.alpha = math.exp(c.rate * c.dt)
        rows, worlds = self.horizon, self.world_count
        starts = host_rng(c.seed).uniform(-c.spread, c.spread, size=worlds).astype(np.float32)
        self.initial = wp.array(starts, dtype=float, device=self.device, requires_grad=True)
        self.states = wp.zeros((rows + 1, worlds), dtype=float, device=self.device, requires_grad=True)
        self.x = wp.zeros((rows, worlds, 1), dtype=float, device=self.device, requires_grad=True)
        self.force = wp.zeros(1, dtype=float, device=self.device, requires_grad=True)
        self.no_actions = wp.zeros((rows, worlds, 1), dtype=float, device=self.device, requires_grad=True)
        self.actions = self.no_actions

    def starts(self) -> np.ndarray:
        return self.initial.numpy().astype(np.float64)

    def reset(self) -> None:
        wp.launch(_reset, dim=self.world_count, inputs=[self.initial], outputs=[self.states], device=self.device)

    def act(self, t: int, actions: wp.array) -> None:
        self.actions = actions

    def step(self, t: int) -> None:
        wp.launch(
            _step, dim=self.world_count, inputs=[self.states, t, self.alpha, self.actions, self.force],
            outputs=[], device=self.device,
        )  # fmt: skip

    def write_observables(self, t: int) -> None:
        wp.launch(_observe, dim=self.world_count, inputs=[self.states, t], outputs=[self.x], device=self.device)

    def trajectory(self) -> Trajectory:
        return {"x": self.x}

    def zero_grad(self) -> None:
        for array in (self.states, self.x, self.initial, self.force, self.no_actions):
            array.grad.zero_()

    def state_arrays(self, t: int) -> list[wp.array]:
        return [self.states[t].reshape((self.world_count, 1))]

    def set_quantity(self, name: str, value: wp.array) -> None:
        wp.launch(_set_force, dim=1, inputs=[value], outputs=[self.force], device=self.device)

    def quantity_value(self, name: str) -> np.ndarray:
        return np.zeros(1, dtype=np.float32)

    def initial_state(self) -> dict[str, wp.array]:
        return {"x": self.initial}
