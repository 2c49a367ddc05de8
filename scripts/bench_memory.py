"""Peak memory and time of one cartpole training iteration against the horizon: the full
tape against segments (``memory.segment_steps``), each configuration in a fresh process.

Each child builds the cartpole (``world_count`` worlds, the upright loss, Adam, norm clip
at 1) through the harness's own TrainStep, runs ``--iterations`` training iterations
(eagerly, or with ``--capture`` the first eagerly and the rest replayed from the captured
graphs: with segments, one graph per kind of segment, :class:`harness.memory.SegmentGraphs`;
scripts/bench_segment_graph.py compares that with eager segments and with one graph of all
segments) and
reports its peak resident memory (``ru_maxrss``: the whole process, Python, Warp and Newton
included) and the median time of the iterations after the first (kernels come from Warp's
cache, so the first iteration is no longer a compile). Ratios are taken between runs of this
one invocation.

Run:
    python scripts/bench_memory.py                     # table + docs/img/memory_vs_horizon.png
    python scripts/bench_memory.py --long              # also a 100,000-step, 1-world iteration
    python scripts/bench_memory.py --one 2000 4 auto   # one child, prints JSON
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HORIZONS = (500, 1000, 2000, 5000, 10_000, 20_000)
FULL_TAPE_LIMIT = 10_000
"""Longest horizon the full tape is run at (20,000 steps at 4 worlds would take about 4 GB)."""


def one(horizon: int, worlds: int, segments: str, iterations: int, capture: bool) -> dict:
    """Runs in the child: build, train ``iterations`` iterations, measure."""
    sys.path.insert(0, str(ROOT))
    import harness  # noqa: F401  (quiet Warp start-up)
    from harness.config import resolve_segment_steps
    from tests.helpers import make_trainer

    steps = resolve_segment_steps(
        None if segments == "full" else segments if segments == "auto" else int(segments), horizon
    )
    kw = {} if steps is None else {"segment_steps": steps}
    trainer = make_trainer(
        horizon=horizon, world_count=worlds, iterations=iterations, log_every=iterations, lr=0.01, max_norm=1.0,
        capture=capture, **kw,
    )  # fmt: skip
    step = trainer.step
    step.set_iteration(0)
    times = []
    for it in range(iterations):
        if capture and it == 1:
            step.capture()
        start = time.perf_counter()
        step.run()
        times.append(time.perf_counter() - start)
    loss = float(step.read_rows(0, iterations - 1)[-1][0])
    return {
        "horizon": horizon,
        "worlds": worlds,
        "segment_steps": steps,
        "capture": capture,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "iteration_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "last_loss": loss,
    }


def child(horizon: int, worlds: int, segments: str, iterations: int, capture: bool) -> dict:
    command = [sys.executable, __file__, "--one", str(horizon), str(worlds), segments, "--iterations", str(iterations)]
    if capture:
        command.append("--capture")
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for (label, capture), style in zip(
        ((name, cap) for name in ("full tape", "segments (auto)") for cap in (False, True)),
        ("o-", "o--", "s-", "s--"),
        strict=True,
    ):
        full = label == "full tape"
        picked = [r for r in rows if (r["segment_steps"] is None) == full and r["capture"] == capture]
        if not picked:
            continue
        name = f"{label}, {'one captured graph' if capture else 'eager'}"
        x = [r["horizon"] for r in picked]
        left.plot(x, [r["peak_rss_mib"] / 1024 for r in picked], style, label=name)
        right.plot(x, [r["iteration_s"] for r in picked], style, label=name)
    left.axhline(1.2, color="grey", lw=0.8, ls=":")
    left.text(520, 1.25, "1.2 GiB", color="grey", fontsize=8)
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for ax, title, unit in ((left, "peak resident memory", "GiB"), (right, "time per iteration", "s")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(plain)
            # minor labels only where the axis spans less than a decade (memory)
            axis.set_minor_formatter(plain if (ax is left and axis is ax.yaxis) else FuncFormatter(lambda *_: ""))
        ax.set_xlabel("horizon [steps]")
        ax.set_ylabel(unit)
        ax.set_title(f"cartpole, {rows[0]['worlds']} worlds: {title}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=3, metavar=("HORIZON", "WORLDS", "SEGMENTS"))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--capture", action="store_true")
    parser.add_argument("--worlds", type=int, default=4)
    parser.add_argument("--horizons", type=int, nargs="*", default=list(HORIZONS))
    parser.add_argument("--long", action="store_true", help="also one 100,000-step, 1-world iteration with segments")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "img" / "memory_vs_horizon.png"))
    args = parser.parse_args()
    if args.one:
        horizon, worlds, segments = args.one
        print(json.dumps(one(int(horizon), int(worlds), segments, args.iterations, args.capture)))
        return

    rows = []
    print(f"{'horizon':>8} {'K':>5} {'capture':>7} {'peak MiB':>9} {'iter s':>8} {'last loss':>12}")
    for horizon in args.horizons:
        for segments in ("full", "auto"):
            if segments == "full" and horizon > FULL_TAPE_LIMIT:
                continue
            for capture in (False, True):
                row = child(horizon, args.worlds, segments, args.iterations, capture)
                rows.append(row)
                k = row["segment_steps"] or "-"
                print(
                    f"{horizon:>8} {k!s:>5} {capture!s:>7} {row['peak_rss_mib']:>9.0f} {row['iteration_s']:>8.3f} "
                    f"{row['last_loss']:>12.6g}",
                    flush=True,
                )
    for capture in (False, True):
        pair = {r["segment_steps"] is None: r for r in rows if r["horizon"] == 2000 and r["capture"] == capture}
        if len(pair) == 2:
            ratio = pair[False]["iteration_s"] / pair[True]["iteration_s"]
            print(
                f"2000 steps, {'captured' if capture else 'eager'}: "
                f"segments / full tape time per iteration = {ratio:.2f}"
            )
    if args.long:
        row = child(100_000, 1, "auto", 1, False)  # one iteration: it completes, and its peak
        print(
            f"100000 steps, 1 world, K={row['segment_steps']}, eager: peak {row['peak_rss_mib']:.0f} MiB, "
            f"{row['iteration_s']:.1f} s per iteration, loss {row['last_loss']:.6g}"
        )
    plot(rows, Path(args.plot))
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
