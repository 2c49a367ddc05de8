"""The cartpole's default ``task=policy`` run holds held-out starts (issue 43, item 4).

With Adam at 1e-2 and a norm clip of 1 (the settings until issue 43), ``python -m harness
train +env=cartpole task=policy`` kept 0.891 of 64 held-out starts upright over twice the
training episode for seed 0 (1.000 at commit ee7dd8c, 0.359 there for seed 1). Every failing
run came apart where windows start to carry the state (iteration 302): the first carried
windows' gradients are hundreds to thousands of times the fresh ones', and Adam's steps on
them, clipped to norm 1 or not, wrecked the policy. ZClip at 3e-3 kept 1.000 for seeds 0, 1, 2
and 4 but none for seed 3, whose carried windows mostly started from falling poles. A carried
world whose pole is past 0.2 rad now starts anew (``env.fall_angle``), and the cart's position
weighs 0.3 in the loss: seeds 0, 1, 3 and 4 keep 1.000, seed 2 0.953 (docs/tasks.md, "The
cartpole result")."""

from __future__ import annotations

import json

import pytest

from tests.helpers import compose_run, run_harness


def test_the_cartpole_policy_trains_at_3e_3_under_zclip_restarting_fallen_worlds():
    """Adam at 3e-3 (the cartpole's per_env) under ZClip capped at norm 1 (task=policy's clip
    option), carried worlds past 0.2 rad started anew and the cart's position at 0.3: the
    command line still wins, and other envs keep task=policy's 1e-2."""
    cfg, _ = compose_run("+env=cartpole", "task=policy")
    assert cfg.env.fall_angle == pytest.approx(0.2)
    assert list(cfg.loss.terms.pose.dim_weights) == pytest.approx([0.3, 1.0, 1.0])
    assert cfg.optim.lr == pytest.approx(3e-3)
    assert (cfg.clip._target_, cfg.clip.max_norm) == ("harness.clip.zclip", 1.0)
    assert cfg.schedule._target_ == "harness.schedules.cosine_decay"
    cfg, _ = compose_run("+env=cartpole", "task=policy", "optim.lr=0.01", "clip=global_norm")
    assert (cfg.optim.lr, cfg.clip._target_) == (pytest.approx(1e-2), "harness.clip.clip_by_global_norm")
    cfg, _ = compose_run("+env=cartpole_swingup", "task=policy")
    assert cfg.optim.lr == pytest.approx(1e-2)
    cfg, _ = compose_run("+env=cartpole", "task=policy", "env.fall_angle=null")
    assert cfg.env.fall_angle is None
    cfg, _ = compose_run("+env=cartpole")  # the open-loop task keeps the env's own loss and never restarts
    assert cfg.env.fall_angle is None and list(cfg.loss.terms.pose.dim_weights) == pytest.approx([0.1, 1.0, 1.0])


SEEDS = [0, 1, 2, 3, 4]
"""Issue 43's seeds (seed 3 kept 0.000 before env.fall_angle and the cart's weight)."""


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_the_default_policy_keeps_held_out_starts_upright_over_twice_the_episode(tmp_path, seed):
    """The default run (11 to 12 minutes on this CPU beside another training), then 64 starts it never drew
    (env.seed=7) over 1920 steps: 0.9 or more upright. Under the former settings seed 0 kept
    0.891 (and seed 1 0.359 at ee7dd8c), and under ZClip alone seed 3 kept 0.000."""
    proc = run_harness(
        "train", "+env=cartpole", "task=policy", f"seed={seed}", "hydra.run.dir=run", cwd=tmp_path, timeout=3600
    )
    assert proc.returncode == 0, proc.stderr
    proc = run_harness(
        "evaluate", "run", "env.seed=7", "env.world_count=64", "env.horizon=1920", cwd=tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert report["figures"]["upright_fraction"] >= 0.9, report["figures"]
