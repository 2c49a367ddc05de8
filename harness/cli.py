"""Command line: ``python -m harness COMMAND [hydra overrides]``.

The commands live in this importable module rather than in ``__main__`` so that launcher
worker processes (joblib, submitit) import them by name instead of receiving pickled copies.

Commands:
    train       train with ``configs/train.yaml`` (``+env=NAME`` picks the simulation)
    gradcheck   compare tape gradients with central finite differences
    report      summarise a multirun sweep folder (table, CSV, PNG)
    evaluate    roll a run's checkpoint out again (other seed, worlds, horizon): eval.json
    record      write a trajectory (an excitation and the observables) for task=sysid

Hydra lives only here and in :mod:`harness.config`; the commands below turn the composed
config into typed objects and call plain functions.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from harness import config, environment_error, init_warp

# Our launcher presets share their names with the plugins' structured configs on purpose
# (`hydra/launcher=joblib`); Hydra 1.3 warns about the name match. Set at import time so
# that launcher worker processes, which import this module, inherit it.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema")

USAGE = """usage: python -m harness COMMAND [overrides...]

commands:
  train       train a simulation:       python -m harness train +env=cartpole [key=value ...]
  gradcheck   tape vs finite diff:      python -m harness gradcheck +env=cartpole env.horizon=120
  report      summarise a sweep:        python -m harness report multirun/<sweep>
  render      video and plots of a run: python -m harness render outputs/cartpole/<time>
  evaluate    a checkpoint elsewhere:   python -m harness evaluate outputs/cartpole/<time> env.seed=7 env.world_count=64
  record      a trajectory for sysid:   python -m harness record +env=cartpole env.pole_masses=[0.3,0.2] out=traj.npz

