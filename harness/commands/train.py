"""``python -m harness train +env=NAME [overrides]``: train, writing TensorBoard events, the
resolved config, checkpoints and summary.json into the run folder.

The command composes the config with Hydra (``configs/train.yaml``), builds the run
(:mod:`harness.build`), trains it (:class:`harness.training.Trainer`) and prints one line at
the end; every refusal is one line and exit 2, an interruption exit 128 + the signal.
Launcher worker processes (joblib, submitit) import :func:`train_command` by name.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config, init_warp, tags
from harness.commands.common import (
    Terminated,
    raise_if_signalled,
    run_dir_override,
    run_hydra,
    stop,
    system_errors_in_one_line,
)

__all__ = ["main", "train_command"]


@hydra.main(version_base="1.3", config_path=str(config.CONFIG_DIR), config_name="train")
def train_command(cfg: DictConfig) -> float:
    """Train and write TensorBoard events, the resolved config, checkpoints and summary.json.

    A single run exits with one line on any refusal or failure. A job of a sweep never ends
    the sweep (a SIGINT or SIGTERM does): a refused, failed or diverged job prints its line,
    records its outcome for the sweep's count (:mod:`harness.sweep`) and returns nan.

    Returns:
        The final loss: the objective a Hydra sweeper (e.g. Optuna) minimises.
    """
    init_warp()  # also in launcher worker processes, which call this function directly
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode.name != "MULTIRUN":
        return _single_run(cfg, hydra_cfg, run_dir)
    from harness import sweep

    # A signal a library turned into an error (the kernel cache warm-up, an earlier job) stops
    # the sweep here, as a Ctrl-C between jobs does.
    raise_if_signalled()
    label = _job_label(hydra_cfg)
    if hydra_cfg.output_subdir is None:  # a resumed sweep: Hydra left every job's .hydra/ alone
        _write_hydra_record(cfg, hydra_cfg, run_dir)
    sweep.record_outcome(hydra_cfg, run_dir, "running", None)  # left as it is if this process is killed
    try:
        final = _train(cfg, hydra_cfg, run_dir, *_prepare(cfg, hydra_cfg, run_dir))
    except JobEnded as exc:
        raise_if_signalled()  # a signal a library turned into the error that ended the job
        print(f"{label} {exc.line}", file=sys.stderr, flush=True)
        sweep.record_outcome(hydra_cfg, run_dir, exc.status, exc.line)
        return math.nan
    except Exception as exc:  # a crash of this job: the sweep goes on (summary.json says what)
        raise_if_signalled()  # unless it was a signal a library turned into an error
        line = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"{label} {line}", file=sys.stderr, flush=True)
        sweep.record_outcome(hydra_cfg, run_dir, "failed", line)
        return math.nan
    sweep.record_outcome(hydra_cfg, run_dir, "finished", None)
    return final


def _write_hydra_record(cfg: DictConfig, hydra_cfg: Any, run_dir: Path) -> None:
    """A job of a resumed sweep (Hydra told to write no ``.hydra/``, so that a job refused
    after Hydra started cannot change its earlier run's record): a job folder that has no
    ``.hydra/overrides.yaml`` yet (a job new to the sweep) gets the three files Hydra would
    have written, so ``evaluate``, ``render`` and the report find it; a job that has one keeps it."""
    from omegaconf import OmegaConf

    from harness.runs import write_bytes

    folder = run_dir / ".hydra"
    if (folder / "overrides.yaml").is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    write_bytes(folder / "config.yaml", OmegaConf.to_yaml(cfg).encode())
    write_bytes(folder / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})).encode())
    write_bytes(folder / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.overrides.task).encode())


def _job_label(hydra_cfg: Any) -> str:
    """``[job 3: clip.max_norm=1]``: what starts every line of a sweep's job."""
    return f"[job {hydra_cfg.job.num}: {hydra_cfg.job.override_dirname}]"


class JobEnded(Exception):
    """A run ended without finishing: ``status`` (``failed``: refused or crashed, or
    ``diverged``), the one ``line`` to print, and the exit ``code`` of a single run (2: bad
    input, 1: failed or diverged)."""

    def __init__(self, status: str, line: str, code: int):
        super().__init__(line)
        self.status, self.line, self.code = status, line, code


def _single_run(cfg: DictConfig, hydra_cfg: Any, run_dir: Path) -> float:
    """One run: every refusal or failure is one line and a non-zero exit (a system error,
    e.g. a full disk: exit 1, :func:`~harness.commands.common.system_errors_in_one_line`)."""
    from harness.runs import LOCK_NAME, RunError, lock_run_folder

    try:  # before anything else: another process may be writing here (then nothing is touched)
        lock_run_folder(run_dir)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    # A single run's folder that Hydra has just made (nothing but .hydra/ in it): removed
    # again when a signal or a refusal comes before training starts, so no empty run is left.
    fresh = cfg.get("resume") is None and {p.name for p in run_dir.iterdir()} <= {".hydra", LOCK_NAME}
    try:
        with system_errors_in_one_line("train"):
            try:
                trainer, extra, episodes = _prepare(cfg, hydra_cfg, run_dir)
                raise_if_signalled()  # one a library swallowed: training's own handlers never see it
            except (KeyboardInterrupt, Terminated) as exc:
                if fresh:
                    shutil.rmtree(run_dir, ignore_errors=True)
                kept = "nothing was kept" if fresh else f"{run_dir} was left as it was"
                name = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
                print(f"train: interrupted by {name} before training started; {kept}", file=sys.stderr)
                stop(143 if isinstance(exc, Terminated) else 130)
            except JobEnded:
                if fresh:  # refused before anything of the run was written
                    shutil.rmtree(run_dir, ignore_errors=True)
                raise
            return _train(cfg, hydra_cfg, run_dir, trainer, extra, episodes)
    except JobEnded as exc:
        print(exc.line, file=sys.stderr, flush=True)
        sys.exit(exc.code)


def _failed(run_dir: Path, resumed: bool, line: str) -> None:
    """Record a failure in summary.json, unless this process continued an earlier run and
    had not yet trained (a resume that fails before its first iteration leaves the run's
    own summary as it was)."""
    from harness.runs import write_json

    if not resumed:
        write_json(run_dir / "summary.json", {"status": "failed", "error": line})


def _train(
    cfg: DictConfig, hydra_cfg: Any, run_dir: Path, trainer: Any, callbacks: list[Any], episodes: Any = None
) -> float:
    import warp as wp

    from harness import checkpoint
    from harness.clip import NonFiniteGradientError
    from harness.runs import write_json
    from harness.training import TrainingDiverged, TrainingInterrupted

    # Jobs of a sweep may run side by side (joblib): label their lines.
    label = _job_label(hydra_cfg) if hydra_cfg.mode.name == "MULTIRUN" else ""
    say = f"{label} " if label else ""
    print(f"{say}run folder: {run_dir}", flush=True)
    try:
        summary = trainer.fit(
            run_dir,
            hparams=config.hparams(cfg, hydra_cfg),
            swept=config.swept_keys(hydra_cfg),
            meta={"config": config.resolved_yaml(cfg)},
            label=label or None,
            callbacks=callbacks,
            episodes=episodes,
        )
    except TrainingInterrupted as exc:
        again = [o for o in hydra_cfg.overrides.task if not o.startswith("resume=")]
        command = shlex.join(["python", "-m", "harness", "train", *again, "resume=auto", run_dir_override(run_dir)])
        print(f"{exc}; summary.json written; continue with: {command}", file=sys.stderr, flush=True)
        sys.exit(128 + exc.signum)
    except TrainingDiverged as exc:  # summary.json (status diverged) is written
        raise JobEnded("diverged", f"error: {exc}", 1) from None
    except checkpoint.CheckpointError as exc:  # refused before training: the run folder stays as it was
        raise JobEnded("failed", f"error: {exc}", 2) from None
    except NonFiniteGradientError as exc:
        write_json(run_dir / "summary.json", {"status": "failed", "error": str(exc)})
        saved = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))
        last = f"; last good checkpoint: {saved[-1]}" if saved else "; no checkpoint was written before it"
        raise JobEnded("failed", f"error: {exc}{last}", 1) from None
    except wp.WarpDeterminismError as exc:  # HARNESS_DETERMINISTIC asked for what a kernel cannot give
        write_json(run_dir / "summary.json", {"status": "failed", "error": str(exc)})
        mode = os.environ.get("HARNESS_DETERMINISTIC", "")
        reason = str(exc).splitlines()[0].split(". ")[0]  # Warp's first sentence names the kernel
        raise JobEnded(
            "failed",
            f"error: HARNESS_DETERMINISTIC={mode}: {reason}; unset HARNESS_DETERMINISTIC to train with "
            "float atomics in any order (results then differ in the last bits between CUDA runs)",
            1,
        ) from None
    except Exception as exc:
        loop = getattr(trainer, "loop", None)
        untrained = loop is None or loop.tally.flushed <= loop.start_iteration
        _failed(run_dir, cfg.get("resume") is not None and untrained, f"{type(exc).__name__}: {exc}")
        raise
    adjoint_logged = tags.ADJOINT_CLIPPED in trainer.step.columns  # the in-backward clip rescales
    found = summary.get("episodes")  # a policy: whole episodes, not the loss of its last window
    change = episode_change(found) if found else loss_change(summary["initial_loss"], summary["final_loss"])
    print(
        f"{say}done: {change}"
        + f", {summary['clipped_steps']} clipped steps"
        + (f" (adjoint clipped in {summary['adjoint_clipped_steps']})" if adjoint_logged else "")
        + f", {summary['wall_time_s']:.1f} s",
        flush=True,
    )
    for line in fitted_lines(trainer, summary):
        print(f"{say}{line}", flush=True)
    return summary["final_loss"]


