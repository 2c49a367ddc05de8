"""``task=ahac`` (harness.tasks.ahac): the contact cut against a numpy model (at the threshold,
within the floor and the learned horizon), the horizon's dual step with its sign pinned, the twin
critic's minimum and its gradient, the critic's stopping rule on scripted losses and as a device
loop, the contact load on the real Ant (its weight standing, 0 in the air), no gradient across a
cut, captured equal to eager, a SIGKILLed run resuming bit for bit, refusals in one line."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

from harness import build, config
from harness.tasks import ahac_kernels as ak
from harness.tasks import shac_kernels as k
from tests.helpers import refused_train
from tests.test_checkpoint import assert_killed_run_resumes_bit_for_bit, final_checkpoint, train
from tests.test_errors import assert_clean_rejection
from tests.test_robot import QUICK, ant

SMALL = [
    "+env=ant", "task=ahac", "env.world_count=2", "task.window=8", "task.steps_min=2", "task.steps_max=6",
    "task.critic_minibatches=2", "task.critic_max_epochs=5", "task.actor.hidden=[16,16]",
    "task.critic.hidden=[16,16]", "plot_every=null", "log_every=1", "env.horizon=20", *QUICK,
]  # fmt: skip
"""A cheap Ant under AHAC: rollouts of 8 steps, windows of 2 to 6, at most 5 critic passes."""


def trainer(*overrides: str):
    cfg, choices = config.compose_config("train", [*SMALL, *overrides])
    return build.build_run(cfg, choices).trainer()


# -- the contact cut --------------------------------------------------------------------------------


def cuts_model(load, done, terminal, *, steps_min, horizon, threshold, gamma):
    """numpy model of the rule, step by step as the rollout decides it: world ``w``'s window ends
    after step ``t`` where it has more than ``steps_min`` steps and the load passes ``threshold``,
    or has ``horizon`` steps; not after the last step nor at an episode's end (an early one valued
    0). Returns the cuts and the actor's weights with them."""
    steps, worlds = load.shape
    cut = np.zeros((steps, worlds), np.int32)
    cw = np.zeros((steps, worlds))
    vw = np.zeros((steps, worlds))
    for w in range(worlds):
        length, discount = 0, 1.0
        for t in range(steps):
            length += 1
            cw[t, w] = discount
            last = done[t, w] or t == steps - 1
            if not last and ((length > steps_min and load[t, w] > threshold) or length >= horizon):
                cut[t, w] = 1
            vw[t, w] = 0.0 if terminal[t, w] else (gamma * discount if (last or cut[t, w]) else 0.0)
            if done[t, w] or cut[t, w]:
                length, discount = 0, 1.0
            else:
                discount *= gamma
    return cut, cw, vw


def run_cuts(load, episode_step, *, length, steps_min, steps_max, horizon, threshold, gamma, ended_at=None):
    """The task's kernels over a rollout, in its order: SHAC's episode marks, then after each step
    the terminations (world ``w`` ends early after step ``ended_at[w]``, -1: never) and the contact cut."""
    steps, worlds = load.shape
    cut, done, ends, terminal = (wp.zeros((steps, worlds), dtype=wp.int32) for _ in range(4))
    cost_weight, value_weight = (wp.zeros((steps, worlds), dtype=wp.float32) for _ in range(2))
    wp.launch(k.episode_marks, dim=worlds, inputs=[wp.array(episode_step, dtype=wp.int32), length, steps, cut],
              outputs=[done, ends, cost_weight, value_weight, gamma])  # fmt: skip
    loads = wp.array(load, dtype=wp.float32)
    h = wp.array([horizon], dtype=wp.float32)
    ended_at = np.full(worlds, -1) if ended_at is None else np.asarray(ended_at)
    for t in range(steps):
        ended = wp.array((ended_at == t).astype(np.int32))
        wp.launch(k.mark_terminations, dim=worlds, inputs=[ended, t, steps, length, gamma, cut],
                  outputs=[done, ends, terminal, cost_weight, value_weight])  # fmt: skip
        wp.launch(ak.contact_cut, dim=worlds,
                  inputs=[loads, t, steps, steps_min, steps_max, h, threshold, gamma, done],
                  outputs=[cut, cost_weight, value_weight])  # fmt: skip
    return cut.numpy(), done.numpy(), ends.numpy(), terminal.numpy(), cost_weight.numpy(), value_weight.numpy()


