"""AHAC: Adaptive Horizon Actor-Critic (Georgiev, Srinivasan, Xu, Heiden and Garg, ICML 2024,
"Adaptive Horizon Actor-Critic for Policy Learning in Contact-Rich Differentiable Simulation"),
as SHAC (:class:`harness.tasks.SHAC`) with four changes:

1. **Windows cut by contact, per world.** A rollout runs ``task.window`` steps; inside it each
   world's gradient window ends after a step whose contact load (the env's
   :meth:`~harness.env.ContactLoad.contact_load`: the contacts' normal force in the world's
   weight) passes ``contact_threshold``, once the window has more than ``steps_min`` steps, and at the
   latest after ``round(H)`` steps. A cut ends the actor's sub-trajectory as a window's end does
   (the state is valued by the critic, the discount starts again) and no gradient crosses it
   (the state's adjoint is zeroed there, world by world: :meth:`SHAC._record_cut`); the critic's
   TD(lambda) returns run on through it.
2. **The horizon learned as a dual variable.** After every iteration
   ``H <- clip(H - lr_i * sum_(k < round(H)) (m_k - C), steps_min, steps_max)``, ``m_k`` the mean
   load at position ``k`` of a window and ``C`` the threshold: ``H`` shrinks while the windows
   meet more contact than the threshold allows and grows while they meet less
   (:func:`~harness.tasks.ahac_kernels.horizon_step`). ``lr_i`` decays linearly, as AHAC's.
3. **A twin critic.** The critic has two heads on one trunk; a state's value is their minimum,
   both regress to the same TD(lambda) targets; no slow target critic (``target_alpha: 0``: the
   values of the next rollout are the fitted critic's, as AHAC's code takes them).
4. **The critic fitted to a stopping rule.** Passes over the data until the mean of the last
   four differences of the pass losses is within ``critic_tolerance`` of 0, at most
   ``critic_max_epochs``: a device loop (``wp.capture_while``), so the iteration stays one
   captured graph whatever the count.

Under ``task.window=auto`` rollouts run ``task.auto.ceiling`` steps and the window ``n`` that the
gradient's measured trust chooses (:mod:`harness.auto_window`, as for SHAC) takes the learned
horizon's place: windows are still cut by contact, at most ``n`` steps (clamped to
``[steps_min, steps_max]``), and ``H`` is not stepped.

Where this differs from the paper's code (imgeorgiev/DiffRL ``ahac.py``), and why, is in
docs/tasks.md. ``H``, the twin critic and the rest are the task's state, in every checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import warp as wp

from harness import schema, tags
from harness.env import ContactLoad, Env
from harness.nn import Regression
from harness.tasks import ahac_kernels as ak
from harness.tasks.shac import SHAC, _Window

__all__ = ["AHAC"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AHACArgs:
    """``task=ahac``'s own fields (``configs/task/ahac.yaml``), checked by :mod:`harness.schema`."""

    steps_min: int = schema.field(8, minimum=1, doc="a contact cuts a window longer than this")
    steps_max: int = schema.field(64, minimum=1, doc="the longest window (the learned horizon's ceiling)")
    contact_threshold: float = schema.field(2.0, minimum=0.0, strict=True, doc="load [world weights] that cuts")
    horizon_init: float | None = schema.field(None, doc="the learned horizon's start (null: steps_min)")
    horizon_lr: float = schema.field(0.01, minimum=0.0, doc="the horizon's dual step size at the start")
    horizon_lr_min: float = schema.field(2.0e-4, minimum=0.0, doc="... decayed linearly to this")
    horizon_decay_iterations: int = schema.field(2000, minimum=1, doc="iterations of the step size's decay")
    critic_heads: int = schema.field(2, minimum=1, doc="the critic's heads; a value is their minimum")
    critic_max_epochs: int = schema.field(64, minimum=1, doc="the most passes over the data per iteration")
    critic_tolerance: float = schema.field(0.2, minimum=0.0, doc="stop at a mean pass-loss change within this")


STOP_LOSSES = 5
"""AHAC's stopping rule reads the last five pass losses (its ``deque(maxlen=5)``)."""

SCALARS = ("window_mean", "cuts_per_world", "contact_load")
"""The task's own device scalars besides ``horizon`` and ``critic_epochs``, in order."""


