"""Compile time of every kernel module a run loads, for a CUDA architecture, with a cold cache.

For each run (``make train``'s cartpole, the swing-up's SHAC, the Ant's SHAC, or ``--runs``),
in a fresh kernel cache of its own: ``python -m harness compile <run> device=cpu`` first (the
CPU kernels the tiny iteration that finds the modules needs; timed apart), then
``python -m harness compile <run> device=cuda arch=<arch>``, whose per-module lines give the
NVRTC seconds of each module, cold. No GPU is needed (Warp's NVRTC compiles on the CPU).
Prints a table per run and a summary line against issue 40's limits: the Ant at most 90 s,
the cartpole and the swing-up at most 45 s, every network kernel at most 20 s.

Run: python scripts/bench_compile.py [--arch 90] [--runs ant swingup cartpole] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUNS = {
    "cartpole": (["+env=cartpole"], 45.0),
    "swingup": (["+env=cartpole_swingup", "task=shac"], 45.0),
    "ant": (["+env=ant", "task=shac"], 90.0),
}
"""Each run's overrides and issue 40's limit on its total (seconds)."""
NETWORK_LIMIT_S = 20.0
LINE = re.compile(r"^\s*([0-9.]+) s  (\S+) \(block (\d+)\)  (compiled|cached)$")
NETWORK = re.compile(r"mlp|mse")
"""Module names of the network kernels (harness.nn's generated kernels)."""


def _compile(overrides: list[str], cache: Path, extra: list[str]) -> tuple[str, float]:
    env = {**os.environ, "WARP_CACHE_PATH": str(cache)}
    command = [sys.executable, "-m", "harness", "compile", *overrides, *extra]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout, wall


def measure(name: str, arch: int) -> dict:
    overrides, limit = RUNS[name]
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "cache"
        _, cpu_wall = _compile(overrides, cache, ["device=cpu"])
        out, wall = _compile(overrides, cache, ["device=cuda", f"arch={arch}"])
    modules = []
    for line in out.splitlines():
        found = LINE.match(line)
        if found:
            seconds, module, block, state = found.groups()
            modules.append({"module": module, "block": int(block), "seconds": float(seconds), "state": state})
    total = sum(m["seconds"] for m in modules)
    networks = [m for m in modules if NETWORK.search(m["module"])]
    return {
        "run": name,
        "overrides": overrides,
        "arch": arch,
        "modules": modules,
        "total_s": total,
        "wall_s": wall,
        "cpu_warmup_wall_s": cpu_wall,
        "limit_s": limit,
        "network_max_s": max((m["seconds"] for m in networks), default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    results = []
    for name in args.runs:
        result = measure(name, args.arch)
        results.append(result)
        print(f"\n## {name}: python -m harness compile {' '.join(result['overrides'])} device=cuda arch={args.arch}")
        print("| module | block | seconds |\n|---|---|---|")
        for m in sorted(result["modules"], key=lambda m: -m["seconds"]):
            print(f"| {m['module']} | {m['block']} | {m['seconds']:.1f} |")
        verdict = "within" if result["total_s"] <= result["limit_s"] else "OVER"
        print(
            f"total {result['total_s']:.1f} s over {len(result['modules'])} modules ({verdict} the "
            f"{result['limit_s']:.0f} s limit); largest network kernel {result['network_max_s']:.1f} s "
            f"(limit {NETWORK_LIMIT_S:.0f} s); command wall {result['wall_s']:.1f} s (its CPU tiny iteration "
            f"included), CPU warm-up {result['cpu_warmup_wall_s']:.1f} s",
            flush=True,
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