Overrides are Hydra's: optim.lr=0.05 clip.max_norm=1 iterations=50 device=cpu seed=3;
-m sweeps, e.g. -m clip.max_norm=0.1,1,10.
"""


def _fail(exc: Exception) -> None:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)


def _run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


@hydra.main(version_base="1.3", config_path=str(config.CONFIG_DIR), config_name="train")
def train_command(cfg: DictConfig) -> float:
    """Train and write TensorBoard events, the resolved config, checkpoints and summary.json.

    Returns:
        The final loss: the objective a Hydra sweeper (e.g. Optuna) minimises.
    """
    init_warp()  # also in launcher worker processes, which call this function directly
    hydra_cfg = HydraConfig.get()
    config.apply_task_env_defaults(cfg, hydra_cfg.runtime.choices, list(hydra_cfg.overrides.task))
    run_dir = _run_dir()
    # A single run's folder that Hydra has just made (nothing but .hydra/ in it): removed
    # again when Ctrl-C comes before training starts, so no empty run is left behind.
    fresh = hydra_cfg.mode.name != "MULTIRUN" and {p.name for p in run_dir.iterdir()} <= {".hydra"}
    try:
        trainer = _prepare(cfg, hydra_cfg, run_dir)
    except KeyboardInterrupt:
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        kept = "nothing was kept" if fresh else f"{run_dir} was left as it was (Hydra rewrote its .hydra/)"
        print(f"interrupted before training started; {kept}", file=sys.stderr)
        sys.exit(130)
    return _train(cfg, hydra_cfg, run_dir, trainer)


def _train(cfg: DictConfig, hydra_cfg: Any, run_dir: Path, trainer: Any) -> float:
    import warp as wp

    from harness import checkpoint
    from harness.clip import NonFiniteGradientError
    from harness.training import TrainingInterrupted, write_json

    # Jobs of a sweep may run side by side (joblib): label their lines.
    label = f"[job {hydra_cfg.job.num}: {hydra_cfg.job.override_dirname}]" if hydra_cfg.mode.name == "MULTIRUN" else ""
    say = f"{label} " if label else ""
    print(f"{say}run folder: {run_dir}", flush=True)
    try:
        summary = trainer.fit(
            run_dir,
            hparams=config.hparams(cfg, hydra_cfg),
            swept=config.swept_keys(hydra_cfg),
            meta={"config": config.resolved_yaml(cfg)},
            label=label or None,
        )
    except TrainingInterrupted as exc:
        again = [o for o in hydra_cfg.overrides.task if not o.startswith("resume=")]
        command = shlex.join(["python", "-m", "harness", "train", *again, "resume=auto", run_dir_override(run_dir)])
        print(f"{exc}; summary.json written; continue with: {command}", file=sys.stderr, flush=True)
        sys.exit(128 + exc.signum)
    except checkpoint.CheckpointError as exc:  # refused before training: the run folder stays as it was
        _fail(exc)
    except NonFiniteGradientError as exc:
        write_json(run_dir / "summary.json", {"status": "failed", "error": str(exc)})
        saved = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))
        last = f"; last good checkpoint: {saved[-1]}" if saved else "; no checkpoint was written before it"
        print(f"error: {exc}{last}", file=sys.stderr, flush=True)
        sys.exit(1)
    except wp.WarpDeterminismError as exc:  # HARNESS_DETERMINISTIC asked for what a kernel cannot give
        write_json(run_dir / "summary.json", {"status": "failed", "error": str(exc)})
        mode = os.environ.get("HARNESS_DETERMINISTIC", "")
        reason = str(exc).splitlines()[0].split(". ")[0]  # Warp's first sentence names the kernel
        print(
            f"error: HARNESS_DETERMINISTIC={mode}: {reason}; unset HARNESS_DETERMINISTIC to train with "
            "float atomics in any order (results then differ in the last bits between CUDA runs)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    except Exception as exc:
        write_json(run_dir / "summary.json", {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        raise
    reduction = summary["loss_reduction"]
    adjoint_logged = "through_time/clipped" in trainer.step.columns  # the in-backward clip rescales
    print(
        f"{say}done: loss {summary['initial_loss']:.6g} -> {summary['final_loss']:.6g}"
        + (f" ({abs(100 * reduction):.1f}% {'lower' if reduction >= 0 else 'higher'})" if reduction is not None else "")
        + f", {summary['clipped_steps']} clipped steps"
        + (f" (adjoint clipped in {summary['adjoint_clipped_steps']})" if adjoint_logged else "")
        + f", {summary['wall_time_s']:.1f} s",
        flush=True,
    )
    return summary["final_loss"]


def _prepare(cfg: DictConfig, hydra_cfg: Any, run_dir: Path) -> Any:
    """The run's trainer; refusals exit with one line."""
    from harness import checkpoint
    from harness.training import CaptureError, write_json

    try:
        run = config.build_run(cfg, hydra_cfg.runtime.choices)
    except config.ConfigError as exc:
        if hydra_cfg.mode.name == "MULTIRUN":  # the sweep's job folder records why
            write_json(run_dir / "summary.json", {"status": "failed", "error": str(exc)})
        _fail(exc)
    if hydra_cfg.mode.name == "MULTIRUN" and run.settings.resume is not None:  # per job: its own checkpoint
        try:
            found = checkpoint.resolve(run.settings.resume, run_dir)
            if found is not None:
                config.check_saved_config(checkpoint.load(found), cfg, found)
        except (config.ConfigError, checkpoint.CheckpointError) as exc:
            _fail(exc)  # no summary.json: the job folder's own one stays as it was
    if not (run_dir / "config.yaml").exists():
        (run_dir / "config.yaml").write_text(config.resolved_yaml(cfg))
    try:
        trainer = run.trainer()
    except (
        CaptureError,
        ValueError,
    ) as exc:  # ValueError: a task's check against the built env (a recording's initial state)
        _fail(ValueError(str(exc).splitlines()[0]))
    return trainer


def run_dir_override(folder: str | Path) -> str:
    """``hydra.run.dir=<folder>`` as Hydra parses it: quoted when the name holds characters
    of Hydra's override grammar (job folders of a sweep are named like ``clip.max_norm=1,seed=2``)."""
    text = str(folder)
    if not any(c in text for c in ",=[]{}()'\" \\"):
        return f"hydra.run.dir={text}"
    return "hydra.run.dir='" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@hydra.main(version_base="1.3", config_path=str(config.CONFIG_DIR), config_name="gradcheck")
def gradcheck_command(cfg: DictConfig) -> None:
    """Print the gradient comparison; exit 1 when the worst error exceeds the tolerance."""
    init_warp()
    hydra_cfg = HydraConfig.get()
    config.apply_task_env_defaults(cfg, hydra_cfg.runtime.choices, list(hydra_cfg.overrides.task))
    try:
        run = config.build_run(cfg, hydra_cfg.runtime.choices)
    except config.ConfigError as exc:
        _fail(exc)
    from harness.gradcheck import check_gradients

    gc = cfg.gradcheck
    result, params = check_gradients(
        run.env,
        run.loss,
        samples=int(gc.samples),
        eps=None if gc.eps is None else float(gc.eps),
        tolerance=run.env.config.gradcheck_tolerance() if gc.tolerance is None else float(gc.tolerance),
        atol_fraction=float(gc.atol_fraction),
        seed=int(gc.seed),
        device=run.settings.device,
        task=run.task,
    )
    print(result.table(params))
    verdict = "ok" if result.passed else "FAILED"
    print(f"worst relative error {result.worst:.3e} (tolerance {result.tolerance:g}): {verdict}", flush=True)
    if not result.passed:
        sys.exit(1)