def test_a_contact_above_the_threshold_cuts_a_window_longer_than_steps_min():
    steps, gamma = 16, 0.9
    rng = np.random.default_rng(3)
    load = rng.uniform(0.0, 3.0, size=(steps, 6)).astype(np.float32)
    load[:, 0] = 0.0
    load[[2, 4, 5, 11], 0] = 2.0  # world 0: 3 steps (not more than 3), then at 4 (5 steps), 5 too soon, 11
    load[:, 5] = 2.0  # world 5: contact all along; it falls after step 6, three steps after a cut
    episode_step = np.array([0, 0, 13, 0, 0, 0], np.int32)  # world 2's episode ends after step 2 (limit 16)
    ended_at = [-1, -1, -1, 7, -1, 6]  # world 3 falls after step 7, where its window reaches 8 steps
    cut, done, ends, terminal, cw, vw = run_cuts(
        load, episode_step, length=16, steps_min=3, steps_max=16, horizon=8.0, threshold=1.5, gamma=gamma,
        ended_at=ended_at,
    )  # fmt: skip
    np.testing.assert_array_equal(np.flatnonzero(cut[:, 0]), [4, 11])
    mcut, mcw, mvw = cuts_model(load, done, terminal, steps_min=3, horizon=8, threshold=1.5, gamma=gamma)
    np.testing.assert_array_equal(cut, mcut)
    np.testing.assert_allclose(cw, mcw, rtol=1e-6)
    np.testing.assert_allclose(vw, mvw, rtol=1e-6)
    assert done[2, 2] == 1 and cut[2, 2] == 0  # an episode's end is no cut: its window ends anyway
    assert terminal[7, 3] == 1 and cut[7, 3] == 0 and vw[7, 3] == 0.0  # a fall where the horizon would cut
    np.testing.assert_array_equal(np.flatnonzero(cut[:, 5]), [3, 10, 14])  # every 4 steps; the fall restarts the count
    assert terminal[6, 5] == 1 and vw[6, 5] == 0.0 and cw[7, 5] == 1.0
    assert not cut[-1].any()  # nor the rollout's last step
    np.testing.assert_array_equal(ends, (done | (np.arange(steps) == steps - 1)[:, None]).astype(np.int32))


def test_windows_stay_between_steps_min_and_the_learned_horizon():
    steps = 24
    always = np.full((steps, 3), 5.0, np.float32)
    cut, *_ = run_cuts(always, np.zeros(3, np.int32), length=1000, steps_min=4, steps_max=16, horizon=16.0,
                       threshold=1.5, gamma=0.99)  # fmt: skip
    np.testing.assert_array_equal(np.flatnonzero(cut[:, 0]), [4, 9, 14, 19])  # every 5 steps: just past the floor
    never = np.zeros((steps, 3), np.float32)
    for horizon, every in ((16.0, 16), (9.6, 10), (2.0, 4), (40.0, 16)):  # round(H), within [4, 16]
        cut, *_ = run_cuts(never, np.zeros(3, np.int32), length=1000, steps_min=4, steps_max=16, horizon=horizon,
                           threshold=1.5, gamma=0.99)  # fmt: skip
        np.testing.assert_array_equal(np.flatnonzero(cut[:, 1]), np.arange(every - 1, steps - 1, every))


# -- the horizon's dual step ------------------------------------------------------------------------


def horizon_model(load, cut, done, horizon, *, lr, threshold, steps_min, steps_max):
    steps, worlds = load.shape
    sums, counts = np.zeros(steps_max), np.zeros(steps_max)
    for w in range(worlds):
        position = 0
        for t in range(steps):
            if position < steps_max:
                sums[position] += load[t, w]
                counts[position] += 1
            position = 0 if (cut[t, w] or done[t, w] or t == steps - 1) else position + 1
    n = min(max(int(np.floor(horizon + 0.5)), steps_min), steps_max)
    excess = sum(sums[j] / counts[j] - threshold for j in range(n) if counts[j] > 0)
    return float(np.clip(horizon - lr * excess, steps_min, steps_max))


