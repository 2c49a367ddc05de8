"""task=shac (Xu et al. 2022) on the real cartpole: the actor's gradient through the simulation,
episode restarts and the critic's bootstrap against central differences; the critic's
TD(lambda) targets against SHAC's own recursion; the observation statistics; restarts;
eager = captured; a SIGKILL and resume, bit for bit; refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import warp as wp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envs.cartpole import CartpoleEnv
from harness import build, config
from harness.tasks import rollout
from harness.tasks import shac_kernels as k
from harness.training import Callback
from tests.helpers import refused_train, run_harness
from tests.test_checkpoint import (
    assert_killed_run_resumes_bit_for_bit,
    final_checkpoint,
    train,
)
from tests.test_errors import assert_clean_rejection

SMALL = [
    "+env=cartpole", "task=shac", "env.world_count=4", "task.window=8", "env.horizon=5", "task.critic_minibatches=2",
    "task.critic_epochs=2", "task.action_scale=20", "task.actor.hidden=[16,16]", "task.critic.hidden=[16,16]",
    "plot_every=null", "log_every=2",
]  # fmt: skip
"""Episodes of 5 steps in windows of 8: every window holds an episode's end."""


def trainer(*overrides: str):
    cfg, choices = config.compose_config("train", [*SMALL, *overrides])
    return build.build_run(cfg, choices).trainer()


def test_the_actor_gradient_through_the_simulation_restarts_and_the_critic_matches_central_differences():
    t = trainer("capture=false", "env.tilt=0.3")
    step, task, env = t.step, t.task, t.env
    actor = t.state.groups["actor"].params
    target = task._target  # a target critic that is not its near-zero start, so the bootstrap counts
    rng = np.random.default_rng(0)
    target.data.assign((target.data.numpy() + 0.3 * rng.normal(size=target.size)).astype(np.float32))
    step.forward_backward(objective=lambda trajectory: task.objective(env, step.loss, trajectory))
    grad = actor.grad.numpy().astype(np.float64)
    assert task.buffers(env).done.numpy()[4].all() and not task.buffers(env).done.numpy()[:4].any()

    def value() -> float:
        with task.training(step.counter):
            step.loss.zero()
            return float(task.objective(env, step.loss, rollout(env, task, actor)).numpy()[0])

    base = actor.data.numpy().copy()
    picked = [*np.argsort(-np.abs(grad))[:4], *rng.choice(actor.size, 8, replace=False)]
    errors = []
    for i in picked:
        plus, minus = base.copy(), base.copy()
        plus[i] += 1e-2
        minus[i] -= 1e-2
        actor.data.assign(plus)
        high = value()
        actor.data.assign(minus)
        low = value()
        fd = (high - low) / (float(plus[i]) - float(minus[i]))
        errors.append(abs(grad[i] - fd) / (max(abs(grad[i]), abs(fd)) + 1e-3 * np.abs(grad).max()))
    actor.data.assign(base)
    # float32 central differences of a 8-step rollout with a step of 1e-2: measured 1e-3 at most
    assert max(errors) < 1e-2, errors


