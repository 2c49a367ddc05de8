"""The last two diffsim ports against Newton's own examples: the bear's memory and time, the
drone's time per frame.

Bear: Newton's example and ``+env=bear`` (its defaults: segments of about sqrt(horizon) steps,
captured) at ``--frames`` frames, each in a process of its own that reports its peak resident
memory (``getrusage``'s ``ru_maxrss``) and the host seconds of building (the example's includes
capturing its two graphs), of the first iteration (the harness's runs eagerly), of recording
the harness's graphs and of every later iteration. One more process times one eager forward
rollout of the harness's env without a tape (where a segmented iteration's time goes: a forward
pass, then every segment again under its tape with its backward).

Drone: the example's captured ``step()`` (one frame: 20 optimizer steps on 16 rollouts) and the
harness's captured frame (``+env=drone`` with the example's two quirks, the same numbers), in one
process, in interleaved rounds; medians of the per-frame times.

    python scripts/bench_bear_drone.py                     # bear at 300 frames (long: hours on 2 cores), drone
    python scripts/bench_bear_drone.py --frames 10 --iterations 4
    python scripts/bench_bear_drone.py --skip-bear         # the drone only

The machine's load average is printed before and after; timings on a shared machine are only
comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux


def bear_example(frames: int, iterations: int) -> dict:
    import warp as wp

    wp.set_device("cpu")
    import importlib

    import newton.viewer

    module = importlib.import_module("newton.examples.diffsim.example_diffsim_bear")
    args = module.Example.create_parser().parse_args(
        ["--viewer", "null", "--device", "cpu", "--sim-steps", str(frames)]
    )
    t0 = time.perf_counter()
    example = module.Example(newton.viewer.ViewerNull(num_frames=10**9), args)
    wp.synchronize()
    built = time.perf_counter() - t0
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        example.step()
        wp.synchronize()
        times.append(time.perf_counter() - t0)
    return {"build_and_capture_s": built, "iteration_s": times, "losses": [float(x) for x in example.loss_history]}


def bear_harness(frames: int, iterations: int) -> dict:
    import warp as wp

    from harness.build import build_run
    from harness.config import compose_config

    run = build_run(*compose_config("train", ["+env=bear", f"env.frames={frames}", "device=cpu"]))
    t0 = time.perf_counter()
    trainer = run.trainer()
    step = trainer.step
    built = time.perf_counter() - t0
    times, capture_s = [], None
    for it in range(iterations):
        if it == 1:
            capture_s = step.capture()
        t0 = time.perf_counter()
        step.run()
        wp.synchronize()
        times.append(time.perf_counter() - t0)
    losses = step.read_rows(0, iterations - 1)[:, 0].tolist()
    return {
        "build_s": built,
        "segment_steps": run.env.segment_steps,
        "eager_first_iteration_s": times[0],
        "capture_s": capture_s,
        "iteration_s": times[1:],
        "losses": losses,
    }


def bear_forward(frames: int) -> dict:
    """One eager forward rollout of the env without a tape (no segments)."""
    import warp as wp

    from harness.build import build_run
    from harness.config import compose_config
    from harness.tasks import prepare, rollout

    run = build_run(
        *compose_config("train", ["+env=bear", f"env.frames={frames}", "memory.segment_steps=null", "device=cpu"])
    )
    params = prepare(run.env, run.task, run.loss)
    rollout(run.env, run.task, params)  # kernels loaded
    t0 = time.perf_counter()
    rollout(run.env, run.task, params)
    wp.synchronize()
    return {"forward_s": time.perf_counter() - t0}


def drone(frames: int, rounds: int) -> dict:
    import importlib

    import warp as wp

    wp.set_device("cpu")
    import newton.viewer

    from harness.build import build_run
    from harness.config import compose_config

    module = importlib.import_module("newton.examples.diffsim.example_diffsim_drone")
    args = module.Example.create_parser().parse_args(["--viewer", "null", "--device", "cpu"])
    example = module.Example(newton.viewer.ViewerNull(num_frames=10**9), args)
    run = build_run(
        *compose_config("train", ["+env=drone", "task.stale_state=true", "env.example_control_cost=true", "device=cpu"])
    )
    trainer = run.trainer()
    step = trainer.step
    step.run()  # eager, as the trainer's first iteration
    step.capture()
    example.step()
    example.render()

    def theirs() -> None:
        example.step()
        example.render()

    timings: dict[str, list[float]] = {"example": [], "harness": []}
    for _ in range(rounds):
        for name, run_frame in (("example", theirs), ("harness", step.run)):
            t0 = time.perf_counter()
            for _ in range(frames):
                run_frame()
            wp.synchronize()
            timings[name].append((time.perf_counter() - t0) / frames)
    return {name: statistics.median(values) for name, values in timings.items()} | {"rounds": timings}


CHILDREN = {"bear_example": bear_example, "bear_harness": bear_harness, "bear_forward": bear_forward, "drone": drone}


def child(name: str, *args: int) -> dict:
    """Run one measurement in a process of its own; its JSON report with its peak memory."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, __file__, "--child", name, "--out", str(out), *map(str, args)]
        subprocess.run(command, check=True, env=env)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=300, help="bear frames (the example's --sim-steps)")
    parser.add_argument("--iterations", type=int, default=3, help="bear iterations per process")
    parser.add_argument("--drone-frames", type=int, default=20, help="drone frames per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="drone rounds")
    parser.add_argument("--skip-bear", action="store_true")
    parser.add_argument("--skip-drone", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("numbers", nargs="*", type=int, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        report = CHILDREN[a.child](*a.numbers)
        report["peak_rss_mib"] = peak_mib()
        Path(a.out).write_text(json.dumps(report))
        return
    print(f"load average before: {os.getloadavg()}", flush=True)
    if not a.skip_drone:
        found = child("drone", a.drone_frames, a.rounds)
        print(
            f"drone, per frame (20 inner steps x 16 rollouts x 30 steps), medians of {a.rounds} rounds of "
            f"{a.drone_frames}: example {found['example'] * 1e3:.1f} ms, harness {found['harness'] * 1e3:.1f} ms, "
            f"harness / example {found['harness'] / found['example']:.2f}",
            flush=True,
        )
    if not a.skip_bear:
        theirs = child("bear_example", a.frames, a.iterations)
        print(f"bear example, {a.frames} frames: {json.dumps(theirs)}", flush=True)
        ours = child("bear_harness", a.frames, a.iterations)
        print(f"bear harness, {a.frames} frames: {json.dumps(ours)}", flush=True)
        forward = child("bear_forward", a.frames)
        print(f"bear harness, one eager forward without a tape: {json.dumps(forward)}", flush=True)
        same = ours["losses"] == [float(x) for x in theirs["losses"]]
        print(
            f"bear, {a.frames} frames ({a.frames * 80} steps): peak memory example {theirs['peak_rss_mib']:.0f} MiB, "
            f"harness {ours['peak_rss_mib']:.0f} MiB (segments of {ours['segment_steps']} steps); "
            f"iteration example {statistics.median(theirs['iteration_s']):.1f} s (median of {a.iterations}, "
            f"build and capture {theirs['build_and_capture_s']:.0f} s), harness "
            f"{statistics.median(ours['iteration_s']) if ours['iteration_s'] else float('nan'):.1f} s captured "
            f"(first, eager: {ours['eager_first_iteration_s']:.0f} s; recording the graphs "
            f"{ours['capture_s'] or 0:.1f} s; one forward without a tape {forward['forward_s']:.1f} s); "
            f"losses equal: {same}",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
