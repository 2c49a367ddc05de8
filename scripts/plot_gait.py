"""How a trained legged robot moves: one held-out world's gait, drawn and counted.

``harness render`` fits the whole path into its frame, so a robot that runs 50 m is a dot; this
looks at the legs. It rolls a run's checkpoint out from a held-out start (``env.seed=7``, one
world, no tape), over ``--start`` + ``--seconds`` of simulated time, and draws the window after
``--start``:

- a film strip over the window's first ``--strip-seconds`` (a stride or two): the robot from the
  side at evenly spaced instants, each drawn about its own base position (so the legs, not the
  distance, are what moves), left to right in time;
- each foot's height (the lowest point of its collision shape above the ground) against time, with
  the steps where it is on the ground (below ``--contact`` m) shaded: a gait diagram;
- the base's forward speed and height.

Every control step is sampled (its end state; the substeps between are not seen), and a foot
counts as on the ground below ``--contact`` (1 cm: a soft contact sinks the foot, and a stance
of a few samples is resolved no finer than the control step). It prints what it counted: the
mean forward speed, each foot's share of samples on the ground (its duty factor), its
touchdowns per second and its highest point in the window, the robot's mass, and the
Froude number ``v^2 / (g h)`` with ``h`` the base's mean height (Alexander 1984: animals walk below
about 0.5, trot or run above, gallop from 2 to 3). A foot is a body whose name matches ``--feet``.
Writes ``<out>.png`` and ``<out>.json``::

    .venv/bin/python scripts/plot_gait.py outputs/quadruped/seed0 --out docs/img/quadruped_gait
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import yaml

GRAVITY = 9.81


def gait(run: str, checkpoint: str | None, start: float, seconds: float, feet: str, contact: float) -> dict:
    """The window's frames and figures (see the module docstring)."""
    from harness.build import trained_run
    from harness.runs import RunFolder
    from harness.video import Scene, sample_frames

    folder = RunFolder(run, "evaluate")
    dt = float(yaml.safe_load((Path(run) / "config.yaml").read_text())["env"]["dt"])
    horizon = round((start + seconds) / dt)
    trained = trained_run(folder, ["env.seed=7", "env.world_count=1", f"env.horizon={horizon}"],
                          checkpoint_name=checkpoint, device="cpu", load=False)  # fmt: skip
    step, env = trained.trainer.step, trained.run.env
    trained.load()
    first = round(start / dt)
    steps = list(range(first, horizon + 1))
    with step.at_eval_params():
        frames, _ = sample_frames(env, step.task, step.params, steps)
    scene = Scene(env.model)
    names = env.layout.body_names
    root, up = env.layout.root_body, scene.up
    direction = np.asarray(env.config.forward, dtype=np.float64)
    forward = int(np.argmax(np.abs(direction)))  # the axis the film strip is drawn along
    foot_bodies = [b for b, name in enumerate(names) if re.search(feet, name)]
    if not foot_bodies:
        raise SystemExit(f"--feet: '{feet}' names no body; accepted: a pattern matching one of {', '.join(names)}")
    clouds = [scene.world_points(frames, k)[0] for k in range(len(steps))]
    shaped = {b for b, _ in clouds[0]}
    if not all(foot in shaped for foot in foot_bodies):
        bare = [names[f] for f in foot_bodies if f not in shaped]
        raise SystemExit(f"--feet: {', '.join(bare)} has no collision shape to stand on; accepted: bodies with one")
    heights = np.array([[min(float(c[:, up].min()) for b, c in cl if b == foot) for foot in foot_bodies]
                        for cl in clouds])  # fmt: skip
    base = frames.body_q[:, root, :3].astype(np.float64)
    time = np.array(steps) * dt
    along = base @ direction  # the base's position along the forward direction
    speed = np.gradient(along, time)
    down = heights < contact
    touchdowns = (np.diff(down.astype(int), axis=0) == 1).sum(axis=0)
    mass = float(env.model.body_mass.numpy().sum())
    mean_speed = float((along[-1] - along[0]) / (time[-1] - time[0]))
    mean_height = float(base[:, up].mean())
    figures = {
        "run": run,
        "checkpoint": str(trained.checkpoint.path),
        "window_s": [float(time[0]), float(time[-1])],
        "sampled_every_s": float(dt),
        "contact_below_m": contact,
        "forward_speed": mean_speed,
        "base_height_mean": mean_height,
        "mass_kg": mass,
        "froude": mean_speed**2 / (GRAVITY * mean_height),
        "feet": {
            names[foot]: {
                "duty_factor": float(down[:, i].mean()),
                "touchdowns_per_s": float(touchdowns[i] / (time[-1] - time[0])),
                "highest_in_window_m": float(heights[:, i].max()),
            }
            for i, foot in enumerate(foot_bodies)
        },
    }
    return {"figures": figures, "time": time, "heights": heights, "down": down, "speed": speed, "base": base,
            "clouds": clouds, "up": up, "forward": forward, "foot_names": [names[f] for f in foot_bodies],
            "root": root}  # fmt: skip


