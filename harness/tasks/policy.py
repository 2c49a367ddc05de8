"""Closed-loop control: an MLP policy maps every world's observation to its action at every step.

The weights and biases are parameters in the flat buffer (``l1.weight``, ``l1.bias``, ...,
``out.weight``, ``out.bias``), so gradient statistics, clipping and the optimizer treat them
as any other parameter, and TensorBoard shows each layer's gradient norm
(``optim/grad_norm_pre/l1.weight``).

The layers are the harness's MLP (:mod:`harness.nn`: one fused tile kernel), each step
writing its own rows: a policy applied at every step of one tape needs every step's
activations for backward, so each step has its own input, hidden and output rows (the
reason this module does not use a layer library that keeps one output buffer per module;
docs/tasks.md has the measurement behind the choice).

Training (inside :meth:`Task.training`, as :class:`harness.training.TrainStep` runs it)
draws the initial state of every world anew at each episode start, on the device, from the
env's seed and the iteration counter (``env.draw_initial``): a run is reproducible and a
resumed run draws what it would have drawn. With ``window`` shorter than the env's
horizon, one optimizer step sees ``window`` steps and the next window continues from the
state the last one ended in (truncated backpropagation through time, as SHAC, Xu et al.
2022, does it, here without a critic); ``window = horizon`` is full backpropagation
through time; a world whose carried state ends its episode by the env's own rule
(:meth:`~harness.env.CarriesState.ended_worlds`: the cartpole's ``env.fall_angle``) starts anew
from its fresh draw instead. Outside training (evaluation, plots, ``harness evaluate``) a rollout starts
from the env's own initial states (``env.seed``) over the whole horizon.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import warp as wp

from harness import schema, tags
from harness.env import CarriesState, DrawsStarts, Env, EnvConfig, PolicyEnv
from harness.losses import WeightedLoss
from harness.nn import MLP
from harness.params import ParamSet, ParamSpec
from harness.tasks.base import Task

__all__ = ["Policy"]


@wp.kernel
def _episode_flags(
    counter: wp.array(dtype=wp.int32), windows_per_episode: int, carry_from: int, carry: wp.array(dtype=wp.int32)
):
    """1 when this iteration's window continues an episode, 0 at an episode's start (every
    window before iteration ``carry_from`` starts one)."""
    fresh = counter[0] < carry_from or counter[0] % windows_per_episode == 0
    carry[0] = wp.where(fresh, 0, 1)


@wp.kernel
def _to_step_row(
    source: wp.array2d(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    slot: int,
    rows: wp.array3d(dtype=wp.float32),
):
    """``rows[base[0] + slot] = source``: the step's row of a whole-horizon buffer, picked on
    the device (its adjoint adds the row's gradient into ``source``'s)."""
    w, j = wp.tid()
    rows[base[0] + slot, w, j] = source[w, j]


@dataclasses.dataclass
class _Buffers:
    """Per-step rows for one env: the observation and the action (the MLP keeps the hidden rows)."""

    observations: wp.array  # (horizon, world_count, observation_dim)
    actions: wp.array  # (horizon, world_count, action_dim)
    carry: wp.array  # int32 (1,): continue the episode (1) or start a new one (0)
    restart: wp.array  # int32 (world_count,): a world whose carried state ended starts anew (1)
    # With segment graphs: one segment's rows, addressed by slot (the same in every segment)
    segment_observations: wp.array | None = None  # (segment_steps, world_count, observation_dim)
    segment_actions: wp.array | None = None  # (segment_steps, world_count, action_dim)


def _segment_rows(env: Env) -> bool:
    """Whether a rollout of ``env`` runs in segments whose launches read the step from the
    device (:attr:`harness.env.Segmentable.segment_graph`): the MLP then works on one
    segment's rows."""
    return env.segment_steps is not None and bool(getattr(env, "segment_graph", False))


