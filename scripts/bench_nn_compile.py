"""How long the MLP kernels of a run take to compile for a GPU, from a cold cache.

Each network kernel a CUDA run builds (:mod:`harness.nn`) is compiled ahead of time for one
CUDA architecture (``--arch``, default 90: H100 and H200) into a fresh temporary folder, with
the options and the block size a launch of it on CUDA uses (the same hash, the same code:
``Module.get_module_hash`` then ``Module._compile``, as ``Module.load`` does), and the seconds
it took are printed, wall clock and this process's CPU time (NVRTC runs in-process; the CPU
time is the figure to trust when other work shares the machine). No GPU is needed: NVRTC
compiles here.

The networks (:data:`NETWORKS`): SHAC's Ant actor and critic (DiffRL's Ant configuration:
actor 37 -> 128 -> 64 -> 32 -> 8 with a tanh output, critic 37 -> 64 -> 64 -> 1, ELU and
LayerNorm), the
swing-up's SHAC actor and critic (5 -> 64 -> 64 -> 1, ELU and LayerNorm) and the cartpole's
BPTT policy (6 -> 64 -> 64 -> 1, tanh, output ``50 tanh``). The kernels: every network's
forward kernel (its module holds the backward kernel too, compiled with it) and the critics'
regression step (:class:`harness.nn.Regression`). The ``rows`` path by default; ``--tile``
adds (or ``--only-tile`` measures only) the tile path, whose kernels take minutes each.

Measured on this project's 2-core machine (Warp 1.19, CUDA toolkit 13.4's NVRTC, sm_90, CPU
seconds; trainings ran beside it): rows path, the Ant actor's forward kernel 4.7 s, the
others 0.8 to 1.4 s each (the swing-up's actor and critic share one kernel); tile path, the
Ant actor's 174 s and the Ant critic's 99 s.

Usage::

    .venv/bin/python scripts/bench_nn_compile.py [--arch 90] [--tile | --only-tile] [--only NAME ...]
"""

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import warp as wp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import nn, nn_rows
from harness.nn import MLP

NETWORKS = {
    "ant.actor": (MLP(37, [128, 64, 32], 8, activation="elu", layer_norm=True, output="tanh"), False),
    "ant.critic": (MLP(37, [64, 64], 1, activation="elu", layer_norm=True), True),
    "swingup.actor": (MLP(5, [64, 64], 1, activation="elu", layer_norm=True), False),
    "swingup.critic": (MLP(5, [64, 64], 1, activation="elu", layer_norm=True), True),
    "cartpole.policy": (MLP(6, [64, 64], 1, activation="tanh", output="tanh", output_scale=50.0), False),
}
"""Name -> (the MLP, whether a run fits it by regression: a critic)."""

CUDA_LAUNCH_BLOCK_DIM = 256
"""Threads per block of ``wp.launch`` on CUDA (its default, the rows path's launches)."""


def kernels(path: str, only: list[str] | None) -> list[tuple[str, object, int]]:
    """``(label, kernel, block_dim)`` of every kernel to measure on ``path``."""
    found = []
    for name, (mlp, critic) in NETWORKS.items():
        if only and name not in only:
            continue
        keys, eps, offsets = mlp._keys(), mlp._eps(), nn._offset_type(len(mlp.layers))
        if path == "rows":
            found.append((f"{name} forward", nn_rows.forward_kernel(keys, eps, False, offsets), CUDA_LAUNCH_BLOCK_DIM))
            if critic:
                found.append((f"{name} regression", nn_rows.mse_kernel(keys, eps, offsets), CUDA_LAUNCH_BLOCK_DIM))
        else:
            # the tile width a launch over a SHAC minibatch or a rollout's worlds picks (32 rows
            # per block; the H100's opt-in shared memory fits these networks at 32) and the
            # tile path's CUDA block size; the regression step is this kernel and _squared_error
            found.append((f"{name} forward", mlp._kernel(nn.MAX_TILE_ROWS, False), nn._CUDA_BLOCK_DIM))
    return found


def compile_seconds(kernel, arch: int, block_dim: int) -> tuple[float, float]:
    """Wall and CPU seconds of compiling ``kernel``'s module for ``sm_<arch>`` into a new folder."""
    module = kernel.module
    with tempfile.TemporaryDirectory() as folder:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        wall0 = time.perf_counter()
        module.get_module_hash(block_dim)  # code generation and the options a launch resolves
        options = module.resolved_options[block_dim]
        compiled = module._compile(None, folder, output_arch=arch, options=options)
        wall = time.perf_counter() - wall0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        assert compiled, "nothing compiled: the folder was not cold"
    return wall, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA architecture (90: H100, H200)")
    parser.add_argument("--tile", action="store_true", help="also the tile path (minutes per kernel)")
    parser.add_argument("--only-tile", action="store_true", help="the tile path only")
    parser.add_argument("--only", nargs="*", choices=list(NETWORKS), help="these networks only")
    args = parser.parse_args()
    wp.config.quiet = True
    wp.init()
    paths = ["tile"] if args.only_tile else ["rows", "tile"] if args.tile else ["rows"]
    print(f"compile for sm_{args.arch}, cold cache, Warp {wp.__version__}", flush=True)
    for path in paths:
        for label, kernel, block_dim in kernels(path, args.only):
            wall, cpu = compile_seconds(kernel, args.arch, block_dim)
            print(f"{path:5s} {label:26s} block_dim {block_dim:3d}: {wall:7.1f} s wall, {cpu:7.1f} s CPU", flush=True)


if __name__ == "__main__":
    main()