@pytest.mark.parametrize("level", [0.5, 3.0])
def test_the_horizon_shrinks_under_contact_above_the_threshold_and_grows_below(level):
    steps, worlds, threshold = 12, 3, 1.5
    rng = np.random.default_rng(int(level * 10))
    load = (level + rng.uniform(-0.2, 0.2, size=(steps, worlds))).astype(np.float32)
    cut = np.zeros((steps, worlds), np.int32)
    cut[5, 0] = cut[3, 2] = 1
    done = np.zeros((steps, worlds), np.int32)
    done[7, 1] = 1
    horizon = wp.array([6.3], dtype=wp.float32)
    scalars = wp.zeros(3, dtype=wp.float32)
    for counter, lr in ((0, 0.01), (500, 0.0051), (2000, 0.0002)):  # decayed linearly from 0.01 to 2e-4 in 1000
        before = float(horizon.numpy()[0])
        wp.launch(
            ak.horizon_step, dim=1,
            inputs=[wp.array(load), wp.array(cut), wp.array(done), wp.array([counter], dtype=wp.int32), 1000, 0.01,
                    2.0e-4, threshold, 4, 10, wp.zeros(10, dtype=wp.float32), wp.zeros(10, dtype=wp.float32)],
            outputs=[horizon, scalars],
        )  # fmt: skip
        after = float(horizon.numpy()[0])
        expected = horizon_model(load, cut, done, before, lr=lr, threshold=threshold, steps_min=4, steps_max=10)
        assert after == pytest.approx(expected, rel=1e-5)
        assert (after < before) if level > threshold else (after > before)  # the sign
    windows = worlds + 3  # the rollout's ends, two cuts and an episode's end
    np.testing.assert_allclose(scalars.numpy(), [steps * worlds / windows, 2 / worlds, load.mean()], rtol=1e-5)


def test_the_horizon_stays_within_steps_min_and_steps_max():
    load = np.full((8, 2), 100.0, np.float32)
    zeros = np.zeros((8, 2), np.int32)
    for level, start, bound in ((100.0, 9.0, 4.0), (0.0, 5.0, 10.0)):
        horizon = wp.array([start], dtype=wp.float32)
        wp.launch(ak.horizon_step, dim=1,
                  inputs=[wp.array(np.full_like(load, level)), wp.array(zeros), wp.array(zeros),
                          wp.array([0], dtype=wp.int32), 10, 1.0, 1.0, 1.5, 4, 10, wp.zeros(10, dtype=wp.float32),
                          wp.zeros(10, dtype=wp.float32)],
                  outputs=[horizon, wp.zeros(3, dtype=wp.float32)])  # fmt: skip
        assert float(horizon.numpy()[0]) == bound


# -- the twin critic and the stopping rule -----------------------------------------------------------


