"""The table of docs/gpu.md ("On a GPU"): start-up, speed and kernel compiles of training runs on
each device given, within one deadline.

Each row is one ``python -m harness train`` run (a fresh run folder). From its TensorBoard events
(``perf/iter_ms`` at every log step, read back with TensorBoard's own reader) and the wall clock:

- ``first_log_s``: seconds from the command's launch to its first logged iteration (imports, the
  model's build, kernel loads or compiles, graph capture and the first iterations);
- ``its``: iterations per second of the steady state: rows that set ITERATIONS log every
  iteration, and ``its`` is 1 / the median interval between the event wall times of logged
  iterations from the third on (so compiling, capturing and the held-out episodes a run rolls
  out about ten times fall outside it; ``iter_ms_min`` is the shortest interval);
- ``wall_s``: the command's wall seconds; ``train_s``: ``summary.json``'s ``wall_time_s``;
- ``compiled``: the kernel-cache folders the run added (``WARP_CACHE_PATH``), split into CUDA
  modules (a ``.cubin`` or ``.ptx`` inside) and CPU ones (``.o``); ``cuda_binaries_added``: the
  ``.cubin`` and ``.ptx`` files it added, also inside folders that were there. A run that starts
  after ``python -m harness compile ... arch=N`` on a GPU of that arch should add none.

A row's ``cache`` says which kernel cache it ran on: ``shared`` (``WARP_CACHE_PATH`` as given,
warm once an earlier row or ``harness compile`` filled it) or ``cold`` (a fresh empty folder).
Each command has its own timeout, cut to what is left of ``--deadline``; a run that is cut or
fails is reported as such and the table goes on. With ``--long`` the last row trains the named
run until the deadline's end, then stops it with SIGTERM (the harness writes a checkpoint) and
packs its folder (without events) into ``--out``/long_run.tgz, to evaluate elsewhere.

Figures go to ``--out`` (``gpu.json``, ``gpu.md``) as they come, so a machine taken back early
leaves what was measured. Meant for a lent GPU (docs/gpu.md says how to carry the packages); it
runs anywhere: ``python scripts/bench_gpu.py --rows cartpole:4:cpu:20`` checks it on the CPU.

Run: python scripts/bench_gpu.py --rows RUN:WORLDS:DEVICE:ITERATIONS[:cold][@TIMEOUT] ...
     [--set RUN=OVERRIDE ...] [--deadline S] [--timeout S] [--long RUN:WORLDS:DEVICE] [--out DIR]
     RUN is one of cartpole (make train's), swingup (task=shac), ant (task=shac); WORLDS 0 keeps
     the preset's count, ITERATIONS 0 the preset's iterations; DEVICE is cpu, cuda or null (no colon).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUNS = {
    "cartpole": ["+env=cartpole"],
    "swingup": ["+env=cartpole_swingup", "task=shac"],
    "ant": ["+env=ant", "task=shac"],
}
"""Each run's overrides."""


def training_seconds(overrides: list[str], iterations: int, *, timeout: float) -> tuple[float, float]:
    """(``summary.json``'s ``wall_time_s``: from the run's first iteration to its last; the
    command's wall seconds) of one run logging once, at its end (so no held-out episode falls
    inside it): what ``scripts/bench_device_rule.py`` differences."""
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "harness", "train", *overrides, f"iterations={iterations}",
             f"log_every={iterations}", "checkpoint.every=0", "plot_every=null", f"hydra.run.dir={folder}/run"],
            cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"train {' '.join(overrides)} failed ({done.returncode}): {done.stderr.strip()}")
        summary = json.loads((Path(folder) / "run" / "summary.json").read_text())
    return float(summary["wall_time_s"]), time.perf_counter() - started


def cuda_binaries(cache: Path) -> set[str]:
    """The CUDA binaries (``.cubin``, ``.ptx``) in a Warp kernel cache, by path: a module
    compiled for another arch or output lands in the same module folder, so files are counted,
    not folders."""
    if not cache.is_dir():
        return set()
    return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.suffix in (".cubin", ".ptx")}


def cache_folders(cache: Path) -> set[str]:
    """The module folders in a Warp kernel cache (Warp puts them under a version folder or at
    its top, depending on how the path was given)."""
    if not cache.is_dir():
        return set()
    return {str(p.relative_to(cache)) for p in cache.rglob("wp_*") if p.is_dir()}


