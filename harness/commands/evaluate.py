"""``python -m harness evaluate RUN_DIR [env.<field>=V ...] [checkpoint=PATH] [out=PATH] [device=NAME]``:
roll a trained run out again, elsewhere.

Loads a run's newest checkpoint (or ``checkpoint=<path>``), rebuilds its env with the run's
own config plus ``env.<field>=value`` overrides (another seed, more worlds, a longer
horizon), rolls out once at the evaluation parameters (ScheduleFree's average where the run
used it), and writes ``eval.json``: the loss with its terms and the env's figures
(``upright_fraction`` for the cartpole). A controller (``task=mpc``, whose run is a flight, not
trained parameters) is run again from its start instead, for the env's ``frames``: the report
holds the last frame's best cost as the loss and the flight's mean distance to the targets and
its share of frames within 0.1 m of them. The env is built as configured, whole horizon: a
policy trained in windows is evaluated over full episodes, from the env's own initial states
(``env.seed``). Overrides that would change a parameter's shape (an open-loop task's horizon
or world count) are refused in one line: a checkpoint's parameters keep their shapes. A loss
that is not finite (the rollout blew up) exits 1 and writes nothing, so an earlier
``eval.json`` stays.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from harness.commands.common import collector_paused, fail, run_folder_argument

__all__ = ["evaluate_run", "format_table", "main"]

OPTIONS = ("checkpoint", "out", "device")
"""The evaluate command's own options (besides ``env.<field>=value``)."""


def evaluate_run(
    run_dir: Path,
    overrides: list[str] = (),  # type: ignore[assignment]
    *,
    checkpoint: str | None = None,
    out: str | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Evaluate a run folder's checkpoint; write and return the report (see the module docstring).
    A loss that is not finite (the rollout blew up) is returned with ``written: None`` and
    nothing is written: an earlier ``eval.json`` stays as it was.

    Raises:
        harness.runs.RunError: One line: not a run folder, no checkpoint, a config the overrides
            break, shapes the overrides change, an output path that cannot be written.
    """
    from harness.runs import OutputError, RunError, RunFolder, check_writable, write_json

    folder = RunFolder(run_dir, "evaluate")  # a folder without a run is refused before Warp is imported
    from harness.build import trained_run
    from harness.tasks import rollout

    target = Path(out) if out else Path(run_dir) / "eval.json"
    if target.is_dir() or not target.parent.is_dir():
        raise RunError(f"out: '{target}' is not a file in an existing folder; accepted: out=<folder>/<name>.json")
    try:
        check_writable(target)  # before the rollout
    except OutputError as exc:
        raise RunError(f"out: {exc}") from None
    with collector_paused():  # Newton's import and the env's build: docs/startup.md
        from harness.build import check_evaluation_memory  # refused before anything is allocated

        check_evaluation_memory(folder, list(overrides), device=device)
        trained = trained_run(folder, list(overrides), checkpoint_name=checkpoint, device=device, load=False)
    step, env, loss = trained.trainer.step, trained.run.env, trained.run.loss
    if step.task.replays:  # a controller (task=mpc): run again from its start, with a fresh trainer
        total, figures, _ = step.task.replay(trained.trainer)
        terms = {}
    else:
        trained.load()
        with step.at_eval_params():
            loss.zero()
            trajectory = rollout(env, step.task, step.params)
            total = float(loss(trajectory).numpy()[0])
        terms = dict(zip(loss.term_names, (float(v) for v in loss.term_values.numpy()), strict=True))
        figures = {**env.describe(trajectory), **step.task.figures(env, loss, trajectory)}
    report = {
        "run": str(run_dir),
        "checkpoint": str(trained.checkpoint.path),
        "iteration": trained.checkpoint.iteration,
        "overrides": list(overrides),
        "task": trained.choices.get("task"),
        "env": {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in vars(env.config).items()
            if v is None or isinstance(v, bool | int | float | str | list | tuple)
        },
        "loss": total,
        "loss_terms": terms,
        "figures": figures,
    }
    if not math.isfinite(total):  # a rollout that blew up: the previous result stays
        report["written"] = None
        return report
    try:
        write_json(target, report)
    except OutputError as exc:
        raise RunError(f"out: {exc}") from None
    except OSError as exc:
        raise RunError(f"out: cannot write '{target}' ({exc.strerror or exc})") from None
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
        f"{_count(env.get('world_count'), 'world')} x {_count(env.get('horizon'), 'step')}, seed {env.get('seed', '?')}"
    )
    width = max(len(name) for name, _ in rows)
    lines = [head, *(f"  {name:<{width}}  {value}" for name, value in rows)]
    if report["written"] is not None:
        lines.append(f"written: {report['written']}")
    return "\n".join(lines)


def _count(n: int | None, noun: str) -> str:
    """``1 world``, ``4 worlds``; ``? worlds`` when unknown."""
    return f"{'?' if n is None else n} {noun}{'' if n == 1 else 's'}"


def _number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def main(args: list[str]) -> None:
    """``evaluate RUN_DIR [env.<field>=V ...] [checkpoint=PATH] [out=PATH] [device=NAME]``: eval.json and a table."""
    from harness.runs import RunError

    try:
        run_dir, options, overrides = run_folder_argument(args, "evaluate", OPTIONS)
    except ValueError as exc:
        fail(exc)
    for override in overrides:
        key = override.partition("=")[0]
        if not (key.startswith("env.") and len(key) > 4):
            fail(
                f"evaluate: '{key}' cannot be set here; accepted: env.<field>=VALUE, "
                + ", ".join(f"{o}=..." for o in OPTIONS)
            )
    try:
        report = evaluate_run(run_dir, overrides, **options)
    except RunError as exc:
        fail(exc)
    print(format_table(report), flush=True)
    if report["written"] is None:
        target = options.get("out") or str(run_dir / "eval.json")
        print(
            f"error: evaluate: the loss is {report['loss']} (the rollout blew up); {target} was not written "
            "(an earlier one is kept)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
