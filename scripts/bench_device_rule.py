"""The CPU side of ``device=null``'s rule (:data:`harness.devices.GPU_MIN_WORLDS`): this CPU's
speed on ``make train``'s cartpole as the world count grows, against a GPU's.

A GPU iteration of this harness is bound by kernel launches (about 55 per simulated step), so
it takes about as long at 4 worlds as at a few thousand; the CPU's grows with the worlds. The
one GPU figure the project has is the issue's (issue 40): ``make train``'s command on an H200,
4 worlds, 5.77 it/s (``--gpu-its``). For each world count this runs ``python -m harness train
+env=cartpole env.world_count=W iterations=N device=cpu`` for N = 5 and 5 + ``--iterations``
and divides the extra iterations by the extra training seconds (``summary.json``'s
``wall_time_s``; compiling, capturing and writing the run cancel out; warm kernel cache), then
prints the largest world count at which the CPU is still faster than the GPU figure. The
figures in docs/gpu.md were taken with the done line's seconds (0.1 s steps) before this
script read ``summary.json``: at 4 worlds (30 iterations in about 0.7 s) that rounding is
worth about 10%, at 32 worlds and more under 2%.

Run: python scripts/bench_device_rule.py [--worlds 4 16 64 256 1024] [--iterations 30] [--gpu-its 5.77]
"""

from __future__ import annotations

import argparse

from bench_gpu import training_seconds  # scripts/ is on the path of a script run from it


def seconds(worlds: int, iterations: int) -> float:
    """The training seconds of one CPU run (``summary.json``: from the first iteration to the last)."""
    overrides = ["+env=cartpole", f"env.world_count={worlds}", "device=cpu"]
    return training_seconds(overrides, iterations, timeout=3600)[0]


def its(worlds: int, iterations: int) -> float:
    """Iterations per second of the steady state: ``iterations`` more iterations over the extra
    seconds they take (two runs, so compiling, capturing and writing the run cancel out)."""
    short = seconds(worlds, 5)
    return iterations / max(seconds(worlds, 5 + iterations) - short, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 16, 64, 256, 1024])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--gpu-its", type=float, default=5.77, help="the GPU's it/s on the same run (issue 40: H200)")
    args = parser.parse_args()
    seconds(args.worlds[0], 2)  # compile (or load) the kernels once
    print(f"| worlds | CPU it/s | CPU / GPU ({args.gpu_its} it/s) |\n|---|---|---|")
    faster = []
    for worlds in args.worlds:
        rate = its(worlds, args.iterations)
        print(f"| {worlds} | {rate:.2f} | {rate / args.gpu_its:.2f} |", flush=True)
        if rate > args.gpu_its:
            faster.append(worlds)
    print(f"largest world count measured at which the CPU is faster: {max(faster) if faster else 'none'}")


if __name__ == "__main__":
    main()
