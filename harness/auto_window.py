"""``task.window=auto``: SHAC's gradient window chosen during training from its measured trust.

Under ``task.window=auto`` every SHAC rollout runs ``task.auto.ceiling`` steps, and the actor's
gradient is cut every ``n`` steps inside it (:class:`harness.tasks.SHAC`): each cut ends a
sub-trajectory, valued by the target critic as SHAC values a window's end, and the backward pass
zeroes the state's adjoint there, so no gradient crosses it. ``n`` lives on the device (the
task's ``window`` state, checkpointed), so the captured iteration stays one graph and a change of
``n`` needs no recapture. The rollout's length, the actor's update per rollout and the critic's
TD(lambda) returns are those of SHAC at the ceiling's window; only how far the actor's gradient
reaches back changes.

Every ``task.auto.every`` iterations :class:`AutoWindow` measures, at the parameters training
has reached, the gradient of ``n``-step rollouts as ``harness diagnose`` does
(:func:`harness.diagnose.measure`: ``diagnose.samples`` starts, the snr of a training batch's
mean gradient and the cosine with a zeroth-order estimate; the central-difference check is left
out, as the rule does not read it) and moves ``n`` by :func:`next_window`:

- ``n`` not trusted: halve it (not below ``floor``);
- ``n`` trusted and ``2 n <= ceiling``: measure ``2 n``; trusted there: double it;
- otherwise keep it.

A horizon is trusted by diagnose's rule (``snr_batch >= diagnose.snr_min`` and ``zo_cosine >=
diagnose.zo_cosine_min``, docs/diagnose.md). One step per measurement: a window that fails is
left at once, a longer one is taken only once it has been measured trusted. The measurement runs on
envs of its own (one per window, built on first use, its graphs kept), so training's arrays,
graph and random draws are untouched. Each measurement's figures are TensorBoard scalars
(``auto_window/<steps>/snr_batch``, ``.../zo_cosine``, ``.../trusted``) and one printed line;
the window every iteration trained with is the history column ``shac/window``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from harness.diagnose import HorizonResult, Probe, measure_trained, training_probe
from harness.training.loop import Callback

__all__ = ["AutoWindow", "next_window", "windows"]


def windows(floor: int, ceiling: int) -> list[int]:
    """The windows ``n`` may take: ``floor, 2 floor, ..., ceiling``."""
    found = [floor]
    while found[-1] < ceiling:
        found.append(found[-1] * 2)
    return found


def next_window(window: int, trusted: Callable[[int], bool], *, floor: int, ceiling: int) -> tuple[int, list[int]]:
    """The rule (module docstring): the next window and the windows measured to decide it, in order.

    Args:
        window: The current window ``n``.
        trusted: Measures one window and says whether its gradient is trusted.
        floor: The shortest window.
        ceiling: The longest window.
    """
    if not trusted(window):
        return max(floor, window // 2), [window]
    if window * 2 > ceiling:
        return window, [window]
    longer = window * 2
    return (longer if trusted(longer) else window), [window, longer]


class AutoWindow(Callback):
    """Measures the gradient's trust every ``every`` iterations and writes the next window into
    the task's device state (module docstring).

    Args:
        settings: :class:`harness.config.DiagnoseSettings`: what a measurement computes
            (``samples``, ``zo_pairs``, ``zo_scale``, ``snr_min``, ``zo_cosine_min``, ``seed``);
            its ``fd_directions`` are not used.
        make: ``make(worlds)`` builds ``(make_env, task, loss)`` for the measurement with that
            many worlds (``make_env(steps, segmented)``), as for ``diagnose.every``.
        floor: The shortest window (``task.auto.floor``).
        ceiling: The longest window (``task.auto.ceiling``).
        every: Iterations between measurements (``task.auto.every``).
        worlds: Starts of a measurement (``diagnose.samples``).
        training_worlds: ``world_count`` of a training batch (the batch the snr judges).
        window: The task's device window (int32, one entry), read and written between iterations.
        evaluation_state: The keys of the training task's state the measured task takes
            before each measurement (SHAC's observation statistics).
    """

    def __init__(
        self,
        settings: Any,
        make: Callable[[int], tuple[Callable[[int, bool], Any], Any, Any]],
        *,
        floor: int,
        ceiling: int,
        every: int,
        worlds: int,
        training_worlds: int,
        window: Any,
        evaluation_state: tuple[str, ...] = (),
    ):
        self.settings = dataclasses.replace(settings, fd_directions=0)
        self.make, self.floor, self.ceiling, self.every = make, floor, ceiling, every
        self.worlds, self.training_worlds, self.window = worlds, training_worlds, window
        self.evaluation_state = evaluation_state
        self._probes: dict[int, Probe] = {}

    def probe(self, steps: int) -> Probe:
        """The measurement of ``steps``-step rollouts (built on first use, then kept), with
        ``worlds`` starts, or training's worlds where the task refuses that many, as
        ``diagnose.every``'s (:func:`harness.diagnose.training_probe`).

        Raises:
            ValueError: One line: the task refuses the measurement's env with either world count.
        """
        found = self._probes.get(steps)
        if found is None:
            found, self.worlds = training_probe(self.make, steps, [self.worlds, self.training_worlds], self.settings)
            self._probes[steps] = found  # (every later window measured with the same starts)
        return found

    def measure(self, steps: int, values: np.ndarray, trained: dict[str, Any], done: int) -> HorizonResult:
        """One window's measures at the flat parameter values ``values``, the training task's
        evaluation state ``trained`` copied in first."""
        rng = np.random.default_rng([self.settings.seed, done, steps])
        return measure_trained(
            self.probe(steps), values, trained, self.evaluation_state, self.settings, rng,
            training_worlds=self.training_worlds,
        )  # fmt: skip

    def decide(self, values: np.ndarray, trained: dict[str, Any], done: int) -> tuple[int, list[HorizonResult]]:
        """The next window from the current one, and the measurements that decided it."""
        results: dict[int, HorizonResult] = {}

        def trusted(steps: int) -> bool:
            results[steps] = self.measure(steps, values, trained, done)
            return results[steps].trusted

        current = int(self.window.numpy()[0])
        following, order = next_window(current, trusted, floor=self.floor, ceiling=self.ceiling)
        return following, [results[steps] for steps in order]

    def on_start(self, loop: Any) -> None:
        """A run resumed from a checkpoint written at a measuring iteration takes that measurement
        now: checkpoints are written before this callback runs, so they hold the window the
        measurement would have replaced (the same parameters give the same measurement)."""
        done = loop.start_iteration
        if done:
            self.on_iteration(loop, done - 1)

    def on_iteration(self, loop: Any, iteration: int) -> None:
        done = iteration + 1
        if done % self.every or done >= loop.settings.iterations or getattr(loop, "stopping", False):
            return  # (a run stopping on a signal has written its checkpoint: a resumed run measures)
        step = loop.step
        current = int(self.window.numpy()[0])
        following, results = self.decide(step.params.data.numpy(), step.task.state(step.env), done)
        self.window.fill_(following)
        scalars: dict[str, float] = {}
        for result in results:
            lead = f"auto_window/{result.steps}"
            scalars.update(
                {
                    f"{lead}/snr_batch": result.snr_batch,
                    f"{lead}/zo_cosine": result.zo_cosine,
                    f"{lead}/trusted": float(result.trusted),
                }
            )
        for callback in loop.callbacks:
            if callback is not self:
                callback.on_scalars(loop, iteration, scalars)
        measured = ", ".join(
            f"{r.steps} steps {'trusted' if r.trusted else 'NOT trusted'} (snr_batch {r.snr_batch:.3g}, "
            f"zo_cosine {r.zo_cosine:.3f})"
            for r in results
        )
        move = f"window {current} -> {following}" if following != current else f"window stays {current}"
        print(
            f"auto window at iteration {done}: {measured}; {move} ({sum(r.seconds for r in results):.1f} s)", flush=True
        )
