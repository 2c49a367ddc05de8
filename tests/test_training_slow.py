"""The default configuration learns: the issue's acceptance run (about a minute on 2 CPU cores)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from harness import config
from harness.trainer import Trainer


@pytest.mark.slow
def test_default_cartpole_run_lowers_the_loss_by_at_least_60_percent(tmp_path):
    with initialize_config_dir(config_dir=str(config.CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["+env=cartpole", "device=cpu"])
    run = config.build_run(cfg)
    summary = Trainer(run.env, run.loss, run.optimizer, run.clip, run.settings).fit(tmp_path)
    assert summary["loss_reduction"] >= 0.6, summary
    # The poles end the horizon closer to upright than the untrained forces leave them.
    assert summary["final"]["max_abs_pole_angle_rad"] < summary["initial"]["max_abs_pole_angle_rad"]
