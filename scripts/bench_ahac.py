"""What ``task=ahac`` costs on the Ant: its iteration against SHAC's at the same window.

Two ``train +env=ant`` runs built in this one process: ``task=shac`` at ``task.window=WINDOW``
and ``task=ahac`` at the same rollout length, with the same networks (SHAC's Ant preset's, so
the ratio is the method's machinery, not AHAC's larger networks): the contact load and cut after
every step, the twin critic, and the critic fitted to the stopping rule. One captured graph per
iteration each (scripts/bench_ant.py's :func:`harness_iteration`), replayed in alternated pairs so
what else runs on the CPU slows both alike. AHAC's critic makes as many passes as its rule
decides (printed: the passes of its last iteration); SHAC's makes 16.

``--networks own`` gives AHAC its own networks ([400, 200, 100] for actor and critic, AHAC's
paper and code) and leaves SHAC at its preset's: the ratio is then what a run with AHAC's
networks costs against the SHAC preset.

Printed: milliseconds per iteration of each and their ratio (the median of the pairs' ratios);
the issue's target is at most 1.2.

Run: python scripts/bench_ahac.py [--worlds 64] [--window 64] [--iterations 5] [--passes N]
[--networks same|own]
(``--passes N``: AHAC's critic capped at N passes, to see the cost of the rule's count apart.)
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
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--passes", type=int, default=64)
    parser.add_argument(
        "--networks",
        choices=("same", "own"),
        default="same",
        help="AHAC with SHAC's Ant networks (same) or with its own [400, 200, 100] (own)",
    )
    args = parser.parse_args()
    common = ["+env=ant", f"env.world_count={args.worlds}", f"task.window={args.window}", "device=cpu"]
    nets = {
        "same": ["task.actor.hidden=[128,64,32]", "task.critic.hidden=[64,64]"],
        "own": ["task.actor.hidden=[400,200,100]", "task.critic.hidden=[400,200,100]"],
    }[args.networks]
    ahac = ["task=ahac", f"task.steps_max={args.window}", f"task.critic_max_epochs={args.passes}", *nets]
    runs, replays = {}, {}
    for name, overrides in (("shac", ["task=shac"]), ("ahac", ahac)):
        cfg, choices = config.compose_config("train", [*common, *overrides])
        runs[name] = build.build_run(cfg, choices)
        replays[name] = harness_iteration(runs[name], args.iterations)
    pairs = [(timed(replays["shac"]), timed(replays["ahac"])) for _ in range(args.iterations)]
    shac_s = float(np.median([s for s, _ in pairs]))
    ahac_s = float(np.median([a for _, a in pairs]))
    ratio = float(np.median([a / s for s, a in pairs]))
    passes = int(runs["ahac"].task._epochs.numpy()[0])
    horizon = float(runs["ahac"].task.state(runs["ahac"].env)["horizon"].numpy()[0])
    load = os.getloadavg()
    own = "SHAC with its Ant networks, AHAC with its own [400, 200, 100]"
    networks = {"same": "SHAC's Ant networks", "own": own}[args.networks]
    print(f"Ant, {args.worlds} worlds, rollouts of {args.window} steps, {networks}, captured, "
          f"{args.iterations} alternated pairs (load average {load[0]:.2f}, {load[1]:.2f}):")  # fmt: skip
    print(f"  SHAC, window {args.window}, 16 critic passes:  {1e3 * shac_s:8.1f} ms per iteration")
    print(f"  AHAC, {passes} critic passes in the last, H {horizon:.2f}: {1e3 * ahac_s:8.1f} ms per iteration")
    print(f"  ratio AHAC / SHAC: {ratio:.3f} (median of the pairs; each: "
          f"{', '.join(f'{a / s:.3f}' for s, a in pairs)})")  # fmt: skip


if __name__ == "__main__":
    main()
