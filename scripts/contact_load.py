"""The contact signal ``task=ahac`` cuts windows on, measured on a trained run's held-out rollout.

Rolls a run's checkpoint deterministically over the env's held-out starts (as ``harness evaluate``)
and prints the distribution of every world-step's contact load (:meth:`envs.robot.env.RobotEnv.contact_load`:
the spring part of the contacts' normal force after the step, in the world's weight) and the share
of world-steps above a few thresholds: what ``task.contact_threshold`` is chosen from (docs/tasks.md).

    python scripts/contact_load.py RUN [env.seed=7 ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a run folder with a checkpoint")
    parser.add_argument("overrides", nargs="*", help="config overrides, as harness evaluate takes them")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[1.5, 2, 3, 4, 6, 8])
    args = parser.parse_args()

    import warp as wp

    from harness.build import trained_run
    from harness.runs import RunFolder
    from harness.tasks import rollout

    trained = trained_run(RunFolder(args.run, "evaluate"), list(args.overrides), load=False)
    trained.load()
    step, env = trained.trainer.step, trained.run.env
    loads = wp.zeros((env.horizon, env.world_count), dtype=wp.float32, device=env.device)
    with step.at_eval_params():  # each step's load right after it (an evaluation keeps two states, not all)
        rollout(env, step.task, step.params, after_step=lambda t, _: env.contact_load(t, loads[t]))
    alive = env.trajectory()["terminated"].numpy()[..., 0] < 0.5  # episodes that have not ended
    values = loads.numpy()[alive]
    print(f"{args.run}: {values.size} world-steps, {env.horizon} steps x {env.world_count} worlds")
    quantiles = (0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
    print("  quantiles " + "  ".join(f"{q:g}: {np.quantile(values, q):.3g}" for q in quantiles))
    print(f"  mean {values.mean():.3g}, share at 0 (no contact) {np.mean(values == 0):.3f}")
    for c in args.thresholds:
        print(f"  above {c:g} body weights: {np.mean(values > c):.4f} of world-steps")


if __name__ == "__main__":
    main()
