"""``python -m harness diagnose +env=NAME [task=...] [diagnose.<key>=...] [overrides]``: can the
gradient be trusted, over how many steps, and where should it be clipped (:mod:`harness.diagnose`,
docs/diagnose.md).

Measures the task's gradient at every horizon of ``diagnose.horizons`` (default: the env's
horizon halved down to ``diagnose.shortest``) over ``diagnose.samples`` starts, prints one
row per horizon as it is measured and a verdict, and writes ``diagnose.json`` and
``diagnose.png`` into the run folder (``outputs/diagnose/<env>/<time>``). A task that trains in
windows (``task.window``) is measured over whole rollouts of each horizon: the
recommendation is the window to train with. Exit 0 with a diagnosis (whatever it says), 2 on
bad input.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config, init_warp
from harness.commands.common import collector_paused, fail, run_hydra, system_errors_in_one_line

__all__ = ["diagnose_command", "main"]


@hydra.main(version_base="1.3", config_path=str(config.CONFIG_DIR), config_name="diagnose")
def diagnose_command(cfg: DictConfig) -> None:
    """Diagnose the gradient of the composed env, task and loss; write the run folder's files."""
    with system_errors_in_one_line("diagnose"):
        _diagnose(cfg)


def _diagnose(cfg: DictConfig) -> None:
    from harness import build

    init_warp()
    hydra_cfg = HydraConfig.get()
    config.apply_task_env_defaults(cfg, hydra_cfg.runtime.choices, list(hydra_cfg.overrides.task))
    try:
        build.evaluation_config(cfg, build.task_class(cfg))  # whole rollouts: no window, no segments
        run = build.validate(cfg, hydra_cfg.runtime.choices)
        env_class, env_config = config.check_env_fields(cfg)
    except config.ConfigError as exc:
        fail(exc)
    settings = run.diagnose
    task = run.task
    # Every horizon's env: diagnose.samples worlds, unless the task fixes the env's size
    # (task=sysid: the recording's worlds, and at most its steps).
    training = task.training_config(env_config)
    sized = build.diagnose_sized(task, env_config, settings.samples)
    horizons = list(settings.horizons or [])
    if not horizons:
        from harness.diagnose import geometric_horizons

        horizons = geometric_horizons(
            training.horizon,
            shortest=min(settings.shortest, training.horizon),
            divisors=task.window_key == "task.window",  # a window must divide the episode
        )
    try:
        for steps in horizons:  # a task may refuse the samples' world count (SHAC's critic minibatches)
            task.check(dataclasses.replace(sized, horizon=steps))
    except ValueError as exc:
        why = config.first_line(exc)
        try:
            for steps in horizons:
                task.check(dataclasses.replace(training, horizon=steps))
        except ValueError:
            fail(f"diagnose: {why}")
        print(f"diagnose: {why}; measuring over training's {training.world_count} worlds instead", flush=True)
        sized = training
    worlds = sized.world_count
    if training.horizon != env_config.horizon and max(horizons) > training.horizon:
        fail(
            f"diagnose.horizons: {max(horizons)} is longer than the {training.horizon} steps task {task.name} "
            f"compares with; accepted: 1..{training.horizon}"
        )
    with collector_paused():  # Newton's import: docs/startup.md
        from harness.diagnose import diagnose, draw_diagnosis, table_header, table_row

    new_env = build.diagnose_envs(env_class, sized, run.settings.device)

    def make_env(steps: int, segmented: bool) -> Any:
        try:
            return new_env(steps, segmented)
        except Exception as exc:  # the env's own code: one line
            fail(
                f"env: building {env_class.__name__} at {steps} steps x {worlds} worlds failed: "
                f"{type(exc).__name__}: {config.first_line(exc)}"
            )

    out = Path(hydra_cfg.runtime.output_dir)
    clipped = run.adjoint is not None and run.adjoint.max_norm is not None
    choice = hydra_cfg.runtime.choices.get("env") or env_class.name
    print(
        f"diagnose: env {choice}, task {task.name}, horizons {horizons}, {worlds} starts, "
        f"{settings.zo_pairs} zeroth-order pairs, {settings.fd_directions} difference directions"
        + (f", the state adjoint clipped at {run.adjoint.max_norm:g} inside backward" if clipped else ""),
        flush=True,
    )
    print(table_header(), flush=True)
    dt = float(getattr(training, "dt", float("nan")))
    try:
        diagnosis = diagnose(
            make_env,
            task,
            run.loss,
            settings,
            horizons=horizons,
            training_worlds=training.world_count,
            env_name=choice,
            capture=run.settings.capture is not False,
            report=lambda h: print(table_row(h, dt), flush=True),
            adjoint_max_norm=run.adjoint.max_norm if clipped else None,
        )
    except ValueError as exc:  # a task's check against a built env (a recording's size): one line
        fail(f"diagnose: {config.first_line(exc)}")
    from harness.runs import write_json

    write_json(out / "diagnose.json", diagnosis.as_json())
    draw_diagnosis(diagnosis, out / "diagnose.png")
    print(diagnosis.verdict(), flush=True)
    print(f"wrote {out / 'diagnose.json'} and {out / 'diagnose.png'} ({diagnosis.seconds:.0f} s)", flush=True)


def main(rest: list[str]) -> None:
    """``python -m harness diagnose [overrides] [hydra flags]``."""
    run_hydra("diagnose", "diagnose", diagnose_command, rest)
