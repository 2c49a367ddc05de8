"""Hydra multirun integration: warm Warp's kernel cache once before the jobs start.

Warp compiles each kernel module on first use and caches the binary under
``WARP_CACHE_PATH`` (default ``~/.cache/warp/<version>``). The cache is safe to share:
a process builds into a private temporary folder and renames it into place, and a
process that loses the race keeps the winner's files. But jobs that start together on a
cold cache each compile the same modules (about 25 s for Newton's Featherstone module on
a 2-core CPU). :class:`WarmKernelCache` runs in the launching process when a multirun
starts and records one tiny iteration of the sweep's base configuration, so the jobs
find every heavy module cached.
"""

from __future__ import annotations

import sys
import time
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
        import hydra

        from harness import build
        from harness import config as harness_config

        choices = dict(config.hydra.runtime.choices)
        cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
        with open_dict(cfg):
            cfg.pop("hydra", None)
        harness_config.apply_task_env_defaults(cfg, choices, [])
        start = time.perf_counter()
        try:
            build.evaluation_config(cfg, hydra.utils.get_class(cfg.task._target_))  # one step: no windows
            with open_dict(cfg):
                cfg.env.horizon = 1
                cfg.env.world_count = 1
            run = build.build_run(cfg, choices)
        except (harness_config.ConfigError, ImportError) as exc:
            print(f"kernel cache warm-up skipped ({exc})", file=sys.stderr, flush=True)
            return
        settings = harness_config.TrainSettings(
            iterations=1, log_every=1, seed=run.settings.seed, device=run.settings.device
        )
        trainer = run.trainer(settings)
        trainer.step.run()  # every kernel of an iteration (a capture records the same kernels)
        trainer.step.log_values()
        trainer.step.evaluate()
        print(f"kernel cache warmed in {time.perf_counter() - start:.1f} s", flush=True)
