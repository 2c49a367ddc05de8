"""What the drone example's two quirks change: its stale planning state and its control-cost row.

Flies ``+env=drone`` (``task=mpc``) with each combination of ``task.stale_state`` and
``env.example_control_cost`` for several seeds (the draws of frame f are seeded with seed + f;
seed 0 with both switches on is Newton's example bit for bit) and prints, per combination, the
mean over seeds of the flight's mean distance to the target, its share of frames within 0.1 m,
the last frame's distance and the mean best cost per frame. Each run writes a run folder under a
temporary directory.

    python scripts/drone_stale_state.py --frames 360 --seeds 5
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fly(run_dir: Path, frames: int, seed: int, stale: bool, example_cost: bool) -> dict:
    args = [
        sys.executable, "-m", "harness", "train", "+env=drone", f"env.frames={frames}", f"seed={seed}",
        f"task.stale_state={str(stale).lower()}", f"env.example_control_cost={str(example_cost).lower()}",
        "device=cpu", "plot_every=null", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run(args, check=True, capture_output=True, env=env, cwd=run_dir.parent)
    summary = json.loads((run_dir / "summary.json").read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    costs = [e.value for e in events.Scalars("mpc/best_cost")]
    return {**summary["after_training"], "mean_best_cost": statistics.fmean(costs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=360, help="frames per flight (360: both targets, one switch)")
    parser.add_argument("--seeds", type=int, default=5)
    a = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    keys = ("mean_distance_m", "within_0.1m_fraction", "final_distance_m", "mean_best_cost")
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for stale, example_cost in itertools.product((True, False), (True, False)):
            found = [
                fly(Path(tmp) / f"{stale}_{example_cost}_{seed}", a.frames, seed, stale, example_cost)
                for seed in range(a.seeds)
            ]
            means = {k: statistics.fmean(f[k] for f in found) for k in keys}
            spread = {k: (min(f[k] for f in found), max(f[k] for f in found)) for k in keys}
            rows.append((stale, example_cost, means, spread))
            print(f"stale_state={stale} example_control_cost={example_cost}: " + ", ".join(
                f"{k} {means[k]:.4g} [{spread[k][0]:.4g}, {spread[k][1]:.4g}]" for k in keys), flush=True)  # fmt: skip
    print(f"load average after: {os.getloadavg()}")
    print("\n| task.stale_state | env.example_control_cost | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for stale, example_cost, means, spread in rows:
        cells = " | ".join(f"{means[k]:.4g} ({spread[k][0]:.3g} to {spread[k][1]:.3g})" for k in keys)
        print(f"| {str(stale).lower()} | {str(example_cost).lower()} | {cells} |")


if __name__ == "__main__":
    main()
