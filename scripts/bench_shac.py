"""SHAC's training wall time against the torch calibration, run back to back on this CPU.

For every seed, in turn: the harness's default swing-up, ``python -m harness train
+env=cartpole_swingup task=shac seed=S`` (500 iterations of 32 steps x 64 worlds), then the
calibration (``/work/shared/tools/shac_calibration.py S``: the same SHAC in torch on one thread,
analytic cart-pole dynamics, 500 epochs), each as its own process, timed from start to exit.
With ``--balance`` it also trains the double-pendulum balance (``+env=cartpole task=shac``,
1000 iterations of 128 steps x 32 worlds), which has no calibration: its figure is its wall
time against the 4-minute target.

Prints, per run, the process's wall time and the training loop's own (``wall_time_s`` in the
run's ``summary.json``; the calibration's printed ``wall``), the process's CPU time (user +
system, from ``getrusage``: what it computed, which the other sessions on a shared machine
stretch less than its wall time) and the machine's load (``os.getloadavg()``) before and
after; then the ratio of the harness's total to the
calibration's. Whether the policies swing up is scripts/shac_study.py's question (held-out
starts over twice the episode); the calibration prints its own upright share in its log. The two run back to back,
alternating, so both see the same load as far as that is possible on a shared machine.

``--before TREE`` also trains every run with the harness of another checkout (an export of an
older commit, ``git archive COMMIT | tar -x -C TREE``), right before this tree's: a before and
after measured in the same run.

Run::

    .venv/bin/python scripts/bench_shac.py --seeds 0 1 2 [--balance] [--before /tmp/base] [--out /tmp/bench_shac]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = Path("/work/shared/tools/shac_calibration.py")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], log: Path, tree: Path = ROOT) -> tuple[float, float, str]:
    """Run ``command`` in ``tree`` (its harness first on the path) with its output in ``log``;
    its wall time, its CPU time and its last output line."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start, cpu = time.perf_counter(), children_cpu()
    with log.open("w") as out:
        done = subprocess.run(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    lines = log.read_text().strip().splitlines()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}); see {log}")
    return wall, cpu, lines[-1] if lines else ""


def harness_run(args: list[str], folder: Path, tree: Path = ROOT) -> dict:
    command = [sys.executable, "-m", "harness", "train", *args, f"hydra.run.dir={folder}", "overwrite=true"]
    before = load()
    wall, cpu, _ = timed(command, folder.parent / f"{folder.name}.log", tree)
    summary = json.loads((folder / "summary.json").read_text())
    return {"wall": wall, "cpu": cpu, "loop": summary.get("wall_time_s"), "load": f"{before} -> {load()}"}


def calibration_run(path: Path, seed: int, iterations: int, log: Path) -> dict:
    before = load()
    wall, cpu, last = timed([sys.executable, str(path), str(seed), str(iterations)], log)
    reported = json.loads(last)
    return {"wall": wall, "cpu": cpu, "loop": reported["wall"], "load": f"{before} -> {load()}"}


def row(name: str, seed: int, found: dict) -> str:
    loop = f"{found['loop']:.1f}" if found["loop"] is not None else "-"
    return f"| {name} | {seed} | {found['wall']:.1f} | {loop} | {found['cpu']:.1f} | {found['load']} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--iterations", type=int, default=500, help="the swing-up's iterations and the calibration's epochs"
    )
    parser.add_argument("--calibration", type=Path, default=CALIBRATION)
    parser.add_argument("--balance", action="store_true", help="also train +env=cartpole task=shac per seed")
    parser.add_argument("--no-calibration", action="store_true", help="time the harness only")
    parser.add_argument("--before", type=Path, default=None, help="another harness checkout, timed first")
    parser.add_argument("--out", type=Path, default=None, help="run folders and logs (default: a temporary folder)")
    args = parser.parse_args()
    if not args.no_calibration and not args.calibration.exists():
        raise SystemExit(f"--calibration: {args.calibration} does not exist; accepted: the path of shac_calibration.py")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_shac_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"runs in {out}; cpu count {os.cpu_count()}; load {load()}", flush=True)
    print("| run | seed | process wall s | training loop s | process CPU s | load before -> after |")
    print("|---|---|---|---|---|---|")
    if args.before is not None and not (args.before / "harness" / "__init__.py").exists():
        raise SystemExit(f"--before: {args.before} holds no harness package; accepted: a checkout of this repository")
    totals = {"before": 0.0, "harness": 0.0, "calibration": 0.0}
    cpu = dict.fromkeys(totals, 0.0)
    for seed in args.seeds:
        swing = [
            "+env=cartpole_swingup", "task=shac", f"seed={seed}", f"iterations={args.iterations}",
        ]  # fmt: skip
        if args.before is not None:
            found = harness_run(swing, out / f"before_swingup_{seed}", args.before)
            totals["before"] += found["wall"]
            cpu["before"] += found["cpu"]
            print(row("before: harness swing-up", seed, found), flush=True)
        found = harness_run(swing, out / f"swingup_{seed}")
        totals["harness"] += found["wall"]
        cpu["harness"] += found["cpu"]
        print(row("harness swing-up", seed, found), flush=True)
        if not args.no_calibration:
            found = calibration_run(args.calibration, seed, args.iterations, out / f"calibration_{seed}.log")
            totals["calibration"] += found["wall"]
            cpu["calibration"] += found["cpu"]
            print(row("calibration (torch, 1 thread)", seed, found), flush=True)
        if args.balance:
            balance = ["+env=cartpole", "task=shac", f"seed={seed}"]
            if args.before is not None:
                found = harness_run(balance, out / f"before_balance_{seed}", args.before)
                print(row("before: harness balance", seed, found), flush=True)
            found = harness_run(balance, out / f"balance_{seed}")
            print(row("harness balance", seed, found), flush=True)
    print()
    if not args.no_calibration:
        for name in ("before", "harness") if args.before is not None else ("harness",):
            ratio = totals[name] / totals["calibration"]
            print(
                f"swing-up, {len(args.seeds)} seed(s): {name} {totals[name]:.1f} s, calibration "
                f"{totals['calibration']:.1f} s: {ratio:.2f}x wall (target 1.25x, aim 1.0x); CPU "
                f"{cpu[name]:.1f} s against {cpu['calibration']:.1f} s: {cpu[name] / cpu['calibration']:.2f}x"
            )
    print(f"load now {load()}")


if __name__ == "__main__":
    main()
