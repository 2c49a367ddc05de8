"""The memory estimate (harness.limits) against the peak memory of real runs.

Each case trains 3 iterations in a fresh process (iteration 1 eager, 2 captured, 3 replayed
under the default capture=auto) and reads its peak resident memory from ``os.wait4``; the
estimate is ``limits.check_memory``'s total, plus what the process holds when it checks
(``--resident``, MiB). Prints one row per case and the ratio estimate / measured, which should
stay above 1 (docs/reliability.md, "Sizes").

    python scripts/bench_memory_estimate.py                      # the default cases
    python scripts/bench_memory_estimate.py "env.world_count=256" "+env=ball"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_CASES = [
    "",
    "env.horizon=2000",
    "env.world_count=256",
    "env.world_count=64 env.horizon=1000",
    "env.horizon=2000 memory.segment_steps=auto",
    "env.world_count=256 capture=false",
]


def peak_mib(overrides: list[str], folder: Path) -> float:
    args = [sys.executable, "-m", "harness", "train", *overrides, "iterations=3", "checkpoint.every=0"]
    proc = subprocess.Popen([*args, f"hydra.run.dir={folder}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(overrides)}: {proc.stderr.read().decode().strip()}")
    return usage.ru_maxrss / 1024


def estimate_mib(overrides: list[str]) -> float:
    from harness import build, limits
    from harness.config import compose_command

    cfg, choices, _ = compose_command("train", [*overrides, "iterations=3"])
    run = build.validate(cfg, choices)
    free = limits.available_host_bytes
    limits.available_host_bytes = lambda: 2**60  # the estimate, never a refusal
    try:
        return limits.check_memory(cfg, run).total / 2**20
    finally:
        limits.available_host_bytes = free


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help="overrides of one case, as one string (default: cartpole runs)")
    parser.add_argument("--resident", type=float, default=186.0, help="MiB the process holds when it checks")
    args = parser.parse_args()
    cases = args.cases or DEFAULT_CASES
    print(f"{'case':<45} {'measured':>10} {'estimated':>10} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for k, case in enumerate(cases):
            overrides = case.split()
            if not any(o.startswith("+env=") for o in overrides):
                overrides = ["+env=cartpole", *overrides]
            measured = peak_mib(overrides, Path(tmp) / str(k))
            estimated = estimate_mib(overrides) + args.resident
            label = " ".join(overrides)
            print(f"{label:<45} {measured:>8.0f} M {estimated:>8.0f} M {estimated / measured:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
