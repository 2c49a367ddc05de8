"""Train and compare policies through the simulator: SHAC, critic-less windows, full BPTT.

For every method and seed, trains one run (``python -m harness train``, one process each, two
at a time; a finished run in the study folder is reused), then rolls every kept checkpoint
out on held-out starts (``env.seed=7``, 64 worlds, deterministic actor, from the env's own
starts) and reports the mean episode return (minus the loss's summed cost of each world's
episode) and the upright fraction against the simulated steps of training (iterations x
steps per iteration x worlds). Writes ``<out>.json`` (every curve), ``<out>.png`` (the return
and the upright fraction against simulated steps, the seeds' range shaded, a line per method's
mean) and prints a Markdown table with the seeds as columns.

Methods (the env's defaults otherwise; the same actor network, 64 x 64 ELU with LayerNorm):

* ``shac``: ``task=shac`` (windows of 32, critic, SHAC's constants);
* ``windows``: ``task=policy`` in windows carried across an episode, no critic
  (``task.window``, a divisor of the episode; the same actor rate and decay);
* ``bptt``: ``task=policy`` over whole episodes (backpropagation through the episode).

Each method runs as many iterations as give ``--steps`` simulated steps. Run::

    .venv/bin/python scripts/shac_study.py --env cartpole_swingup --seeds 0 1 2 3 4 \\
        --methods shac windows bptt --runs /tmp/study --out docs/img/shac_swingup

and the double-pendulum balance (``task=shac``'s ``per_env.cartpole`` settings)::

    .venv/bin/python scripts/shac_study.py --env cartpole --seeds 0 1 2 3 4 --methods shac \\
        --episode 240 --window 128 --worlds 32 --steps 4096000 --runs /tmp/balstudy \\
        --out docs/img/shac_balance
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ACTOR = ["task.hidden=[64,64]", "task.activation=elu", "task.layer_norm=true", "task.init_scale=1.0"]
"""task=policy with SHAC's actor network."""

DECAY = ["schedule=linear_decay", "schedule.min_factor=0.001"]
"""SHAC's actor schedule (1e-2 linearly to 1e-5 over the run) for task=policy."""


def method_overrides(method: str, env: str, episode: int, window: int, worlds: int, steps: int, extra: list[str]):
    """The command-line overrides of one method, and its simulated steps per iteration."""
    if method == "shac":
        per_iteration = window * worlds
        found = ["task=shac", f"task.window={window}"]
    elif method == "windows":
        divisor = min((d for d in range(1, episode + 1) if episode % d == 0), key=lambda d: (abs(d - window), d))
        per_iteration = divisor * worlds
        found = ["task=policy", *ACTOR, f"task.window={divisor}", "task.carry_from=0", *DECAY]
    elif method == "bptt":
        per_iteration = episode * worlds
        found = ["task=policy", *ACTOR, "task.window=null", *DECAY]
    else:
        raise SystemExit(f"--methods: '{method}' is not one of shac, windows, bptt")
    iterations = max(1, round(steps / per_iteration))
    every = max(1, iterations // 20)
    found += [
        f"+env={env}", f"env.horizon={episode}", f"env.world_count={worlds}", f"iterations={iterations}",
        f"checkpoint.every={every}", "checkpoint.keep=1000", f"log_every={every}", *extra,
    ]  # fmt: skip
    if method != "shac":
        found += ["optim=adam", "optim.lr=0.01", "optim.betas=[0.7,0.95]"]  # SHAC actor rate
        found += ["clip=global_norm", "clip.max_norm=1.0"]  # SHAC's actor clip (task=policy's own is ZClip)
    return found, per_iteration


def train_all(jobs: list[tuple[Path, list[str]]], parallel: int) -> None:
    """Run the training jobs whose folder has no finished summary, ``parallel`` at a time."""
    todo = [(folder, args) for folder, args in jobs if not _finished(folder)]
    running: list[tuple[subprocess.Popen, Path]] = []
    while todo or running:
        while todo and len(running) < parallel:
            folder, args = todo.pop(0)
            folder.parent.mkdir(parents=True, exist_ok=True)
            log = open(folder.parent / f"{folder.name}.log", "w")
            command = [sys.executable, "-m", "harness", "train", *args, f"hydra.run.dir={folder}"]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            running.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), folder))
            print(f"started {folder.name}", flush=True)
        time.sleep(2)
        for proc, folder in list(running):
            if proc.poll() is not None:
                running.remove((proc, folder))
                print(f"{folder.name}: exit {proc.returncode}", flush=True)


