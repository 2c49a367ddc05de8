"""Draw docs/img/architecture.png: the data flow of one training run and of one iteration.

The boxes name the module that owns each step; the layer table in docs/architecture.md is
printed by ``--layers`` from the import graph that tests/test_architecture.py checks.

Run::

    .venv/bin/python scripts/draw_architecture.py            # writes docs/img/architecture.png
    .venv/bin/python scripts/draw_architecture.py --layers   # prints the modules by layer
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (column, row, width, title, module, colour); rows top to bottom
BOXES = {
    "cli": (0.0, 0, 2.2, "command line", "cli, commands/train", "#dfe9f5"),
    "config": (2.6, 0, 2.2, "compose + validate", "config (Hydra, schemas)", "#dfe9f5"),
    "build": (5.2, 0, 2.2, "typed objects", "build: env, task, loss, rules", "#dfe9f5"),
    "trainer": (7.8, 0, 2.6, "Trainer", "training: groups, state, step, loop", "#dfe9f5"),
    "zero": (0.0, 2, 2.2, "zero every gradient", "training/step, env, loss, task", "#e8f3e0"),
    "rollout": (2.6, 2, 2.8, "rollout on a tape", "tasks: begin, act; env: step, write_observables", "#e8f3e0"),
    "loss": (5.8, 2, 2.0, "loss", "losses: TermKind kernels", "#e8f3e0"),
    "backward": (8.2, 2, 2.2, "backward", "wp.Tape (+ adjoint clip, memory segments)", "#e8f3e0"),
    "stats": (8.2, 4, 2.2, "pre-clip statistics", "stats: FlatStats (post-clip after)", "#fdf1d8"),
    "clip": (5.8, 4, 2.0, "clip", "clip: policy, nonfinite wrapper", "#fdf1d8"),
    "optim": (2.6, 4, 2.8, "schedule -> optimizer -> bounds", "schedules, optim, transform.chain", "#fdf1d8"),
    "row": (0.0, 4, 2.2, "history row", "device scalars at counter % rows", "#fdf1d8"),
    "read": (0.0, 6, 2.2, "read-back (log_every)", "training/loop: tallies", "#f3e3ef"),
    "logs": (2.6, 6, 2.8, "TensorBoard, progress line", "tags, events, callbacks", "#f3e3ef"),
    "ckpt": (5.8, 6, 2.0, "checkpoint", "checkpoint, runs (atomic)", "#f3e3ef"),
    "summary": (8.2, 6, 2.2, "summary.json", "training/loop, runs.write_json", "#f3e3ef"),
}
ARROWS = [
    ("cli", "config"),
    ("config", "build"),
    ("build", "trainer"),
    ("zero", "rollout"),
    ("rollout", "loss"),
    ("loss", "backward"),
    ("backward", "stats"),
    ("stats", "clip"),
    ("clip", "optim"),
    ("optim", "row"),
    ("row", "read"),
    ("read", "logs"),
    ("logs", "ckpt"),
    ("ckpt", "summary"),
]
BAND = {
    0: ("once per run", "#4a6fa5"),
    2: ("every iteration: one captured graph (CPU and CUDA), per parameter group for the update", "#4a8a3a"),
    6: ("outside the graph, at log steps and checkpoint steps", "#8a4a7a"),
}


def draw(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = plt.subplots(figsize=(12.5, 6.6), dpi=110)
    ax.set_xlim(-0.3, 10.7)
    ax.set_ylim(7.4, -1.1)
    ax.axis("off")
    height = 1.05
    centres = {}
    for name, (x, row, width, title, module, colour) in BOXES.items():
        y = row
        box = FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0.02,rounding_size=0.08", fc=colour, ec="0.35")
        ax.add_patch(box)
        ax.text(x + width / 2, y + 0.36, title, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x + width / 2, y + 0.72, module, ha="center", va="center", fontsize=7.2, color="0.25", wrap=True)
        centres[name] = (x, y, width)
    for a, b in ARROWS:
        xa, ya, wa = centres[a]
        xb, yb, wb = centres[b]
        if ya == yb:  # same row: side to side
            left_to_right = xb > xa
            start = (xa + wa, ya + height / 2) if left_to_right else (xa, ya + height / 2)
            end = (xb, yb + height / 2) if left_to_right else (xb + wb, yb + height / 2)
        else:  # down a row
            start = (xa + wa / 2, ya + height)
            end = (xb + wb / 2, yb)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.3, color="0.2"))
    # the trainer starts the loop (an elbow above the iteration's row); the loop repeats
    xa, ya, wa = centres["trainer"]
    xz = centres["zero"][0] + 1.1
    elbow = ya + height + 0.33
    ax.plot([xa + wa / 2, xa + wa / 2, xz], [ya + height, elbow, elbow], color="0.2", lw=1.3)
    ax.add_patch(FancyArrowPatch((xz, elbow), (xz, 2), arrowstyle="-|>", mutation_scale=14, lw=1.3, color="0.2"))
    ax.add_patch(
        FancyArrowPatch(
            (centres["row"][0] + 0.3, 4), (centres["zero"][0] + 0.3, 2 + height), arrowstyle="-|>",
            mutation_scale=14, lw=1.3, color="#4a8a3a", linestyle="--",
        )
    )  # fmt: skip
    ax.text(0.42, 3.52, "next iteration", fontsize=7.5, color="#4a8a3a", ha="left", va="center")
    for row, (label, colour) in BAND.items():
        ax.text(10.4, row - 0.2, label, fontsize=9, color=colour, weight="bold", ha="right")
    ax.set_title("One training run: config -> run -> task/env -> tape -> transforms -> optimizer -> logs", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def layers() -> list[list[str]]:
    """Modules by layer: a module's layer is one above the highest layer it imports (0: imports none)."""
    sys.path.insert(0, str(ROOT))
    from tests.test_architecture import import_graph

    graph = import_graph(ROOT)
    floor: dict[str, int] = {}

    def height(name: str) -> int:
        if name not in floor:
            floor[name] = 0
            floor[name] = 1 + max((height(t) for t in graph[name]), default=-1)
        return floor[name]

    for name in graph:
        height(name)
    found: list[list[str]] = [[] for _ in range(max(floor.values()) + 1)]
    for name, level in floor.items():
        found[level].append(name)
    return [sorted(names) for names in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", action="store_true", help="print the modules by layer instead of drawing")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "architecture.png")
    args = parser.parse_args()
    if args.layers:
        for level, names in enumerate(layers()):
            print(f"{level:2d}  {', '.join(names)}")
        return
    draw(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
