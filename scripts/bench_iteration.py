"""Where a cartpole training iteration spends its time (the trainer's timing breakdown).

Runs the default configuration (`configs/train.yaml` with `+env=cartpole`) for a few
iterations after one warm-up iteration (kernel loading), then prints each phase's share
of the iteration, measured in one run. On the CPU, Warp launches are synchronous, so host
timers measure the kernels themselves.

Run: python scripts/bench_iteration.py [--iterations 10] [--horizon 240] [--worlds 4] [--adjoint-max-norm X]
"""

from __future__ import annotations

import argparse

from harness import build, config
from harness.training.loop import TrainSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--horizon", type=int, default=240)
    parser.add_argument("--worlds", type=int, default=4)
    parser.add_argument("--adjoint-max-norm", type=float, default=None)
    args = parser.parse_args()
    overrides = ["+env=cartpole", f"env.horizon={args.horizon}", f"env.world_count={args.worlds}", "device=cpu"]
    if args.adjoint_max_norm is not None:
        overrides.append(f"clip.adjoint.max_norm={args.adjoint_max_norm}")
    run = build.build_run(
        *config.compose_config("train", overrides)
    )  # the default config: the loss, optimizer and clip a user gets
    settings = TrainSettings(iterations=args.iterations + 1, log_every=args.iterations + 1, device="cpu")
    trainer = run.trainer(settings)
    trainer.step.run()  # loads every kernel module
    trainer.step.timing = dict.fromkeys(trainer.step.timing, 0.0)
    for _it in range(1, args.iterations + 1):
        trainer.step.run()
    total = sum(trainer.step.timing.values())
    per_iteration_ms = 1e3 * total / args.iterations
    print(f"{args.iterations} iterations, horizon {args.horizon}, {args.worlds} worlds: {per_iteration_ms:.1f} ms each")
    for phase, seconds in trainer.step.timing.items():
        print(f"  {phase:<16} {1e3 * seconds / args.iterations:9.2f} ms  {100 * seconds / total:6.2f} %")


if __name__ == "__main__":
    main()
