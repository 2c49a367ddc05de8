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
        arch: Also compile the sweep's CUDA kernels for ``sm_<arch>``
            (``hydra.callbacks.warm_kernel_cache.arch=90``), on the launching machine whether
            or not it has a GPU: jobs on GPU nodes that share its ``WARP_CACHE_PATH`` compile
            nothing (:mod:`harness.compile`, docs/gpu.md).
    """

    def __init__(self, *, enabled: bool = True, arch: int | None = None) -> None:
        self.enabled = enabled
        self.arch = arch

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled or config.get("env") is None:
            return
        from harness import build
        from harness import compile as kernel_compile
        from harness import config as harness_config

        choices = dict(config.hydra.runtime.choices)
        cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
        with open_dict(cfg):
            cfg.pop("hydra", None)
        harness_config.apply_task_env_defaults(cfg, choices, [])
        start = time.perf_counter()
        try:
            if self.arch is None:
                build.tiny_iteration(cfg, choices)  # every kernel of an iteration
                print(f"kernel cache warmed in {time.perf_counter() - start:.1f} s", flush=True)
                return
            with open_dict(cfg):
                cfg.device = "cpu"  # the modules are found on the CPU, with CUDA's kernels
            with kernel_compile.record_loads(cuda=True, arch=int(self.arch)) as recording:
                build.tiny_iteration(cfg, choices)
        except Exception as exc:  # the jobs report their own refusals and failures, one line each
            line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"kernel cache warm-up skipped ({line})", file=sys.stderr, flush=True)
            return
        print(
            f"kernel cache warmed for sm_{self.arch} in {time.perf_counter() - start:.1f} s "
            f"({len(recording.compiled)} modules compiled, {len(recording.cached)} cached, "
            f"{len(recording.skipped)} left to the jobs)",
            flush=True,
        )


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
RAY_CONNECT_S = 10.0
"""How long :func:`ray_address_problem` tries a TCP connection to a cluster's address (again
while it is refused: the head's Ray Client server opens its port a moment after ``ray start``
returned)."""
RAY_REPLY_S = 15.0
"""How long :func:`ray_address_problem` waits, once a TCP connection was made, for a control
store to answer Ray's first request (``GetClusterId``), or a Ray Client server to take a gRPC
connection."""
RAY_ACCEPTED = (
    "accepted: the address of a running cluster (auto, HOST:6379, ray://HOST:10001), or null for a "
    "private Ray on this machine"
)


def ray_address_problem(init: dict[str, Any]) -> str | None:
    """Why ``ray.init(**init)`` would find no cluster at its address, in words, or None.

    At a ``HOST:PORT`` where no Ray control store (GCS) answers, ``ray.init`` retries for many
    minutes, printing Ray's own warnings; so the address Ray would connect to is checked first,
    as Ray finds it (``RAY_ADDRESS`` for null or ``auto``, then the cluster ``ray start``
    recorded on this machine; ``127.0.0.1`` is this machine's address to Ray): a TCP
    connection within :data:`RAY_CONNECT_S`, then an answer within :data:`RAY_REPLY_S` as
    Ray's own client expects it (:func:`_grpc_reply_problem`; the channel is made as Ray
    makes it, with TLS where ``RAY_USE_TLS`` is set and Ray's token). A ``ray://`` address
    is a Ray Client server's. None when there is no address (a private Ray starts), when
    Ray's own check refuses the address (``ray.init`` says why at once) or when the server
    answered."""
    import socket

    address = init.get("address")
    given = repr(address)
    from_env = os.environ.get("RAY_ADDRESS")
    if from_env and (address is None or address == "auto"):
        address, given = from_env, f"{from_env!r} (RAY_ADDRESS)"
    if address is not None and "://" in str(address):
        scheme, _, target = str(address).partition("://")
        if scheme != "ray":
            return None  # Ray refuses it itself, at once
        client = True
    else:
        from ray._private import services

        try:
            target = services.canonicalize_bootstrap_address(address, init.get("_temp_dir"))
        except Exception:  # no cluster for "auto", a malformed address: ray.init says so at once
            return None
        if target is None:  # a private Ray
            return None
        if address is None:
            given = f"{target!r} (the cluster `ray start` recorded on this machine)"
        client = False
    host, _, port_text = str(target).rpartition(":")
    host = host.strip("[]")
    if not host or not port_text.isdigit():
        return None  # Ray refuses it itself
    where = f"{host}:{port_text}"
    at = "" if where in given else f" at {where}"  # 127.0.0.1 is this machine's address to Ray
    service = "Ray Client server" if client else "Ray control store"
    tried = f"tried a TCP connection to the {service}{at}"
    deadline = time.monotonic() + RAY_CONNECT_S
    while True:
        try:
            with socket.create_connection((host, int(port_text)), timeout=max(deadline - time.monotonic(), 0.1)):
                break
        except socket.gaierror:
            return f"nothing answers at {given}: its host '{host}' is not known to this machine"
        except TimeoutError:
            return f"nothing answers at {given} ({tried} for {RAY_CONNECT_S:g} s: no answer)"
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                return f"nothing answers at {given} ({tried} for {RAY_CONNECT_S:g} s: connection refused)"
            time.sleep(0.25)
        except OSError as exc:  # no route to the host, a network that is down
            return f"nothing answers at {given} ({tried}: {(exc.strerror or type(exc).__name__).lower()})"
    return _grpc_reply_problem(where, given, at, client=client)


def _grpc_reply_problem(where: str, given: str, at: str, *, client: bool) -> str | None:
    """Whether the server at ``where`` (it took a TCP connection) answers as Ray does, within
    :data:`RAY_REPLY_S`: a control store Ray's first request (``GetClusterId``), a Ray Client
    server a gRPC connection (see :func:`ray_address_problem`)."""
    import grpc

    try:
        from ray._private.grpc_utils import init_grpc_channel  # TLS and Ray's token, as Ray connects

        channel = init_grpc_channel(where)
    except Exception:  # another Ray version: a plain channel
        channel = grpc.insecure_channel(where)
    service = "a Ray Client server" if client else "a Ray control store"
    lead = f"something at {given} takes a TCP connection but is not {service}"
    try:
        if client:
            grpc.channel_ready_future(channel).result(timeout=RAY_REPLY_S)
        else:
            call = channel.unary_unary(
                "/ray.rpc.NodeInfoGcsService/GetClusterId",
                request_serializer=lambda request: request,  # an empty GetClusterIdRequest
                response_deserializer=lambda reply: reply,
            )
            call(b"", timeout=RAY_REPLY_S)
    except grpc.FutureTimeoutError:
        return f"{lead} (tried a gRPC connection{at}: no answer in {RAY_REPLY_S:g} s)"
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else None
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return None  # a Ray server that wants Ray's token: ray.init says what it needs
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"{lead} (tried Ray's first request{at}: no answer in {RAY_REPLY_S:g} s)"
        return f"{lead} (tried Ray's first request{at}: the answer was {getattr(code, 'name', code)})"
    finally:
        channel.close()
    return None


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
        problem = ray_address_problem(init)  # before ray.init, which retries for many minutes
        if problem is not None:
            raise ConnectionError(f"hydra.launcher.ray.init.address: {problem}; {RAY_ACCEPTED}")
        try:
            ray.init(**init)
        except Exception as exc:  # a cluster that is not there, or that refused the connection
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
            raise ConnectionError(
                f"hydra.launcher.ray.init.address: Ray at {init.get('address')!r} did not take the sweep "
                f"({type(exc).__name__}: {lines[-1]}); {RAY_ACCEPTED}"
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


# Sweeps on a SLURM cluster (hydra/launcher=submitit_slurm).

SLURM_POLL_S = 5.0
"""How often the launching process asks SLURM (``squeue``) about the jobs that have no result yet."""
SLURM_RESULT_GRACE_S = 30.0
"""How long a job SLURM says completed may take to show its result file (a shared file
system shows another node's files with a delay)."""
SLURM_WAITING = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"}
    | {"RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "PREEMPTED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
)
"""SLURM job states of a job that may still return (``PREEMPTED``: submitit may requeue it)."""


def slurm_error_line(state: str | None, stderr: Path | None) -> str:
    """Why a SLURM job ended without a result, in one line, from its state (None: the job has
    left SLURM's queue and accounting has no record of it)."""
    log = f"; its log: {stderr}" if stderr is not None else ""
    if state == "CANCELLED":
        return "slurm: the job was cancelled by the scheduler (scancel, or an administrator) before it ended"
    if state == "TIMEOUT":
        return "slurm: the job ran past its time limit and was stopped (hydra.launcher.timeout_min)"
    if state == "OUT_OF_MEMORY":
        return "slurm: the job ran out of the memory it asked for (hydra.launcher.mem_gb) and was stopped"
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return "slurm: the node running the job failed"
    if state == "DEADLINE":
        return "slurm: the job reached its deadline and was cancelled"
    if state is None:
        return f"slurm: the job left the queue without a result{log}"
    return f"slurm: the job ended {state} without a result (its batch script or Python failed on the node{log})"


def slurm_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """``{array task id: state}`` of the SLURM jobs ``job_ids`` (``ID_N``) that SLURM still
    knows: ``squeue`` (ended jobs stay listed for the cluster's ``MinJobAge``), else ``sacct``
    (a cluster with accounting); a job neither knows is left out. None when ``squeue`` could
    not answer (the controller busy or unreachable): nothing is known."""
    import subprocess

    arrays = ",".join(sorted({job_id.split("_")[0] for job_id in job_ids}))
    found: dict[str, str] = {}
    commands = (
        ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T", f"--jobs={arrays}"],
        ["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID,State", f"--jobs={arrays}"],
    )
    for command in commands:
        if all(job_id in found for job_id in job_ids):
            break
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            out = None
        if out is None or out.returncode != 0:
            if command[0] == "squeue" and (out is None or "Invalid job id" not in out.stderr):
                return None  # an array SLURM has forgotten is an answer; any other failure is not
            continue
        for line in out.stdout.splitlines():
            job_id, _, state = line.strip().partition("|")
            if job_id and state:
                found.setdefault(job_id, state.split()[0].rstrip("+"))  # sacct: "CANCELLED by 0"
    return found


def launch_on_slurm(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    """Run a sweep's jobs as one SLURM job array through submitit and return one ``JobReturn``
    per job, in order (``launcher``: the harness's ``SlurmLauncher``, hydra-submitit-launcher's
    with this gathering of results).

    The jobs are submitted as hydra-submitit-launcher submits them; a submission SLURM refuses
    (``sbatch: error: ...``) ends the command with one line. Each job's result is read as it
    ends. A job that ends without one (cancelled with ``scancel``, past its time limit, out of
    memory, its node failed: its state from ``squeue``, else ``sacct``, so a cluster without
    accounting works too) prints one line, is recorded as failed (:func:`record_lost_job`) and
    returns nan, as a failed job does; the other jobs go on. Any exception here (a Ctrl-C, a
    SIGTERM) cancels the unfinished jobs with ``scancel`` and is then raised.
    """
    import submitit
    from hydra.core.singleton import Singleton
    from hydra.core.utils import filter_overrides
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    config = launcher.config
    assert config is not None, "setup() comes first"
    params = dict(launcher.params)
    init_keys = {"submitit_folder", "max_num_timeout"}
    executor = submitit.AutoExecutor(
        cluster="slurm", folder=params["submitit_folder"], slurm_max_num_timeout=params.get("max_num_timeout", 0)
    )
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items() if k not in init_keys})
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in config.hydra.sweep:
        os.chmod(sweep_dir, mode=int(str(config.hydra.sweep.mode), 8))

    numbers = range(initial_job_idx, initial_job_idx + len(job_overrides))
    state = Singleton.get_state()
    args = [
        (list(o), "hydra.sweep.dir", n, f"job_id_for_{n}", state) for n, o in zip(numbers, job_overrides, strict=True)
    ]
    import logging

    log = logging.getLogger(__name__)
    log.info(f"Submitit 'slurm' sweep output dir : {sweep_dir}")
    for n, overrides in zip(numbers, job_overrides, strict=True):
        log.info(f"\t#{n} : {' '.join(filter_overrides(overrides))}")
    started = time.time()
    jobs = _submit_to_slurm(executor, launcher, args)

    returns: dict[int, Any] = {}
    ended_at: dict[int, float] = {}
    states: dict[str, str] = {}
    next_poll = 0.0
    try:
        while len(returns) < len(jobs):
            if time.monotonic() >= next_poll:
                answer = slurm_states([job.job_id for i, job in enumerate(jobs) if i not in returns])
                states = states if answer is None else answer
                next_poll = time.monotonic() + SLURM_POLL_S
            for i, job in enumerate(jobs):
                if i in returns:
                    continue
                if job.paths.result_pickle.exists():
                    try:
                        returns[i] = job.results()[0]
                        _echo_job_line(returns[i])
                        continue
                    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as exc:
                        detail = _submitit_error_detail(exc)
                        line = f"slurm: the job failed on its node ({detail}); its log: {job.paths.stderr}"
                else:
                    slurm_state = states.get(job.job_id)
                    if slurm_state in SLURM_WAITING:
                        ended_at.pop(i, None)
                        continue
                    # ended, or no longer known: a result may still be on its way through the file system
                    grace = SLURM_RESULT_GRACE_S if slurm_state in (None, "COMPLETED") else 2 * SLURM_POLL_S
                    if time.monotonic() - ended_at.setdefault(i, time.monotonic()) < grace:
                        continue
                    line = slurm_error_line(slurm_state, job.paths.stderr)
                returns[i] = _lost_slurm_job(launcher, args[i], f"error: {line}", started)
            if len(returns) < len(jobs):
                time.sleep(1.0)
    except BaseException:
        _cancel_slurm_jobs([job for i, job in enumerate(jobs) if i not in returns])
        raise
    return [returns[i] for i in range(len(jobs))]


def _echo_job_line(result: Any) -> None:
    """Print the line of a job that returned failed or diverged (its outcome's, which it printed
    into its own log on its node) in the launching terminal too, as ``[job N: overrides] line``."""
    with contextlib.suppress(Exception):  # a result without a folder (not the harness's train): nothing to say
        folder = OmegaConf.select(result.hydra_cfg, "hydra.runtime.output_dir")
        path = Path(str(folder)) / ".hydra" / OUTCOME_FILE
        outcome = json.loads(path.read_text())
        if outcome.get("status") in ("failed", "diverged") and outcome.get("error"):
            label = f"[job {outcome.get('job')}: {outcome.get('overrides')}]"
            print(f"{label} {outcome['error']}", file=sys.stderr, flush=True)


def _submitit_error_detail(exc: BaseException) -> str:
    """The last line of the traceback submitit reports for a job that raised on its node."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    trace = [x for x in lines if not x.startswith(("-", "You can check", "or at paths", "Job (task="))]
    return trace[-1] if trace else type(exc).__name__


def _submit_to_slurm(executor: Any, launcher: Any, args: list[tuple]) -> list[Any]:
    """Submit the jobs as one array; SLURM's refusal (``sbatch: error: ...``), or no ``sbatch``
    here, as one line (a ``ConnectionError``: the command prints it and exits 1)."""
    from submitit.core.utils import FailedJobError

    try:
        jobs = executor.map_array(launcher, *zip(*args, strict=True))
    except (FailedJobError, OSError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        why = next((x for x in lines if "error" in x.lower()), lines[-1])
        raise ConnectionError(
            f"hydra.launcher: SLURM did not take the sweep's jobs ({why}); accepted: what this cluster has "
            "(partition, account, qos, gpus_per_node or gres, cpus_per_task, mem_gb, timeout_min), "
            "launched where sbatch works"
        ) from None
    print(f"slurm: submitted {len(jobs)} jobs as job array {jobs[0].job_id.split('_')[0]}", flush=True)
    return jobs


def _lost_slurm_job(launcher: Any, job_args: tuple, line: str, started: float) -> Any:
    """A job SLURM ended without a result: its line printed, its outcome recorded as failed in
    its folder (:func:`record_lost_job`), and the ``JobReturn`` of a failed job (nan)."""
    from hydra.core.utils import JobReturn, JobStatus

    overrides, _, number, job_id, _ = job_args
    sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = job_id
        sweep_config.hydra.job.num = number
    folder = job_folder(sweep_config)
    label = f"[job {number}: {sweep_config.hydra.job.override_dirname}]"
    print(f"{label} {line}; its folder: {folder}", file=sys.stderr, flush=True)
    record_lost_job(sweep_config, folder, line, started)
    return JobReturn(
        overrides=list(sweep_config.hydra.overrides.task),
        working_dir=str(folder),
        task_name=str(sweep_config.hydra.job.name),
        status=JobStatus.COMPLETED,
        _return_value=math.nan,
    )


def _cancel_slurm_jobs(jobs: list[Any]) -> None:
    """Cancel a stopped sweep's unfinished SLURM jobs (``scancel``: SLURM signals each running job,
    then kills it after the cluster's ``KillWait``)."""
    if not jobs:
        return
    print(f"slurm: cancelling {len(jobs)} unfinished jobs (scancel)", file=sys.stderr, flush=True)
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["scancel", *[job.job_id for job in jobs]], capture_output=True, timeout=60, check=False)