def test_td_lambda_targets_equal_shacs_recursion():
    """The kernel's lambda-return against SHAC's own form of it (its Ai, Bi, lam recursion,
    NVlabs/DiffRL algorithms/shac.py), with the last row of the window always an end, and a
    state that ended its episode early (``terminal``, a subset of the ends) valued at 0."""
    rng = np.random.default_rng(1)
    steps, worlds, gamma, lam = 9, 5, 0.99, 0.95
    cost = rng.uniform(0, 2, size=(steps, worlds)).astype(np.float32)
    values = rng.normal(size=(steps, worlds)).astype(np.float32)
    ends = (rng.uniform(size=(steps, worlds)) < 0.2).astype(np.int32)
    ends[-1] = 1
    terminal = (ends * (rng.uniform(size=(steps, worlds)) < 0.5)).astype(np.int32)
    assert terminal.any() and (ends > terminal).any()
    targets = wp.zeros((steps, worlds), dtype=wp.float32, device="cpu")
    wp.launch(
        k.td_lambda, dim=worlds,
        inputs=[wp.array(cost, device="cpu"), wp.array(values, device="cpu"), wp.array(ends, device="cpu"),
                wp.array(terminal, device="cpu"), 1.0, gamma, lam, steps],
        outputs=[targets], device="cpu",
    )  # fmt: skip
    r, d = -cost.astype(np.float64), ends.astype(np.float64)
    v = values.astype(np.float64) * (1 - terminal)
    a_i, b_i, lam_i = np.zeros(worlds), np.zeros(worlds), np.ones(worlds)
    expected = np.zeros((steps, worlds))
    for i in reversed(range(steps)):
        lam_i = lam_i * lam * (1.0 - d[i]) + d[i]
        a_i = (1.0 - d[i]) * (lam * gamma * a_i + gamma * v[i] + (1.0 - lam_i) / (1.0 - lam) * r[i])
        b_i = gamma * (v[i] * d[i] + b_i * (1.0 - d[i])) + r[i]
        expected[i] = (1.0 - lam) * a_i + lam_i * b_i
    np.testing.assert_allclose(targets.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_the_observation_statistics_are_the_running_moments_of_every_observation_seen(tmp_path):
    t = trainer("capture=false", "iterations=3")
    seen = []

    class Keep(Callback):
        def on_iteration(self, loop, iteration):
            seen.append(t.task.buffers(t.env).obs.numpy().reshape(-1, 6).astype(np.float64))

    t.fit(tmp_path, callbacks=[Keep()])
    rows = np.concatenate(seen)
    state = t.state.task
    prior = 1.0e-4  # SHAC's running statistics start at mean 0, variance 1, count 1e-4
    mean = rows.sum(axis=0) / (len(rows) + prior)
    second = (prior * 1.0 + ((rows - mean) ** 2).sum(axis=0) + prior * mean**2) / (len(rows) + prior)
    np.testing.assert_allclose(state["obs_count"].numpy()[0], len(rows) + prior)
    np.testing.assert_allclose(state["obs_mean"].numpy(), mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(state["obs_var"].numpy(), second, rtol=1e-5)


def test_an_ended_episode_restarts_from_a_fresh_draw_and_no_gradient_reaches_it():
    env = CartpoleEnv(horizon=6, world_count=2, device="cpu", tilt=0.3)
    env.enable_restarts()
    actions = wp.array(np.full((6, 2, 1), 5.0, np.float32), device="cpu", requires_grad=True)
    done = wp.array(np.array([1, 0], np.int32), device="cpu")
    going_on = wp.zeros(2, dtype=wp.int32, device="cpu")
    key = wp.array(np.array([3], np.int32), device="cpu")
    out = wp.zeros(1, dtype=wp.float32, device="cpu", requires_grad=True)

    @wp.kernel
    def final_cost(q: wp.array(dtype=wp.float32), cost: wp.array(dtype=wp.float32)):
        i = wp.tid()
        wp.atomic_add(cost, 0, q[i] * q[i])

    tape = wp.Tape()
    with tape:
        env.reset()
        for t in range(6):
            if t > 0:  # once restarts are on, before every step: world 0's episode ends after step 2
                env.restart(t, done if t == 3 else going_on, key)
            env.act(t, actions)
            env.step(t)
        wp.launch(final_cost, dim=6, inputs=[env.state(6).joint_q], outputs=[out], device="cpu")
    before = env.state(3).joint_q.numpy().reshape(2, 3)
    after = env.current(3).joint_q.numpy().reshape(2, 3)
    drawn = env.initial["joint_q"].numpy().reshape(2, 3)
    np.testing.assert_array_equal(after[0], drawn[0])  # world 0 starts afresh
    np.testing.assert_array_equal(after[1], before[1])  # world 1 goes on
    tape.backward(out)
    grad = actions.grad.numpy()[:, :, 0]
    assert np.all(grad[:3, 0] == 0.0) and np.all(grad[3:, 0] != 0.0)  # nothing flows into the ended episode
    assert np.all(grad[:, 1] != 0.0)


def test_a_shac_iteration_is_the_same_eager_and_captured(tmp_path):
    arrays = {}
    for capture in (False, True):
        t = trainer(f"capture={capture}", "iterations=4")
        t.fit(tmp_path / str(capture))
        arrays[capture] = {key: value.numpy().copy() for key, value in t.state.arrays().items()}
    assert arrays[True].keys() == arrays[False].keys()
    for key, value in arrays[False].items():
        np.testing.assert_array_equal(value, arrays[True][key], err_msg=key)


def test_both_groups_and_the_critic_are_logged_and_checkpointed(tmp_path):
    proc = train([*SMALL, "iterations=4", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for group in ("actor", "critic"):
        for stat in ("grad_norm_pre", "grad_norm_post", "clipped_fraction", "lr"):
            assert f"optim/{group}/{stat}" in tags, (group, stat)
    for name in ("critic_loss", "value_mean", "target_mean", "action_std", "episode_return", "episode_length"):
        assert f"shac/{name}" in tags, name
    assert [e.value for e in acc.Scalars("shac/episode_length")][-1] == 5.0
    saved = final_checkpoint(tmp_path / "run")
    kept = ("actor/params/data", "critic/params/data", "critic/optim/exp_avg", "task/target_critic", "task/obs_mean")
    for key in (*kept, "task/obs_var", "task/obs_count", "task/carried/joint_q", "task/episode_step"):
        assert key in saved.arrays, key
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "episode_return" in summary["after_training"]

    # evaluated again: the checkpoint's observation statistics normalise the observations (the
    # same rollout as the run's own final evaluation, which spans one window of the env's own
    # starts), and the per-world training bookkeeping is not needed, so another world count
    # evaluates too
    same = run_harness("evaluate", "run", "env.horizon=8", "out=same.json", cwd=tmp_path, timeout=300)
    assert same.returncode == 0, same.stderr
    report = json.loads((tmp_path / "same.json").read_text())
    assert report["figures"]["episode_return"] == summary["after_training"]["episode_return"]
    assert report["loss"] == summary["final_loss"]
    wider = run_harness("evaluate", "run", "env.world_count=6", "env.seed=7", cwd=tmp_path, timeout=300)
    assert wider.returncode == 0, wider.stderr
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert report["env"]["world_count"] == 6 and np.isfinite(report["figures"]["episode_return"])


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_shac_run_killed_with_sigkill_resumes_bit_for_bit(tmp_path):
    args = [*SMALL, "iterations=200", "checkpoint.every=3", "log_every=1"]
    assert_killed_run_resumes_bit_for_bit(args, tmp_path, iterations=200, kill_after=6)


@pytest.mark.parametrize(
    ("args", "field", "accepted"),
    [
        (["+env=ball", "task=shac"], "task: shac needs an env with the role PolicyEnv", "env 'ball'"),
        ([*SMALL, "+loss.terms.pose.steps=last"], "loss.terms.pose.steps: task=shac rewards every step", "all"),
        ([*SMALL, "task.critic_minibatches=3"], "task.critic_minibatches", "a divisor of 32"),
        ([*SMALL, "memory.segment_steps=2"], "memory.segment_steps: task=shac", "null"),
        ([*SMALL, "task.critic.optim.lr=-1"], "task.critic.optim.lr", ">= 0"),
        ([*SMALL, "task.actor.activation=gelu"], "task.actor.activation", "elu"),
    ],
    ids=["env_without_observations", "terminal_cost", "minibatches", "segments", "critic_lr", "activation"],
)
def test_bad_shac_settings_are_refused_in_one_line_before_anything_is_written(request, tmp_path, args, field, accepted):
    assert_clean_rejection(refused_train(request, [*args, "iterations=1"], tmp_path), field, accepted, tmp_path)
