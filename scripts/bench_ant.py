"""The Ant's SHAC iteration against Newton's own captured loop on the same model, worlds and substeps.

Both run in this one process, one after the other, on the model ``+env=ant`` builds (DiffRL's
constants on Newton's nv_ant.xml):

- **harness**: ``train +env=ant task=shac`` as configured (a window of ``--window`` steps over
  ``--worlds`` worlds, the actor on every step, backward, the actor's update, the critic's 16 x 4
  minibatch updates, statistics), one captured graph per iteration, replayed ``--iterations`` times;
- **newton**: the loop a user writes with Newton alone for the same simulation: one State per
  substep, the collision pipeline on the tape at the env's cadence (``collide_every``) into a
  Contacts of its own, newton's own contact model (the env's Hunt-Crossley damping is its own work),
  ``SolverFeatherstone`` with the mass matrix built every 16th substep into a scratch set of its own,
  a fixed action per step, a loss of the root's forward velocity at the end, ``Tape.backward``, the
  gradients zeroed: forward, backward and zeroing captured into one graph and replayed.

Printed: milliseconds per iteration and per world-step of each (medians), their ratio (the median
of alternated pairs, so what else runs on the CPU slows both alike; the issue's target: the harness
within 1.1x of Newton's loop), the minutes DiffRL's 2000 iterations take at that rate, and the
machine's load average.

Run: python scripts/bench_ant.py [--worlds 64] [--window 32] [--iterations 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import numpy as np
import warp as wp

from harness import build, config
from harness.training.loop import TrainSettings


@wp.kernel
def _set_actions(actions: wp.array2d(dtype=wp.float32), dofs: wp.array(dtype=wp.int32), t: int, torque: float,
                 dof_count: int, joint_f: wp.array(dtype=wp.float32)):  # fmt: skip
    w, i = wp.tid()
    joint_f[w * dof_count + dofs[i]] = torque * wp.clamp(actions[t, i], -1.0, 1.0)


@wp.kernel
def _forward_velocity(body_qd: wp.array(dtype=wp.spatial_vector), body_count: int, loss: wp.array(dtype=wp.float32)):
    w = wp.tid()
    wp.atomic_add(loss, 0, -wp.spatial_top(body_qd[w * body_count])[0])


def newton_loop(env, steps: int):
    """Newton's own captured loop on ``env``'s model (module docstring): a function replaying it once."""
    import newton

    from envs.featherstone import FEATHERSTONE_SCRATCH

    model, cfg, layout = env.model, env.config, env.layout
    solver = newton.solvers.SolverFeatherstone(
        model, angular_damping=0.0, update_mass_matrix_interval=cfg.mass_matrix_every
    )
    pipeline = newton.CollisionPipeline(model, requires_grad=False, rigid_contact_max=env.pipeline.rigid_contact_max)
    substeps = cfg.substeps
    states = [model.state(requires_grad=True) for _ in range(steps * substeps + 1)]
    contacts = [pipeline.contacts() for _ in range(steps * substeps)]
    shared = {name: getattr(solver, name) for name in FEATHERSTONE_SCRATCH}
    scratch = [{name: wp.zeros_like(a, requires_grad=True) for name, a in shared.items()} for _ in range(steps)]
    controls = [model.control() for _ in range(steps)]
    rng = np.random.default_rng(0)
    actions = wp.array(rng.uniform(-0.5, 0.5, (steps, len(layout.actuated_dofs))).astype(np.float32), dtype=wp.float32)
    dofs = wp.array(np.asarray(layout.actuated_dofs, np.int32), dtype=wp.int32)
    loss = wp.zeros(1, dtype=wp.float32, requires_grad=True)
    newton.eval_fk(model, env.initial["joint_q"], env.initial["joint_qd"], states[0])
    wp.copy(states[0].joint_q, env.initial["joint_q"])
    wp.copy(states[0].joint_qd, env.initial["joint_qd"])
    tape = wp.Tape()

    def iteration() -> None:
        tape.reset()
        loss.zero_()
        with tape:
            i = 0
            for t in range(steps):
                wp.launch(
                    _set_actions, dim=(env.world_count, len(layout.actuated_dofs)),
                    inputs=[actions, dofs, t, 200.0, layout.dof_count], outputs=[controls[t].joint_f],
                )  # fmt: skip
                for k in range(substeps):
                    source, target = states[i], states[i + 1]
                    if k % cfg.collide_every == 0:  # the env's cadence; the contacts held in between
                        pipeline.collide(source, contacts[i])
                        held = contacts[i]
                    if k % cfg.mass_matrix_every == 0:
                        for name, array in scratch[t].items():
                            setattr(solver, name, array)
                    solver._step = k
                    source.clear_forces()
                    solver.step(source, target, controls[t], held, cfg.dt / substeps)
                    i += 1
            wp.launch(
                _forward_velocity, dim=env.world_count, inputs=[states[-1].body_qd, layout.body_count], outputs=[loss]
            )
        tape.backward(loss)
        tape.zero()

    iteration()  # kernels load, the solver allocates
    with wp.ScopedCapture(device=model.device) as capture:
        iteration()
    gc.freeze()
    return lambda: wp.capture_launch(capture.graph)


def harness_iteration(run, iterations: int):
    """The captured SHAC iteration of ``run``: a function replaying it once."""
    trainer = run.trainer(TrainSettings(iterations=iterations + 2, log_every=iterations + 2, device="cpu"))
    trainer.step.run()  # eager: kernels load
    trainer.step.capture()  # every later run replays the graph
    gc.freeze()  # as the training loop does after its capture
    trainer.step.run()
    return trainer.step.run


def timed(replay) -> float:
    start = time.perf_counter()
    replay()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="further Hydra overrides of the harness run")
    args = parser.parse_args()
    overrides = ["+env=ant", "task=shac", f"env.world_count={args.worlds}", f"task.window={args.window}", "device=cpu",
                 *args.overrides]  # fmt: skip
    run = build.build_run(*config.compose_config("train", overrides))
    harness = harness_iteration(run, args.iterations)
    newton = newton_loop(run.env, args.window)
    # alternated, so what else runs on the CPU slows both alike; the ratio is per pair
    pairs = [(timed(harness), timed(newton)) for _ in range(args.iterations)]
    harness_s = float(np.median([h for h, _ in pairs]))
    newton_s = float(np.median([n for _, n in pairs]))
    ratio = float(np.median([h / n for h, n in pairs]))
    world_steps = args.worlds * args.window
    load = os.getloadavg()
    print(f"Ant, {args.worlds} worlds x {args.window} steps x {run.env.config.substeps} substeps, captured, "
          f"{args.iterations} alternated pairs (load average {load[0]:.2f}, {load[1]:.2f}):")  # fmt: skip
    for name, s in (("harness SHAC iteration", harness_s), ("Newton's own loop", newton_s)):
        print(f"  {name:<24} {1e3 * s:9.1f} ms   {1e3 * s / world_steps:6.3f} ms per world-step (median)")
    print(f"  ratio harness / newton: {ratio:.3f} (median of the pairs; each: "
          f"{', '.join(f'{h / n:.2f}' for h, n in pairs)})")  # fmt: skip
    print(f"  2000 iterations (DiffRL's budget) at this rate: {2000 * harness_s / 60:.0f} min")


if __name__ == "__main__":
    main()
