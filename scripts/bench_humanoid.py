"""The Humanoid's SHAC iteration against the Ant's: what a world-step of ``+env=humanoid`` costs.

Both are ``train +env=ENV task=shac`` as their presets configure them (the Humanoid: DiffRL's 48
substeps per control step, 21 motors, 13 bodies, 27 dofs, actor [256, 128]; the Ant: 16 substeps,
8 motors, 9 bodies, 14 dofs, actor [128, 64, 32]), at the same ``--worlds`` and ``--window``, one
captured graph per iteration each (scripts/bench_ant.py's :func:`harness_iteration`), built in
this one process and replayed in alternated pairs, so what else runs on the CPU slows both alike.

Printed: milliseconds per iteration, per world-step and per simulated substep of each (medians),
the Humanoid / Ant ratio per world-step (the median of the pairs' ratios), the minutes DiffRL's
2000 Humanoid iterations take at that rate, and the machine's load average.

Run: python scripts/bench_humanoid.py [--worlds 64] [--window 32] [--iterations 5]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from bench_ant import harness_iteration, timed  # scripts/ is on the path of a script run from it

from harness import build, config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    runs, replays = {}, {}
    for env in ("humanoid", "ant"):
        overrides = [f"+env={env}", "task=shac", f"env.world_count={args.worlds}", f"task.window={args.window}",
                     "device=cpu"]  # fmt: skip
        runs[env] = build.build_run(*config.compose_config("train", overrides))
        replays[env] = harness_iteration(runs[env], args.iterations)
    pairs = [(timed(replays["humanoid"]), timed(replays["ant"])) for _ in range(args.iterations)]
    world_steps = args.worlds * args.window
    load = os.getloadavg()
    print(f"SHAC iterations, {args.worlds} worlds x {args.window} steps, captured, {args.iterations} alternated "
          f"pairs (load average {load[0]:.2f}, {load[1]:.2f}):")  # fmt: skip
    for k, env in enumerate(("humanoid", "ant")):
        s = float(np.median([p[k] for p in pairs]))
        substeps = runs[env].env.config.substeps
        print(f"  {env:<9} {substeps:3d} substeps  {1e3 * s:9.1f} ms per iteration  "
              f"{1e3 * s / world_steps:6.3f} ms per world-step  {1e6 * s / (world_steps * substeps):6.2f} us per "
              "world-substep")  # fmt: skip
    ratio = float(np.median([h / a for h, a in pairs]))
    print(f"  ratio humanoid / ant per world-step: {ratio:.2f} (median of the pairs; each: "
          f"{', '.join(f'{h / a:.2f}' for h, a in pairs)})")  # fmt: skip
    humanoid_s = float(np.median([h for h, _ in pairs]))
    print(f"  2000 Humanoid iterations (DiffRL's budget) at this rate: {2000 * humanoid_s / 60:.0f} min")


if __name__ == "__main__":
    main()