def test_the_twin_critics_value_is_its_smaller_head_and_its_gradient_goes_there():
    heads = wp.array(np.array([[1.0, 2.0], [5.0, -3.0], [0.5, 0.7]], np.float32), requires_grad=True)
    out = wp.zeros((3, 1), dtype=wp.float32, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(ak.twin_min, dim=3, inputs=[heads], outputs=[out])
    np.testing.assert_array_equal(out.numpy()[:, 0], [1.0, -3.0, 0.5])
    tape.backward(grads={out: wp.array(np.array([[1.0], [2.0], [3.0]], np.float32))})
    np.testing.assert_array_equal(heads.grad.numpy(), [[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])


def stop_model(losses, *, max_epochs, tolerance):
    """AHAC's loop (DiffRL ``ahac.py``): after each pass, with five earlier pass losses kept, stop
    when the mean of their differences is within ``tolerance`` of 0; then keep this pass's."""
    kept = []
    for j, loss in enumerate(losses, start=1):
        stop = len(kept) == 5 and abs(np.mean(np.diff(kept))) < tolerance
        kept = [*kept, loss][-5:]
        if stop or j >= max_epochs:
            return j
    raise AssertionError("ran out of scripted losses")


@pytest.mark.parametrize(
    ("losses", "max_epochs"),
    [
        ([10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.9, 4.8, 4.75, 4.7, 4.69, 4.68, 4.67, 4.66], 64),  # settles
        ([10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0], 8),  # keeps falling: the cap
        ([3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0], 64),  # flat from the start: the earliest stop, after 6
    ],
)
def test_the_critic_stops_by_ahacs_rule_on_scripted_losses(losses, max_epochs):
    expected = stop_model(losses, max_epochs=max_epochs, tolerance=0.2)
    ring, count, go = wp.zeros(5, dtype=wp.float32), wp.zeros(1, dtype=wp.int32), wp.zeros(1, dtype=wp.int32)
    wp.launch(ak.stop_start, dim=1, outputs=[count, go])
    passes = 0
    while go.numpy()[0]:
        pass_losses = wp.array([losses[passes] - 0.25, losses[passes] + 0.25], dtype=wp.float32)  # mean: the loss
        wp.launch(ak.critic_stop, dim=1, inputs=[pass_losses, ring, count, max_epochs, 0.2], outputs=[go])
        passes += 1
    assert passes == expected == int(count.numpy()[0])


@wp.kernel
def scripted_losses(
    script: wp.array(dtype=wp.float32), count: wp.array(dtype=wp.int32), losses: wp.array(dtype=wp.float32)
):
    # in place of the critic's update: pass j's minibatch losses become script[j] (count: passes before it)
    losses[wp.tid()] = script[count[0]]


def passes(task, env, script: wp.array, cap: int) -> None:
    """The critic's loop of ``task`` as its iteration issues it (``Regression.fit_while``, AHAC's
    rule at tolerance 0.2), its minibatch losses replaced by ``script``'s."""
    b, extra = task.buffers(env), task.extra(env)
    ring, count, go = extra["ring"], task._epochs, extra["go"]

    def update() -> None:
        wp.launch(scripted_losses, dim=b.losses.shape, inputs=[script, count], outputs=[b.losses])

    def after_epoch() -> None:
        wp.launch(ak.critic_stop, dim=1, inputs=[b.losses, ring, count, cap, 0.2], outputs=[go])

    wp.launch(ak.stop_start, dim=1, outputs=[count, go])
    b.critic_fit.fit_while(go, b.losses, update, after_epoch)


def test_one_captured_graph_runs_as_many_critic_passes_as_the_rule_decides():
    """The critic's loop on a device flag: one graph, captured once, replayed with other losses,
    runs the passes AHAC's rule decides for each (at most 12), as the eager loop does."""
    scripts = [
        [10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.9, 4.8, 4.75, 4.7, 4.69, 4.68, 4.67],  # settles: stops after 11 passes
        [3.0] * 13,  # flat: the earliest stop, after 6
        [20.0 - j for j in range(13)],  # keeps falling: the cap, 12
    ]
    expected = [stop_model(losses, max_epochs=12, tolerance=0.2) for losses in scripts]
    assert expected == [11, 6, 12]
    t = trainer("capture=false")
    task, env = t.task, t.env
    t.step.run()  # one eager iteration (kernels built, buffers made)
    script = wp.zeros(13, dtype=wp.float32)
    eager = []
    for losses in scripts:
        script.assign(np.array(losses, np.float32))
        passes(task, env, script, 12)
        eager.append(int(task._epochs.numpy()[0]))
    with wp.ScopedCapture(device="cpu") as capture:
        passes(task, env, script, 12)
    captured = []
    for losses in scripts:
        script.assign(np.array(losses, np.float32))
        wp.capture_launch(capture.graph)
        captured.append(int(task._epochs.numpy()[0]))
    assert eager == captured == expected


# -- on the real Ant ------------------------------------------------------------------------------


def test_the_contact_load_is_the_ants_weight_standing_and_zero_in_the_air():
    """2.5 s after the preset's start the Ant rests on the ground: its contacts' springs carry its
    weight (under dflex's damped hinges one world still rocks at 1.5 s, its load 0.81). Started
    1.5 m up, nothing touches after the first step."""
    loads = {}
    for name, overrides, steps in (("standing", [], 150), ("in the air", ["env.start_height=1.5"], 1)):
        env = ant("env.world_count=2", f"env.horizon={steps}", "env.settle_time=0", *overrides)
        env.reset()
        for t in range(steps):
            env.step(t)
        out = wp.zeros(2, dtype=wp.float32)
        env.contact_load(steps - 1, out)
        loads[name] = out.numpy()
    np.testing.assert_allclose(loads["standing"], 1.0, atol=0.05)
    np.testing.assert_array_equal(loads["in the air"], 0.0)


def test_no_gradient_crosses_a_contact_cut():
    """Started low (0.5 m), every world's feet press on the ground from the first step; with a
    threshold of almost 0 and a horizon of 6, each window is cut by contact just past the floor,
    after step 2. Only the steps after it weighted: the state's adjoint up to the cut
    (``clip.adjoint.profile``) is exactly 0, and after it is not."""
    t = trainer("capture=false", "task.contact_threshold=1e-9", "task.horizon_init=6", "env.start_height=0.5",
                "clip.adjoint.profile=true")  # fmt: skip
    step, task, env = t.step, t.task, t.env

    def objective(trajectory):
        b = task.buffers(env)
        for weights in (b.cost_weight, b.value_weight):
            kept = weights.numpy()
            kept[:3] = 0.0  # the first window of every world (steps 0 to 2)
            weights.assign(kept)
        return task.objective(env, step.loss, trajectory)

    step.forward_backward(objective=objective)
    cut, load = task.buffers(env).cut.numpy(), task.extra(env)["load"].numpy()
    np.testing.assert_array_equal(cut[:2], 0)
    np.testing.assert_array_equal(cut[2], 1)  # 3 steps: past the floor (2), short of the horizon (6)
    assert (load[2] > 0).all()  # so contact cut there
    profile = step.adjoint.profile()  # row t: the adjoint of the state after step t
    np.testing.assert_array_equal(profile[:3], 0.0)
    assert profile[3:].min() > 0


def test_captured_iterations_equal_eager_with_the_horizon_and_cuts_moving(tmp_path):
    """Four iterations, captured and eager, the horizon moving every iteration: the final
    checkpoints agree bit for bit."""
    args = [*SMALL, "iterations=4", "checkpoint.every=4", "task.contact_threshold=0.8", "task.horizon_lr=0.5"]
    for capture in ("false", "true"):
        proc = train([*args, f"capture={capture}", f"hydra.run.dir={tmp_path / capture}"], tmp_path)
        assert proc.returncode == 0, proc.stderr
    eager, captured = final_checkpoint(tmp_path / "false"), final_checkpoint(tmp_path / "true")
    for key, value in eager.arrays.items():
        np.testing.assert_array_equal(value, captured.arrays[key], err_msg=key)
    horizon = [key for key in eager.arrays if key.endswith("horizon")]
    assert horizon and float(eager.arrays[horizon[0]][0]) != 2.0


def test_under_auto_the_measured_window_caps_the_windows_in_place_of_the_horizon():
    t = trainer("task.window=auto", "task.auto.floor=2", "task.auto.ceiling=8", "task.contact_threshold=1e9",
                "capture=false")  # fmt: skip
    task, env = t.task, t.env
    state = task.state(env)
    for window, cuts in ((2, [1, 3, 5]), (4, [3])):
        state["window"].fill_(window)
        t.step.run()
        np.testing.assert_array_equal(np.flatnonzero(task.buffers(env).cut.numpy()[:, 0]), cuts)
        assert float(state["horizon"].numpy()[0]) == window  # not stepped: the window is the cap


def test_an_auto_run_measures_and_logs_its_window(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = [*SMALL, "task.window=auto", "task.auto.floor=2", "task.auto.ceiling=8", "task.auto.every=2",
            "diagnose.samples=4", "iterations=3", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    proc = train(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "auto window at iteration" in proc.stdout + proc.stderr
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert any(tag.startswith("auto_window/") for tag in tags)
    window = [e.value for e in events.Scalars("shac/window")]
    horizon = [e.value for e in events.Scalars("ahac/horizon")]
    assert window == [8.0] * 3 and horizon == [6.0] * 3  # the window's cap, clamped to steps_max


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_sigkilled_ahac_run_resumes_bit_for_bit(tmp_path):
    args = [*SMALL, "iterations=120", "checkpoint.every=10", "task.horizon_lr=0.5", "task.contact_threshold=0.8"]
    assert_killed_run_resumes_bit_for_bit(args, tmp_path, iterations=120, kill_after=30, timeout=600)


@pytest.mark.parametrize(
    ("args", "field", "accepted"),
    [
        (["task.steps_min=9", "task.steps_max=8"], "task.steps_min", "at most task.steps_max"),
        (["task.steps_max=16"], "task.steps_max", "at most 8"),
        (["task.window=auto", "task.auto.floor=2", "task.auto.ceiling=4"], "task.steps_max", "at most 4"),
        (["task.horizon_init=1"], "task.horizon_init", "[task.steps_min, task.steps_max]"),
        (["task.contact_threshold=0"], "task.contact_threshold", "> 0"),
    ],
)
def test_bad_ahac_settings_are_refused_in_one_line(request, tmp_path, args, field, accepted):
    proc = refused_train(request, [*SMALL, "iterations=1", *args], tmp_path)
    assert_clean_rejection(proc, field, accepted, tmp_path)


def test_an_env_without_a_contact_load_is_refused_in_one_line(tmp_path):
    proc = train(["+env=cartpole", "task=ahac", "iterations=1"], tmp_path)
    assert_clean_rejection(proc, "task", "ContactLoad", tmp_path)