def draw(found: dict, out: Path, snapshots: int, strip_seconds: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Polygon

    from harness.video import hull

    time, up, forward = found["time"], found["up"], found["forward"]
    fig, axes = plt.subplots(3, 1, figsize=(12, 8), gridspec_kw={"height_ratios": [0.8, 1.2, 0.8]})
    strip = axes[0]
    shown = min(len(time) - 1, max(1, round(strip_seconds / (time[1] - time[0]))))
    every = max(1, shown // max(snapshots - 1, 1))  # whole samples apart: evenly spaced instants
    picks = np.arange(0, len(time), every)[:snapshots]
    spacing = 0.0
    for k in picks:  # the widest pose (all its bodies) sets the spacing
        pose = np.concatenate([cloud[:, forward] for body, cloud in found["clouds"][k] if body >= 0])
        spacing = max(spacing, float(np.ptp(pose)))
    spacing *= 1.1
    colours = plt.get_cmap("tab10")
    for j, k in enumerate(picks):
        centre = found["base"][k, forward]
        for body, cloud in found["clouds"][k]:
            if body < 0:
                continue
            points = cloud[:, [forward, up]].copy()
            points[:, 0] += j * spacing - centre
            outline = hull(points)
            if len(outline) >= 3:
                strip.add_patch(Polygon(outline, closed=True, facecolor=colours(j % 10), alpha=0.7,
                                        edgecolor="0.2", linewidth=0.5))  # fmt: skip
        strip.text(j * spacing, -0.08, f"{time[k]:.2f} s", ha="center", va="top", fontsize=8)
    strip.axhline(0.0, color="0.4", linewidth=1.0)
    strip.set_xlim(-spacing, len(picks) * spacing)
    strip.set_ylim(-0.15, None)
    strip.set_aspect("equal")
    strip.set_yticks([0.0, 0.25, 0.5])
    strip.set_xticks([])
    strip.set_ylabel("height [m]")
    figures = found["figures"]
    strip.set_title(
        f"side view every {time[picks[1]] - time[picks[0]]:.4f} s, each pose about its own base position "
        f"(forward speed {figures['forward_speed']:.2f} m/s, Froude {figures['froude']:.2f})",
        fontsize=10,
    )
    feet = axes[1]
    for i, name in enumerate(found["foot_names"]):
        line = feet.plot(time, found["heights"][:, i] + 0.12 * i, label=name, linewidth=1.2)[0]
        down = found["down"][:, i]
        feet.fill_between(time, 0.12 * i, 0.12 * i + 0.1, where=down, color=line.get_color(), alpha=0.25, step="mid")
    feet.set_ylabel("foot height [m]\n(each offset by 0.12 m)")
    feet.set_title(
        f"each foot's lowest point above the ground, every {time[1] - time[0]:.4f} s; shaded: below "
        f"{figures['contact_below_m'] * 100:g} cm (on the ground)",
        fontsize=10,
    )
    feet.legend(loc="upper right", fontsize=8, ncol=len(found["foot_names"]))
    motion = axes[2]
    motion.plot(time, found["speed"], color="tab:blue", label="base forward speed [m/s]")
    motion.set_ylabel("speed [m/s]")
    twin = motion.twinx()
    twin.plot(time, found["base"][:, up], color="tab:green", label="base height [m]")
    twin.set_ylabel("base height [m]")
    motion.set_xlabel("simulated time [s]")
    motion.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)
    for ax in axes[1:]:
        ax.set_xlim(time[0], time[-1])
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a trained run folder (task=shac or task=policy on a robot env)")
    parser.add_argument("--checkpoint", default=None, help="a checkpoint file (default: the newest)")
    parser.add_argument("--start", type=float, default=5.0, help="simulated seconds before the window drawn")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of the window drawn [s]")
    parser.add_argument("--feet", default="SHANK|foot|shin", help="regular expression naming the foot bodies")
    parser.add_argument("--contact", type=float, default=0.01, help="a foot below this height [m] is on the ground")
    parser.add_argument("--snapshots", type=int, default=10, help="poses in the film strip")
    parser.add_argument("--strip-seconds", type=float, default=0.2,
                        help="the film strip's span from the window's start [s]: a stride or two")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="output path without suffix")
    args = parser.parse_args()
    found = gait(args.run, args.checkpoint, args.start, args.seconds, args.feet, args.contact)
    draw(found, args.out, args.snapshots, args.strip_seconds)
    args.out.with_suffix(".json").write_text(json.dumps(found["figures"], indent=2) + "\n")
    print(json.dumps(found["figures"], indent=2))


if __name__ == "__main__":
    main()