def _values(value: Any, limit: int = 8) -> str:
    """A short text of an array's values: at most ``limit`` of them, 5 significant digits."""
    import numpy as np

    flat = np.asarray(value, dtype=np.float64).ravel()
    shown = ", ".join(f"{v:.5g}" for v in flat[:limit])
    return f"[{shown}{', ...' if flat.size > limit else ''}]" if flat.size != 1 else shown


def fitted_lines(trainer: Any, summary: dict[str, Any]) -> list[str]:
    """For a task that fits physical quantities (``task=sysid``, ``physical``, ``initial``):
    one line per quantity, ``pole_masses: start [0.25, 0.25] -> fitted [0.3249, 0.1759]``, with
    the true values when the recording carries them (``quantities/<name>``, written by
    ``harness record``)."""
    import numpy as np

    fitted = summary.get("parameters")
    if not fitted:
        return []
    starts = {spec.name: spec.init for spec in trainer.step.state.params.specs}
    reference = getattr(trainer.step.task, "reference", None)  # task=sysid's recording
    truth = getattr(reference, "quantities", {})
    lines = []
    for name, value in fitted.items():
        value = np.asarray(value, dtype=np.float64)
        start = starts.get(name)
        line = f"{name}: " + (f"start {_values(np.broadcast_to(start, value.shape))} -> " if start is not None else "")
        line += f"fitted {_values(value)}"
        if name in truth:
            true = np.asarray(truth[name], dtype=np.float64)
            if true.shape != value.shape and true.ndim == value.ndim + 1 and np.all(true == true[:1]):
                true = true[0]  # one shared value fitted; the recording has it per world
            line += f" (truth {_values(true)})"
        lines.append(line)
    return lines


