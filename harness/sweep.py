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

:func:`launch_on_ray` runs a sweep's jobs on a Ray cluster (``hydra/launcher=ray``; the
Hydra plugin that calls it is ``hydra_plugins/harness_ray_launcher``): every job ends with an
outcome, also one lost with its node, and a Ctrl-C stops the jobs with a checkpoint each.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
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


# Sweeps on a Ray cluster (hydra/launcher=ray).

RAY_FORWARDED = ("WARP_CACHE_PATH", "HARNESS_CONFIG_PATH", "HARNESS_DETERMINISTIC", "HARNESS_WARP_LOG_LEVEL")
"""Environment variables of the launching process that every Ray job gets too (its
``runtime_env``): a job on a node started long before sees the kernel cache the warm-up
filled, the user's config folders and the determinism asked for. The job's own
``hydra.launcher.ray.remote.runtime_env.env_vars`` win over these."""

STOP_GRACE_S = 120.0
"""How long a stopped sweep waits for its running jobs to write their checkpoints."""
LOG_SETTLE_S = 1.0
"""How long the launching process waits after the last job before it goes on: Ray forwards the
jobs' lines from the nodes with a delay, and the sweep's count line should come after them."""


def ray_job(hydra_context: Any, sweep_config: DictConfig, task_function: Any, singleton_state: dict) -> Any:
    """One job of a sweep in a Ray worker process: Hydra's own ``run_job``, as the basic
    launcher runs it in the launching process (the job's folder is ``hydra.sweep.dir`` /
    ``hydra.sweep.subdir``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    return run_job(
        hydra_context=hydra_context,
        task_function=task_function,
        config=sweep_config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def ray_remote_options(remote: DictConfig | None) -> dict[str, Any]:
    """``hydra.launcher.ray.remote`` as ``ray.remote`` options, with :data:`RAY_FORWARDED`
    added to the ``runtime_env``'s ``env_vars``."""
    options = dict(OmegaConf.to_container(remote, resolve=True) or {}) if remote is not None else {}
    forwarded = {name: os.environ[name] for name in RAY_FORWARDED if os.environ.get(name)}
    if forwarded:
        runtime_env = dict(options.get("runtime_env") or {})
        runtime_env["env_vars"] = {**forwarded, **dict(runtime_env.get("env_vars") or {})}
        options["runtime_env"] = runtime_env
    return options


