"""What ``task.window=auto`` costs on the Ant: its iteration against SHAC's, and its measurements.

Two ``train +env=ant task=shac`` runs built in this one process: SHAC at ``task.window=CEILING``
and SHAC under ``task.window=auto`` (rollouts of ``task.auto.ceiling=CEILING`` steps, the gradient
cut every ``--cut`` steps inside them), one captured graph per iteration each
(scripts/bench_ant.py's :func:`harness_iteration`), replayed in alternated pairs so what else runs
on the CPU slows both alike. Then the rule's measurements (:class:`harness.auto_window.AutoWindow`,
``diagnose.samples`` starts) at every window from the floor up: each window's decision timed once
its envs are built and its kernels loaded (a first, untimed decision per window).

Printed: milliseconds per iteration of each and their ratio (the median of the pairs' ratios),
the seconds of one decision from each window, and the iteration's cost with the measurements
spread over ``task.auto.every`` iterations (the slowest decision: two windows measured), as a
ratio to SHAC's iteration: the issue's target is at most 1.2.

Run: python scripts/bench_auto_window.py [--worlds 64] [--ceiling 32] [--floor 8] [--cut 16]
     [--every 50] [--iterations 5]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from bench_ant import harness_iteration, timed  # scripts/ is on the path of a script run from it

from harness import build, config
from harness.auto_window import AutoWindow, windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--ceiling", type=int, default=32)
    parser.add_argument("--floor", type=int, default=8)
    parser.add_argument("--cut", type=int, default=16)
    parser.add_argument("--every", type=int, default=150)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    common = ["+env=ant", "task=shac", f"env.world_count={args.worlds}", "device=cpu"]
    auto = [f"task.auto.floor={args.floor}", f"task.auto.ceiling={args.ceiling}", f"task.auto.every={args.every}"]
    runs, replays = {}, {}
    for name, overrides in (("shac", [f"task.window={args.ceiling}"]), ("auto", ["task.window=auto", *auto])):
        cfg, choices = config.compose_config("train", [*common, *overrides])
        runs[name] = (build.build_run(cfg, choices), cfg, choices)
        replays[name] = harness_iteration(runs[name][0], args.iterations)
    run, cfg, choices = runs["auto"]
    task, env = run.task, run.env
    task.state(env)["window"].fill_(args.cut)
    pairs = [(timed(replays["shac"]), timed(replays["auto"])) for _ in range(args.iterations)]
    shac_s = float(np.median([s for s, _ in pairs]))
    auto_s = float(np.median([a for _, a in pairs]))
    ratio = float(np.median([a / s for s, a in pairs]))

    settings = config.diagnose_settings(cfg)
    window = task.state(env)["window"]
    rule = AutoWindow(
        settings, build.measurement_maker(cfg, choices), floor=args.floor, ceiling=args.ceiling, every=args.every,
        worlds=settings.samples, training_worlds=args.worlds, window=window, evaluation_state=task.evaluation_state,
    )  # fmt: skip
    actor = replays["auto"].__self__.state.params.data.numpy()  # the step's actor after its iterations
    trained = task.state(env)
    decisions = {}
    for n in windows(args.floor, args.ceiling):
        window.fill_(n)
        rule.decide(actor, trained, 1)  # builds the windows' envs, loads their kernels
        window.fill_(n)
        start = time.perf_counter()
        following, results = rule.decide(actor, trained, 2)
        decisions[n] = (time.perf_counter() - start, following, results)
    load = os.getloadavg()
    print(f"Ant, {args.worlds} worlds, rollouts of {args.ceiling} steps, captured, {args.iterations} alternated pairs "
          f"(load average {load[0]:.2f}, {load[1]:.2f}):")  # fmt: skip
    print(f"  SHAC, window {args.ceiling}:             {1e3 * shac_s:8.1f} ms per iteration")
    print(f"  auto, the gradient cut every {args.cut}: {1e3 * auto_s:8.1f} ms per iteration  (ratio {ratio:.3f}; each: "
          f"{', '.join(f'{a / s:.3f}' for s, a in pairs)})")  # fmt: skip
    print(f"  one decision ({settings.samples} starts, {settings.zo_pairs} zeroth-order pairs):")
    for n, (seconds, following, results) in decisions.items():
        measured = ", ".join(f"{r.steps} {'trusted' if r.trusted else 'not trusted'}" for r in results)
        print(f"    from window {n:3d}: {seconds:6.1f} s  ({measured}; next {following})")
    slowest = max(seconds for seconds, _, _ in decisions.values())
    spread = auto_s + slowest / args.every
    print(f"  auto with its slowest decision every {args.every} iterations: {1e3 * spread:8.1f} ms per iteration, "
          f"{spread / shac_s:.3f} x SHAC's")  # fmt: skip


if __name__ == "__main__":
    main()