def kind_of(folder: Path) -> str:
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    if any(n.endswith((".cubin", ".ptx")) for n in names):
        return "cuda"
    if any(n.endswith(".o") for n in names):
        return "cpu"
    return "other"


def read_events(run: Path) -> tuple[list[tuple[int, float]], str]:
    """(step, event wall time) of every ``perf/iter_ms`` event; the events' tag list if none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    if "perf/iter_ms" not in tags:
        return [], ",".join(tags[:8])
    return [(e.step, e.wall_time) for e in acc.Scalars("perf/iter_ms")], ""


def first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


def train_row(
    name: str, worlds: int, device: str, iterations: int, *, cache: Path, timeout: float, extra: list[str]
) -> dict:
    """One training run: the row described in the module docstring."""
    row: dict = {"run": name, "worlds": worlds or "preset", "device": device, "iterations": iterations or "preset"}
    overrides = [*RUNS[name], f"device={device}", "checkpoint.every=0", "plot_every=null"]
    if worlds:
        overrides.append(f"env.world_count={worlds}")
    if iterations:
        overrides += [f"iterations={iterations}", "log_every=1"]
    overrides += extra
    env = {**os.environ, "WARP_CACHE_PATH": str(cache), "PYTHONUNBUFFERED": "1"}
    before, before_cuda = cache_folders(cache), cuda_binaries(cache)
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run"
        launched = time.time()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "harness", "train", *overrides, f"hydra.run.dir={run}"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(timeout, 1.0),
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            row["error"] = f"timed out at {timeout:.0f} s"
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            row["last_output"] = out.strip().splitlines()[-1:] if out else []
            done = None
        row["wall_s"] = round(time.time() - launched, 2)
        if done is not None:
            row["device_line"] = first_line(done.stdout)
            if done.returncode:
                tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
                row["error"] = f"rc {done.returncode}: " + " | ".join(tail)
        if run.is_dir():
            points, tags = read_events(run)
            if points:
                row["first_log_s"] = round(points[0][1] - launched, 2)
                row["first_log_step"] = points[0][0]
                if len(points) >= 4:  # from the third logged iteration: past the eager one and the capture
                    gaps = [(b[1] - a[1]) / max(b[0] - a[0], 1) for a, b in itertools.pairwise(points[2:])]
                    row["iter_ms_median"] = round(1e3 * statistics.median(gaps), 3)
                    row["iter_ms_min"] = round(1e3 * min(gaps), 3)
                    row["its"] = round(1e3 / row["iter_ms_median"], 3)
                    row["intervals"] = len(gaps)
            elif tags:
                row["tags"] = tags
            summary = run / "summary.json"
            if summary.is_file():
                data = json.loads(summary.read_text())
                row["train_s"] = round(float(data.get("wall_time_s", 0.0)), 2)
                row["iterations_done"] = data.get("iterations_done")
                row["final_loss"] = data.get("final_loss")
                row["summary_device"] = data.get("device")
    added = sorted(cache_folders(cache) - before)
    kinds = [kind_of(cache / a) for a in added]
    row["compiled"] = {k: kinds.count(k) for k in ("cuda", "cpu", "other") if kinds.count(k)}
    row["cuda_binaries_added"] = sorted(cuda_binaries(cache) - before_cuda)[:20]
    return row


def long_run(spec: str, *, cache: Path, seconds: float, out: Path) -> dict:
    """Train ``spec`` (RUN:WORLDS:DEVICE) for ``seconds``, then SIGTERM; pack the run folder."""
    name, worlds, device = spec.split(":")
    overrides = [*RUNS[name], f"device={device}", "checkpoint.every=50"]
    if int(worlds):
        overrides.append(f"env.world_count={worlds}")
    env = {**os.environ, "WARP_CACHE_PATH": str(cache), "PYTHONUNBUFFERED": "1"}
    run = Path(tempfile.mkdtemp()) / "long_run"
    row: dict = {"run": name, "worlds": worlds, "device": device, "what": "long", "budget_s": round(seconds, 1)}
    log = (out / "long_run.log").open("w")
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "train", *overrides, f"hydra.run.dir={run}"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        proc.wait(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()
    row["wall_s"] = round(time.time() - started, 1)
    row["rc"] = proc.returncode
    summary = run / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        row.update({k: data.get(k) for k in ("status", "iterations_done", "wall_time_s", "final_loss", "device")})
    if run.is_dir():
        checkpoints = sorted((run / "checkpoints").glob("*.hckpt"))
        with tarfile.open(out / "long_run.tgz", "w:gz") as tar:
            for path in run.rglob("*"):
                if (
                    path.is_file()
                    and "tfevents" not in path.name
                    and (path.suffix != ".hckpt" or path == checkpoints[-1])
                ):
                    tar.add(path, arcname=str(path.relative_to(run.parent)))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="*", default=[], help="RUN:WORLDS:DEVICE:ITERATIONS[:cold][@TIMEOUT]")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds for each command at most")
    parser.add_argument("--deadline", type=float, default=3600.0, help="seconds for the whole script")
    parser.add_argument("--long", default=None, help="RUN:WORLDS:DEVICE trained until the deadline, then SIGTERM")
    parser.add_argument("--long-reserve", type=float, default=40.0, help="seconds kept after the long run")
    parser.add_argument("--out", type=Path, default=Path("gpu_bench"))
    parser.add_argument("--set", nargs="*", default=[], help="RUN=OVERRIDE: an override for that run's rows")
    args = parser.parse_args()
    for spec in args.rows:
        head, _, timeout = spec.partition("@")
        parts = head.split(":")
        if (
            len(parts) not in (4, 5)
            or parts[0] not in RUNS
            or not (parts[1].isdigit() and parts[3].isdigit())
            or (len(parts) == 5 and parts[4] != "cold")
            or (timeout and not timeout.replace(".", "", 1).isdigit())
        ):
            parser.error(
                f"--rows: '{spec}' is not RUN:WORLDS:DEVICE:ITERATIONS[:cold][@TIMEOUT] with RUN in {sorted(RUNS)}, "
                "WORLDS and ITERATIONS whole numbers"
            )
    for item in args.set:
        if item.partition("=")[0] not in RUNS or "=" not in item.partition("=")[2]:
            parser.error(f"--set: '{item}' is not RUN=KEY=VALUE with RUN in {sorted(RUNS)}")
    if args.long is not None:
        parts = args.long.split(":")
        if len(parts) != 3 or parts[0] not in RUNS or not parts[1].isdigit():
            parser.error(f"--long: '{args.long}' is not RUN:WORLDS:DEVICE with RUN in {sorted(RUNS)}")
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    shared = Path(os.environ.get("WARP_CACHE_PATH") or Path.home() / ".cache" / "warp")
    rows: list[dict] = []

    def keep(row: dict) -> None:
        row["at_s"] = round(time.time() - start, 1)
        rows.append(row)
        (args.out / "gpu.json").write_text(json.dumps(rows, indent=2))
        print(json.dumps(row), flush=True)

    for spec in args.rows:
        spec, _, own_timeout = spec.partition("@")
        name, worlds, device, iterations, *cold = spec.split(":")
        left = args.deadline - (time.time() - start) - (args.long_reserve if args.long else 0.0)
        if left < 10:
            keep({"run": name, "worlds": worlds, "device": device, "error": "skipped: no time left"})
            continue
        with tempfile.TemporaryDirectory() as fresh:
            cache = Path(fresh) if cold else shared
            extra = [o for run, o in (item.split("=", 1) for item in args.set) if run == name]
            row = train_row(
                name,
                int(worlds),
                device,
                int(iterations),
                cache=cache,
                timeout=min(float(own_timeout or args.timeout), left),
                extra=extra,
            )
        row["cache"] = "cold" if cold else "shared"
        keep(row)
    if args.long:
        left = args.deadline - (time.time() - start) - args.long_reserve
        if left > 30:
            keep(long_run(args.long, cache=shared, seconds=left, out=args.out))
        else:
            keep({"run": args.long, "what": "long", "error": f"skipped: {max(left, 0):.0f} s left"})
    lines = [
        "| run | worlds | device | cache | first log (s) | it/s (steady) | wall (s) | compiled (cuda/cpu) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.get("what") == "long":
            continue
        its = f"{row['its']:.2f}" if "its" in row else row.get("error", "")[:60]
        compiled = row.get("compiled", {})
        lines.append(
            f"| {row['run']} | {row['worlds']} | {row['device']} | {row.get('cache', '')} "
            f"| {row.get('first_log_s', '')} | {its} | {row.get('wall_s', '')} "
            f"| {compiled.get('cuda', 0)}/{compiled.get('cpu', 0)} |"
        )
    (args.out / "gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
