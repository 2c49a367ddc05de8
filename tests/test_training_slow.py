"""The default configuration learns: the issue's acceptance run (about a minute on 2 CPU cores)."""

from __future__ import annotations

import pytest

from harness import build
from tests.helpers import compose_run


@pytest.mark.slow
def test_default_cartpole_run_lowers_the_loss_by_at_least_60_percent(tmp_path):
    run = build.build_run(*compose_run("+env=cartpole", "device=cpu"))
    summary = run.trainer().fit(tmp_path)
    assert summary["loss_reduction"] >= 0.6, summary
    # The poles end the horizon closer to upright than the untrained forces leave them.
    assert summary["after_training"]["max_abs_pole_angle_rad"] < summary["before_training"]["max_abs_pole_angle_rad"]
