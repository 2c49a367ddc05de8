"""``python -m harness gradcheck +env=NAME [overrides]``: tape gradients against central finite
differences (:mod:`harness.gradcheck`); exit 1 when the worst relative error exceeds the
tolerance."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config, init_warp
from harness.commands.common import fail, run_hydra, system_errors_in_one_line

__all__ = ["gradcheck_command", "main"]


@hydra.main(version_base="1.3", config_path=str(config.CONFIG_DIR), config_name="gradcheck")
def gradcheck_command(cfg: DictConfig) -> None:
    """Print the gradient comparison; exit 1 when the worst error exceeds the tolerance."""
    with system_errors_in_one_line("gradcheck"):
        _gradcheck(cfg)


def _gradcheck(cfg: DictConfig) -> None:
    from harness import build

    init_warp()
    hydra_cfg = HydraConfig.get()
    config.apply_task_env_defaults(cfg, hydra_cfg.runtime.choices, list(hydra_cfg.overrides.task))
    try:
        run = build.build_run(cfg, hydra_cfg.runtime.choices)
    except config.ConfigError as exc:
        fail(exc)
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
        phase_window=int(gc.phase_window),
        coarse_factor=float(gc.coarse_factor),
    )
    print(result.table(params))
    if result.phases:
        print(result.phase_table())
    verdict = "ok" if result.passed else "FAILED"
    print(f"worst relative error {result.worst:.3e} (tolerance {result.tolerance:g}): {verdict}", flush=True)
    if not result.passed:
        sys.exit(1)


def main(rest: list[str]) -> None:
    """``python -m harness gradcheck [overrides] [hydra flags]``."""
    run_hydra("gradcheck", "gradcheck", gradcheck_command, rest)
