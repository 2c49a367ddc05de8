"""Model-predictive control: the outer loop is the controlled system's own time.

One training iteration is one *frame* (control step) of a real system beside the rollouts
(the env's :class:`~harness.env.Plant` role). Every frame, all of it one captured graph:

1. the real system's time moves to the frame (the drone's target switches every
   ``switch_every`` frames) and the rollouts' initial state becomes its current state;
2. every world but the last draws a plan around the best plan so far: each control point
   ``best + noise * N(0, 1)``, redrawn up to ten times while outside the bounds, then clamped
   (Warp's ``rand_init(seed + frame, entry)``, the example's draws exactly); the last world
   keeps the best plan itself;
3. ``inner_steps`` gradient steps on all plans at once: a taped rollout of the plans, the sum
   over worlds of each world's cost (the loss's cost of every step, summed, :meth:`MPC.objective`),
   its backward, and the parameter group's update: the harness's statistics, clip policy,
   schedule, optimizer and the plans' bounds (:mod:`harness.training.groups`), every inner step;
4. the plan whose cost was lowest in the last inner step's rollout (the plans themselves
   after that step's update, as the example picks) becomes the best plan, and the last world's;
5. the real system advances one control step under the best plan's first action; its distance
   to its goal is recorded.

A plan is ``knots + 1`` control points of the env's actions, linearly interpolated over the
rollout's ``horizon`` steps (``horizon / knots`` steps between points, not necessarily a whole
number; the last point is only reached by interpolation): the example's 3 + 1 points 10 steps apart.

``loss/total`` of a frame is the best plan's cost (the lowest world cost of the last inner
rollout, what the example prints), as is ``mpc/best_cost``; ``summary.json``'s ``final_loss``
is that of the last frame. Per frame TensorBoard also gets the inner steps' gradient norms
before and after clipping (mean and largest over the frame's steps), how many were clipped
and the real system's distance to its goal. The best plan, the real system's state, the
rollouts' initial state and the flight so far are the task's state: a checkpoint resumes
mid-flight bit for bit.

Newton's example captures its rollouts reading the real drone's first State buffer while its
``step()`` swaps the two buffers in Python, so on every odd frame it plans from the state one
frame old. ``stale_state=true`` reproduces that (the initial state is not refreshed on odd
frames); the default plans from the current state.

Where the env plays only the core and :class:`~harness.env.Plant`, this task runs it; it trains
nothing that outlives the run: ``harness evaluate`` replays the controller from frame 0
(:meth:`MPC.replay`) and reports its flight.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import warp as wp

from harness import schema, tags
from harness.env import Env, EnvConfig, Plant
from harness.losses import WeightedLoss
from harness.params import ParamSet, ParamSpec
from harness.tasks.base import Task

__all__ = ["MPC"]

CLOSE = 0.1
"""Metres: a frame whose real system is this close to its goal counts as on target (``harness evaluate``)."""

INNER = ("grad_norm_pre_mean", "grad_norm_pre_max", "grad_norm_post_mean", "grad_norm_post_max", "clipped_inner_steps")
"""Per-frame summaries of the inner steps, ``mpc/<name>``, in the order of the task's scalars."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MPCArgs:
    """The task's fields (``configs/task/mpc.yaml``), checked by :mod:`harness.schema`."""

    inner_steps: int = schema.field(20, minimum=1, doc="gradient steps on the plans per frame")
    knots: int = schema.field(3, minimum=1, doc="intervals of a plan: knots + 1 control points over the horizon")
    noise: float = schema.field(0.15, minimum=0.0, doc="standard deviation of the plans drawn around the best one")
    stale_state: bool = schema.field(False, doc="plan every odd frame from the state one frame old (Newton's example)")
    lower: float | None = schema.field(None, finite=False, doc="smallest action; null: the env's own bound")
    upper: float | None = schema.field(None, finite=False, doc="largest action; null: the env's own bound")
    seed: int = schema.field(0, minimum=0, doc="the draws of frame f are seeded with seed + f")


