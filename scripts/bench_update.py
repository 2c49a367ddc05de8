"""What the transformation protocol costs: the trainer's update as one wrapped chain against
its members called by hand, eager and as a captured graph, measured in one run.

The update is the trainer's (``harness.training.step.training_update``): the non-finite
stage and skip guard around clip (global norm), schedule (cosine), optimizer (Adam) and the
parameter bounds, on a flat parameter buffer of ``--size`` entries with a random gradient.
"By hand" issues the same launches without the chain (the stage, guard save, the four
members, guard restore), so the difference is the chain's host work; a captured graph runs
none of it. Prints milliseconds per update and the ratios.

Run: python scripts/bench_update.py [--size 100000] [--updates 200] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import warp as wp

from harness import optim, schedules
from harness.clip import SkipGuard, clip_by_global_norm
from harness.clip.kernels import nonfinite_stage_kernel
from harness.params import ParamSet, ParamSpec
from harness.stats import FlatStats
from harness.training.step import training_update
from harness.transform import Shared, project_to_bounds, substate


def timed(run, updates: int, device: wp.context.Device) -> float:
    run()  # loads kernels, builds per-ParamSet tables
    wp.synchronize_device(device)
    t0 = time.perf_counter()
    for _ in range(updates):
        run()
    wp.synchronize_device(device)
    return 1e3 * (time.perf_counter() - t0) / updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = wp.get_device(args.device)
    params = ParamSet([ParamSpec("w", (args.size,), lower=-1.0, upper=1.0)], device=device)
    params.grad.assign(np.random.default_rng(0).standard_normal(args.size).astype(np.float32))
    stats = FlatStats(params)
    stats.compute(params.grad)

    def members():
        return clip_by_global_norm(1.0), schedules.cosine_decay(decay_steps=10**6), optim.adam(1e-3)

    update = training_update(*members(), "skip")
    shared = Shared(stats)
    state = update.init(params, shared)

    clip, schedule, optimizer = members()
    bounds = project_to_bounds()
    hand = training_update(clip, schedule, optimizer, "skip")  # for its skip guard and counters only
    hand_shared = Shared(stats)
    hand_state = hand.init(params, hand_shared)
    inner = {k: v for k, v in hand_state.items() if not k.startswith("nonfinite/")}
    guard = SkipGuard(params, inner, hand_state["nonfinite/skip"])
    own = substate(hand_state, "nonfinite")
    parts = {name: substate(hand_state, name) for name in ("clip", "schedule", "optim")}

    def by_hand() -> None:
        wp.launch(
            nonfinite_stage_kernel,
            dim=1,
            inputs=[0, 1, stats.nonfinite, stats.segment_nonfinite, own["skip"], own["skipped"], own["iteration"],
                    own["first_iteration"], own["first_param"]],
            device=device,
        )  # fmt: skip
        guard.save()
        clip.update(params, parts["clip"], hand_shared)
        schedule.update(params, parts["schedule"], hand_shared)
        optimizer.update(params, parts["optim"], hand_shared)
        bounds.update(params, {}, hand_shared)
        guard.restore()

    def chained() -> None:
        update.update(params, state, shared)

    hand_ms = timed(by_hand, args.updates, device)
    chain_ms = timed(chained, args.updates, device)
    with wp.ScopedCapture(device=device) as capture:
        chained()
    graph_ms = timed(lambda: wp.capture_launch(capture.graph), args.updates, device)
    print(f"{args.size} parameters, {args.updates} updates on {device.alias}:")
    print(f"  members by hand, eager   {hand_ms:8.3f} ms")
    print(f"  one wrapped chain, eager {chain_ms:8.3f} ms   ({chain_ms / hand_ms:.3f}x by hand)")
    print(f"  one wrapped chain, graph {graph_ms:8.3f} ms   ({graph_ms / hand_ms:.3f}x by hand)")


if __name__ == "__main__":
    main()
