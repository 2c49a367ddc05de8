"""A robot's return against simulated steps, from the TensorBoard events of SHAC and AHAC runs
(the Ant's by default; ``--robot hopper`` for the Hopper's).

Every ``task=shac`` or ``task=ahac`` run logs ``episode/return`` (whole episodes from the env's own starts,
rolled out at the training's current weights: docs/tasks.md, "What a policy run reports") at
step 0 and about ten times over the run. This reads those with TensorBoard's own reader and
draws them against the simulated steps of training (iteration x window x worlds), one line per
run, with the held-out evaluation (``harness evaluate RUN env.seed=7``: its ``eval.json``) as a
marker where the run folder has one. ``--reference`` (repeatable) adds a published curve
(``docs/data/shac_ant_georgiev2024.csv`` and the others ``scripts/reference_shac_ant.py`` writes):
its mean over seeds and the band of one standard deviation against iterations (epochs) on the
right, and a SHAC curve also against the same simulated steps (epochs x 32 steps x
``--reference-worlds``) on the left; an adaptive-horizon curve (AHAC's) is on the right only, as
its epochs' steps vary and the export does not hold them. Writes ``<out>.png`` and ``<out>.json``;
``--from <out>.json`` draws an earlier plot again from what it read (run folders since removed);
run folders given with it are read now and added, each in place of an earlier curve of the same
method, seed and worlds::

    .venv/bin/python scripts/plot_ant.py outputs/ant/seed0 outputs/ant/seed1 --out docs/img/ant_shac \
        --reference docs/data/shac_ant_georgiev2024.csv
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

REFERENCE_COLOURS = ("0.35", "tab:brown", "tab:pink", "tab:olive")
"""The published curves' colours; the runs' below never take one of them."""
RUN_COLOURS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:cyan",
    "black",
    "gold",
    "navy",
    "lime",
)


def curve(run: Path) -> dict:
    """One run's ``episode/return`` against simulated steps, and its held-out evaluation."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from harness import tags

    config = yaml.safe_load((run / "config.yaml").read_text())
    task = config["task"]
    auto = task["window"] == "auto"  # task.window=auto: every rollout runs the ceiling's steps
    per_iteration = int(task["auto"]["ceiling"] if auto else task["window"]) * int(config["env"]["world_count"])
    name = "AHAC" if str(task.get("_target_", "")).endswith("AHAC") else "SHAC"
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    points = {e.step: e.value for e in events.Scalars(tags.EPISODE_RETURN)}  # a resumed run rewrites its steps
    found = {
        "run": str(run),
        "seed": config.get("seed"),
        "method": f"{name}, task.window=auto (ceiling {task['auto']['ceiling']})" if auto else name,
        "planned_iterations": config.get("iterations"),
        "worlds": int(config["env"]["world_count"]),
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


def _identity(c: dict) -> tuple:
    """What a curve's legend tells it by: two curves alike in all three would read as one."""
    return (c["method"], c["seed"], c["worlds"])


def _named(c: dict) -> str:
    return f"{c['method']}, seed {c['seed']}, {c['worlds']} worlds"


def reference(path: Path) -> dict:
    """A summarised published curve: epoch, seeds, mean, std, min, max (``#`` lines are its source)."""
    import csv

    lines = path.read_text().splitlines()
    notes = [line.lstrip("# ") for line in lines if line.startswith("#")]
    method = next((note.split(":", 1)[1].strip() for note in notes if note.startswith("method:")), "SHAC")
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    return {
        "source": " ".join(note for note in notes if not note.startswith("method:")),
        "method": method,
        "epochs": [int(r["epoch"]) for r in rows],
        "mean": [float(r["mean"]) for r in rows],
        "std": [float(r["std"]) for r in rows],
        "seeds": max(int(r["seeds"]) for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="*", help="task=shac or task=ahac run folders")
    parser.add_argument("--out", type=Path, required=True, help="<out>.png and <out>.json")
    parser.add_argument("--from", dest="source", type=Path,
                        help="redraw the curves an earlier <out>.json holds (its run folders may be gone)")  # fmt: skip
    parser.add_argument("--reference", type=Path, action="append", default=[],
                        help="a published curve (docs/data/shac_ant_georgiev2024.csv); repeatable")  # fmt: skip
    parser.add_argument("--reference-worlds", type=int, default=128, help="its worlds per epoch (their config: 128)")
    parser.add_argument("--robot", default="ant", help="the env the runs trained (+env=NAME), for the title")
    args = parser.parse_args()
    if not args.runs and args.source is None:
        parser.error("runs: give run folders, --from an earlier <out>.json, or both")
    curves, published = [], [reference(path) for path in args.reference]
    if args.source is not None:  # the runs' curves and held-out figures as read then; references too
        earlier = json.loads(args.source.read_text())
        curves = earlier["runs"]
        published = published or earlier["references"]
    fresh = [curve(run) for run in args.runs]
    for i, c in enumerate(fresh):
        twin = next((other for other in fresh[:i] if _identity(other) == _identity(c)), None)
        if twin is not None:
            parser.error(f"runs: '{twin['run']}' and '{c['run']}' are both {_named(c)}; give one")
    earlier_at = {_identity(c): i for i, c in enumerate(curves)}  # read then: a run read now takes its place
    for c in fresh:
        if _identity(c) in earlier_at:
            curves[earlier_at[_identity(c)]] = c
        else:
            curves.append(c)
    found = {"runs": curves, "references": published}
    args.out.with_suffix(".json").write_text(json.dumps(found, indent=1) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 6), layout="constrained", sharey=True)
    for panel, ax in enumerate(axes):
        x = "steps" if panel == 0 else "iterations"
        for j, ref in enumerate(published):
            if panel == 0 and ref["method"] != "SHAC":
                continue  # its epochs' steps vary with the horizon and are not in the export
            epochs = np.array(ref["epochs"])
            at = epochs * 32 * args.reference_worlds if panel == 0 else epochs
            mean, std = np.array(ref["mean"]), np.array(ref["std"])
            shade = REFERENCE_COLOURS[j % len(REFERENCE_COLOURS)]
            label = (f"{ref['method']}, Georgiev et al. 2024: mean +- std of {ref['seeds']} seeds, "
                     f"{args.reference_worlds} worlds, training episodes")  # fmt: skip
            ax.plot(at, mean, "-", color=shade, label=label)
            ax.fill_between(at, mean - std, mean + std, color=shade, alpha=0.15, linewidth=0)
        mixed = len({c["worlds"] for c in curves}) > 1  # then each run's label names its worlds
        for i, c in enumerate(curves):
            colour = RUN_COLOURS[i % len(RUN_COLOURS)]
            sized = f", {c['worlds']} worlds" if mixed else ""
            run = f"{c['method']}{sized}, seed {c['seed']}"
            label = f"{run}: episodes from the env's starts"
            if c["iterations"] and c["planned_iterations"] and c["iterations"][-1] < c["planned_iterations"]:
                label += f" (to iteration {c['iterations'][-1]} of {c['planned_iterations']})"
            ax.plot(c[x], c["return"], "o-", color=colour, label=label, markersize=4)
            if "held_out" in c and "episode_return" in c["held_out"]:
                h = c["held_out"]
                where = h["steps"] if panel == 0 else h["iteration"]
                speed = h.get("forward_speed", float("nan"))
                held = f"{run}: 64 held-out starts (env.seed=7), {speed:.2f} m/s"
                ax.plot([where], [h["episode_return"]], "*", color=colour, markersize=14, label=held)
        ax.grid(alpha=0.3)
    worlds = "/".join(str(w) for w in sorted({c["worlds"] for c in curves}))
    axes[0].set_xlabel(f"simulated steps (ours: iterations x rollout steps x {worlds} worlds)")
    axes[1].set_xlabel("iterations (epochs)")
    axes[0].set_ylabel("episode return (1000 steps)")
    robot = args.robot.capitalize()
    methods = " and ".join(sorted({c["method"].split(",")[0] for c in curves}))
    axes[0].set_title(f"{methods} on the {robot} (+env={args.robot}), this CPU: against simulated steps")
    axes[1].set_title("against iterations")
    handles, labels = axes[1].get_legend_handles_labels()  # below the panels: inside, it hid a curve
    fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=2)
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    print(f"wrote {args.out.with_suffix('.png')} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
