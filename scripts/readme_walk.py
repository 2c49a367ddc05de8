"""Walk through README.md as a new user would: every command of its ``bash`` blocks, exactly as
written, on a fresh clone, each checked against what its comment promises.

    python scripts/readme_walk.py                 # clone this checkout's HEAD into a temporary folder
    python scripts/readme_walk.py --keep /tmp/w   # ... into /tmp/w, kept afterwards
    python scripts/readme_walk.py --list          # the commands and the check each one gets
    python scripts/readme_walk.py --only 'sgd'    # make train, then only the commands matching a pattern

The commands run with ``bash`` in the clone's root, with the clone's ``.venv/bin`` first on
``PATH`` after ``make train`` made it (what ``source .venv/bin/activate`` does). The README's
placeholders stand for folders an earlier command made, and are the only words replaced:

- ``<time>``: the name of the run folder ``make train`` wrote (the cartpole with the defaults);
- ``<policy time>``: the name of the run folder the ``task=shac`` line (the first policy) wrote;
- ``<sweep>``: the newest sweep folder, relative to ``multirun/``.

A run's folder is read off its ``run folder: ...`` line. Every command must exit 0 and print no
traceback; :data:`CHECKS` adds, per command, what its comment promises. The whole walk takes
about 25 minutes on a 2-core CPU (``make test`` and the 10,000-step run the longest); it prints
one line per command and a table of times at the end, and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Command:
    line: str  # as written in README.md (continuation lines joined)
    comment: str


@dataclass
class Walk:
    root: Path
    runs: dict[str, Path]  # placeholder -> folder
    out: str = ""  # the last command's stdout + stderr


def readme_commands(text: str) -> list[Command]:
    """Every command of README.md's ``bash`` blocks, with its comment; a line ending in ``\\``
    continues on the next."""
    commands: list[Command] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        pending = ""
        for raw in block.splitlines():
            code, _, comment = raw.partition("  #")
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            if code.rstrip().endswith("\\"):
                pending += code.rstrip()[:-1].rstrip() + " "
                continue
            commands.append(Command((pending + code.strip()).strip(), comment.strip()))
            pending = ""
    return commands


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def run_folder(out: str) -> Path:
    found = re.findall(r"run folder: (\S+)", out)
    assert found, "no 'run folder:' line"
    return Path(found[-1])


def improved(walk: Walk, run: Path) -> dict:
    """A finished run whose final loss is below its initial loss, said so on the done line."""
    s = summary(walk.root / run)
    assert s["status"] == "finished", s["status"]
    assert s["final_loss"] < s["initial_loss"], (s["initial_loss"], s["final_loss"])
    assert f"final loss {s['final_loss']:.6g}" in walk.out and "% lower" in walk.out
    return s


def check_make_train(walk: Walk) -> None:
    run = run_folder(walk.out)
    walk.runs["<time>"] = Path(run.name)  # the README writes outputs/cartpole/<time>
    s = improved(walk, run)
    assert s["iterations"] == 100 and s["env"] == "cartpole"


def check_make_test(walk: Walk) -> None:
    assert re.search(r"\d+ passed", walk.out) and " failed" not in walk.out


def check_overrides(walk: Walk) -> None:
    run = walk.root / run_folder(walk.out)
    improved(walk, run)
    config = (run / "config.yaml").read_text()
    for text in ("horizon: 120", "lr: 0.05", "max_norm: 1", "iterations: 50", "seed: 3", "device: cpu"):
        assert text in config, text


def sweep_jobs(walk: Walk, count: int) -> None:
    sweeps = sorted((walk.root / "multirun").glob("**/multirun.yaml"), key=lambda p: p.stat().st_mtime)
    folder = sweeps[-1].parent
    walk.runs["<sweep>"] = folder.relative_to(walk.root / "multirun")  # the README writes multirun/<sweep>
    jobs = [p for p in folder.iterdir() if (p / "summary.json").exists()]
    assert len(jobs) == count, (folder, len(jobs))
    assert all(summary(job)["status"] == "finished" for job in jobs)


def check_preset_sweep(walk: Walk) -> None:
    sweep_jobs(walk, 15)


def check_gradcheck(walk: Walk) -> None:
    assert "passed" in walk.out.lower() or "worst relative error" in walk.out


def check_gradcheck_ant(walk: Walk) -> None:
    """The Ant's check: a table per contact phase, touchdowns and lift-offs among them, and a pass (which
    other phases the sampled entries fall in varies with the preset: no stance under dflex's damping)."""
    for phase in ("touchdown", "lift-off"):
        assert re.search(rf"^\s+{phase}\s+\d+", walk.out, flags=re.M), phase
    assert re.search(r"worst relative error \S+ \(tolerance \S+\): ok", walk.out), walk.out[-500:]