def report_command(args: list[str]) -> None:
    """``report SWEEP_DIR``: table sorted by final loss, CSV and PNG in the sweep folder."""
    from harness.report import ReportError, report_sweep

    if len(args) != 1 or args[0].startswith("-"):
        _fail(ValueError("report: expects one argument, the sweep folder (e.g. multirun/2026-11-22_10-00-00)"))
    try:
        print(report_sweep(Path(args[0])))
    except ReportError as exc:
        _fail(exc)


HYDRA_VALUE_FLAGS = frozenset(
    {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"}
    | {"--experimental-rerun"}
)
"""Hydra's own command-line flags that take a value (``--cfg job``, ``-cn my_train``)."""
HYDRA_INFO_VALUES = frozenset({"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"})
"""The values ``--info`` / ``-i`` may take (it also stands alone)."""
HYDRA_INSPECT_FLAGS = frozenset(
    {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc"}
)
"""Flags with which Hydra prints something and exits without running the command."""


def split_hydra_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """Split a command line into Hydra's own flags (with their values) and overrides."""
    flags: list[str] = []
    overrides: list[str] = []
    pending = False  # the previous flag takes the next word as its value
    optional = False  # the previous flag (--info) may take the next word
    for arg in args:
        if pending or (optional and arg in HYDRA_INFO_VALUES):
            flags.append(arg)
            pending = optional = False
            continue
        optional = False
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            flags.append(arg)
            pending = name in HYDRA_VALUE_FLAGS and "=" not in arg
            optional = name in ("--info", "-i") and "=" not in arg
        else:
            overrides.append(arg)
    return flags, overrides


def render_command(args: list[str]) -> None:
    """``render RUN_DIR [checkpoint=PATH] [frames=N] [fps=N]``: video, plots and Newton recordings."""
    from harness.render import RenderError, render_run

    is_option = [a.partition("=")[0].isidentifier() and "=" in a for a in args]  # sweep job folders hold '='
    folders = [a for a, option in zip(args, is_option, strict=True) if not option]
    options = dict(a.split("=", 1) for a, option in zip(args, is_option, strict=True) if option)
    if len(folders) != 1 or folders[0].startswith("-"):
        _fail(ValueError("render: expects one run folder, e.g. python -m harness render outputs/cartpole/<time>"))
    unknown = sorted(set(options) - {"checkpoint", "frames", "fps"})
    if unknown:
        _fail(ValueError(f"render: unknown option '{unknown[0]}'; accepted: checkpoint=PATH, frames=N, fps=N"))
    numbers = {}
    for key, default, least in (("frames", 120, 2), ("fps", 30, 1)):
        try:
            numbers[key] = int(options.get(key, default))
        except ValueError:
            numbers[key] = least - 1
        if numbers[key] < least:
            _fail(ValueError(f"render: {key} must be a whole number >= {least}, got {options[key]}"))
    init_warp()
    try:
        written = render_run(Path(folders[0]), checkpoint=options.get("checkpoint"), **numbers)
    except RenderError as exc:
        _fail(exc)
    print(f"video: {written['video']} ({written['frames']} frames, before | after, from {written['checkpoint']})")
    if written["plot"]:
        print(f"plot: {written['plot']} ({', '.join(written['panels'])})")
    print(f"Newton ViewerFile recordings: {', '.join(written['recordings'])}")


def record_command(args: list[str]) -> None:
    """``record +env=NAME [overrides] [out=PATH] [amplitude=N] [noise=STD]``: a trajectory file for ``task=sysid``."""
    from harness.trajectory import ReferenceError, record

    options, overrides = {}, []
    for arg in args:
        key, eq, value = arg.partition("=")
        (options.__setitem__(key, value) if eq and key in ("out", "amplitude", "noise") else overrides.append(arg))
    numbers = {}
    for key, default, least in (("amplitude", 10.0, 0.0), ("noise", 0.0, 0.0)):
        try:
            numbers[key] = float(options.get(key, default))
        except ValueError:
            numbers[key] = float("nan")
        if not numbers[key] >= least or numbers[key] == float("inf"):
            _fail(ValueError(f"record: {key} must be a finite number >= {least:g}, got {options[key]}"))
    if not any(o.lstrip("+").startswith("env=") for o in overrides):
        _fail(ValueError("record: choose the env, e.g. python -m harness record +env=cartpole out=traj.npz"))
    init_warp()
    try:
        written = record(overrides, Path(options.get("out", "trajectory.npz")), **numbers)
    except ReferenceError as exc:
        _fail(exc)
    quantities = ", ".join(f"{k}={np.round(np.asarray(v), 4).tolist()}" for k, v in written["quantities"].items())
    print(
        f"trajectory: {written['path']} ({written['steps']} steps x {written['worlds']} worlds: "
        f"{', '.join(written['observables'])}; noise std {written['noise_std']:g}; {quantities or 'no quantities'})",
        flush=True,
    )


def evaluate_command(args: list[str]) -> None:
    """``evaluate RUN_DIR [env.<field>=V ...] [checkpoint=PATH] [out=PATH] [device=NAME]``: eval.json and a table."""
    from harness.evaluate import EvaluateError, evaluate_run, format_table, split_arguments

    try:
        run_dir, options, overrides = split_arguments(args)
    except EvaluateError as exc:
        _fail(exc)
    init_warp()
    try:
        report = evaluate_run(run_dir, overrides, **options)
    except EvaluateError as exc:
        _fail(exc)
    print(format_table(report), flush=True)


COMMANDS = {
    "train": train_command,
    "gradcheck": gradcheck_command,
    "report": report_command,
    "render": render_command,
    "evaluate": evaluate_command,
    "record": record_command,
}
CONFIG_NAMES = {"train": "train", "gradcheck": "gradcheck"}
"""Commands whose command line is validated (no folder created) before Hydra runs."""


def dirname_overrides(args: list[str]) -> list[str]:
    """Which overrides name a run's folder.

    A single run's folder is ``outputs/<env>/<date>_<time>_<overrides>``: its command-line
    overrides except the env (already the parent folder), ``resume``, ``device`` and
    Hydra's own (never part of it), so runs side by side in TensorBoard can be told apart by name. In a
    multirun, job folders are named by the swept values only: the command-line overrides
    that are the same for every job (``+env=cartpole iterations=50``) would only make the
    names long; what stays are the command-line sweeps and the sweeper's own parameters (an
    experiment's ``hydra.sweeper.params``, Optuna's search space).

    Returns an override setting ``hydra.job.config.override_dirname.exclude_keys``.
    """
    multirun = any(a in ("-m", "--multirun") for a in args)
    try:
        parsed = OverridesParser.create().parse_overrides(split_hydra_flags(args)[1])
    except Exception:  # Hydra reports malformed overrides itself
        return []
    if multirun:
        keys = [o.key_or_group for o in parsed if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
    else:
        keys = [o.key_or_group for o in parsed if o.key_or_group in ("env", "resume", "device")]
    if not keys:
        return []
    keys = ["hydra.run.dir", "hydra.sweep.dir", *dict.fromkeys(keys)]
    return ["hydra.job.config.override_dirname.exclude_keys=[" + ",".join(f"'{k}'" for k in keys) + "]"]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    command, rest = argv[0], argv[1:]
    problem = environment_error()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    if command not in COMMANDS:
        print(f"error: command: '{command}' is not one of {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    if command not in CONFIG_NAMES:
        COMMANDS[command](rest)
        return
    init_warp()
    flags, overrides = split_hydra_flags(rest)
    if not any(f.split("=", 1)[0] in HYDRA_INSPECT_FLAGS for f in flags):  # --cfg, --info, --help run nothing
        multirun = [f for f in flags if f in ("-m", "--multirun")]
        try:
            resume_folder = config.precheck(CONFIG_NAMES[command], [*multirun, *overrides])
        except config.ConfigError as exc:
            _fail(exc)
        except KeyboardInterrupt:  # e.g. while the env is built: no folder exists yet
            print("interrupted before training started; nothing was written", file=sys.stderr)
            sys.exit(130)
        if resume_folder is not None and not any(a.startswith("hydra.run.dir=") for a in overrides):
            overrides = [*overrides, run_dir_override(resume_folder)]  # continue in the checkpoint's folder
    try:
        overrides = config.search_path_overrides(overrides)
    except config.ConfigError as exc:
        _fail(exc)
    # Overrides first, Hydra's flags last: its parser takes the overrides as one positional
    # list, and a bare --info would take a following override as its value.
    config.register_resolvers()
    # Hydra 1.3's @hydra.main takes its command line from sys.argv only (no public argument
    # for it): set for the call, restored afterwards.
    saved = sys.argv
    sys.argv = [f"harness {command}", *overrides, *dirname_overrides([*flags, *overrides]), *flags]
    try:
        COMMANDS[command]()
    finally:
        sys.argv = saved