def _figure(value: Any) -> str:
    """A figure of the done line: whole numbers from 100 on, else 3 significant digits; ``?``
    when unknown (a run resumed from a checkpoint that has no record of it)."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "?" if value is None else str(value)
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def episode_change(episodes: dict[str, Any]) -> str:
    """``return -1620 -> -470, upright 0.00 -> 1.00 (64 worlds, 240 steps)``: a policy's whole
    episodes from the env's own starts before and after training (``summary.json``'s
    ``episodes``); the episodes' loss where the env defines no return."""
    before, after = episodes.get("before") or {}, episodes.get("after") or {}
    if "episode_return" in after:
        parts = [f"return {_figure(before.get('episode_return'))} -> {_figure(after['episode_return'])}"]
    else:
        parts = [f"episode loss {_figure(before.get('loss'))} -> {_figure(after.get('loss'))}"]
    if "upright_fraction" in after:
        start = before.get("upright_fraction")
        parts.append(f"upright {'?' if start is None else f'{start:.2f}'} -> {after['upright_fraction']:.2f}")
    return ", ".join(parts) + f" ({episodes.get('worlds')} worlds, {episodes.get('steps')} steps)"


def loss_change(initial: float, final: float) -> str:
    """``initial loss 0.84 -> final loss 0.19 (77.1% lower)``; a final loss above the initial
    one, or one that is not finite, is said in words (the run made the loss worse)."""
    text = f"initial loss {initial:.6g} -> final loss {final:.6g}"
    if not math.isfinite(final):
        return text + " (not finite: training made the loss worse)"
    if not initial:
        return text
    change = 100 * (1 - final / initial)
    if final > initial:
        more = f"{-change:.1f}% higher" if final < 2 * initial else f"{final / initial:.3g} times the initial loss"
        return text + f" ({more}: training made the loss worse)"
    return text + f" ({change:.1f}% lower)"


