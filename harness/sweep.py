"""Hydra multirun integration: warm Warp's kernel cache once before the jobs start, and
count how the jobs ended.

Every job of a sweep records its outcome in ``<job>/.hydra/harness_outcome.json``
(:func:`record_outcome`: ``running`` when it starts, then ``finished``, ``failed`` or
``diverged``); a job never ends the sweep, only a signal does. :class:`SweepOutcome` prints
one line at the end counting this launch's outcomes; the command exits 1 when a job failed or
never recorded its end (:data:`LAST_COUNTS`).

Warp compiles each kernel module on first use and caches the binary under
``WARP_CACHE_PATH`` (default ``~/.cache/warp/<version>``). The cache is safe to share:
a process builds into a private temporary folder and renames it into place, and a
process that loses the race keeps the winner's files. But jobs that start together on a
cold cache each compile the same modules (about 25 s for Newton's Featherstone module on
a 2-core CPU). :class:`WarmKernelCache` runs in the launching process when a multirun
starts and records one tiny iteration of the sweep's base configuration, so the jobs
find every heavy module cached.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict


class WarmKernelCache(Callback):
    """Compile the sweep's kernels once, in the launching process, before any job runs.

    Args:
        enabled: Set False (``hydra.callbacks.warm_kernel_cache.enabled=false``) to skip.
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled or config.get("env") is None:
            return
        from harness import build
        from harness import config as harness_config

        choices = dict(config.hydra.runtime.choices)
        cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
        with open_dict(cfg):
            cfg.pop("hydra", None)
        harness_config.apply_task_env_defaults(cfg, choices, [])
        start = time.perf_counter()
        try:
            build.evaluation_config(cfg, build.task_class(cfg))  # one step: no windows
            with open_dict(cfg):
                cfg.env.horizon = 1
                cfg.env.world_count = 1
            run = build.build_run(cfg, choices)
            settings = harness_config.TrainSettings(
                iterations=1, log_every=1, seed=run.settings.seed, device=run.settings.device
            )
            trainer = run.trainer(settings)
            trainer.step.run()  # every kernel of an iteration (a capture records the same kernels)
            trainer.step.log_values()
            trainer.step.evaluate()
        except Exception as exc:  # the jobs report their own refusals and failures, one line each
            line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"kernel cache warm-up skipped ({line})", file=sys.stderr, flush=True)
            return
        print(f"kernel cache warmed in {time.perf_counter() - start:.1f} s", flush=True)


OUTCOME_FILE = "harness_outcome.json"
"""A job's outcome, in its ``.hydra/`` folder (which Hydra rewrites for every launch)."""
STATUSES = ("finished", "failed", "diverged", "running")
"""The outcomes; ``running`` at the end of a sweep means the job was killed."""

LAST_COUNTS: Counter[str] | None = None
"""The outcome counts of the last sweep this process launched (None before one ended)."""


def record_outcome(hydra_cfg: Any, run_dir: Path, status: str, line: str | None) -> None:
    """Write a job's outcome (``status`` one of :data:`STATUSES`, ``line`` its error line)."""
    from harness.runs import write_json

    folder = Path(run_dir) / ".hydra"
    if folder.is_dir():
        record = {"job": int(hydra_cfg.job.num), "overrides": str(hydra_cfg.job.override_dirname)}
        with contextlib.suppress(OSError):  # a full disk: the job's own line said what happened
            write_json(folder / OUTCOME_FILE, {**record, "status": status, "error": line})


def read_outcomes(sweep_dir: Path, *, since: float = 0.0) -> dict[Path, dict[str, Any]]:
    """Every job folder of ``sweep_dir`` with an outcome recorded at or after ``since`` (a file
    time; earlier ones are an earlier launch's), and the outcome."""
    from harness.files import read_small_text

    found: dict[Path, dict[str, Any]] = {}
    for path in sorted(Path(sweep_dir).rglob(f".hydra/{OUTCOME_FILE}")):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < since:
                continue
        try:
            found[path.parent.parent] = json.loads(read_small_text(path, "outcome", accepted="a file"))
        except (OSError, ValueError):
            found[path.parent.parent] = {"status": "running", "error": "unreadable outcome"}
    return found


class SweepOutcome(Callback):
    """Count the jobs' outcomes at the end of a sweep: one line, and :data:`LAST_COUNTS`.

    The outcomes of this launch are those recorded since Hydra wrote the sweep's
    ``multirun.yaml`` (it does, before any job starts); outcome files of an earlier sweep into
    the same folder are neither counted nor touched.
    """

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None
        self.started = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global LAST_COUNTS
        LAST_COUNTS = None
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.started = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global LAST_COUNTS
        if self.sweep_dir is None:
            return
        launched = self.sweep_dir / "multirun.yaml"
        since = launched.stat().st_mtime if launched.is_file() else self.started - 1.0
        outcomes = read_outcomes(self.sweep_dir, since=since)
        counts = Counter(str(o.get("status")) for o in outcomes.values())
        LAST_COUNTS = counts
        parts = [f"{counts[s]} {s}" for s in ("finished", "failed", "diverged") if counts[s] or s != "diverged"]
        if counts["running"]:
            parts.append(f"{counts['running']} ended without an outcome (killed)")
        where = f"{self.sweep_dir}; python -m harness report {self.sweep_dir}"
        print(f"sweep: {len(outcomes)} jobs: {', '.join(parts)} ({where})", flush=True)


def sweep_failed() -> bool:
    """Whether the last sweep of this process had a job that failed or never ended."""
    return LAST_COUNTS is not None and (LAST_COUNTS["failed"] + LAST_COUNTS["running"]) > 0