def check_robot_file(walk: Walk) -> None:
    """A robot file given alone trains: SHAC's iterations finish and the episodes are reported."""
    run = walk.root / run_folder(walk.out)
    s = summary(run)
    assert s["status"] == "finished" and s["env"] == "robot", (s["status"], s["env"])
    assert s["iterations_done"] == 20, s["iterations_done"]
    assert re.search(r"done: return \S+ -> \S+ \(16 worlds, 1000 steps\)", walk.out), walk.out[-500:]


def check_diagnose(walk: Walk) -> None:
    found = re.search(r"wrote (\S+)/diagnose\.json and ", walk.out)
    assert found, walk.out[-2000:]
    report = json.loads((walk.root / found.group(1) / "diagnose.json").read_text())
    assert [h["steps"] for h in report["horizons"]] == [15, 30, 60, 120, 240], report["horizons"]
    assert report["recommended"]["window"] and report["recommended"]["clip_max_norm"] > 0, report["recommended"]
    assert (walk.root / found.group(1) / "diagnose.png").stat().st_size > 0


def check_long_horizon(walk: Walk) -> None:
    s = improved(walk, run_folder(walk.out))
    assert s["segment_steps"] and s["segment_steps"] < 10000, s["segment_steps"]


def check_report(walk: Walk) -> None:
    folder = walk.root / "multirun" / walk.runs["<sweep>"]
    assert list(folder.glob("report*.png")) and list(folder.glob("report*.csv")), sorted(folder.iterdir())


def check_shac(walk: Walk) -> None:
    """The first policy: SHAC swings the pole up and holds it, and the done line says so."""
    run = run_folder(walk.out)
    walk.runs["<policy time>"] = Path(run.name)
    s = summary(walk.root / run)
    assert s["status"] == "finished", s["status"]
    episodes = s["episodes"]
    assert (episodes["worlds"], episodes["steps"]) == (64, 240), episodes
    assert episodes["after"]["upright_fraction"] >= 0.9, episodes["after"]
    assert re.search(r"done: return \S+ -> \S+, upright \S+ -> \S+ \(64 worlds, 240 steps\)", walk.out)


def check_render(walk: Walk) -> None:
    render = walk.root / "outputs" / "cartpole_swingup" / walk.runs["<policy time>"] / "render"
    for name in ("rollout.mp4", "rollout.png", "before.json", "after.json"):
        assert (render / name).stat().st_size > 0, name


def check_evaluate_policy(walk: Walk) -> None:
    run = walk.root / "outputs" / "cartpole_swingup" / walk.runs["<policy time>"]
    report = json.loads((run / "eval.json").read_text())
    env = report["env"]
    assert (env["seed"], env["world_count"], env["horizon"]) == (7, 64, 240), env
    assert "upright_fraction" in report["figures"] and "episode_return" in report["figures"]


def check_record(walk: Walk) -> None:
    assert (walk.root / "outputs" / "traj.npz").stat().st_size > 0
    assert not (walk.root / "traj.npz").exists()


