"""Segments under graph capture: one segment's graph replayed for every segment, against eager
segments (and against the one graph of all segments), each configuration in a fresh process.

Each child builds the cartpole (``world_count`` worlds, ``task=open_loop``, the upright loss,
Adam, norm clip at 1, ``memory.segment_steps=auto``) through the harness's own TrainStep and
runs ``--iterations`` training iterations in one of three modes:

- ``eager``: every iteration eagerly (:func:`harness.memory.segmented_forward_backward`);
- ``graphs``: the first eagerly, the rest replayed from the split capture (one graph per kind
  of segment, :class:`harness.memory.SegmentGraphs`; what ``capture=auto`` does now);
- ``one-graph``: the first eagerly, the rest from one graph of the whole segmented iteration
  (what capture did before: the env's ``segment_graph`` switched off in the child).

It reports the peak resident memory of the whole process (``ru_maxrss``: Python, Warp and
Newton included), the median time of the iterations after the first (after the capture, for
the captured modes), the number of captured graphs, the last logged loss and a hash of the
final parameters (the modes must give the same bits). Ratios are taken between runs of this
one invocation.

Run:
    python scripts/bench_segment_graph.py                         # 2,000 and 10,000 steps, 1/4/64 worlds
    python scripts/bench_segment_graph.py --long                  # also 100,000 steps, 1 world, captured
    python scripts/bench_segment_graph.py --one 2000 4 graphs     # one child, prints JSON
    python scripts/bench_segment_graph.py --horizons 10000 --worlds 4 --adjoint 1e-3
                                                                  # with the in-backward adjoint clip
    python scripts/bench_segment_graph.py --horizons 10000 --worlds 4 --task policy   # an MLP policy [64, 64]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("eager", "graphs", "one-graph")


def one(
    horizon: int, worlds: int, mode: str, iterations: int, adjoint: float | None = None, task: str = "open_loop"
) -> dict:
    """Runs in the child: build, train ``iterations`` iterations, measure."""
    sys.path.insert(0, str(ROOT))
    import harness  # noqa: F401  (quiet Warp start-up)
    from harness.config import resolve_segment_steps
    from harness.tasks import OpenLoop, Policy
    from tests.helpers import make_trainer

    steps = resolve_segment_steps("auto", horizon)
    capture = mode != "eager"
    trainer = make_trainer(
        horizon=horizon, world_count=worlds, iterations=iterations, log_every=iterations, lr=0.01, max_norm=1.0,
        capture=capture, segment_steps=steps, adjoint=None if adjoint is None else {"max_norm": adjoint},
        task=Policy(hidden=[64, 64], action_scale=20.0) if task == "policy" else OpenLoop(),
    )  # fmt: skip
    if mode == "one-graph":
        trainer.env.segment_graph = False  # the fallback: one graph of all segments (decided at capture)
    step = trainer.step
    step.set_iteration(0)
    times, capture_s = [], 0.0
    for it in range(iterations):
        if capture and it == 1:
            capture_s = step.capture()
        start = time.perf_counter()
        step.run()
        times.append(time.perf_counter() - start)
    loss = float(step.read_rows(0, iterations - 1)[-1][0])
    graphs = 0
    if step.graph is not None:
        graphs = 1 if step.segment_graphs is None else len(step.segment_graphs.graphs) + 3  # + head, loss, tail
    return {
        "horizon": horizon,
        "worlds": worlds,
        "segment_steps": steps,
        "mode": mode,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "iteration_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "first_s": times[0],
        "capture_s": capture_s,
        "graphs": graphs,
        "last_loss": loss,
        "params_sha": hashlib.sha256(trainer.params.data.numpy().tobytes()).hexdigest()[:16],
        "adjoint_max_norm": adjoint,
        "task": task,
    }


def child(
    horizon: int, worlds: int, mode: str, iterations: int, adjoint: float | None = None, task: str = "open_loop"
) -> dict:
    command = [sys.executable, __file__, "--one", str(horizon), str(worlds), mode, "--iterations", str(iterations)]
    command += ["--task", task]
    if adjoint is not None:
        command += ["--adjoint", repr(adjoint)]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=3, metavar=("HORIZON", "WORLDS", "MODE"))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--horizons", type=int, nargs="*", default=[2000, 10_000])
    parser.add_argument("--worlds", type=int, nargs="*", default=[1, 4, 64])
    parser.add_argument("--modes", nargs="*", default=["eager", "graphs"], choices=MODES)
    parser.add_argument("--one-graph-at", type=int, nargs="*", default=[4], help="worlds also run as one graph")
    parser.add_argument("--long", action="store_true", help="also 100,000 steps, 1 world, captured (2 iterations)")
    parser.add_argument("--adjoint", type=float, default=None, help="clip.adjoint.max_norm (off by default)")
    parser.add_argument("--task", choices=("open_loop", "policy"), default="open_loop", help="what is trained")
    args = parser.parse_args()
    if args.one:
        horizon, worlds, mode = args.one
        print(json.dumps(one(int(horizon), int(worlds), mode, args.iterations, args.adjoint, args.task)))
        return

    print(
        f"{'horizon':>8} {'worlds':>6} {'K':>4} {'mode':>9} {'peak MiB':>9} {'iter s':>8} {'first s':>8} "
        f"{'capture s':>9} {'graphs':>6} {'last loss':>12} {'params sha':>16}",
        flush=True,
    )
    rows = []

    def report(row: dict) -> None:
        rows.append(row)
        print(
            f"{row['horizon']:>8} {row['worlds']:>6} {row['segment_steps']:>4} {row['mode']:>9} "
            f"{row['peak_rss_mib']:>9.0f} {row['iteration_s']:>8.3f} {row['first_s']:>8.2f} {row['capture_s']:>9.2f} "
            f"{row['graphs']:>6} {row['last_loss']:>12.6g} {row['params_sha']:>16}",
            flush=True,
        )

    for horizon in args.horizons:
        for worlds in args.worlds:
            modes = list(args.modes) + (["one-graph"] if worlds in args.one_graph_at else [])
            for mode in dict.fromkeys(modes):
                report(child(horizon, worlds, mode, args.iterations, args.adjoint, args.task))
    for horizon in args.horizons:
        for worlds in args.worlds:
            found = {r["mode"]: r for r in rows if r["horizon"] == horizon and r["worlds"] == worlds}
            if "eager" in found and "graphs" in found:
                eager, graphs = found["eager"], found["graphs"]
                same = eager["params_sha"] == graphs["params_sha"] and eager["last_loss"] == graphs["last_loss"]
                print(
                    f"{horizon} steps, {worlds} worlds: eager / graphs time per iteration = "
                    f"{eager['iteration_s'] / graphs['iteration_s']:.1f}x; same parameters bit for bit: {same}"
                )
    if args.long:
        report(child(100_000, 1, "graphs", 2, args.adjoint, args.task))


if __name__ == "__main__":
    main()
