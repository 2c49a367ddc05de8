"""SHAC: Short-Horizon Actor-Critic (Xu et al., ICLR 2022, "Accelerated Policy Learning with
Parallel Differentiable Simulation"), on any env that plays the policy roles.

Two parameter groups, each with its own optimizer, schedule, clip policy and statistics
(:mod:`harness.training.groups`): the ``actor``, an MLP from the normalised observation to the
mean of a Gaussian whose log standard deviation is a parameter too (``log_std``; the action is
``action_scale * tanh(mean + std * eps)``), and the ``critic``, an MLP from the normalised
observation to a value. One iteration (:meth:`SHAC.iterate`), all of it one captured graph:

1. **Actor.** A window of ``window`` steps across all worlds on one tape, continuing from where
   the last window ended (:class:`~harness.env.CarriesState`); a world whose episode ends inside
   the window restarts there from a fresh draw with the gradient cut (:class:`~harness.env.Restarts`).
   The reward of a step is minus the loss's cost of that step and world
   (:meth:`harness.losses.WeightedLoss.step_costs`), times ``reward_scale``. The objective is
   ``-(sum_k gamma^k r_k + gamma^(k+1) V'(s)) / (window x worlds)`` summed over every
   sub-trajectory (an episode's part inside the window), ``V'`` the target critic at the state
   the sub-trajectory ended in; backward through the simulation, then the actor's update
   (SHAC clips it at global norm 1).
2. **Critic.** TD(lambda) targets from the window's costs and target values (no tape), then
   ``critic_epochs`` passes over the window's ``window x worlds`` observations in
   ``critic_minibatches`` contiguous minibatches (as SHAC's code: time-major, unshuffled),
   each a mean squared error, its backward and the critic's update.
3. **Target critic** ``<- target_alpha * target + (1 - target_alpha) * critic`` (Polyak); the
   running mean and variance of the observations absorb the window's (Chan et al. 1979);
   every world's episode counter moves on.

Under ``window=auto`` (:mod:`harness.auto_window`) every rollout runs ``auto.ceiling`` steps and the
actor's gradient is cut every ``n`` steps inside it, ``n`` a device number the measurement of the
gradient's trust moves between iterations.

Observations are normalised with the statistics as they stood when the window began (SHAC:
a frozen copy); the statistics, the target critic, the episode counters, the carried state
and the episode bookkeeping are the task's state, in every checkpoint, so a resumed run goes
on bit for bit. Outside training (evaluation, the end of a run, ``harness evaluate``) the
actor is deterministic (``tanh(mean)``) and rolls whole episodes from the env's own starts.

Where this differs from SHAC's code (NVlabs/DiffRL), and why, is in docs/tasks.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import warp as wp

from harness import schema, tags
from harness.adjoint import flat_grad_view, recording_tape
from harness.env import CarriesState, DrawsStarts, Env, EnvConfig, PolicyEnv, Restarts, Terminates
from harness.losses import WeightedLoss
from harness.nn import ACTIVATIONS, MLP, Regression
from harness.params import ParamSet, ParamSpec
from harness.tasks import shac_kernels as k
from harness.tasks.base import Task

__all__ = ["SHAC"]

UPDATE_KEYS = ("optim", "clip", "schedule")
"""Keys of ``task.critic`` that configure the critic group's update (:mod:`harness.build`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class NetArgs:
    """An MLP's shape (``task.actor``, ``task.critic``)."""

    hidden: tuple[int, ...] = schema.field((64, 64), minimum=1, doc="hidden layer widths")
    activation: str = schema.field("elu", choices=tuple(ACTIVATIONS), doc="hidden activation")
    layer_norm: bool = schema.field(True, doc="LayerNorm after every hidden activation (Ba et al. 2016)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActorArgs(NetArgs):
    log_std_init: float = schema.field(-1.0, doc="initial log standard deviation of the action noise")
    init_scale: float = schema.field(1.0, minimum=0.0, doc="multiplies the output layer's initial weights")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoArgs:
    """``task.auto``: the gradient's window under ``task.window=auto`` (:mod:`harness.auto_window`)."""

    floor: int = schema.field(8, minimum=1, doc="the shortest gradient window")
    ceiling: int = schema.field(32, minimum=1, doc="the longest, and the steps of every rollout (floor x 2^k)")
    every: int = schema.field(150, minimum=1, doc="iterations between two measurements of the gradient's trust")


AUTO = "auto"
"""``task.window=auto``: the gradient's window chosen in training from its measured trust."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SHACArgs:
    """The task's own fields (``configs/task/shac.yaml``), checked by :mod:`harness.schema`."""

    window: int | str | None = schema.field(32, doc="steps per actor update, auto, or null (a whole episode)")
    gamma: float = schema.field(0.99, minimum=0.0, strict=True, maximum=1.0, doc="discount per step")
    lam: float = schema.field(0.95, minimum=0.0, maximum=1.0, strict_maximum=True, doc="TD(lambda)'s lambda")
    critic_epochs: int = schema.field(16, minimum=1, doc="passes over the window's data per iteration")
    critic_minibatches: int = schema.field(4, minimum=1, doc="minibatches per pass")
    target_alpha: float = schema.field(0.2, minimum=0.0, maximum=1.0, doc="Polyak weight kept of the old target")
    reward_scale: float = schema.field(1.0, minimum=0.0, strict=True, doc="reward = -reward_scale * cost")
    action_scale: float = schema.field(1.0, minimum=0.0, strict=True, doc="largest action, in the env's units")
    seed: int = schema.field(0, doc="seeds the initial weights and the action noise")


@dataclasses.dataclass
class _Window:
    """Per-env buffers of one window (``steps`` rows of ``worlds``)."""

    obs: wp.array  # raw observation of the state each step starts from (steps, worlds, obs)
    obs_n: wp.array  # normalised (steps, worlds, obs)
    mean: wp.array  # actor output (steps, worlds, act)
    actions: wp.array  # (steps, worlds, act)
    next_obs: wp.array  # raw observation of the state after each step, before a restart
    next_n: wp.array
    next_values: wp.array  # target critic at next_n (steps * worlds, 1)
    cost: wp.array  # (steps, worlds)
    done: wp.array  # int32 (steps, worlds): the episode ends after the step
    ends: wp.array  # int32 (steps, worlds): a sub-trajectory ends after the step
    terminal: wp.array  # int32 (steps, worlds): the episode ended early after the step (valued 0)
    cut: wp.array  # int32 (steps, worlds): the gradient is cut after the step (task.window=auto)
    ended: wp.array  # int32 (worlds,): the env's early ends of the state being restarted
    no_restart: wp.array  # int32 (worlds,): zeros, the restart mask outside training
    cost_weight: wp.array
    value_weight: wp.array
    keys: wp.array  # int32 (steps + 1,): random streams of the window's draws
    carry: wp.array  # int32 (1,)
    objective: wp.array  # (1,)
    targets: wp.array  # (steps * worlds,)
    inputs: wp.array  # the critic's data: obs_n without a gradient (steps * worlds, obs)
    losses: wp.array  # (minibatches,): each minibatch's loss in the last epoch
    critic_fit: Regression | None = None  # the critic's minibatch steps on inputs and targets (made on first use)


class SHAC(Task):
    """SHAC's actor and critic (module docstring).

    Args:
        window: Steps per actor update (SHAC: 32); ``auto``: rollouts of ``auto.ceiling`` steps,
            the gradient cut every ``n`` steps, ``n`` moved by :class:`harness.auto_window.AutoWindow`.
        gamma: Discount per step (0.99).
        lam: TD(lambda)'s lambda (0.95).
        critic_epochs: Passes over the window's data per iteration (16).
        critic_minibatches: Contiguous minibatches per pass (4).
        target_alpha: The target critic keeps this much of itself per iteration (0.2).
        reward_scale: The reward of a step is ``-reward_scale * cost``.
        action_scale: The actor's action is ``action_scale * tanh(.)``, in the env's units.
        seed: Seeds the initial weights and the action noise.
        actor: :class:`ActorArgs` fields (``hidden``, ``activation``, ``layer_norm``,
            ``log_std_init``, ``init_scale``).
        critic: :class:`NetArgs` fields, and the critic group's ``optim``, ``clip`` and
            ``schedule`` (built by :mod:`harness.build`, not here).
        auto: :class:`AutoArgs` fields (``floor``, ``ceiling``, ``every``), read under ``window=auto``.
    """

    name = "shac"
    roles = (PolicyEnv, DrawsStarts, CarriesState, Restarts)
    critic_outputs = 1  # the critic's heads (task=ahac: 2, valued by their minimum)
    training_only = ("window", "auto")
    window_key = "task.window"
    evaluation_state = ("obs_mean", "obs_var", "obs_count")

    def __init__(
        self,
        *,
        window: int | str | None = 32,
        gamma: float = 0.99,
        lam: float = 0.95,
        critic_epochs: int = 16,
        critic_minibatches: int = 4,
        target_alpha: float = 0.2,
        reward_scale: float = 1.0,
        action_scale: float = 1.0,
        seed: int = 0,
        actor: Mapping[str, Any] | None = None,
        critic: Mapping[str, Any] | None = None,
        auto: Mapping[str, Any] | None = None,
    ):
        if (
            window != AUTO
            and window is not None
            and (isinstance(window, bool) or not isinstance(window, int) or window < 1)
        ):
            raise schema.SchemaError(f"task.window: must be an integer >= 1, auto or null, got {window!r}")
        self.auto = schema.build(AutoArgs, dict(auto or {}), prefix="task.auto")
        floor, ceiling = self.auto.floor, self.auto.ceiling
        ratio = ceiling // floor
        if window == AUTO and (ceiling % floor or ratio & (ratio - 1)):
            raise schema.SchemaError(
                f"task.auto.ceiling: must be task.auto.floor ({floor}) times a power of 2 "
                f"({floor}, {2 * floor}, {4 * floor}, ...), got {ceiling}"
            )
        self.adaptive = window == AUTO
        self.args = schema.check(
            SHACArgs, "task", window=window, gamma=gamma, lam=lam, critic_epochs=critic_epochs,
            critic_minibatches=critic_minibatches, target_alpha=target_alpha, reward_scale=reward_scale,
            action_scale=action_scale, seed=seed,
        )  # fmt: skip
        self.window = ceiling if self.adaptive else self.args.window
        self.action_scale = self.args.action_scale
        self.actor_args = schema.build(ActorArgs, dict(actor or {}), prefix="task.actor")
        self.critic_args = schema.build(NetArgs, dict(critic or {}), prefix="task.critic", ignore=UPDATE_KEYS)
        self._episode: int | None = None  # an episode's steps (the env's configured horizon)
        self._buffers: dict[int, _Window] = {}
        self._restarting: set[int] = set()
        self._critic: ParamSet | None = None
        self._target: ParamSet | None = None
        self._state: dict[str, wp.array] = {}
        self._mlps: dict[tuple[int, int], tuple[MLP, MLP]] = {}

    # -- shapes and checks -----------------------------------------------------------------

    def _nets(self, config: EnvConfig) -> tuple[MLP, MLP]:
        """The actor's and the critic's MLP for an env with this config (made once per width)."""
        obs, act = config.observation_dim(), config.action_dim()
        found = self._mlps.get((obs, act))
        if found is None:
            a, c = self.actor_args, self.critic_args
            actor = MLP(obs, a.hidden, act, activation=a.activation, layer_norm=a.layer_norm)
            critic = MLP(obs, c.hidden, self.critic_outputs, activation=c.activation, layer_norm=c.layer_norm)
            found = self._mlps[(obs, act)] = (actor, critic)
        return found

    def check(self, config: EnvConfig) -> None:
        if config.observation_dim() < 1 or config.action_dim() < 1:
            raise ValueError(
                f"task: shac maps observations to actions, and this env offers {config.observation_dim()} "
                f"observations and {config.action_dim()} actions per world"
            )
        window = self.window or config.horizon
        rows = window * config.world_count
        if rows % self.args.critic_minibatches:
            raise ValueError(
                f"task.critic_minibatches: {self.args.critic_minibatches} does not divide the window's "
                f"{window} x {config.world_count} = {rows} rows; accepted: a divisor of {rows}"
            )

    def check_loss(self, loss: WeightedLoss) -> None:
        super().check_loss(loss)
        for term in loss.terms:
            if term.steps != "all":
                raise ValueError(
                    f"loss.terms.{term.name}.steps: task=shac rewards every step (reward = -cost of the step); "
                    "accepted: all"
                )

    def check_segments(self, steps: int | None, config: EnvConfig) -> None:
        if steps is not None:
            raise ValueError("memory.segment_steps: task=shac trains in short windows already; accepted: null")

    def training_config(self, config: EnvConfig) -> EnvConfig:
        """The env trains one window at a time; an episode lasts the configured horizon (a window
        may hold several episodes' ends)."""
        self._episode = config.horizon
        return dataclasses.replace(config, horizon=self.window or config.horizon)

    def group_settings(self) -> dict[str, str]:
        return {"critic": "task.critic"}

    def parameter_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        actor, _ = self._nets(config)
        return {**actor.shapes(), "log_std": (config.action_dim(),)}

    def group_shapes(self, config: EnvConfig) -> dict[str, dict[str, tuple[int, ...]]]:
        _, critic = self._nets(config)
        return {"actor": self.parameter_shapes(config), "critic": critic.shapes()}

    def parameter_specs(self, env: Env) -> list[ParamSpec]:
        actor, _ = self._nets(env.config)
        log_std = np.full(env.config.action_dim(), self.actor_args.log_std_init, np.float32)
        return [
            *actor.specs(
                seed=self.args.seed, init_scale=self.actor_args.init_scale, fd_step=env.config.weight_fd_step()
            ),
            ParamSpec("log_std", log_std.shape, init=log_std, fd_step=1.0e-2),
        ]

    def groups(self, env: Env) -> dict[str, list[ParamSpec]]:
        _, critic = self._nets(env.config)
        return {"actor": self.parameter_specs(env), "critic": critic.specs(seed=self.args.seed + 1)}

    def bind(self, params: dict[str, ParamSet]) -> None:
        critic = params["critic"]
        self._critic = critic
        self._target = ParamSet(critic.specs, device=critic.device)
        wp.copy(self._target.data, critic.data)  # the target critic starts as the critic (SHAC: deepcopy)

    # -- the task's state -----------------------------------------------------------------------

    def state(self, env: Env) -> dict[str, wp.array]:
        """What carries over between iterations: the target critic, the observation
        statistics, the episode counters and bookkeeping, the env's carried state."""
        if not self._state:
            device, worlds, obs = env.device, env.world_count, env.config.observation_dim()
            self._state = {
                "target_critic": self._target.data,
                "obs_mean": wp.zeros(obs, dtype=wp.float64, device=device),
                "obs_var": wp.ones(obs, dtype=wp.float64, device=device),
                "obs_count": wp.full(1, 1.0e-4, dtype=wp.float64, device=device),  # SHAC's epsilon
                "episode_step": wp.zeros(worlds, dtype=wp.int32, device=device),
                "running_return": wp.zeros(worlds, dtype=wp.float32, device=device),
                "running_length": wp.zeros(worlds, dtype=wp.int32, device=device),
                "last_return": wp.full(1, float("nan"), dtype=wp.float32, device=device),
                "last_length": wp.full(1, float("nan"), dtype=wp.float32, device=device),
                **({"window": wp.full(1, self.window, dtype=wp.int32, device=device)} if self.adaptive else {}),
                **{f"carried/{name}": array for name, array in env.carried().items()},
            }
            self._finished = wp.zeros(3, dtype=wp.float32, device=device)
            self._objective = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)  # the actor's loss
            self._scalars = wp.zeros(4, dtype=wp.float32, device=device)  # critic loss, value and target means, std
        return self._state

    def buffers(self, env: Env) -> _Window:
        found = self._buffers.get(id(env))
        if found is not None and found.obs.shape[:2] == (env.horizon, env.world_count):
            return found  # (an env of another size may reuse a collected env's id)
        steps, worlds, device = env.horizon, env.world_count, env.device
        obs, act = env.config.observation_dim(), env.config.action_dim()
        rows = steps * worlds

        def grad(*shape: int) -> wp.array:
            return wp.zeros(shape, dtype=wp.float32, device=device, requires_grad=True)

        found = _Window(
            obs=grad(steps, worlds, obs),
            obs_n=grad(steps, worlds, obs),
            mean=grad(steps, worlds, act),
            actions=grad(steps, worlds, act),
            next_obs=grad(steps, worlds, obs),
            next_n=grad(steps, worlds, obs),
            next_values=grad(rows, 1),
            cost=grad(steps, worlds),
            done=wp.zeros((steps, worlds), dtype=wp.int32, device=device),
            ends=wp.zeros((steps, worlds), dtype=wp.int32, device=device),
            terminal=wp.zeros((steps, worlds), dtype=wp.int32, device=device),
            cut=wp.zeros((steps, worlds), dtype=wp.int32, device=device),
            ended=wp.zeros(worlds, dtype=wp.int32, device=device),
            no_restart=wp.zeros(worlds, dtype=wp.int32, device=device),
            cost_weight=wp.zeros((steps, worlds), dtype=wp.float32, device=device),
            value_weight=wp.zeros((steps, worlds), dtype=wp.float32, device=device),
            keys=wp.zeros(steps + 1, dtype=wp.int32, device=device),
            carry=wp.zeros(1, dtype=wp.int32, device=device),
            objective=self.state(env) and self._objective,
            targets=wp.zeros(rows, dtype=wp.float32, device=device),
            inputs=wp.zeros((rows, obs), dtype=wp.float32, device=device),
            losses=wp.zeros(self.args.critic_minibatches, dtype=wp.float32, device=device),
        )
        self._buffers[id(env)] = found
        return found

    def zero_grad(self, env: Env) -> None:
        b = self.buffers(env)
        for array in (b.obs, b.obs_n, b.mean, b.actions, b.next_obs, b.next_n, b.next_values, b.cost, b.objective):
            array.grad.zero_()
        self._target.zero_grad()

    # -- the rollout --------------------------------------------------------------------------------

    def begin(self, env: Env, params: ParamSet) -> None:
        b = self.buffers(env)
        if self.training_key is None:
            env.restore_initial()
        else:
            if id(env) not in self._restarting:
                env.enable_restarts()
                self._restarting.add(id(env))
            state = self.state(env)
            steps = env.horizon
            # the window's keys, episode marks and carry flag have no gradient: not on the tape
            wp.launch(
                k.window_keys, dim=steps + 1, inputs=[self.training_key, steps], outputs=[b.keys], device=env.device,
                record_tape=False,
            )  # fmt: skip
            self._begin_cuts(env, state, b)
            wp.launch(
                k.episode_marks, dim=env.world_count,
                inputs=[state["episode_step"], self._episode, steps, b.cut],
                outputs=[b.done, b.ends, b.cost_weight, b.value_weight, self.args.gamma],
                device=env.device, record_tape=False,
            )  # fmt: skip
            b.terminal.zero_()
            env.draw_initial(b.keys[0:1])
            wp.launch(
                _carry_after_first, dim=1, inputs=[self.training_key], outputs=[b.carry], device=env.device,
                record_tape=False,
            )  # fmt: skip
            env.carry_final(b.carry)
        env.reset()

    def _begin_cuts(self, env: Env, state: dict[str, wp.array], b: _Window) -> None:
        """The rollout's gradient cuts known before it starts, into ``b.cut`` (``window=auto``: every
        ``n`` steps; otherwise none, and ``b.cut`` stays 0)."""
        if self.adaptive:
            wp.launch(
                k.cut_every, dim=b.cut.shape, inputs=[state["window"], env.horizon], outputs=[b.cut],
                device=env.device, record_tape=False,
            )  # fmt: skip

    def _cuts_at(self, t: int) -> bool:
        """Whether a gradient cut can fall after step ``t - 1`` (where :meth:`_record_cut` records its
        adjoint's zeroing): under ``window=auto`` at multiples of the floor only (``n`` is the floor
        times a power of 2)."""
        return self.adaptive and t % self.auto.floor == 0

    def _mark_cuts(self, env: Env, t: int) -> None:
        """After step ``t - 1``'s terminations are marked: cuts decided during the rollout (none here;
        ``task=ahac``: by contact)."""

    def _observe(self, env: Env, t: int, row: int, raw: wp.array, normalised: wp.array) -> None:
        """Row ``row`` of ``raw``: what a policy sees of state ``t`` (after its restart); of
        ``normalised``: the same with the window's statistics."""
        env.observe(t, raw[row])
        self._normalize(env, raw[row], normalised[row])

    def _normalize(self, env: Env, raw: wp.array, normalised: wp.array) -> None:
        """``normalised = raw`` normalised with the window's statistics, rows ``(n, observation_dim)``."""
        state = self.state(env)
        wp.launch(
            k.normalize, dim=raw.shape, inputs=[raw, state["obs_mean"], state["obs_var"]], outputs=[normalised],
            device=env.device,
        )  # fmt: skip

    def _restart(self, env: Env, t: int) -> None:
        """Before step ``t >= 1`` (or after the last): keep the observation of the state step ``t - 1``
        ended in (the target critic values it; :meth:`end` normalises every row of them at once,
        one launch, as nothing reads them before), then restart the worlds whose episode ended."""
        if id(env) not in self._restarting:
            return
        b = self.buffers(env)
        env.observe_ended(t, b.next_obs[t - 1])
        if self.training_key is not None and self._cuts_at(t):
            self._record_cut(env, t)
        if self.training_key is not None and isinstance(env, Terminates):
            env.terminated(t, b.ended)
            # marks and weights without a gradient: not on the tape (no adjoint launch)
            wp.launch(
                k.mark_terminations, dim=env.world_count,
                inputs=[b.ended, t - 1, env.horizon, self._episode, self.args.gamma, b.cut],
                outputs=[b.done, b.ends, b.terminal, b.cost_weight, b.value_weight], device=env.device,
                record_tape=False,
            )  # fmt: skip
        if self.training_key is not None:
            self._mark_cuts(env, t)
        env.restart(t, b.done[t - 1] if self.training_key is not None else b.no_restart, b.keys[t : t + 1])

    def _record_cut(self, env: Env, t: int) -> None:
        """On the tape, between the observation the critic values at a cut after step ``t - 1`` and
        everything after it: the backward pass zeroes the state's adjoint there for the worlds cut
        (:func:`~harness.tasks.shac_kernels.zero_cut_adjoint`), once the later steps have added to it
        and before the value's own gradient does, so each window's gradient stays inside it."""
        tape = recording_tape()
        if tape is None:
            return
        cut, arrays = self.buffers(env).cut, env.state_arrays(t)
        views = [flat_grad_view(array, env.world_count) for array in arrays]

        def backward() -> None:
            for view in views:
                wp.launch(k.zero_cut_adjoint, dim=view.shape, inputs=[cut, t - 1], outputs=[view], device=env.device)

        tape.record_func(backward, arrays)

    def act(self, env: Env, params: ParamSet, t: int) -> None:
        b = self.buffers(env)
        if t > 0:
            self._restart(env, t)
        self._observe(env, t, t, b.obs, b.obs_n)
        actor, _ = self._nets(env.config)
        actor.forward_step(params, b.obs_n, t, b.mean)
        training = self.training_key is not None
        wp.launch(
            k.sample_actions, dim=(env.world_count, b.mean.shape[2]),
            inputs=[b.mean, params["log_std"], t, self.training_key if training else b.keys, self.args.seed,
                    env.horizon, int(training), self.action_scale],
            outputs=[b.actions], device=env.device,
        )  # fmt: skip
        env.act(t, b.actions)

    def end(self, env: Env, params: ParamSet) -> None:
        if id(env) in self._restarting:
            self._restart(env, env.horizon)
            b = self.buffers(env)
            rows = (b.next_obs.shape[0] * b.next_obs.shape[1], b.next_obs.shape[2])
            self._normalize(env, b.next_obs.reshape(rows), b.next_n.reshape(rows))  # every step's at once
        if self.training_key is not None:
            env.keep_final()

    def rollout_actions(self, env: Env) -> wp.array:
        return self.buffers(env).actions

    # -- one iteration ------------------------------------------------------------------------------

    def objective(self, env: Env, loss: WeightedLoss, trajectory: Any) -> wp.array:
        """The actor's loss of the window just rolled out (module docstring), on the tape; the
        loss's own terms are recorded too (``loss/<term>``)."""
        b = self.buffers(env)
        loss(trajectory)
        loss.step_costs(trajectory, b.cost)
        rows = b.next_n.shape[0] * b.next_n.shape[1]
        self._values(env, b.next_n.reshape((rows, b.next_n.shape[2])), b.next_values)
        b.objective.zero_()
        wp.launch(
            k.actor_objective, dim=b.cost.shape,
            inputs=[b.cost, b.next_values.reshape(b.cost.shape), b.cost_weight, b.value_weight,
                    self.args.reward_scale, float(rows)],
            outputs=[b.objective], device=env.device,
        )  # fmt: skip
        return b.objective

    def _values(self, env: Env, inputs: wp.array, out: wp.array) -> None:
        """``out`` ``(rows, 1)``: the target critic's values of the normalised ``inputs``, on the tape."""
        _, critic = self._nets(env.config)
        critic.forward(self._target, inputs, out)

    def _fit_critic(self, step: Any, env: Env, b: _Window) -> None:
        """The critic's epochs on the window's inputs and TD(lambda) targets (SHAC: ``critic_epochs``
        passes of ``critic_minibatches``), each minibatch step followed by the critic group's update."""
        if b.critic_fit is None:
            _, critic = self._nets(env.config)
            targets = b.targets.reshape((b.targets.shape[0], 1))
            b.critic_fit = Regression(critic, self._critic, b.inputs, targets, minibatches=self.args.critic_minibatches)
        b.critic_fit.fit(self.args.critic_epochs, b.losses, lambda: step.apply("critic"))

    def _after_critic(self, step: Any, env: Env, b: _Window) -> None:
        """After the critic's fit and the target's update, before the statistics move on (none here;
        ``task=ahac``: the horizon's dual step)."""

    def iterate(self, step: Any) -> None:
        """The actor's window and update, the critic's epochs, the target critic and statistics."""
        env = step.env
        b = self.buffers(env)
        state = self.state(env)
        step.forward_backward(objective=lambda trajectory: self.objective(env, step.loss, trajectory))
        step.apply("actor")
        a = self.args
        wp.launch(
            k.td_lambda, dim=env.world_count,
            inputs=[b.cost, b.next_values.reshape(b.cost.shape), b.ends, b.terminal, a.reward_scale, a.gamma, a.lam,
                    env.horizon],
            outputs=[b.targets.reshape(b.cost.shape)], device=env.device,
        )  # fmt: skip
        wp.copy(b.inputs, b.obs_n.reshape(b.inputs.shape))
        self._fit_critic(step, env, b)
        wp.launch(
            k.polyak, dim=self._critic.size, inputs=[state["target_critic"], self._critic.data, a.target_alpha],
            device=env.device,
        )  # fmt: skip
        self._after_critic(step, env, b)
        wp.launch(
            k.update_moments, dim=1,
            inputs=[b.obs.reshape(b.inputs.shape), state["obs_mean"], state["obs_var"], state["obs_count"],
                    b.obs.shape[2]],
            device=env.device,
        )  # fmt: skip
        self._finished.zero_()
        wp.launch(
            k.episode_stats, dim=env.world_count, inputs=[b.cost, b.done, a.reward_scale, env.horizon],
            outputs=[state["running_return"], self._finished, state["running_length"]], device=env.device,
        )  # fmt: skip
        wp.launch(
            k.next_episode, dim=env.world_count, inputs=[state["episode_step"], b.done, self._episode, env.horizon],
            device=env.device,
        )  # fmt: skip
        wp.launch(
            k.summarize, dim=1,
            inputs=[self._finished, b.losses, b.next_values, b.targets, step.params["log_std"]],
            outputs=[state["last_return"], state["last_length"], self._scalars], device=env.device,
        )  # fmt: skip

    # -- what it reports ------------------------------------------------------------------------------

    def columns(self, params: ParamSet, loss: WeightedLoss) -> list[tuple[str, wp.array, int]]:
        """``shac/actor_loss`` (the actor's objective of the window; ``loss/total`` is the loss's own
        value over it), ``shac/critic_loss`` (the mean minibatch loss of the last critic epoch), ``shac/value_mean``
        (the target critic over the window's states), ``shac/target_mean`` (the TD(lambda)
        targets), ``shac/action_std``, ``shac/episode_return`` and ``shac/episode_length`` (of the
        episodes that ended most recently; nan before the first); under ``task.window=auto``,
        ``shac/window``: the gradient's window the iteration trained with."""
        state = self._state
        found = [(tags.task("shac", name), self._scalars, i) for i, name in enumerate(SCALARS)]
        found.append((tags.task("shac", "actor_loss"), self._objective, 0))
        found.append((tags.task("shac", "episode_return"), state["last_return"], 0))
        found.append((tags.task("shac", "episode_length"), state["last_length"], 0))
        if self.adaptive:
            found.append((tags.task("shac", "window"), state["window"], 0))
        return found

    def figures(self, env: Env, loss: WeightedLoss, trajectory: Any) -> dict[str, Any]:
        """``episode_return``: the mean over worlds of the summed rewards (minus the scaled cost of
        every step) of a whole-horizon rollout."""
        costs = wp.zeros((env.horizon, env.world_count), dtype=wp.float32, device=env.device)
        loss.step_costs(trajectory, costs)
        returns = -self.args.reward_scale * costs.numpy().astype(np.float64).sum(axis=0)
        return {"episode_return": float(returns.mean())}


SCALARS = ("critic_loss", "value_mean", "target_mean", "action_std")
"""The task's device scalars, in the order of ``_scalars``."""


@wp.kernel
def _carry_after_first(counter: wp.array(dtype=wp.int32), carry: wp.array(dtype=wp.int32)):
    """Carry the last window's state on from the second iteration (the first draws every world)."""
    carry[0] = wp.where(counter[0] > 0, 1, 0)