def check_sysid(walk: Walk) -> None:
    s = improved(walk, run_folder(walk.out))
    fitted = s["parameters"]["pole_masses"]
    assert abs(fitted[0] / 0.3 - 1) < 0.02 and abs(fitted[1] / 0.2 - 1) < 0.02, fitted
    assert re.search(r"pole_masses: start \[0.25, 0.25\] -> fitted \[[^]]+\] \(truth \[0.3, 0.2\]\)", walk.out)


CHECKS: list[tuple[str, Callable[[Walk], None]]] = [
    (r"^make train$", check_make_train),
    (r"^make test$", check_make_test),
    (r"\+env=cartpole_swingup task=shac$", check_shac),
    (r"^python -m harness evaluate outputs/cartpole_swingup/<policy time> ", check_evaluate_policy),
    (r"^python -m harness render outputs/cartpole_swingup/<policy time>$", check_render),
    (r"^python -m harness train \+env=cartpole env\.horizon=120 ", check_overrides),
    (r"^python -m harness gradcheck \+env=cartpole ", check_gradcheck),
    (r"^python -m harness gradcheck \+env=ant$", check_gradcheck_ant),
    (r"^python -m harness train \+env=robot env\.asset=", check_robot_file),
    (r"^python -m harness record ", check_record),
    (r"task=sysid ", check_sysid),
    (r"^python -m harness diagnose ", check_diagnose),
    (r"\+experiment=cartpole_clip_sweep$", check_preset_sweep),
    (r"^python -m harness report multirun/<sweep>$", check_report),
    (r"env\.horizon=10000 ", check_long_horizon),
]
"""What each README command's comment promises, by a pattern of the command."""


def check_for(command: Command) -> Callable[[Walk], None]:
    found = [check for pattern, check in CHECKS if re.search(pattern, command.line)]
    if len(found) != 1:
        raise LookupError(f"README command has {len(found)} checks (needs exactly 1): {command.line}")
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="clone into this (new) folder and keep it")
    parser.add_argument("--list", action="store_true", help="list the commands and their checks, run nothing")
    parser.add_argument(
        "--only", metavar="PATTERN", help="run only the commands that match this regular expression (and make train)"
    )
    args = parser.parse_args()
    commands = readme_commands((ROOT / "README.md").read_text())
    checks = [check_for(c) for c in commands]
    if args.only:  # make train stays: it makes the environment the others run in
        keep = [i for i, c in enumerate(commands) if i == 0 or re.search(args.only, c.line)]
        commands, checks = [commands[i] for i in keep], [checks[i] for i in keep]
    if args.list:
        for command, check in zip(commands, checks, strict=True):
            print(f"{check.__name__:<22} {command.line}")
        return
    parent = args.keep or Path(tempfile.mkdtemp(prefix="readme_walk_"))
    clone = parent / "harness" if args.keep is None else parent
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    walk = Walk(clone, {})
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    failures, times = 0, []
    for command, check in zip(commands, checks, strict=True):
        line = command.line
        for placeholder, folder in walk.runs.items():
            line = line.replace(placeholder, str(folder))
        start = time.perf_counter()
        proc = subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        walk.out = proc.stdout + proc.stderr
        try:
            assert proc.returncode == 0, f"exit {proc.returncode}: {walk.out.strip().splitlines()[-3:]}"
            assert "Traceback" not in walk.out, "a traceback"
            check(walk)
            verdict = "ok"
        except Exception as exc:  # every command is tried; the walk fails at the end
            verdict = f"FAILED: {type(exc).__name__}: {exc}"
            failures += 1
        times.append((line, seconds, verdict))
        print(f"{seconds:7.1f} s  {verdict[:100]:<6}  {line}", flush=True)
        (clone / "walk.log").open("a").write(f"$ {line}\n{walk.out}\n[{verdict}, {seconds:.1f} s]\n\n")
    print(f"\n{len(commands) - failures} of {len(commands)} README commands did what their comments say")
    print(f"log: {clone / 'walk.log'}")
    if args.keep is None and not failures:
        shutil.rmtree(parent, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