def _finished(folder: Path) -> bool:
    summary = folder / "summary.json"
    return summary.exists() and json.loads(summary.read_text()).get("status") == "finished"


def evaluate_checkpoints(folder: Path, episode: int, horizons: tuple[int, ...]) -> list[dict]:
    """Every checkpoint of ``folder`` rolled out on held-out starts: iteration, mean return
    over an episode, upright fractions over each of ``horizons``."""
    import warp as wp

    from harness import checkpoint
    from harness.build import trained_run
    from harness.runs import RunFolder
    from harness.tasks import rollout

    paths = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(folder))
    found = []
    for horizon in horizons:
        held_out = ["env.seed=7", "env.world_count=64", f"env.horizon={horizon}"]
        trained = trained_run(RunFolder(folder, "study"), held_out, checkpoint_name=str(paths[-1]), device="cpu")
        step, env, loss = trained.trainer.step, trained.run.env, trained.run.loss
        costs = wp.zeros((env.horizon, env.world_count), dtype=wp.float32, device=env.device)
        for k, path in enumerate(paths):
            trained.checkpoint = checkpoint.load(path)
            trained.load()
            with step.at_eval_params():
                trajectory = rollout(env, step.task, step.params)
                loss.step_costs(trajectory, costs)
            c = costs.numpy().astype(np.float64)
            figures = env.describe(trajectory)
            if len(found) <= k:
                found.append({"iteration": trained.checkpoint.iteration})
            found[k][f"upright_{horizon}"] = figures.get("upright_fraction")
            if horizon == episode:
                found[k]["return"] = float(-c.sum(axis=0).mean())
    return found


REFERENCE = {
    "DiffRL SHAC, read off the paper's figure": (
        [1.0e5, 2.2e5, 3.0e5, 5.0e5, 1.0e6],
        [-1800, -1000, -800, -600, -500],
        "o--",
    ),
    "DiffRL BPTT, read off the paper's figure": ([3.0e5, 6.0e5, 1.0e6], [-1450, -1400, -800], "s:"),
    "calibration: analytic model, cart 1 kg, pole 10 kg (mean of 5)": ([1.02e6], [-431.0], "^"),
}
"""Xu et al. 2022, Figure (cartpole swing-up), read by eye (roughly +-50); the calibration of
../shared/docs/background.md section 10 (another system: cart 1 kg, pole 10 kg)."""