@wp.kernel
def _interpolate(plans: wp.array3d(dtype=wp.float32), t: float, actions: wp.array3d(dtype=wp.float32), row: int):
    # Linear between the control points around t (in control-point units).
    w, d = wp.tid()
    k = int(t)
    frac = t - wp.floor(t)
    left = plans[w, k, d]
    right = plans[w, k + 1, d]
    actions[row, w, d] = left * (1.0 - frac) + right * frac


@wp.kernel
def _keep_initial(frame: wp.array(dtype=wp.int32), stale: int, keep: wp.array(dtype=wp.int32)):
    keep[0] = wp.where(stale != 0 and frame[0] % 2 == 1, 1, 0)


@wp.kernel
def _draw_plans(
    best: wp.array3d(dtype=wp.float32),
    noise: float,
    points: int,
    dim: int,
    lower: float,
    upper: float,
    seed: int,
    frame: wp.array(dtype=wp.int32),
    plans: wp.array3d(dtype=wp.float32),
):
    # A normal draw around the best plan, redrawn up to ten times while outside the bounds, then
    # clamped; each entry its own stream of Warp's generator (the example's draws).
    w, k, d = wp.tid()
    state = wp.rand_init(seed + frame[0], (w * points + k) * dim + d)
    mean = best[0, k, d]
    x = mean + noise * wp.randn(state)
    for _i in range(10):
        if x < lower or x > upper:
            x = mean + noise * wp.randn(state)
        else:
            break
    plans[w, k, d] = wp.clamp(x, lower, upper)


@wp.kernel
def _world_costs(
    rows: wp.array2d(dtype=wp.float32), costs: wp.array(dtype=wp.float32), objective: wp.array(dtype=wp.float32)
):
    w = wp.tid()
    total = float(0.0)  # noqa: UP018  (a dynamic Warp variable)
    for t in range(rows.shape[0]):
        total += rows[t, w]
    costs[w] = total
    wp.atomic_add(objective, 0, total)


@wp.kernel
def _record_inner(
    i: int,
    pre: wp.array(dtype=wp.float32),
    post: wp.array(dtype=wp.float32),
    clipped: wp.array(dtype=wp.int32),
    inner: wp.array2d(dtype=wp.float32),
):
    inner[i, 0] = pre[0]
    inner[i, 1] = post[0]
    inner[i, 2] = float(clipped[0])


