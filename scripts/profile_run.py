"""Where a command's time goes: the host's functions (cProfile) and, on CUDA, the device's
kernels, copies and memsets (Warp's activity timing, ``wp.timing_begin``).

Runs ``python -m harness ARGS`` in this process and prints, at its end, the ``--top`` host
functions by cumulative time and the ``--top`` device operations by total time (count, total,
mean), with the totals by kind. For per-kernel device times pass ``capture=false``: a captured
iteration is one graph launch to Warp's timer (a part the harness captures even then, such as
a loop run by a conditional graph node, stays one ``graph`` row). On the CPU only the host table is printed (a CPU
kernel runs inside the launch call, so cProfile's ``launch`` rows hold the kernels' time).

Run: python scripts/profile_run.py [--top N] [--out DIR] -- train +env=ant task=shac device=cuda
         iterations=6 log_every=3 capture=false
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path


def device_table(results: list, top: int) -> tuple[str, dict]:
    """The device operations by total milliseconds (Warp's ``TimingResult``: name, filter, elapsed)."""
    import warp as wp

    kinds = {
        wp.TIMING_KERNEL: "kernel",
        wp.TIMING_KERNEL_BUILTIN: "builtin kernel",
        wp.TIMING_MEMCPY: "memcpy",
        wp.TIMING_MEMSET: "memset",
        wp.TIMING_GRAPH: "graph",
    }
    by_name: dict[tuple[str, str], list[float]] = defaultdict(list)
    for result in results:
        by_name[(kinds.get(result.filter, str(result.filter)), result.name)].append(float(result.elapsed))
    rows = sorted(by_name.items(), key=lambda item: -sum(item[1]))
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for (kind, _), times in by_name.items():
        totals[kind][0] += len(times)
        totals[kind][1] += sum(times)
    lines = [f"{'total ms':>10} {'count':>8} {'mean us':>9}  kind  name"]
    for (kind, name), times in rows[:top]:
        lines.append(f"{sum(times):10.1f} {len(times):8d} {1e3 * sum(times) / len(times):9.1f}  {kind}  {name[:90]}")
    lines.append("by kind: " + ", ".join(f"{k}: {int(n)} ops, {ms:.1f} ms" for k, (n, ms) in totals.items()))
    summary = {
        "by_kind": {k: {"count": int(n), "ms": ms} for k, (n, ms) in totals.items()},
        "top": [
            {"kind": kind, "name": name, "count": len(times), "total_ms": sum(times)}
            for (kind, name), times in rows[:top]
        ],
    }
    return "\n".join(lines), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="also write profile.json and host.txt here")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the harness command line")
    args = parser.parse_args()
    argv = args.args[1:] if args.args[:1] == ["--"] else args.args
    if not argv:
        parser.error("args: give the harness command line after --, e.g. -- train +env=cartpole device=cuda")

    import warp as wp

    from harness import cli

    wp.init()
    cuda = any(a.startswith("device=cuda") for a in argv)
    if cuda:
        wp.timing_begin(cuda_filter=wp.TIMING_ALL)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    code = 0
    profiler.enable()
    try:
        cli.main(argv)
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # the report still shows where the time went up to the failure
        print(f"profile_run: the command raised {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    finally:
        profiler.disable()
    wall = time.perf_counter() - started
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(args.top)
    host = stream.getvalue()
    print(f"\n== host, {wall:.1f} s wall, exit {code}: top {args.top} by cumulative time ==")
    print(host[host.find("ncalls") :] if "ncalls" in host else host)
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(args.top)
    own = stream.getvalue()
    print(f"== host: top {args.top} by own time ==")
    print(own[own.find("ncalls") :] if "ncalls" in own else own)
    summary: dict = {"argv": argv, "wall_s": wall, "exit": code}
    if cuda:
        table, summary["device"] = device_table(wp.timing_end(), args.top)
        print(f"== device: top {args.top} operations by total time ==")
        print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile.json").write_text(json.dumps(summary, indent=2))
        (args.out / "host.txt").write_text(host + "\n" + own)
    sys.exit(code)


if __name__ == "__main__":
    main()
