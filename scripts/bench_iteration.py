"""Where a cartpole training iteration spends its time (the trainer's timing breakdown).

Runs the default cartpole problem (240 steps, 4 worlds, Adam, global-norm clip) for a few
iterations after one warm-up iteration (kernel loading), then prints each phase's share
of the iteration, measured in one run. On the CPU, Warp launches are synchronous, so host
timers measure the kernels themselves.

Run: python scripts/bench_iteration.py [--iterations 10] [--horizon 240] [--worlds 4] [--adjoint-max-norm X]
"""

from __future__ import annotations

import argparse

import harness  # noqa: F401  (quiet Warp)
from envs.cartpole import CartpoleEnv
from harness.clip import clip_by_global_norm
from harness.losses import WeightedLoss
from harness.optim import adam
from harness.trainer import Trainer, TrainSettings

TERMS = {
    "pose": {"source": "joint_q", "dim_weights": [0.1, 1.0, 1.0]},
    "velocity": {"source": "joint_qd", "dim_weights": [0.01, 0.1, 0.1]},
    "effort": {"source": "controls", "weight": 1e-3},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--horizon", type=int, default=240)
    parser.add_argument("--worlds", type=int, default=4)
    parser.add_argument("--adjoint-max-norm", type=float, default=None)
    args = parser.parse_args()
    adjoint = {"max_norm": args.adjoint_max_norm, "profile": False}
    trainer = Trainer(
        env=CartpoleEnv(horizon=args.horizon, world_count=args.worlds, device="cpu"),
        loss=WeightedLoss(TERMS),
        optimizer=adam(0.5),
        clip=clip_by_global_norm(1.0, adjoint=adjoint),
        settings=TrainSettings(iterations=args.iterations + 1, log_every=args.iterations + 1, device="cpu"),
    )
    trainer.step(0, log_step=False)  # loads every kernel module
    trainer.timing = dict.fromkeys(trainer.timing, 0.0)
    for it in range(1, args.iterations + 1):
        trainer.step(it, log_step=False)
    total = sum(trainer.timing.values())
    per_iteration_ms = 1e3 * total / args.iterations
    print(f"{args.iterations} iterations, horizon {args.horizon}, {args.worlds} worlds: {per_iteration_ms:.1f} ms each")
    for phase, seconds in trainer.timing.items():
        print(f"  {phase:<16} {1e3 * seconds / args.iterations:9.2f} ms  {100 * seconds / total:6.2f} %")


if __name__ == "__main__":
    main()
