"""The Newton diffsim ports against Newton's own example loops, per training iteration.

For each env: Newton's ``Example`` (built with ``ViewerNull``; one ``step()`` launches its
captured forward + backward graph, on the CPU too, then takes its gradient step) against the
harness with the example's optimiser (``optim=sgd optim.lr=<the example's> optim.momentum=0
clip=none``), eager and with one captured graph per iteration. Both run the same number of
frames (``--frames``; default: the example's own). Each contender is warmed up (kernels
compiled, the harness's graph recorded), then the three run one iteration each per round in
a shuffled order; medians over ``--repeats`` rounds.

Run: python scripts/bench_envs.py [--envs ball cloth spring_cage soft_body] [--repeats 5] [--frames N]
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import time

import warp as wp

import harness  # noqa: F401  (quiet Warp start-up)
from harness import build, config

LR = {"ball": 0.02, "cloth": 5.0, "spring_cage": 0.5, "soft_body": 1.0e7}


def example(name: str, frames: int | None):
    import newton.viewer

    module = importlib.import_module(f"newton.examples.diffsim.example_diffsim_{name}")
    args = module.Example.create_parser().parse_args(["--viewer", "null", "--device", "cpu"])
    capture = module.Example.capture
    if frames is not None:  # build without a graph, shorten, then capture the shortened loop
        module.Example.capture = lambda self: setattr(self, "graph", None)
    try:
        ex = module.Example(newton.viewer.ViewerNull(num_frames=10**9), args)
    finally:
        module.Example.capture = capture
    if frames is not None:
        ex.sim_steps = frames
        ex.states = ex.states[: frames * ex.sim_substeps + 1]
        ex.capture()
    return ex, ex.sim_steps * ex.sim_substeps


def trainer(name: str, horizon: int, capture: bool):
    overrides = [f"+env={name}", "optim=sgd", f"optim.lr={LR[name]}", "optim.momentum=0", "clip=none"]
    overrides += [f"env.horizon={horizon}", "device=cpu", f"capture={str(capture).lower()}"]
    return build.build_run(*config.compose_config("train", overrides)).trainer()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=sorted(LR))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--frames", type=int, default=None)
    args = parser.parse_args()
    wp.set_device("cpu")
    print("| env | steps | example | harness eager | harness graph | example / harness graph |")
    print("|---|---|---|---|---|---|")
    for name in args.envs:
        ex, steps = example(name, args.frames)
        eager, graph = trainer(name, steps, False), trainer(name, steps, True)
        ex.step()
        eager.step.run()
        graph.step.run()
        graph.step.capture()
        runs = {"example": ex.step, "eager": eager.step.run, "graph": graph.step.run}
        times: dict[str, list[float]] = {key: [] for key in runs}
        for _ in range(args.repeats):
            for key in random.sample(list(runs), len(runs)):
                wp.synchronize()
                start = time.perf_counter()
                runs[key]()
                wp.synchronize()
                times[key].append(time.perf_counter() - start)
        med = {key: statistics.median(values) for key, values in times.items()}
        print(
            f"| {name} | {steps} | {med['example']:.3f} s | {med['eager']:.3f} s | {med['graph']:.3f} s "
            f"| {med['example'] / med['graph']:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
