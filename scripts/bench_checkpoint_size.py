"""Checkpoint size against the iteration count: a checkpoint's tally is constant-size (the
loss and norm curves live in the TensorBoard events).

Trains the default cartpole (or ``--overrides``) for the largest iteration count with a
checkpoint at each count asked for, then prints each checkpoint's size and the size it would
have with the earlier tally layout, which carried every loss and pre-clip gradient norm (the
same checkpoint re-saved with those lists, read from the run's events).

    python scripts/bench_checkpoint_size.py 20 200 2000
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("counts", nargs="+", type=int, help="iteration counts to compare")
    parser.add_argument("--overrides", default="+env=cartpole", help="the run's overrides, as one string")
    args = parser.parse_args()
    counts = sorted(args.counts)
    every = math.gcd(*counts)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        train = [sys.executable, "-m", "harness", "train", *args.overrides.split(), f"iterations={counts[-1]}"]
        train += [f"checkpoint.every={every}", f"checkpoint.keep={counts[-1] // every + 1}", "plot_every=null"]
        subprocess.run([*train, f"hydra.run.dir={run}"], check=True, stdout=subprocess.DEVNULL)

        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        from harness import checkpoint as ckpt

        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
        losses = [float(e.value) for e in events.Scalars("loss/total")]
        norms = [float(e.value) for e in events.Scalars("optim/grad_norm_pre")]
        print(f"{'iterations':>10} {'checkpoint':>12} {'earlier layout':>15}")
        for n in counts:
            path = ckpt.checkpoint_dir(run) / f"ckpt_{n:08d}.hckpt"
            saved = ckpt.load(path)
            kept = ("clipped_steps", "skipped_steps", "nonfinite_steps", "adjoint_clipped_steps", "lr_reductions")
            tally = {key: saved.meta["tally"][key] for key in (*kept, "wall_time_s", "initial_figures", "groups")}
            earlier = {**saved.meta, "tally": {"losses": losses[:n], "norms": norms[:n], **tally}}
            old = ckpt.save(ckpt.Checkpoint(arrays=saved.arrays, meta=earlier), Path(tmp) / "old" / str(n), keep=1)
            print(f"{n:>10} {path.stat().st_size:>10} B {old.stat().st_size:>13} B", flush=True)


if __name__ == "__main__":
    main()
