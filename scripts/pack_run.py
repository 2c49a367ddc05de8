"""Pack what a stopped run needs to go on elsewhere into a small folder: its ``config.yaml``, its
Hydra record (``.hydra/``), its newest checkpoint, and the scalars of the tags it is told to keep
(``--keep``, by default ``episode/``: the curves scripts/plot_ant.py reads) in one TensorBoard
event file with their steps and wall times.

A long run's folder is mostly its event file (the Ant's 128-world SHAC: 14 MB at iteration 1500,
per-iteration scalars, histograms and images) and the checkpoints it keeps (350 kB each); the
pack is one checkpoint and a few kB of events, small enough to carry where a run folder would be
lost (a machine that is replaced between two sessions). The run continues from the pack as from
its own folder, bit for bit (``resume=auto``: tests/test_pack_run.py); the scalars left behind
are missing from its curves up to the checkpoint. Stop the run first (SIGTERM writes a checkpoint
at the iteration it stops after), and copy the pack to a folder outside the repository that does
not exist yet, so that the resumed run writes there::

    mkdir -p docs/data/runs
    .venv/bin/python scripts/pack_run.py /work/runs/shac_w128_s1 docs/data/runs/ant_shac_w128_s1
    mkdir -p /work/runs && cp -r docs/data/runs/ant_shac_w128_s1 /work/runs/shac_w128_s1   # the other machine
    .venv/bin/python -m harness train +env=ant task=shac seed=1 env.world_count=128 resume=auto \\
        hydra.run.dir=/work/runs/shac_w128_s1

The pack is written into a hidden folder beside ``out`` and renamed into place once whole and its
copied checkpoint read back: an ``out`` that holds anything is refused, and a refused or failed
pack leaves nothing behind (a pack killed part-way leaves its hidden ``.<out>.partial-*`` folder).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: harness is importable


def pack(run: Path, out: Path, keep: list[str]) -> dict:
    """Write the pack of ``run`` to ``out`` (which must not exist, or be an empty folder);
    returns what it holds: the checkpoint's iteration, its file and the scalars kept per tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from harness import checkpoint
    from harness.events import EventWriter

    newest = checkpoint.resolve("auto", run)
    if newest is None:
        raise ValueError(f"run: '{run}' has no checkpoint to go on from (looked in {checkpoint.checkpoint_dir(run)})")
    saved = checkpoint.load(newest, field="run")  # the checksum and the arrays, before anything is written
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    tags = [tag for tag in events.Tags()["scalars"] if any(tag.startswith(prefix) for prefix in keep)]
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        partial.chmod(0o755)  # mkdtemp's is the owner's alone
        (partial / "checkpoints").mkdir()
        shutil.copy2(run / "config.yaml", partial / "config.yaml")
        if (run / ".hydra").is_dir():
            shutil.copytree(run / ".hydra", partial / ".hydra")
        shutil.copy2(newest, partial / "checkpoints" / newest.name)
        checkpoint.load(partial / "checkpoints" / newest.name, field="run")  # the bytes copied are whole
        kept: dict[str, int] = {}
        writer = EventWriter(partial)
        for tag in tags:  # what the resumed run will not log again: the steps up to its checkpoint
            points = [e for e in events.Scalars(tag) if e.step <= saved.iteration]
            for e in points:
                writer.scalars(e.step, {tag: e.value}, wall_time=e.wall_time)
            kept[tag] = len(points)
        writer.close()
        os.replace(partial, out)  # an empty out (checked by the caller) is replaced
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return {"iteration": saved.iteration, "checkpoint": newest.name, "scalars": kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder of python -m harness train")
    parser.add_argument("out", type=Path, help="the pack's folder (new, or empty)")
    parser.add_argument("--keep", action="append", default=None,
                        help="keep the scalars whose tag starts with this (repeatable; default: episode/)")  # fmt: skip
    args = parser.parse_args()
    if not (args.run / "config.yaml").is_file():
        parser.error(f"run: '{args.run}' is not a run folder of python -m harness train (no config.yaml)")
    out = args.out.resolve()  # a symlink's target, '.' by its name
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        parser.error(f"out: '{args.out}' exists and is not an empty folder; accepted: a new or empty folder")
    if not out.parent.is_dir():
        parser.error(f"out: its parent folder '{out.parent}' does not exist")
    if out == args.run.resolve() or args.run.resolve() in out.parents:
        parser.error(f"out: '{args.out}' is inside the run folder '{args.run}'; accepted: a folder outside it")
    try:
        found = pack(args.run, out, args.keep or ["episode/"])
    except ValueError as exc:  # harness.checkpoint.CheckpointError is one
        parser.error(str(exc))
    except (OSError, shutil.Error) as exc:  # unreadable, unwritable, a dangling link: nothing left behind
        parser.error(f"out: cannot pack into '{args.out}': {str(exc).splitlines()[0][:300]}")
    scalars = ", ".join(f"{tag} {count}" for tag, count in found["scalars"].items()) or "none"
    where = f"at iteration {found['iteration']} ({found['checkpoint']})"
    print(f"packed {args.run} {where} into {args.out}; scalars: {scalars}")


if __name__ == "__main__":
    main()