def ray_error_line(exc: BaseException) -> str:
    """Why a job on Ray never returned, in one line."""
    from ray import exceptions as ray_errors

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, ray_errors.TaskCancelledError):
        return "ray: the job was cancelled before it ended"
    if isinstance(exc, ray_errors.NodeDiedError):
        return "ray: the node running the job left the cluster (stopped, or its machine went down)"
    if isinstance(exc, ray_errors.OutOfMemoryError):
        return "ray: Ray's memory monitor killed the job (the node ran out of memory)"
    if isinstance(exc, ray_errors.WorkerCrashedError):
        return "ray: the process running the job died (its node stopped, or it was killed or crashed)"
    if isinstance(exc, ray_errors.RayTaskError):
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else None
        if isinstance(cause, ray_errors.RayError) and cause is not exc:
            return ray_error_line(cause)
        text = str(cause) if cause is not None else first
        lines = [line for line in text.strip().splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else type(exc).__name__
        return f"ray: the job failed on its node ({detail}); every node needs the same harness and env code"
    return f"ray: {type(exc).__name__}: {first}"


def job_folder(sweep_config: DictConfig) -> Path:
    """The folder Hydra's ``run_job`` gives a job of a sweep (``hydra.sweep.subdir`` resolves
    through Hydra's ``${hydra:...}``, so the job's config is made Hydra's current one, as
    Hydra's basic launcher does for each job it runs)."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(sweep_config)
    base = str(OmegaConf.select(sweep_config, "hydra.sweep.dir"))
    return Path(os.path.abspath(os.path.join(base, str(OmegaConf.select(sweep_config, "hydra.sweep.subdir")))))


def record_lost_job(sweep_config: DictConfig, folder: Path, line: str, since: float) -> None:
    """Record a job that never returned from Ray as failed with ``line`` in its ``folder``: its
    outcome (unless the job itself recorded an end since ``since``: only its return was
    lost), its ``summary.json`` when it has none, and Hydra's ``.hydra/overrides.yaml`` when the
    job never started, so the count and ``harness report`` list it. A file that cannot be
    written is left out (the line printed says what happened)."""
    from harness.runs import write_bytes, write_json

    hydra_cfg = sweep_config.hydra
    outcome = folder / ".hydra" / OUTCOME_FILE
    with contextlib.suppress(OSError, ValueError):
        if outcome.stat().st_mtime >= since and json.loads(outcome.read_text()).get("status") != "running":
            return
    with contextlib.suppress(Exception):  # a full disk, a folder it cannot reach: the printed line says it
        (folder / ".hydra").mkdir(parents=True, exist_ok=True)
        if not (folder / ".hydra" / "overrides.yaml").exists():
            write_bytes(folder / ".hydra" / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.overrides.task).encode())
        if not (folder / "summary.json").exists():
            write_json(folder / "summary.json", {"status": "failed", "error": line})
        record_outcome(hydra_cfg, folder, "failed", line)


def launch_on_ray(
    ray_cfg: DictConfig,
    config: DictConfig,
    hydra_context: Any,
    task_function: Any,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> list[Any]:
    """Run a sweep's jobs on Ray and return one ``JobReturn`` per job, in order.

    ``ray_cfg.init`` goes to ``ray.init`` (``address``: null, ``auto``, ``HOST:PORT`` or
    ``ray://HOST:10001``), ``ray_cfg.remote`` to ``ray.remote`` for every job
    (:func:`ray_remote_options`). The results are collected as the jobs end. A job that
    never returns (its node left the cluster, its process died, it could not start on its
    node) prints one line, is recorded as failed (:func:`record_lost_job`) and returns nan,
    as a failed job does; the other jobs go on. Any exception here (a Ctrl-C, a SIGTERM)
    first stops the running jobs as a Ctrl-C stops a run (each writes a checkpoint), cancels
    those not started, waits up to :data:`STOP_GRACE_S` for them (a second signal stops at
    once) and is then raised.
    """
    import ray
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
    from ray import exceptions as ray_errors

    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    if not ray.is_initialized():
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        init = OmegaConf.to_container(ray_cfg.init, resolve=True) or {}
        try:
            ray.init(**init)
        except Exception as exc:  # a cluster that is not there, or that refused the connection
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
            raise ConnectionError(
                f"hydra.launcher.ray.init.address: Ray at {init.get('address')!r} did not take the sweep "
                f"({type(exc).__name__}: {lines[-1]}); accepted: the address of a running cluster (auto, "
                "HOST:6379, ray://HOST:10001), or null for a private Ray on this machine"
            ) from None
        finally:
            for sig, handler in handlers.items():  # ray.init installs a SIGTERM handler of its own
                if handler is not None:
                    signal.signal(sig, handler)
    options = ray_remote_options(ray_cfg.get("remote"))
    remote = ray.remote(**options)(ray_job) if options else ray.remote(ray_job)
    started = time.time()
    jobs: dict[Any, tuple[int, DictConfig, Path]] = {}
    for number, overrides in enumerate(job_overrides, start=initial_job_idx):
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"job_id_for_{number}"
            sweep_config.hydra.job.num = number
        ref = remote.remote(hydra_context, sweep_config, task_function, Singleton.get_state())
        jobs[ref] = (number, sweep_config, job_folder(sweep_config))

    returns: dict[Any, Any] = {}
    pending = list(jobs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    returns[ref] = ray.get(ref)
                except ray_errors.RayError as exc:
                    number, sweep_config, folder = jobs[ref]
                    line = f"error: {ray_error_line(exc)}"
                    label = f"[job {number}: {sweep_config.hydra.job.override_dirname}]"
                    print(f"{label} {line}; its folder: {folder}", file=sys.stderr, flush=True)
                    record_lost_job(sweep_config, folder, line, started)
                    returns[ref] = JobReturn(
                        overrides=list(sweep_config.hydra.overrides.task),
                        working_dir=str(folder),
                        task_name=str(sweep_config.hydra.job.name),
                        status=JobStatus.COMPLETED,
                        _return_value=math.nan,
                    )
    except BaseException:
        _stop_ray_jobs(ray, pending)
        raise
    time.sleep(LOG_SETTLE_S)
    return [returns[ref] for ref in jobs]


def _stop_ray_jobs(ray: Any, pending: list[Any]) -> None:
    """Stop a sweep's unfinished jobs: a KeyboardInterrupt in each running one (it stops after
    its iteration and writes a checkpoint, as on Ctrl-C), the rest cancelled; wait up to
    :data:`STOP_GRACE_S` for them, or stop them at once on a second signal."""
    if not pending:
        return
    print(
        f"ray: stopping {len(pending)} unfinished jobs (a running job writes its checkpoint first)",
        file=sys.stderr,
        flush=True,
    )
    for ref in pending:
        with contextlib.suppress(Exception):
            ray.cancel(ref)
    try:
        ray.wait(pending, num_returns=len(pending), timeout=STOP_GRACE_S)
        time.sleep(LOG_SETTLE_S)
    except BaseException:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
