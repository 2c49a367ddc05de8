"""``python -m harness evaluate RUN_DIR [overrides]``: roll a trained run out again, elsewhere.

Loads a run's newest checkpoint (or ``checkpoint=<path>``), rebuilds its env with the
run's own config plus ``env.<field>=value`` overrides (another seed, more worlds, a longer
horizon), rolls out once at the evaluation parameters (ScheduleFree's average where the
run used it), and writes ``eval.json``: the loss with its terms and the env's figures
(``upright_fraction`` for the cartpole). The env is built as configured, whole horizon:
a policy trained in windows is evaluated over full episodes, from the env's own initial
states (``env.seed``).

Overrides that would change a parameter's shape (an open-loop task's horizon or world
count) are refused in one line: a checkpoint's parameters keep their shapes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["EvaluateError", "evaluate_run", "format_table"]

OPTIONS = ("checkpoint", "out", "device")
"""The evaluate command's own options (besides ``env.<field>=value``)."""


class EvaluateError(ValueError):
    """A refusal of ``harness evaluate``: one line naming the argument and what is accepted."""


def split_arguments(args: list[str]) -> tuple[Path, dict[str, str], list[str]]:
    """The run folder, the command's options and the env overrides of a command line.

    Raises:
        EvaluateError: Not one folder, an unknown option, or an override outside ``env.``.
    """
    folders, options, overrides = [], {}, []
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or not key.replace(".", "").replace("_", "").isalnum():
            folders.append(arg)  # sweep job folders hold '=' but not as their first part
        elif key in OPTIONS:
            options[key] = value
        elif key.startswith("env.") and len(key) > 4:
            overrides.append(arg)
        else:
            raise EvaluateError(
                f"evaluate: '{key}' cannot be set here; accepted: env.<field>=VALUE, "
                + ", ".join(f"{o}=..." for o in OPTIONS)
            )
    if len(folders) != 1 or folders[0].startswith("-"):
        raise EvaluateError(
            "evaluate: expects one run folder, e.g. python -m harness evaluate outputs/cartpole/<time> env.seed=7"
        )
    return Path(folders[0]), options, overrides


def evaluate_run(
    run_dir: Path,
    overrides: list[str] = (),  # type: ignore[assignment]
    *,
    checkpoint: str | None = None,
    out: str | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Evaluate a run folder's checkpoint; write and return the report (see the module docstring).

    Raises:
        EvaluateError: One line: not a run folder, no checkpoint, a config the overrides
            break, shapes the overrides change, an output path that cannot be written.
    """
    import warp as wp
    from omegaconf import open_dict

    from harness import checkpoint as ckpt
    from harness import config
    from harness.tasks import prepare, rollout
    from harness.training.loop import write_json

    try:
        saved_overrides = config.run_overrides(run_dir, "evaluate")
    except config.ConfigError as exc:
        raise EvaluateError(str(exc)) from None
    target = Path(out) if out else run_dir / "eval.json"
    if target.is_dir() or not target.parent.is_dir():
        raise EvaluateError(f"out: '{target}' is not a file in an existing folder; accepted: out=<folder>/<name>.json")
    try:
        path = ckpt.resolve(checkpoint or "auto", run_dir, field="checkpoint")
        if path is None:
            raise EvaluateError(
                f"evaluate: no checkpoint in '{run_dir / 'checkpoints'}'; accepted: a finished or interrupted run"
            )
        saved = ckpt.load(path, field="checkpoint")
    except ckpt.CheckpointError as exc:
        raise EvaluateError(str(exc)) from None
    device_override = [f"device={device}"] if device else []
    try:
        cfg, choices, _ = config.compose_command("train", [*saved_overrides, *overrides, *device_override])
        with open_dict(cfg):  # how the run trained (windows, segments) does not bind an evaluation
            cfg.memory.segment_steps = None
            if "window" in cfg.task:
                cfg.task.window = None
        run = config.validate(cfg, choices)
        env = config.build_env(cfg, run.settings.device, task=run.task, evaluation=True)  # whole horizon, no windows
    except config.ConfigError as exc:
        raise EvaluateError(f"evaluate: {exc}") from None
    task, loss, optimizer = run.task, run.loss, run.optimizer
    mine = {name: tuple(shape) for name, shape in task.parameter_shapes(env.config).items()}
    theirs = {name: tuple(shape) for name, shape, *_ in saved.meta.get("layout", [])}
    if saved.meta.get("env") != env.name:
        raise EvaluateError(f"checkpoint: '{path}' was written by env '{saved.meta.get('env')}', not '{env.name}'")
    if mine != theirs:
        changed = next(name for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name))
        raise EvaluateError(
            f"evaluate: {' '.join(overrides) or 'the config'} changes parameter '{changed}' from shape "
            f"{theirs.get(changed)} to {mine.get(changed)}; accepted: overrides that keep the trained shapes"
        )
    try:
        params = prepare(env, task, loss, device=run.settings.device)
    except ValueError as exc:
        raise EvaluateError(f"evaluate: {str(exc).splitlines()[0]}") from None
    opt_state = optimizer.init(params)
    from harness.optim import load_state

    try:
        load_state({"params/data": params.data}, {"params/data": saved.arrays["params/data"]})
        load_state(
            {f"optim/{k}": v for k, v in opt_state.items()},
            {k: v for k, v in saved.arrays.items() if k.startswith("optim/")},
        )
    except (KeyError, ValueError) as exc:
        raise EvaluateError(f"checkpoint: '{path}' does not fit this run ({exc})") from None
    x = optimizer.eval_params(params, opt_state)
    if x.ptr != params.data.ptr:
        wp.copy(params.data, x)
    loss.zero()
    trajectory = rollout(env, task, params)
    total = float(loss(trajectory).numpy()[0])
    terms = dict(zip(loss.term_names, (float(v) for v in loss.term_values.numpy()), strict=True))
    report = {
        "run": str(run_dir),
        "checkpoint": str(path),
        "iteration": saved.iteration,
        "overrides": list(overrides),
        "task": choices.get("task"),
        "env": {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in vars(env.config).items()
            if v is None or isinstance(v, bool | int | float | str | list | tuple)
        },
        "loss": total,
        "loss_terms": terms,
        "figures": env.describe(trajectory),
    }
    try:
        write_json(target, report)
    except OSError as exc:
        raise EvaluateError(f"out: cannot write '{target}' ({exc.strerror or exc})") from None
    report["written"] = str(target)
    return report


def format_table(report: dict[str, Any]) -> str:
    """A short table: the loss, its terms and the env's scalar figures."""
    rows: list[tuple[str, str]] = [("loss", _number(report["loss"]))]
    rows += [(f"loss/{name}", _number(value)) for name, value in report["loss_terms"].items()]
    for name, value in report["figures"].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            rows.append((name, _number(value)))
    env = report["env"]
    head = (
        f"task {report['task']}, checkpoint of iteration {report['iteration']}: "
        f"{env.get('world_count', '?')} worlds x {env.get('horizon', '?')} steps, seed {env.get('seed', '?')}"
    )
    width = max(len(name) for name, _ in rows)
    lines = [head, *(f"  {name:<{width}}  {value}" for name, value in rows)]
    lines.append(f"written: {report['written']}")
    return "\n".join(lines)


def _number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)
