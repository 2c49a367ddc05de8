"""Start-up time of the command line: help, config printing, refusals and a 1-iteration run.

Each command runs as a fresh ``python -m harness ...`` process, ``--repeats`` times, in turn
with the others (so a slow spell of the machine hits all of them); the table gives the
median wall time (min - max), the median CPU time (user + system) and the exit code. For
the 1-iteration training run stdout is read line by line as it comes, so a second table
gives when the ``run folder:`` line (the env is built, training is about to start), the
progress line that starts the first iteration and the one with its loss (printed once it
is done) appeared. The kernel cache is warmed by one training run first.

``--baseline DIR`` times the same commands in another copy of the repository as well
(``python -m harness`` imports the package from the folder it runs in), alternating between
the two in every round, and prints both side by side: a before/after comparison on one
machine under the same load. ``--importtime`` runs each command once more under
``python -X importtime`` and lists the packages whose imports took the longest.

Run: python scripts/bench_startup.py [--repeats 5] [--baseline /tmp/before] [--importtime] [--only help cfg-job ...]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMANDS: dict[str, list[str]] = {
    "help": ["--help"],
    "train-help": ["train", "--help"],
    "cfg-job": ["train", "+env=cartpole", "--cfg", "job"],
    "refuse-lr": ["train", "+env=cartpole", "optim.lr=-1"],
    "refuse-env": ["train", "+env=nope"],
    "refuse-clip": ["train", "+env=cartpole", "clip=bogus"],
    "refuse-evaluate": ["evaluate", "/nonexistent"],
    "refuse-render": ["render", "/nonexistent"],
    "refuse-report": ["report", "/nonexistent"],
    "refuse-record": ["record", "+env=cartpole", "env.horizon=-3"],
    "refuse-gradcheck": ["gradcheck", "+env=cartpole", "env.horizon=0"],
    "train-1": ["train", "+env=cartpole", "iterations=1"],
}
"""Every command timed, by its name in the tables (``python -m harness`` and these arguments)."""

TRAIN = "train-1"
STARTED = re.compile(r"^(\[job [^\]]*\] )?\[ *1/\d+\] ")
"""The progress line that starts the first iteration (its warm-up: compiling or loading kernels)."""
DONE = re.compile(r"^(\[job [^\]]*\] )?\[ *1/\d+\] .*loss -?[0-9]")
"""The progress line with the first iteration's loss (``iterations=1`` logs it once it is done)."""
MARKS = {
    "run_folder": "`run folder:` line",
    "first_start": "1st iteration starts",
    "first_done": "1st iteration done",
    "wall": "process exits",
}


def run_once(name: str, root: Path, folder: Path, importtime: bool = False) -> dict:
    """One run of a command in ``root``: wall and CPU time, exit code, the training run's
    marks (:data:`MARKS`); with ``importtime`` also its stderr (the import times)."""
    args = list(COMMANDS[name])
    if name == TRAIN:
        args.append(f"hydra.run.dir={folder / f'run_{time.monotonic_ns()}'}")
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "harness", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    marks: dict[str, float] = {}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            now = time.perf_counter() - start
            if line.startswith("run folder:"):
                marks.setdefault("run_folder", now)
            if STARTED.match(line):
                marks.setdefault("first_start", now)
            if DONE.match(line):
                marks.setdefault("first_done", now)
        code = process.wait()
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        errors.seek(0)
        stderr = errors.read().decode(errors="replace")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "code": code, **marks, "stderr": stderr}


def top_imports(stderr: str, count: int = 5) -> list[tuple[str, float]]:
    """The packages a ``-X importtime`` log spent the most import time in [s]: the self time of
    every module summed by its top-level package (``newton._src.sim`` counts as ``newton``)."""
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not line.startswith("import time:"):
            continue
        self_us = parts[0].removeprefix("import time:").strip()
        if not self_us.isdigit():
            continue  # the header line
        package = parts[2].strip().split(".")[0]
        found[package] = found.get(package, 0.0) + int(self_us) / 1e6
    return sorted(found.items(), key=lambda item: -item[1])[:count]


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of every command (the median is reported)")
    parser.add_argument("--only", nargs="+", choices=list(COMMANDS), help="time only these commands")
    parser.add_argument("--baseline", type=Path, help="another copy of the repository to time alongside")
    parser.add_argument("--importtime", action="store_true", help="also list each command's costliest imports")
    args = parser.parse_args()
    names = args.only or list(COMMANDS)
    roots = {"before": args.baseline.resolve(), "after": ROOT} if args.baseline else {"now": ROOT}

    results: dict[tuple[str, str], list[dict]] = {(r, n): [] for r in roots for n in names}
    imports: dict[tuple[str, str], list[tuple[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        folder = Path(tmp)
        for root in roots.values():
            run_once(TRAIN, root, folder)  # warms the kernel cache and the file system cache
        for round_ in range(args.repeats):
            for name in names:
                order = list(roots.items()) if round_ % 2 == 0 else list(roots.items())[::-1]
                for label, root in order:
                    results[label, name].append(run_once(name, root, folder))
        if args.importtime:
            for label, root in roots.items():
                for name in names:
                    imports[label, name] = top_imports(run_once(name, root, folder, importtime=True)["stderr"])

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; median (min-max) of {args.repeats} runs [s]\n")
    head = "| command | exit |" + "".join(f" {label}: wall | {label}: CPU |" for label in roots)
    print(head)
    print("|---|---|" + "---|---|" * len(roots))
    for name in names:
        codes = sorted({r["code"] for label in roots for r in results[label, name]})
        cells = "".join(
            f" {_spread([r['wall'] for r in results[label, name]])} "
            f"| {statistics.median(r['cpu'] for r in results[label, name]):.2f} |"
            for label in roots
        )
        print(f"| `python -m harness {' '.join(COMMANDS[name])}` | {','.join(map(str, codes))} |{cells}")
    if TRAIN in names:
        print(f"\n`python -m harness {' '.join(COMMANDS[TRAIN])}`: seconds after the process started\n")
        print("| moment |" + "".join(f" {label} |" for label in roots))
        print("|---|" + "---|" * len(roots))
        for mark, text in MARKS.items():
            cells = []
            for label in roots:
                values = [r[mark] for r in results[label, TRAIN] if mark in r]
                cells.append(_spread(values) if values else "")
            print(f"| {text} | " + " | ".join(cells) + " |")
    if args.importtime:
        print("\nImport time by package (`python -X importtime`, self times by top-level package, one run) [s]\n")
        print("| command |" + "".join(f" {label} |" for label in roots))
        print("|---|" + "---|" * len(roots))
        for name in names:
            cells = [", ".join(f"{m} {s:.2f}" for m, s in imports[label, name]) for label in roots]
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