def plot(curves: dict, path: Path, reference: dict | None) -> None:
    """Two panels against simulated steps: the return over one episode (with ``reference``) and
    the upright fraction over twice the episode; each method's mean, its seeds' range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, up) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    colours = {"shac": "tab:blue", "windows": "tab:orange", "bptt": "tab:green"}
    labels = {"shac": "SHAC", "windows": "windows, no critic", "bptt": "full BPTT"}
    low = 0.0
    for method, runs in curves.items():
        first = next(iter(runs.values()))
        steps = np.array([p["steps"] for p in first])
        # the longer of the two evaluation horizons: twice the episode
        upright_key = max((k for k in first[-1] if k.startswith("upright_")), key=lambda k: int(k.split("_")[1]))
        for axis, key in ((ax, "return"), (up, upright_key)):
            values = np.array([[p[key] for p in run] for run in runs.values()])
            mean = values.mean(axis=0)
            axis.fill_between(steps, values.min(axis=0), values.max(axis=0), color=colours[method], alpha=0.2)
            axis.plot(steps, mean, color=colours[method], label=f"{labels[method]} ({len(runs)} seeds)")
            if key == "return":
                low = min(low, float(mean.min()))
    if reference:
        for name, (steps, values, style) in reference.items():
            ax.plot(steps, values, style, color="black", label=name, markersize=5)
    if low < -3000:  # keep the methods' later differences readable; say what is cut
        ax.set_ylim(-3000, 100)
        ax.set_title(f"(the axis stops at -3000; the lowest mean is {low:.0f})", fontsize=8)
    ax.set_ylabel("return over one episode (64 held-out starts)")
    up.set_ylabel(f"upright fraction over {upright_key.split('_')[1]} steps (64 held-out starts)")
    up.set_ylim(-0.03, 1.03)
    for axis in (ax, up):
        axis.set_xlabel("simulated steps (steps x worlds)")
        axis.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    up.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="cartpole_swingup")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--methods", nargs="+", default=["shac", "windows", "bptt"])
    parser.add_argument("--episode", type=int, default=240, help="env.horizon: steps per episode")
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1_024_000, help="simulated steps per run")
    parser.add_argument("--runs", type=Path, default=Path("/tmp/study"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "shac_swingup")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--extra", nargs="*", default=[], help="further overrides for every run")
    parser.add_argument("--reference", action="store_true", help="mark DiffRL's published SHAC/BPTT returns")
    parser.add_argument("--plot-only", action="store_true", help="redraw <out>.png from <out>.json")
    args = parser.parse_args()
    if args.plot_only:
        data = json.loads(args.out.with_suffix(".json").read_text())
        curves = {m: {int(s): p for s, p in runs.items()} for m, runs in data["curves"].items()}
        plot(curves, args.out.with_suffix(".png"), REFERENCE if args.reference else None)
        return

    jobs, per_iteration = [], {}
    for method in args.methods:
        for seed in args.seeds:
            overrides, per_iteration[method] = method_overrides(
                method, args.env, args.episode, args.window, args.worlds, args.steps, args.extra
            )
            jobs.append((args.runs / f"{args.env}_{method}_s{seed}", [*overrides, f"seed={seed}"]))
    train_all(jobs, args.parallel)

    curves: dict[str, dict[int, list]] = {}
    table: dict[str, dict[int, dict]] = {}
    for (folder, _), (method, seed) in zip(jobs, [(m, s) for m in args.methods for s in args.seeds], strict=True):
        if not _finished(folder):
            print(f"{folder.name}: not finished, left out", flush=True)
            continue
        points = evaluate_checkpoints(folder, args.episode, (args.episode, 2 * args.episode))
        for point in points:
            point["steps"] = point["iteration"] * per_iteration[method]
        summary = json.loads((folder / "summary.json").read_text())
        curves.setdefault(method, {})[seed] = points
        table.setdefault(method, {})[seed] = {**points[-1], "wall_time_s": summary["wall_time_s"]}
        upright = points[-1][f"upright_{2 * args.episode}"]
        print(f"{folder.name}: return {points[-1]['return']:.1f}, upright over {2 * args.episode} steps {upright:.3f}, "
              f"{summary['wall_time_s']:.0f} s", flush=True)  # fmt: skip

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"curves": curves, "table": table}, indent=1) + "\n")
    plot(curves, args.out.with_suffix(".png"), REFERENCE if args.reference else None)
    seeds = args.seeds
    print("\n| method | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    for method, rows in table.items():
        cells = []
        for s in seeds:
            row = rows.get(s)
            if row is None:
                cells.append("n/a")
                continue
            upright = row[f"upright_{2 * args.episode}"]
            cells.append(f"{row['return']:.0f}, {upright:.2f}, {row['wall_time_s'] / 60:.1f} min")
        print(f"| {method} | " + " | ".join(cells) + " |")
    print(f"\n(return over {args.episode} steps, upright fraction over {2 * args.episode}, training wall time)")
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
