"""The harness's Ray launcher (``hydra/launcher=ray``, configs/hydra/launcher/ray.yaml).

Hydra takes launchers only from its ``hydra_plugins`` package, so this is the one module
there; the work is :func:`harness.sweep.launch_on_ray`. Compared with hydra-ray-launcher's own
``RayLauncher`` (whose config fields it keeps: ``ray.init``, ``ray.remote``), every job ends
with an outcome the sweep counts, also one lost with its node, a Ctrl-C stops the jobs with
their checkpoints, and an address where no Ray answers ends the sweep in one line before
``ray.init`` would retry for minutes (:func:`harness.sweep.ray_address_problem`). Importing
this module imports neither Ray nor the harness: Hydra imports every plugin module on every
command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig


class RayLauncher(Launcher):
    """Jobs of a sweep as Ray tasks on a cluster, or on a private Ray of this machine."""

    def __init__(self, ray: DictConfig) -> None:
        self.ray_cfg = ray
        self.config: DictConfig | None = None
        self.hydra_context: Any = None
        self.task_function: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from harness.sweep import launch_on_ray

        assert self.config is not None, "setup() comes first"
        return launch_on_ray(
            self.ray_cfg, self.config, self.hydra_context, self.task_function, job_overrides, initial_job_idx
        )
