"""Command line: ``python -m harness COMMAND [hydra overrides]``.

Commands:
    train       train with ``configs/train.yaml`` (``+env=NAME`` picks the simulation)
    gradcheck   compare tape gradients with central finite differences

Hydra lives only here and in :mod:`harness.config`; the commands below turn the composed
config into typed objects and call plain functions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config

USAGE = """usage: python -m harness COMMAND [overrides...]

commands:
  train       train a simulation:       python -m harness train +env=cartpole [key=value ...]
  gradcheck   tape vs finite diff:      python -m harness gradcheck +env=cartpole env.horizon=120

Overrides are Hydra's: optim.lr=0.05 clip.max_norm=1 iterations=50 device=cpu seed=3;
-m sweeps, e.g. -m clip.max_norm=0.1,1,10.
"""


def _fail(exc: Exception) -> None:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)


def _run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


@hydra.main(version_base="1.3", config_path=str(config.CONFIG_DIR), config_name="train")
def train_command(cfg: DictConfig) -> None:
    """Train and write TensorBoard events, the resolved config and summary.json."""
    try:
        run = config.build_run(cfg)
    except config.ConfigError as exc:
        _fail(exc)
    from harness.trainer import Trainer

    run_dir = _run_dir()
    (run_dir / "config.yaml").write_text(config.resolved_yaml(cfg))
    trainer = Trainer(run.env, run.loss, run.optimizer, run.clip, run.settings)
    print(f"run folder: {run_dir}", flush=True)
    summary = trainer.fit(run_dir)
    reduction = summary["loss_reduction"]
    print(
        f"done: loss {summary['initial_loss']:.6g} -> {summary['final_loss']:.6g}"
        + (f" ({100 * reduction:.1f}% lower)" if reduction is not None else "")
        + f", {summary['clipped_steps']} clipped steps, {summary['wall_time_s']:.1f} s",
        flush=True,
    )


@hydra.main(version_base="1.3", config_path=str(config.CONFIG_DIR), config_name="gradcheck")
def gradcheck_command(cfg: DictConfig) -> None:
    """Print the gradient comparison; exit 1 when the worst error exceeds the tolerance."""
    try:
        run = config.build_run(cfg)
    except config.ConfigError as exc:
        _fail(exc)
    from harness.gradcheck import check_gradients

    gc = cfg.gradcheck
    result, params = check_gradients(
        run.env,
        run.loss,
        samples=int(gc.samples),
        eps=float(gc.eps),
        tolerance=float(gc.tolerance),
        atol_fraction=float(gc.atol_fraction),
        seed=int(gc.seed),
        device=run.settings.device,
    )
    print(result.table(params))
    verdict = "ok" if result.passed else "FAILED"
    print(f"worst relative error {result.worst:.3e} (tolerance {result.tolerance:g}): {verdict}", flush=True)
    if not result.passed:
        sys.exit(1)


COMMANDS = {"train": train_command, "gradcheck": gradcheck_command}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: command: '{command}' is not one of {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [f"harness {command}", *rest]
    COMMANDS[command]()


if __name__ == "__main__":
    main()