class Policy(Task):
    """An MLP from observation to action, the same weights for every world and step.

    Args:
        hidden: Widths of the hidden layers, e.g. ``[64, 64]``.
        activation: ``tanh``, ``elu`` or ``relu`` (the hidden layers).
        layer_norm: LayerNorm after every hidden activation (SHAC's networks; Ba et al. 2016).
        action_scale: The output layer is ``action_scale * tanh(.)``: actions stay within
            ``+-action_scale`` in the env's units (N for the cartpole).
        window: Steps per optimizer step during training (null: the env's horizon, full
            backpropagation through time); must divide the env's horizon.
        carry_from: With ``window`` set, the iteration from which a window starts where the
            previous one ended; before it every window starts a new episode from fresh
            draws (a curriculum: learn to recover from the starts before learning from the
            states a policy drifts into). 0: from the first iteration.
        random_starts: Draw every world's initial state anew at each episode start during
            training (true), or train from the env's own initial states (false).
        seed: Seeds the initial weights.
        init_scale: Multiplies the output layer's initial weights (small: the untrained
            policy pushes gently).
    """

    name = "policy"
    segment_graph = True
    """Under graph capture, one segment's graph serves every segment
    (:func:`harness.memory.segment_graph_blocker`): with an env that reads the step from the
    device, each step's MLP runs on its segment's rows, addressed by slot, and
    :meth:`act` copies them into the whole-horizon rows at ``segment_base[0] + slot``."""
    training_only = ("window",)
    window_key = "task.window"
    """Settings that only shape training (unset when a run is evaluated over whole episodes)."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Args:
        """The task's fields (``configs/task/policy.yaml``), checked by :mod:`harness.schema`."""

        hidden: tuple[int, ...] = schema.field(minimum=1, doc="hidden layer widths, e.g. [64, 64]")
        activation: str = schema.field(choices=("tanh", "elu", "relu"))
        layer_norm: bool = schema.field()
        action_scale: float = schema.field(minimum=0.0, strict=True)
        window: int | None = schema.field(minimum=1)
        carry_from: int = schema.field(minimum=0)
        random_starts: bool = schema.field()
        seed: int = schema.field()
        init_scale: float = schema.field(minimum=0.0)

    @schema.checked(Args, "task")
    def __init__(
        self,
        *,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        layer_norm: bool = False,
        action_scale: float = 1.0,
        window: int | None = None,
        carry_from: int = 0,
        random_starts: bool = True,
        seed: int = 0,
        init_scale: float = 0.1,
    ):
        self.hidden = [int(h) for h in hidden]
        self.activation = activation
        self.layer_norm = layer_norm
        self.action_scale = float(action_scale)
        self.window = window
        self.carry_from = carry_from
        self.random_starts = random_starts
        self.seed = int(seed)
        self.init_scale = float(init_scale)
        self._buffers: dict[int, _Buffers] = {}
        self._mlps: dict[tuple[int, int], MLP] = {}
        self._episode: int | None = None  # the env horizon an episode has in training (windows)

    # -- shapes ------------------------------------------------------------------------

    def check(self, config: EnvConfig) -> None:
        if config.observation_dim() < 1 or config.action_dim() < 1:
            raise ValueError(
                "task: policy maps observations to actions, and this env offers "
                f"{config.observation_dim()} observations and {config.action_dim()} actions per world; "
                "accepted: an env with both (cartpole)"
            )
        if self.window is not None and (self.window > config.horizon or config.horizon % self.window):
            raise ValueError(
                f"task.window: {self.window} does not divide env.horizon={config.horizon}; "
                "accepted: a divisor of the horizon, or null (the whole horizon)"
            )

    def required_roles(self) -> tuple[type, ...]:
        """Observations always; fresh draws with ``random_starts``; a carried state with ``window``."""
        return (PolicyEnv, *((DrawsStarts,) if self.random_starts else ()), *((CarriesState,) if self.window else ()))

    def check_segments(self, steps: int | None, config: EnvConfig) -> None:
        if steps is not None and self.window is not None and self.window < config.horizon:
            raise ValueError(
                f"memory.segment_steps: task.window={self.window} carries the state between windows, which a "
                "segmented rollout does not yet support; accepted: memory.segment_steps=null, or task.window=null"
            )

    def training_config(self, config: EnvConfig) -> EnvConfig:
        """The env trains one window at a time: its rollouts are ``window`` steps long, and
        an episode lasts the configured horizon."""
        if self.window is None or self.window == config.horizon:
            return config
        self._episode = config.horizon
        return dataclasses.replace(config, horizon=self.window)

    def mlp(self, config: EnvConfig) -> MLP:
        """The policy's MLP for an env with this config (made once per width)."""
        key = (config.observation_dim(), config.action_dim())
        if key not in self._mlps:
            self._mlps[key] = MLP(
                key[0],
                self.hidden,
                key[1],
                activation=self.activation,
                layer_norm=self.layer_norm,
                output="tanh",
                output_scale=self.action_scale,
            )
        return self._mlps[key]

    def parameter_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        return self.mlp(config).shapes()

    def parameter_specs(self, env: Env) -> list[ParamSpec]:
        # PyTorch's nn.Linear default: weights and biases uniform in +-1/sqrt(fan_in).
        return self.mlp(env.config).specs(
            seed=self.seed, init_scale=self.init_scale, fd_step=env.config.weight_fd_step()
        )

    # -- training mode -------------------------------------------------------------------

    def state(self, env: Env) -> dict[str, wp.array]:
        """The env's carried state: a checkpoint holds it, so a run resumed mid-episode goes on
        from where it stopped."""
        return env.carried() if self._windowed(env) else {}

    def _windowed(self, env: Env) -> bool:
        return self._episode is not None and env.horizon < self._episode

    # -- the rollout ---------------------------------------------------------------------

    def buffers(self, env: Env) -> _Buffers:
        found = self._buffers.get(id(env))
        segment = env.segment_steps if _segment_rows(env) else None
        held = None if found is None or found.segment_actions is None else found.segment_actions.shape[0]
        if found is None or found.observations.shape[:2] != (env.horizon, env.world_count) or held != segment:
            rows = (env.horizon, env.world_count)
            obs, act = env.config.observation_dim(), env.config.action_dim()
            found = _Buffers(
                observations=wp.zeros((*rows, obs), device=env.device, requires_grad=True),
                actions=wp.zeros((*rows, act), device=env.device, requires_grad=True),
                carry=wp.zeros(1, dtype=wp.int32, device=env.device),
                restart=wp.zeros(env.world_count, dtype=wp.int32, device=env.device),
            )
            if segment is not None:
                found.segment_observations = wp.zeros(
                    (segment, env.world_count, obs), device=env.device, requires_grad=True
                )
                found.segment_actions = wp.zeros((segment, env.world_count, act), device=env.device, requires_grad=True)
            self._buffers[id(env)] = found
        return found

    def begin(self, env: Env, params: ParamSet) -> None:
        buffers = self.buffers(env)
        if self.training_key is None:
            env.restore_initial()
        elif self.random_starts or self._windowed(env):
            env.keep_built_initial()  # once: what evaluation rollouts start from
            if self.random_starts:
                env.draw_initial(self.training_key)
            else:
                env.restore_initial()
            if self._windowed(env):
                per_episode = self._episode // env.horizon
                wp.launch(_episode_flags, dim=1, inputs=[self.training_key, per_episode, self.carry_from],
                          outputs=[buffers.carry], device=env.device)  # fmt: skip
                # a world whose kept state ended its episode by the env's rule (the cartpole's
                # env.fall_angle) starts anew from its fresh draw, as in SHAC's early termination
                ended = env.ended_worlds(buffers.restart)
                env.carry_final(buffers.carry, buffers.restart if ended else None)
        env.reset()

    def zero_grad(self, env: Env) -> None:
        buffers = self.buffers(env)
        for array in (buffers.observations, buffers.actions, buffers.segment_observations, buffers.segment_actions):
            if array is not None:
                array.grad.zero_()

    def act(self, env: Env, params: ParamSet, t: int) -> None:
        buffers = self.buffers(env)
        mlp = self.mlp(env.config)
        if buffers.segment_actions is None:
            env.observe(t, buffers.observations[t])
            mlp.forward_step(params, buffers.observations, t, buffers.actions)
            env.act(t, buffers.actions)
            return
        # In segments, with an env that reads the step from the device: the launches are the
        # same in every segment. Each segment is re-run just before its backward, so zeroing its
        # rows' gradient here clears what the later segment's backward left in them (the
        # observation's: env.observe's adjoint reads it without consuming it).
        slot = env.slot(t)
        observations, actions = buffers.segment_observations, buffers.segment_actions
        if slot == 0:
            observations.grad.zero_()
            actions.grad.zero_()
        env.observe(t, observations[slot])
        mlp.forward(params, observations[slot], actions[slot])
        for rows, whole in ((observations, buffers.observations), (actions, buffers.actions)):
            wp.launch(
                _to_step_row, dim=rows.shape[1:], inputs=[rows[slot], env.segment_base, slot], outputs=[whole],
                device=env.device,
            )  # fmt: skip
        env.act(t, buffers.actions)

    def end(self, env: Env, params: ParamSet) -> None:
        if self.training_key is not None and self._windowed(env):
            env.keep_final()

    def columns(self, params: ParamSet, loss: WeightedLoss) -> list[tuple[str, wp.array, int]]:
        """``policy/window_cost``: the loss of each iteration's training window (the
        negative of what SHAC calls the window's return)."""
        return [(tags.POLICY_WINDOW_COST, loss.total, 0)]

    def rollout_actions(self, env: Env) -> wp.array:
        """The actions of the latest rollout, ``(horizon, world_count, action_dim)``."""
        return self.buffers(env).actions