class AHAC(SHAC):
    """AHAC's actor and critic (module docstring); SHAC's arguments, and:

    Args:
        steps_min: A contact cuts a window of more than this many steps (8).
        steps_max: The learned horizon's ceiling (64), at most ``window``.
        contact_threshold: The load, in the world's weight, above which a contact cuts (2).
        horizon_init: The learned horizon's start (None: ``steps_min``, as AHAC's 8).
        horizon_lr: The dual step's size at the start (0.01); ``horizon_lr_min``: at the end.
        horizon_decay_iterations: Iterations over which the step size decays (the run's).
        critic_heads: Heads of the critic (2); a state's value is their minimum.
        critic_max_epochs: The most passes of the critic per iteration (64).
        critic_tolerance: The stopping rule's tolerance on the pass losses' mean difference (0.2).
    """

    name = "ahac"
    roles = (*SHAC.roles, ContactLoad)

    def __init__(
        self,
        *,
        window: int | str | None = 64,
        steps_min: int = 8,
        steps_max: int = 64,
        contact_threshold: float = 2.0,
        horizon_init: float | None = None,
        horizon_lr: float = 0.01,
        horizon_lr_min: float = 2.0e-4,
        horizon_decay_iterations: int = 2000,
        critic_heads: int = 2,
        critic_max_epochs: int = 64,
        critic_tolerance: float = 0.2,
        **shac: Any,
    ):
        self.ahac = schema.check(
            AHACArgs, "task", steps_min=steps_min, steps_max=steps_max, contact_threshold=contact_threshold,
            horizon_init=horizon_init, horizon_lr=horizon_lr, horizon_lr_min=horizon_lr_min,
            horizon_decay_iterations=horizon_decay_iterations, critic_heads=critic_heads,
            critic_max_epochs=critic_max_epochs, critic_tolerance=critic_tolerance,
        )  # fmt: skip
        super().__init__(window=window, **shac)
        a = self.ahac
        if a.steps_min > a.steps_max:
            raise schema.SchemaError(
                f"task.steps_min: must be at most task.steps_max ({a.steps_max}), got {a.steps_min}"
            )
        if self.window is not None and a.steps_max > self.window:
            rollout = "task.auto.ceiling" if self.adaptive else "task.window"
            raise schema.SchemaError(
                f"task.steps_max: a window lies inside a rollout of {rollout} ({self.window}) steps; "
                f"accepted: at most {self.window}, got {a.steps_max}"
            )
        start = a.steps_min if a.horizon_init is None else a.horizon_init
        if not a.steps_min <= start <= a.steps_max:
            raise schema.SchemaError(
                f"task.horizon_init: must lie in [task.steps_min, task.steps_max] = [{a.steps_min}, {a.steps_max}], "
                f"got {start}"
            )
        self.horizon_start = float(start)
        self.critic_outputs = a.critic_heads
        self._extra: dict[int, dict[str, Any]] = {}
        self._device: Any = None

    # -- state and buffers -----------------------------------------------------------------------

    capture_note = (
        "its critic's stopping rule is a device loop (wp.capture_while), which a CUDA graph runs only with "
        "conditional nodes (CUDA toolkit and driver 12.4 or later)"
    )

    @property
    def capturable(self) -> bool:
        """Whether the iteration can be one captured graph here: on the CPU always; on CUDA where
        Warp's graphs have conditional nodes (the critic's loop)."""
        device = self._device
        return device is None or device.is_cpu or wp.is_conditional_graph_supported()

    def state(self, env: Env) -> dict[str, wp.array]:
        """SHAC's state, and the learned horizon ``H``."""
        if not self._state:
            self._device = wp.get_device(env.device)
            super().state(env)
            self._state["horizon"] = wp.full(1, self.horizon_start, dtype=wp.float32, device=env.device)
            self._ahac_scalars = wp.zeros(len(SCALARS), dtype=wp.float32, device=env.device)
            self._epochs = wp.zeros(1, dtype=wp.int32, device=env.device)
        return self._state

    def extra(self, env: Env) -> dict[str, Any]:
        """AHAC's per-env buffers beside SHAC's window: every world-step's contact load, the
        critic's heads, the stopping rule's ring and flag, the dual step's sums."""
        b = self.buffers(env)
        found = self._extra.get(id(env))
        if found is not None and found["load"].shape == b.cost.shape:
            return found
        steps, worlds, device = env.horizon, env.world_count, env.device
        rows, heads = steps * worlds, self.ahac.critic_heads
        found = self._extra[id(env)] = {
            "load": wp.zeros((steps, worlds), dtype=wp.float32, device=device),
            "heads": wp.zeros((rows, heads), dtype=wp.float32, device=device, requires_grad=True),
            "targets": wp.zeros((rows, heads), dtype=wp.float32, device=device),
            "ring": wp.zeros(STOP_LOSSES, dtype=wp.float32, device=device),
            "go": wp.zeros(1, dtype=wp.int32, device=device),
            "sums": wp.zeros(self.ahac.steps_max, dtype=wp.float32, device=device),
            "counts": wp.zeros(self.ahac.steps_max, dtype=wp.float32, device=device),
        }
        return found

    def zero_grad(self, env: Env) -> None:
        super().zero_grad(env)
        self.extra(env)["heads"].grad.zero_()

    # -- the rollout's cuts ------------------------------------------------------------------------

    def _begin_cuts(self, env: Env, state: dict[str, wp.array], b: _Window) -> None:
        b.cut.zero_()  # every cut of the rollout is decided as it runs (_mark_cuts)
        if self.adaptive:  # window=auto: the measured window caps the windows in place of the learned horizon
            wp.launch(
                ak.horizon_from_window, dim=1, inputs=[state["window"]], outputs=[state["horizon"]],
                device=env.device, record_tape=False,
            )  # fmt: skip

    def _cuts_at(self, t: int) -> bool:
        return True  # a contact may cut after any step

    def _mark_cuts(self, env: Env, t: int) -> None:
        """After step ``t - 1``: its contact load, then the cut it decides (module docstring)."""
        b, extra, a = self.buffers(env), self.extra(env), self.ahac
        load = extra["load"]
        env.contact_load(t - 1, load[t - 1])
        wp.launch(
            ak.contact_cut, dim=env.world_count,
            inputs=[load, t - 1, env.horizon, a.steps_min, a.steps_max, self.state(env)["horizon"],
                    a.contact_threshold, self.args.gamma, b.done],
            outputs=[b.cut, b.cost_weight, b.value_weight], device=env.device, record_tape=False,
        )  # fmt: skip

    # -- the twin critic and its stopping rule ------------------------------------------------------

    def _values(self, env: Env, inputs: wp.array, out: wp.array) -> None:
        heads = self.extra(env)["heads"]
        _, critic = self._nets(env.config)
        critic.forward(self._target, inputs, heads)
        wp.launch(ak.twin_min, dim=heads.shape[0], inputs=[heads], outputs=[out], device=env.device)

    def _fit_critic(self, step: Any, env: Env, b: _Window) -> None:
        extra, a = self.extra(env), self.ahac
        targets = extra["targets"]
        wp.launch(ak.duplicate_targets, dim=targets.shape, inputs=[b.targets], outputs=[targets], device=env.device)
        if b.critic_fit is None:  # the heads' targets, (rows, critic_heads)
            _, critic = self._nets(env.config)
            b.critic_fit = Regression(critic, self._critic, b.inputs, targets, minibatches=self.args.critic_minibatches)
        wp.launch(ak.stop_start, dim=1, outputs=[self._epochs, extra["go"]], device=env.device)

        def after_epoch() -> None:
            wp.launch(
                ak.critic_stop, dim=1, inputs=[b.losses, extra["ring"], self._epochs, a.critic_max_epochs,
                                               a.critic_tolerance],
                outputs=[extra["go"]], device=env.device,
            )  # fmt: skip

        b.critic_fit.fit_while(extra["go"], b.losses, lambda: step.apply("critic"), after_epoch)

    def _after_critic(self, step: Any, env: Env, b: _Window) -> None:
        extra, a = self.extra(env), self.ahac
        lr, lr_min = (0.0, 0.0) if self.adaptive else (a.horizon_lr, a.horizon_lr_min)  # auto: H is the window
        wp.launch(
            ak.horizon_step, dim=1,
            inputs=[extra["load"], b.cut, b.done, step.counter, a.horizon_decay_iterations, lr, lr_min,
                    a.contact_threshold, a.steps_min, a.steps_max, extra["sums"], extra["counts"]],
            outputs=[self.state(env)["horizon"], self._ahac_scalars], device=env.device,
        )  # fmt: skip

    # -- checks and what it reports -------------------------------------------------------------------

    def columns(self, params: Any, loss: Any) -> list[tuple[str, wp.array, int]]:
        """SHAC's columns, and ``ahac/horizon`` (the learned ``H`` after the iteration),
        ``ahac/critic_epochs`` (the critic's passes the stopping rule allowed), ``ahac/window_mean``
        (world-steps per gradient window), ``ahac/cuts_per_world`` (cuts inside the rollout, by
        contact or the horizon) and ``ahac/contact_load`` (the mean load, in world weights)."""
        found = super().columns(params, loss)
        found.append((tags.task("ahac", "horizon"), self._state["horizon"], 0))
        found.append((tags.task("ahac", "critic_epochs"), self._epochs, 0))
        found += [(tags.task("ahac", name), self._ahac_scalars, i) for i, name in enumerate(SCALARS)]
        return found
