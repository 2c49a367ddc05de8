"""The table of docs/gpu.md ("On a GPU"): start-up and speed of three runs on each device given.

For each run (``make train``'s cartpole, the swing-up's SHAC, the Ant's SHAC) and each world
count, on each device: iterations per second of the steady state (``--iterations`` more
iterations over the extra seconds of two ``python -m harness train`` runs, so compiling,
capturing and writing the run cancel out; the first run of a device also gives the cold start
when the cache is cold). Before that, per run and CUDA device: ``python -m harness compile``
cold (a fresh ``WARP_CACHE_PATH``) and warm. Every command has its own timeout
(``--timeout``); one that runs out is reported as such and the table goes on. Figures go to
``--out`` (``gpu.json`` and ``gpu.md``) as they come, so a machine taken back early leaves
what was measured.

Meant for a lent GPU (docs/gpu.md says how to carry the packages there); it runs anywhere:
``python scripts/bench_gpu.py --devices cpu --worlds 4 --iterations 3`` checks it on the CPU.

Run: python scripts/bench_gpu.py [--devices cuda:0 cpu] [--worlds 64 1024 4096] [--iterations 20]
     [--runs cartpole swingup ant] [--timeout 300] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUNS = {
    "cartpole": ["+env=cartpole"],
    "swingup": ["+env=cartpole_swingup", "task=shac"],
    "ant": ["+env=ant", "task=shac"],
}
"""Each run's overrides."""


class TimedOut(Exception):
    """A command ran past its timeout."""


def harness(args: list[str], *, timeout: float, env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run ``python -m harness ARGS``: its stdout and wall seconds.

    Raises:
        TimedOut: It ran past ``timeout``.
        RuntimeError: It failed (its stderr).
    """
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise TimedOut(f"over {timeout:.0f} s") from None
    if done.returncode:
        raise RuntimeError(f"python -m harness {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout, time.perf_counter() - start


def training_seconds(overrides: list[str], iterations: int, *, timeout: float) -> tuple[float, float]:
    """(the run's training seconds, ``summary.json``'s ``wall_time_s``: from its first iteration
    to its last; the command's wall seconds) of one run."""
    with tempfile.TemporaryDirectory() as folder:
        _, wall = harness(
            ["train", *overrides, f"iterations={iterations}", f"log_every={iterations}", "checkpoint.every=0",
             "plot_every=null", f"hydra.run.dir={folder}/run"],
            timeout=timeout,
        )  # fmt: skip
        summary = json.loads((Path(folder) / "run" / "summary.json").read_text())
    return float(summary["wall_time_s"]), wall


def steady_its(overrides: list[str], iterations: int, *, timeout: float) -> dict[str, float]:
    """Iterations per second of the steady state, and the first run's wall seconds (the start,
    cold when the cache was)."""
    short, first_wall = training_seconds(overrides, 5, timeout=timeout)
    long, _ = training_seconds(overrides, 5 + iterations, timeout=timeout)
    return {"its": iterations / max(long - short, 1e-9), "first_wall_s": first_wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", nargs="+", default=["cuda:0", "cpu"])
    parser.add_argument("--worlds", type=int, nargs="+", default=[64, 1024, 4096])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for each command")
    parser.add_argument("--out", type=Path, default=Path("gpu_bench"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def keep(row: dict) -> None:
        rows.append(row)
        (args.out / "gpu.json").write_text(json.dumps(rows, indent=2))
        print(json.dumps(row), flush=True)

    for name in args.runs:
        for device in (d for d in args.devices if d.startswith("cuda")):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "WARP_CACHE_PATH": cache}
                for state in ("cold", "warm"):
                    row = {"run": name, "device": device, "what": f"compile {state}"}
                    try:
                        _, row["wall_s"] = harness(
                            ["compile", *RUNS[name], f"device={device}"], timeout=args.timeout, env=env
                        )
                    except (TimedOut, RuntimeError) as exc:
                        row["error"] = str(exc).splitlines()[0]
                    keep(row)
        for worlds in args.worlds:
            for device in args.devices:
                row = {"run": name, "device": device, "worlds": worlds, "what": "train"}
                overrides = [*RUNS[name], f"env.world_count={worlds}", f"device={device}"]
                try:
                    row.update(steady_its(overrides, args.iterations, timeout=args.timeout))
                except (TimedOut, RuntimeError) as exc:
                    row["error"] = str(exc).splitlines()[0]
                keep(row)
    lines = ["| run | worlds | device | it/s | first run wall (s) |", "|---|---|---|---|---|"]
    for row in rows:
        if row["what"] == "train":
            figure = f"{row['its']:.2f}" if "its" in row else row.get("error", "")
            first = f"{row['first_wall_s']:.1f}" if "first_wall_s" in row else ""
            lines.append(f"| {row['run']} | {row['worlds']} | {row['device']} | {figure} | {first} |")
        else:
            figure = f"{row['wall_s']:.1f} s" if "wall_s" in row else row.get("error", "")
            lines.append(f"| {row['run']} | | {row['device']} | {row['what']}: {figure} | |")
    (args.out / "gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
