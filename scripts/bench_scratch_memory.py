"""Cost of the per-step Featherstone scratch copies vs one solver per step.

The cartpole env gives every taped step its own copy of SolverFeatherstone's M, J, P, H, L
(see envs/cartpole.py). The alternative is one solver instance per step. This prints, for
a few world counts and in one run, the bytes per step of each approach (values + grads of
the solver's arrays) and the time to set up one step's worth of either, as ratios.

Run: python scripts/bench_scratch_memory.py
"""

from __future__ import annotations

import time

import newton
import warp as wp

import harness  # noqa: F401  (quiet Warp)
from envs.cartpole import FEATHERSTONE_SCRATCH, CartpoleEnv


def array_bytes(obj: object) -> int:
    total = 0
    for value in vars(obj).values():
        if isinstance(value, wp.array):
            total += value.capacity * (2 if value.grad is not None else 1)
    return total


def mean_seconds(fn, repeats: int = 50) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    print(f"{'worlds':>6} {'floats/step':>11} {'scratch B':>10} {'solver B':>9} {'mem ratio':>9} {'setup ratio':>11}")
    for worlds in (1, 4, 64):
        env = CartpoleEnv(horizon=1, world_count=worlds, device="cpu")
        scratch = sum(a.capacity * 2 for a in env.scratch[0].values())
        solver = array_bytes(env.solver)
        floats = sum(getattr(env.solver, n).size for n in FEATHERSTONE_SCRATCH)
        t_scratch = mean_seconds(
            lambda env=env: [wp.zeros_like(getattr(env.solver, n), requires_grad=True) for n in FEATHERSTONE_SCRATCH]
        )
        t_solver = mean_seconds(lambda env=env: newton.solvers.SolverFeatherstone(env.model))
        print(
            f"{worlds:>6} {floats:>11} {scratch:>10} {solver:>9} {solver / scratch:>9.2f} {t_solver / t_scratch:>11.1f}"
        )


if __name__ == "__main__":
    main()