def _diagnose_callbacks(cfg: DictConfig, hydra_cfg: Any, trainer: Any) -> list[Any]:
    """``diagnose.every=N``: the callback measuring the gradient every N iterations
    (:class:`harness.diagnose.DiagnoseLog`), on an env, task and loss of its own built from the
    run's config, before training starts (whole rollouts of training's length: a windowed
    policy's window), with ``diagnose.samples`` starts, or training's worlds when every world
    trains its own parameters (or the task refuses the samples' count); and under
    ``task.window=auto`` the one choosing SHAC's gradient window (:class:`harness.auto_window.AutoWindow`).

    Raises:
        JobEnded: One line when the task refuses the measurement's env.
    """
    settings = config.diagnose_settings(cfg)
    adaptive = getattr(trainer.task, "adaptive", False)
    if not settings.every and not adaptive:
        return []
    from harness import build
    from harness.auto_window import AutoWindow
    from harness.diagnose import DiagnoseLog

    per_world = any(spec.world_axis is not None for spec in trainer.step.params.specs)
    worlds = trainer.env.world_count if per_world else settings.samples
    make = build.measurement_maker(cfg, hydra_cfg.runtime.choices)  # as the diagnose command sizes it

    found: list[Any] = []
    if settings.every:
        log = DiagnoseLog(
            settings, make, horizon=trainer.env.horizon, worlds=worlds, training_worlds=trainer.env.world_count
        )
        try:
            log.prepare()
        except (ValueError, config.ConfigError) as exc:
            raise JobEnded("failed", f"error: {config.first_line(exc)}", 2) from None
        found.append(log)
    if adaptive:
        task = trainer.task
        auto = AutoWindow(
            settings, make, floor=task.auto.floor, ceiling=task.auto.ceiling, every=task.auto.every, worlds=worlds,
            training_worlds=trainer.env.world_count, window=task.state(trainer.env)["window"],
            evaluation_state=task.evaluation_state,
        )  # fmt: skip
        try:
            auto.probe(task.auto.ceiling)  # the largest measurement is refused now, not after hours of training
        except (ValueError, config.ConfigError) as exc:
            raise JobEnded("failed", f"error: task.window=auto: {config.first_line(exc)}", 2) from None
        found.append(auto)
    return found


def _prepare(cfg: DictConfig, hydra_cfg: Any, run_dir: Path) -> tuple[Any, list[Any], Any]:
    """The run's trainer, its further callbacks (``diagnose.every``) and a policy's episode
    evaluator (:func:`harness.build.episode_evaluator`), after this process has claimed the
    run folder.

    Raises:
        JobEnded: A refusal (the folder is in use or holds a run; the config, the checkpoint
            to resume from or the env refuses), with its one line.
    """
    from harness import build, checkpoint
    from harness.runs import RunError, claim_run_folder, clear_run_folder
    from harness.training import CaptureError

    multirun = hydra_cfg.mode.name == "MULTIRUN"
    resumed = cfg.get("resume") is not None
    try:  # whatever named the folder (the command line, an experiment, a sweep's job)
        replace = claim_run_folder(run_dir, resume=resumed, overwrite=bool(cfg.get("overwrite")), own_hydra=True)
    except RunError as exc:
        raise JobEnded("failed", f"error: {exc}", 2) from None
    config.apply_task_env_defaults(cfg, hydra_cfg.runtime.choices, list(hydra_cfg.overrides.task))
    try:
        if multirun:  # a job's own sizes (a single run's were checked before Hydra started)
            from harness import limits

            limits.check_memory(cfg, build.validate(cfg, hydra_cfg.runtime.choices))
        run = build.build_run(cfg, hydra_cfg.runtime.choices)
    except config.ConfigError as exc:
        if multirun:  # the sweep's job folder records why
            _failed(run_dir, resumed, str(exc))
        raise JobEnded("failed", f"error: {exc}", 2) from None
    label = f"{_job_label(hydra_cfg)} " if multirun else ""
    print(f"{label}device: {run.settings.device} ({run.device_note})", flush=True)  # the run's first line
    if multirun and run.settings.resume is not None:  # per job: its own checkpoint
        try:
            found = checkpoint.resolve(run.settings.resume, run_dir)
            if found is not None:
                config.check_saved_config(checkpoint.load(found), cfg, found)
        except (config.ConfigError, checkpoint.CheckpointError) as exc:
            raise JobEnded("failed", f"error: {exc}", 2) from None  # the job folder's own summary stays
    try:
        trainer = run.trainer()
    except (
        CaptureError,
        ValueError,
    ) as exc:  # ValueError: a task's check against the built env (a recording's initial state)
        raise JobEnded("failed", f"error: {str(exc).splitlines()[0]}", 2) from None
    callbacks = _diagnose_callbacks(cfg, hydra_cfg, trainer)
    episodes, why = build.episode_evaluator(cfg, hydra_cfg.runtime.choices)
    if why is not None:
        print(f"{label}episodes: not reported (the done line gives the window loss): {why}", flush=True)
    if replace:  # overwrite=true: the earlier run goes only now that this one passed every check
        clear_run_folder(run_dir)
    if not (run_dir / "config.yaml").exists():
        from harness.runs import write_bytes

        write_bytes(run_dir / "config.yaml", config.resolved_yaml(cfg).encode())
    return trainer, callbacks, episodes


def main(rest: list[str]) -> None:
    """``python -m harness train [overrides] [hydra flags]``."""
    run_hydra("train", "train", train_command, rest)