@wp.kernel
def _summarize_inner(inner: wp.array2d(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
    n = inner.shape[0]
    pre_sum = float(0.0)  # noqa: UP018  (a dynamic Warp variable)
    post_sum = float(0.0)  # noqa: UP018  (a dynamic Warp variable)
    pre_max = float(0.0)  # noqa: UP018  (a dynamic Warp variable)
    post_max = float(0.0)  # noqa: UP018  (a dynamic Warp variable)
    clipped = float(0.0)  # noqa: UP018  (a dynamic Warp variable)
    for i in range(n):
        pre_sum += inner[i, 0]
        post_sum += inner[i, 1]
        pre_max = wp.max(pre_max, inner[i, 0])
        post_max = wp.max(post_max, inner[i, 1])
        clipped += inner[i, 2]
    out[0] = pre_sum / float(n)
    out[1] = pre_max
    out[2] = post_sum / float(n)
    out[3] = post_max
    out[4] = clipped


@wp.kernel
def _pick_best(
    costs: wp.array(dtype=wp.float32),
    plans: wp.array3d(dtype=wp.float32),
    best: wp.array3d(dtype=wp.float32),
    best_cost: wp.array(dtype=wp.float32),
    total: wp.array(dtype=wp.float32),
):
    # The first world of lowest cost (numpy's argmin) gives the best plan, which the last world keeps.
    found = int(0)  # noqa: UP018, RUF046  (a dynamic Warp variable)
    lowest = costs[0]
    for w in range(1, costs.shape[0]):
        if costs[w] < lowest:
            lowest = costs[w]
            found = w
    last = plans.shape[0] - 1
    for k in range(plans.shape[1]):
        for d in range(plans.shape[2]):
            best[0, k, d] = plans[found, k, d]
            plans[last, k, d] = plans[found, k, d]
    best_cost[0] = lowest
    total[0] = lowest


@wp.kernel
def _record_frame(
    frame: wp.array(dtype=wp.int32),
    distance: wp.array(dtype=wp.float32),
    best_cost: wp.array(dtype=wp.float32),
    pose: wp.array(dtype=wp.transform),
    distances: wp.array(dtype=wp.float32),
    costs: wp.array(dtype=wp.float32),
    flight: wp.array2d(dtype=wp.transform),
):
    f = frame[0]
    if f < distances.shape[0]:
        distances[f] = distance[0]
        costs[f] = best_cost[0]
        for b in range(pose.shape[0]):
            flight[f + 1, b] = pose[b]


def _components(array: wp.array) -> wp.array:
    """A float32 alias of an array of vectors or transforms (the same memory), as checkpoints store them."""
    return array if array.dtype is wp.float32 else array.view(wp.float32)


class MPC(Task):
    """Model-predictive control of the env's real system (module docstring).

    Args:
        inner_steps: Gradient steps on the plans per frame (the example's 20).
        knots: Intervals of a plan (``knots + 1`` control points; the example's 3).
        noise: Standard deviation of the plans drawn around the best one (the example's 0.15).
        stale_state: Plan every odd frame from the state one frame old, as Newton's example does.
        lower, upper: The actions' bounds (None: the env's ``action_bounds()``, else unbounded).
        seed: Frame ``f`` draws with seed ``seed + f``.
    """

    name = "mpc"
    roles = (Plant,)
    window_key = "env.horizon"
    replays = True

    def __init__(
        self,
        *,
        inner_steps: int = 20,
        knots: int = 3,
        noise: float = 0.15,
        stale_state: bool = False,
        lower: float | None = None,
        upper: float | None = None,
        seed: int = 0,
    ):
        self.args = schema.check(
            MPCArgs, "task", inner_steps=inner_steps, knots=knots, noise=noise, stale_state=stale_state,
            lower=lower, upper=upper, seed=seed,
        )  # fmt: skip
        if lower is not None and upper is not None and not lower <= upper:
            raise schema.SchemaError(f"task.lower: {lower:g} is above task.upper {upper:g}; accepted: lower <= upper")
        self._state: dict[str, wp.array] = {}
        self._buffers: dict[int, dict[str, wp.array]] = {}
        self._tapes: list[Any] = []

    # -- shapes and checks -----------------------------------------------------------------

    def check(self, config: EnvConfig) -> None:
        if config.action_dim() < 1:
            raise ValueError("task: mpc plans actions, and this env takes none")
        lower, upper = self.bounds(config)
        if not lower <= upper:
            raise ValueError(f"task.lower: {lower:g} is above task.upper {upper:g}; accepted: lower <= upper")

    def check_segments(self, steps: int | None, config: EnvConfig) -> None:
        if steps is not None:
            raise ValueError("memory.segment_steps: task=mpc plans over short rollouts already; accepted: null")

    def bounds(self, config: EnvConfig) -> tuple[float, float]:
        """The actions' bounds: ``task.lower`` / ``task.upper``, else the env's ``action_bounds()``."""
        own = config.action_bounds() if hasattr(config, "action_bounds") else (-math.inf, math.inf)
        lower = own[0] if self.args.lower is None else self.args.lower
        upper = own[1] if self.args.upper is None else self.args.upper
        return float(lower), float(upper)

    def frames(self, config: EnvConfig) -> int:
        """Control steps of the real system: the env's ``frames``."""
        return int(getattr(config, "frames", 1))

    def parameter_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        return {"plans": (config.world_count, self.args.knots + 1, config.action_dim())}

    def parameter_specs(self, env: Env) -> list[ParamSpec]:
        lower, upper = self.bounds(env.config)
        shape = self.parameter_shapes(env.config)["plans"]
        fd_step = env.config.action_fd_step()
        return [ParamSpec("plans", shape, lower=lower, upper=upper, fd_step=fd_step, world_axis=0)]

    # -- the task's state -------------------------------------------------------------------

    def state(self, env: Env) -> dict[str, wp.array]:
        """What carries over between frames: the best plan, the real system and the rollouts'
        initial state (read again on a stale frame), the flight so far."""
        if not self._state:
            device = env.device
            frames = self.frames(env.config)
            pose = env.plant_pose()
            points, dim = self.args.knots + 1, env.config.action_dim()
            env.reset_plant()
            flight = wp.zeros((frames + 1, pose.shape[0]), dtype=wp.transform, device=device)
            wp.copy(flight[0], pose)
            self._flight = flight
            self._state = {
                "best_plan": wp.zeros((1, points, dim), dtype=wp.float32, device=device),
                "distances": wp.full(frames, math.nan, dtype=wp.float32, device=device),
                "best_costs": wp.full(frames, math.nan, dtype=wp.float32, device=device),
                # checkpoints hold float32 arrays: transforms and spatial vectors as their components
                "flight": _components(flight),
                **{f"plant/{name}": _components(array) for name, array in env.plant_state().items()},
                **{f"initial/{name}": _components(array) for name, array in env.initial_state().items()},
            }
            self._best_cost = wp.full(1, math.nan, dtype=wp.float32, device=device)
            self._distance = wp.full(1, math.nan, dtype=wp.float32, device=device)
            self._scalars = wp.zeros(len(INNER), dtype=wp.float32, device=device)
        return self._state

    def buffers(self, env: Env) -> dict[str, wp.array]:
        found = self._buffers.get(id(env))
        if found is not None and found["actions"].shape[:2] == (env.horizon, env.world_count):
            return found
        device, worlds, dim = env.device, env.world_count, env.config.action_dim()
        grad = dict(dtype=wp.float32, device=device, requires_grad=True)
        found = {
            "actions": wp.zeros((env.horizon, worlds, dim), **grad),
            "rows": wp.zeros((env.horizon, worlds), **grad),
            "costs": wp.zeros(worlds, **grad),
            "objective": wp.zeros(1, **grad),
            "keep": wp.zeros(1, dtype=wp.int32, device=device),
            "inner": wp.zeros((self.args.inner_steps, 3), dtype=wp.float32, device=device),
            "first": wp.zeros((1, 1, dim), dtype=wp.float32, device=device),
        }
        self._buffers[id(env)] = found
        return found

    def zero_grad(self, env: Env) -> None:
        b = self.buffers(env)
        for name in ("actions", "rows", "costs", "objective"):
            b[name].grad.zero_()

    # -- the rollout --------------------------------------------------------------------------

    def begin(self, env: Env, params: ParamSet) -> None:
        env.reset()

    def act(self, env: Env, params: ParamSet, t: int) -> None:
        actions = self.buffers(env)["actions"]
        # step t in control-point units (t / 10 for the example's 3 knots over 30 steps, exactly)
        at = t * self.args.knots / env.horizon
        wp.launch(
            _interpolate, dim=(env.world_count, actions.shape[2]), inputs=[params["plans"], at],
            outputs=[actions, t], device=env.device,
        )  # fmt: skip
        env.act(t, actions)

    def rollout_actions(self, env: Env) -> wp.array:
        return self.buffers(env)["actions"]

    def objective(self, env: Env, loss: WeightedLoss, trajectory: Any) -> wp.array:
        """The sum over worlds of each world's cost (the loss's weighted cost of every step,
        :meth:`harness.losses.WeightedLoss.step_costs`, not averaged), on the tape: every plan
        descends its own cost, whatever the number of worlds. The loss's own terms are recorded too."""
        b = self.buffers(env)
        loss(trajectory)
        loss.step_costs(trajectory, b["rows"])
        b["objective"].zero_()
        wp.launch(
            _world_costs, dim=env.world_count, inputs=[b["rows"]], outputs=[b["costs"], b["objective"]],
            device=env.device,
        )  # fmt: skip
        return b["objective"]

    # -- one frame ------------------------------------------------------------------------------

    def iterate(self, step: Any) -> None:
        """One frame (module docstring)."""
        env, loss = step.env, step.loss
        b = self.buffers(env)
        state = self.state(env)
        frame = step.counter
        plans = step.params["plans"]
        worlds, points, dim = plans.shape
        env.set_frame(frame)
        wp.launch(_keep_initial, dim=1, inputs=[frame, int(self.args.stale_state)], outputs=[b["keep"]],
                  device=env.device)  # fmt: skip
        env.plan_from_plant(b["keep"])
        if worlds > 1:
            lower, upper = self.bounds(env.config)
            wp.launch(
                _draw_plans, dim=(worlds - 1, points, dim),
                inputs=[state["best_plan"], self.args.noise, points, dim, lower, upper, self.args.seed, frame],
                outputs=[plans], device=env.device,
            )  # fmt: skip
        name = next(iter(step.groups))
        group = step.groups[name]
        tapes = []
        for i in range(self.args.inner_steps):
            step.forward_backward(objective=lambda trajectory: self.objective(env, loss, trajectory))
            tapes.append(step._tape)  # a captured graph replays launches that reference what each tape holds
            step.apply(name)
            wp.launch(
                _record_inner, dim=1,
                inputs=[i, group.stats_pre.norm, group.stats_post.norm, group.state["clip/clipped"]],
                outputs=[b["inner"]], device=env.device,
            )  # fmt: skip
        self._tapes = tapes
        wp.launch(_summarize_inner, dim=1, inputs=[b["inner"]], outputs=[self._scalars], device=env.device)
        wp.launch(
            _pick_best, dim=1, inputs=[b["costs"], plans], outputs=[state["best_plan"], self._best_cost, loss.total],
            device=env.device,
        )  # fmt: skip
        wp.launch(_interpolate, dim=(1, dim), inputs=[state["best_plan"], 0.0], outputs=[b["first"], 0],
                  device=env.device)  # fmt: skip
        env.advance(b["first"].reshape((dim,)))
        env.plant_error(self._distance)
        wp.launch(
            _record_frame, dim=1, inputs=[frame, self._distance, self._best_cost, env.plant_pose()],
            outputs=[state["distances"], state["best_costs"], self._flight], device=env.device,
        )  # fmt: skip

    # -- what it reports ------------------------------------------------------------------------

    def columns(self, params: ParamSet, loss: WeightedLoss) -> list[tuple[str, wp.array, int]]:
        """``mpc/best_cost`` (as ``loss/total``), ``mpc/distance_to_target`` (the real system's, after
        the frame's step) and the inner steps' gradient norms (:data:`INNER`)."""
        found = [
            (tags.task("mpc", "best_cost"), self._best_cost, 0),
            (tags.task("mpc", "distance_to_target"), self._distance, 0),
        ]
        found += [(tags.task("mpc", name), self._scalars, k) for k, name in enumerate(INNER)]
        return found

    def flight_figures(self, done: int) -> dict[str, Any]:
        """The flight of the first ``done`` frames: the mean distance to the goal, the share of
        frames within :data:`CLOSE` of it, the last distance (host values)."""
        distances = self._state["distances"].numpy()[:done].astype(np.float64)
        if not len(distances):
            return {"frames": 0}
        return {
            "frames": len(distances),
            "mean_distance_m": float(distances.mean()),
            "within_0.1m_fraction": float((distances < CLOSE).mean()),
            "final_distance_m": float(distances[-1]),
        }

    def final_evaluation(self, step: Any) -> tuple[float, dict[str, Any]]:
        """The last frame's best cost and the flight so far (nothing is rolled out again)."""
        done = min(int(step.counter.numpy()[0]), self._state["distances"].shape[0])
        cost = float(self._state["best_costs"].numpy()[done - 1]) if done else math.nan
        return cost, self.flight_figures(done)

    def replay(self, trainer: Any) -> tuple[float, dict[str, Any], np.ndarray]:
        """Run the controller from frame 0 with a fresh trainer (``harness evaluate``, ``render``):
        the env's ``frames`` frames, captured after the first as in training.

        Returns:
            The last frame's best cost, the flight's figures and its poses ``(frames + 1, bodies, 7)``.
        """
        step = trainer.step
        frames = self.frames(step.env.config)
        step.set_iteration(0)
        for it in range(frames):
            if it == 1 and trainer.capture:
                step.capture()
            step.run()
        cost, figures = self.final_evaluation(step)
        return cost, figures, self._flight.numpy().reshape(frames + 1, -1, 7)
