"""A published SHAC learning curve (the Ant's; ``--robot Hopper`` with ``shac_hopper_time.csv``;
``--method AHAC`` with ``ahac_ant_time.csv``, ``--method "SHAC + adaptive horizon" --column
rewards/iter`` with ``shac_ant_adaptive_horizon_time.csv``), summarised for
``scripts/plot_ant.py --reference``.

The source is the wandb export behind AHAC's figures (Georgiev et al. 2024, "Adaptive Horizon
Actor-Critic for Policy Learning in Contact-Rich Differentiable Simulation"): the repository
github.com/imgeorgiev/DiffRL, file ``results/data/shac_ant_time.csv`` (added in commit
9b09828, "add results and figures"). It holds 10 seeds of SHAC on DiffRL's Ant, each logging
``rewards`` (the mean return of the last training episodes of its stochastic policy) against
``_step`` (the epoch, 0..1999). This writes every ``--every``-th epoch's mean, standard
deviation (n - 1), minimum and maximum over the seeds, and the number of seeds that logged it::

    .venv/bin/python scripts/reference_shac_ant.py shac_ant_time.csv --out docs/data/shac_ant_georgiev2024.csv
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path


def per_seed(path: Path, column: str = "rewards") -> dict[str, dict[int, float]]:
    """seed -> epoch -> reward, from the export's ``<seed> - _step`` and ``<seed> - <column>`` columns.

    A seed whose return column has no ``_step`` column beside it cannot be put on epochs and is
    left out, with a line saying so (``ahac_hopper_time.csv``: seeds 1 and 4, whose returns equal
    seed 2's row for row)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    named = sorted({name.split(" - ")[0] for name in rows[0] if name.endswith(f" - {column}")})
    seeds = [seed for seed in named if f"{seed} - _step" in rows[0]]
    if len(seeds) < len(named):
        print(f"left out (no _step column): {', '.join(sorted(set(named) - set(seeds)))}")
    found: dict[str, dict[int, float]] = {seed: {} for seed in seeds}
    for row in rows:
        for seed in seeds:
            step, reward = row[f"{seed} - _step"], row[f"{seed} - {column}"]
            if step and reward:
                found[seed][int(float(step))] = float(reward)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", type=Path, help="results/data/shac_ant_time.csv of imgeorgiev/DiffRL")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--every", type=int, default=10, help="keep every n-th epoch (and the last)")
    parser.add_argument("--robot", default="Ant", help="the export's robot, for the header (Hopper, Ant)")
    parser.add_argument("--method", default="SHAC", help="the export's method, for the header (SHAC, AHAC, ...)")
    parser.add_argument("--column", default="rewards", help="the export's return column (rewards, rewards/iter)")
    args = parser.parse_args()
    seeds = per_seed(args.export, args.column)
    last = max(max(epochs) for epochs in seeds.values())
    with args.out.open("w", newline="") as f:
        f.write(
            f"# {args.method} on DiffRL's {args.robot} as run by Georgiev et al. 2024 (AHAC): "
            f"github.com/imgeorgiev/DiffRL results/data/{args.export.name} (commit 9b09828, column {args.column}), "
            f"summarised by scripts/reference_shac_ant.py\n# method: {args.method}\n"
        )
        out = csv.writer(f)
        out.writerow(["epoch", "seeds", "mean", "std", "min", "max"])
        for epoch in [*range(0, last, args.every), last]:
            values = [epochs[epoch] for epochs in seeds.values() if epoch in epochs]
            if not values:
                continue
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))  # sample std
            out.writerow([epoch, len(values), f"{mean:.1f}", f"{std:.1f}", f"{min(values):.1f}", f"{max(values):.1f}"])
    print(f"wrote {args.out}: {len(seeds)} seeds, epochs 0..{last}")


if __name__ == "__main__":
    main()
