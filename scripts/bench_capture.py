"""One captured graph per iteration: the harness against a raw hand-written Newton loop.

Four contenders, interleaved in one process on the cartpole (horizon T, W worlds, the
device given), each timed per iteration (median over ``--repeats``) after warm-up:

* ``harness graph``: ``python -m harness train`` defaults (upright loss, Adam, global-norm
  clip, constant schedule) with ``capture`` on: one ``wp.capture_launch`` per iteration.
* ``harness eager``: the same trainer with ``capture=false``.
* ``raw graph`` / ``raw eager``: what a user writes by hand with Newton and Warp: one
  State per step, per-step Featherstone scratch (M, J, P, H, L), the force kernel, the
  solver step and a trajectory copy per step, the same upright loss as one kernel, backward,
  one Adam step with a device step counter, ``tape.zero()``; captured once with
  ``wp.ScopedCapture`` for the graph variant (as Newton's diffsim examples do).

Also printed: the one-off capture time of the harness iteration against its eager
iteration, at several horizons (``--capture-horizons``).

Timings are medians over ``--repeats`` rounds; within a round the four contenders run one
iteration each, back to back in a shuffled order, so a slow spell of the machine hits all
of them and none always runs after the same one (whose memory traffic it would inherit).

Run: python scripts/bench_capture.py [--worlds 1 4 16 64 256] [--horizon 240] [--repeats 30] [--device cpu]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import newton
import newton.examples
import numpy as np
import warp as wp

import harness  # noqa: F401  (quiet Warp start-up)
from envs.cartpole import FEATHERSTONE_SCRATCH
from harness import build, config
from harness.training.loop import TrainSettings

UPRIGHT = (0.1, 1.0, 1.0)  # dim weights of joint_q in configs/loss/cartpole_upright.yaml
UPRIGHT_QD = (0.01, 0.1, 0.1)
EFFORT = 1e-3


@wp.kernel
def _force(controls: wp.array2d(dtype=float), t: int, joint_f: wp.array(dtype=float)):
    w = wp.tid()
    joint_f[w * 3] = controls[t, w]


@wp.kernel
def _copy_state(q: wp.array(dtype=float), qd: wp.array(dtype=float), t: int, out: wp.array3d(dtype=float)):
    w, d = wp.tid()
    out[t, w, d] = q[w * 3 + d]
    out[t, w, d + 3] = qd[w * 3 + d]


@wp.kernel
def _loss(traj: wp.array3d(dtype=float), controls: wp.array2d(dtype=float), scale: float, loss: wp.array(dtype=float)):
    t, w = wp.tid()
    q = wp.vec3(traj[t, w, 0], traj[t, w, 1], traj[t, w, 2])
    qd = wp.vec3(traj[t, w, 3], traj[t, w, 4], traj[t, w, 5])
    c = 0.1 * q[0] * q[0] + q[1] * q[1] + q[2] * q[2]
    c += 0.01 * qd[0] * qd[0] + 0.1 * qd[1] * qd[1] + 0.1 * qd[2] * qd[2]
    c += 0.001 * controls[t, w] * controls[t, w]
    wp.atomic_add(loss, 0, scale * c)


@wp.kernel
def _adam(
    x: wp.array(dtype=float),
    g: wp.array(dtype=float),
    m: wp.array(dtype=float),
    v: wp.array(dtype=float),
    step: wp.array(dtype=int),
    lr: float,
):
    i = wp.tid()
    k = float(step[0] + 1)
    m[i] = 0.9 * m[i] + 0.1 * g[i]
    v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i]
    mhat = m[i] / (1.0 - wp.pow(0.9, k))
    vhat = v[i] / (1.0 - wp.pow(0.999, k))
    x[i] = x[i] - lr * mhat / (wp.sqrt(vhat) + 1.0e-8)


@wp.kernel
def _count(step: wp.array(dtype=int)):
    step[0] = step[0] + 1


class RawLoop:
    """The hand-written loop: forward, loss, backward, Adam, tape.zero()."""

    def __init__(self, horizon: int, worlds: int, device: wp.context.Device):
        self.horizon, self.worlds, self.device = horizon, worlds, device
        single = newton.ModelBuilder()
        single.add_urdf(newton.examples.get_asset("cartpole.urdf"), floating=False, enable_self_collisions=False)
        builder = newton.ModelBuilder()
        builder.replicate(single, worlds, spacing=(0.0, 2.0, 0.0))
        self.model = builder.finalize(device=device, requires_grad=True)
        q0 = self.model.joint_q.numpy().reshape(worlds, 3)
        q0[:, 1:] = np.random.default_rng(0).uniform(-0.2, 0.2, size=(worlds, 2))
        self.q0 = wp.array(q0.ravel(), dtype=float, device=device)
        self.solver = newton.solvers.SolverFeatherstone(self.model, angular_damping=0.05)
        self.states = [self.model.state(requires_grad=True) for _ in range(horizon + 1)]
        self.joint_f = wp.zeros((horizon, self.model.joint_dof_count), dtype=float, device=device, requires_grad=True)
        self.controls = []
        for t in range(horizon):
            control = self.model.control()
            control.joint_f = self.joint_f[t]
            self.controls.append(control)
        own = {name: getattr(self.solver, name) for name in FEATHERSTONE_SCRATCH}
        self.scratch = [{k: wp.zeros_like(a, requires_grad=True) for k, a in own.items()} for _ in range(horizon)]
        self.forces = wp.zeros((horizon, worlds), dtype=float, device=device, requires_grad=True)
        self.traj = wp.zeros((horizon, worlds, 6), dtype=float, device=device, requires_grad=True)
        self.loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
        n = horizon * worlds
        self.m, self.v = wp.zeros(n, dtype=float, device=device), wp.zeros(n, dtype=float, device=device)
        self.step_count = wp.zeros(1, dtype=int, device=device)
        self.tape = wp.Tape()
        self.graph = None

    def iteration(self) -> None:
        dev = self.device
        self.loss.zero_()
        self.tape = wp.Tape()
        with self.tape:
            wp.copy(self.states[0].joint_q, self.q0)
            self.states[0].joint_qd.zero_()
            for t in range(self.horizon):
                for name, array in self.scratch[t].items():
                    setattr(self.solver, name, array)
                wp.launch(_force, dim=self.worlds, inputs=[self.forces, t], outputs=[self.joint_f[t]], device=dev)
                self.states[t].clear_forces()
                self.solver.step(self.states[t], self.states[t + 1], self.controls[t], None, 1.0 / 240.0)
                s = self.states[t + 1]
                wp.launch(_copy_state, dim=(self.worlds, 3), inputs=[s.joint_q, s.joint_qd, t, self.traj], device=dev)
            scale = 1.0 / (self.horizon * self.worlds)
            wp.launch(
                _loss, dim=(self.horizon, self.worlds), inputs=[self.traj, self.forces, scale, self.loss], device=dev
            )
        self.tape.backward(self.loss)
        flat, grad = self.forces.flatten(), self.forces.grad.flatten()
        wp.launch(_adam, dim=flat.shape[0], inputs=[flat, grad, self.m, self.v, self.step_count, 0.5], device=dev)
        wp.launch(_count, dim=1, inputs=[self.step_count], device=dev)
        self.tape.zero()

    def run(self) -> None:
        if self.graph is None:
            self.iteration()
        else:
            wp.capture_launch(self.graph)

    def capture(self) -> float:
        t0 = time.perf_counter()
        with wp.ScopedCapture(device=self.device) as capture:
            self.iteration()
        self.graph = capture.graph
        return time.perf_counter() - t0


def harness_trainer(horizon: int, worlds: int, device: str, capture: bool):
    overrides = ["+env=cartpole", f"env.horizon={horizon}", f"env.world_count={worlds}", f"device={device}"]
    run = build.build_run(*config.compose_config("train", overrides))
    trainer = run.trainer(TrainSettings(iterations=10**6, log_every=10, device=device, capture=capture))
    trainer.step.set_iteration(0)
    return trainer


def timed(run, device) -> float:
    t0 = time.perf_counter()
    run()
    wp.synchronize_device(device)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--horizon", type=int, default=240)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--capture-horizons", type=int, nargs="*", default=[60, 120, 240, 480])
    args = parser.parse_args()
    device = wp.get_device(args.device)
    rng = random.Random(0)
    print(f"device {device.alias}, horizon {args.horizon}, median of {args.repeats} iterations each, interleaved")
    print(
        "| worlds | harness graph | raw graph | harness / raw (graph) | harness eager | raw eager "
        "| harness eager / graph | harness capture (one-off) | capture / eager iteration |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for worlds in args.worlds:
        graph = harness_trainer(args.horizon, worlds, args.device, True)
        eager = harness_trainer(args.horizon, worlds, args.device, False)
        raw_g, raw_e = RawLoop(args.horizon, worlds, device), RawLoop(args.horizon, worlds, device)
        for contender in (graph.step, eager.step, raw_g, raw_e):
            contender.run()  # eager warm-up: kernels load, solvers allocate
            contender.run()
        capture_s = graph.step.capture()
        raw_g.capture()
        runs = {"hg": graph.step.run, "rg": raw_g.run, "he": eager.step.run, "re": raw_e.run}
        times: dict[str, list[float]] = {key: [] for key in runs}
        order = list(runs)
        for _ in range(args.repeats):
            rng.shuffle(order)  # no contender always runs right after the same one
            for key in order:
                times[key].append(timed(runs[key], device))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"| {worlds} | {1e3 * med['hg']:.2f} ms | {1e3 * med['rg']:.2f} ms | {med['hg'] / med['rg']:.3f} "
            f"| {1e3 * med['he']:.1f} ms | {1e3 * med['re']:.1f} ms | {med['he'] / med['hg']:.1f}x "
            f"| {capture_s:.2f} s | {capture_s / med['he']:.2f} |",
            flush=True,
        )
    if args.capture_horizons:
        print("\ncapture time against the horizon (1 world):")
        print("| horizon | eager iteration | capture | capture / eager |")
        print("|---|---|---|---|")
        for horizon in args.capture_horizons:
            trainer = harness_trainer(horizon, 1, args.device, True)
            trainer.step.run()
            trainer.step.run()
            eager_s = statistics.median(timed(trainer.step.run, device) for _ in range(3))
            capture_s = trainer.step.capture()
            print(
                f"| {horizon} | {1e3 * eager_s:.1f} ms | {1e3 * capture_s:.0f} ms | {capture_s / eager_s:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
