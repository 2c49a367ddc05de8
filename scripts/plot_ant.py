"""The Ant's return against simulated steps, from the TensorBoard events of SHAC runs.

Every ``task=shac`` run logs ``episode/return`` (whole episodes from the env's own starts,
rolled out at the training's current weights: docs/tasks.md, "What a policy run reports") at
step 0 and about ten times over the run. This reads those with TensorBoard's own reader and
draws them against the simulated steps of training (iteration x window x worlds), one line per
run, with the held-out evaluation (``harness evaluate RUN env.seed=7``: its ``eval.json``) as a
marker where the run folder has one. Writes ``<out>.png`` and ``<out>.json``::

    .venv/bin/python scripts/plot_ant.py outputs/ant/seed0 outputs/ant/seed1 --out docs/img/ant_shac
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def curve(run: Path) -> dict:
    """One run's ``episode/return`` against simulated steps, and its held-out evaluation."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from harness import tags

    config = yaml.safe_load((run / "config.yaml").read_text())
    per_iteration = int(config["task"]["window"]) * int(config["env"]["world_count"])
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    points = {e.step: e.value for e in events.Scalars(tags.EPISODE_RETURN)}  # a resumed run rewrites its steps
    found = {
        "run": str(run),
        "seed": config.get("seed"),
        "planned_iterations": config.get("iterations"),
        "steps": [step * per_iteration for step in sorted(points)],
        "iterations": sorted(points),
        "return": [points[step] for step in sorted(points)],
    }
    held_out = run / "eval.json"
    if held_out.exists():
        report = json.loads(held_out.read_text())
        figures = report["figures"]
        found["held_out"] = {
            "iteration": report.get("iteration"),
            "steps": (report.get("iteration") or 0) * per_iteration,
            **{k: figures[k] for k in ("episode_return", "forward_speed", "fall_fraction") if k in figures},
        }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="task=shac run folders")
    parser.add_argument("--out", type=Path, required=True, help="<out>.png and <out>.json")
    args = parser.parse_args()
    curves = [curve(run) for run in args.runs]
    args.out.with_suffix(".json").write_text(json.dumps(curves, indent=1) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), constrained_layout=True)
    for i, c in enumerate(curves):
        colour = f"C{i}"
        label = f"seed {c['seed']}: episodes from the env's starts"
        if c["iterations"] and c["planned_iterations"] and c["iterations"][-1] < c["planned_iterations"]:
            label += f" (stopped at iteration {c['iterations'][-1]} of {c['planned_iterations']})"
        ax.plot(c["steps"], c["return"], "o-", color=colour, label=label)
        if "held_out" in c and "episode_return" in c["held_out"]:
            h = c["held_out"]
            held = f"seed {c['seed']}: 64 held-out starts (env.seed=7), {h.get('forward_speed', float('nan')):.2f} m/s"
            ax.plot([h["steps"]], [h["episode_return"]], "*", color=colour, markersize=14, label=held)
    ax.set_xlabel("simulated steps (iterations x 32 steps x 64 worlds)")
    ax.set_ylabel("episode return (1000 steps)")
    ax.set_title("SHAC on the Ant (+env=ant task=shac), this CPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    print(f"wrote {args.out.with_suffix('.png')} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
