"""A policy run ends with what a user asks: whole episodes from the env's own starts before and
after training (``task=policy``, ``task=shac``), on the done line, in ``summary.json``, in
TensorBoard's first group (``episode/``), in the HParams record and in the sweep report.
Real runs through the command line; the events read back with TensorBoard's own reader."""

from __future__ import annotations

import csv
import json
import re

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from harness import tags
from tests.helpers import run_harness

SHAC = ["+env=cartpole_swingup", "task=shac", "env.world_count=4", "env.horizon=64", "task.window=16"]
SHAC += ["iterations=4", "log_every=2", "plot_every=null"]
POLICY = ["+env=cartpole", "task=policy", "env.world_count=2", "env.horizon=40", "iterations=4", "log_every=2"]
NUMBER = r"-?[0-9.]+(?:e[-+]?[0-9]+)?"


def scalars(run) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def shac_sweep(tmp_path_factory):
    """Two SHAC swing-up jobs (the basic launcher: one after the other)."""
    root = tmp_path_factory.mktemp("episodes")
    sweep = root / "sweep"
    proc = run_harness("train", "-m", *SHAC, "seed=0,1", f"hydra.sweep.dir={sweep}", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sweep, proc


def test_a_shac_run_ends_with_the_return_and_upright_fraction_of_whole_episodes(shac_sweep):
    sweep, proc = shac_sweep
    done = [line for line in proc.stdout.splitlines() if "done:" in line]
    assert len(done) == 2, proc.stdout
    pattern = rf"done: return ({NUMBER}) -> ({NUMBER}), upright ([0-9.]+) -> ([0-9.]+) \(4 worlds, 64 steps\), "
    for line in done:
        found = re.search(pattern, line)
        assert found, line
        seed = re.search(r"\[job \d+: seed=(\d)\]", line).group(1)
        summary = json.loads((sweep / f"seed={seed}" / "summary.json").read_text())
        episodes = summary["episodes"]
        assert (episodes["worlds"], episodes["steps"]) == (4, 64)  # whole episodes, not the 16-step windows
        before, after = episodes["before"], episodes["after"]
        assert found.group(1) == f"{before['episode_return']:.0f}"
        assert found.group(2) == f"{after['episode_return']:.0f}"
        assert float(found.group(4)) == pytest.approx(after["upright_fraction"], abs=0.005)
        # the window losses stay where they were
        assert "final_loss" in summary and "loss/total" in scalars(sweep / f"seed={seed}")


def test_tensorboard_opens_a_policy_run_on_its_episodes_and_hparams_shows_them(shac_sweep):
    sweep, _ = shac_sweep
    run = sweep / "seed=0"
    found = scalars(run)
    summary = json.loads((run / "summary.json").read_text())["episodes"]
    groups = sorted({tag.split("/")[0] for tag in found})
    assert groups[0] == "episode", groups  # TensorBoard sorts the groups by name and opens the first
    returns = found[tags.EPISODE_RETURN]
    assert returns[0] == (0, pytest.approx(summary["before"]["episode_return"], rel=1e-6))  # before training
    assert returns[-1] == (4, pytest.approx(summary["after"]["episode_return"], rel=1e-6))  # at the end
    assert [step for step, _ in returns] == [0, 2, 4]  # and at log steps between
    assert found[tags.EPISODE_UPRIGHT][-1][1] == pytest.approx(summary["after"]["upright_fraction"])
    acc = EventAccumulator(str(run))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics[:3] == [tags.EPISODE_RETURN, tags.EPISODE_UPRIGHT, tags.EPISODE_LOSS]


def test_each_episode_evaluation_logs_its_time_and_sets_it_aside(shac_sweep):
    """``perf/episodes_ms`` at every ``episode/`` step; the summary's ``timing_s.aside`` is their
    sum (what ``perf/iter_ms`` leaves out)."""
    run = shac_sweep[0] / "seed=0"
    found = scalars(run)
    timed = found[tags.PERF_EPISODES_MS]
    assert [step for step, _ in timed] == [step for step, _ in found[tags.EPISODE_RETURN]] == [0, 2, 4]
    assert all(ms > 0.0 for _, ms in timed)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["timing_s"]["aside"] == pytest.approx(sum(ms for _, ms in timed) / 1e3, rel=1e-4)


def test_the_sweep_report_shows_the_episode_figures(shac_sweep, tmp_path):
    sweep, _ = shac_sweep
    proc = run_harness("report", str(sweep), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0].split()
    assert header[:3] == ["seed", "return", "upright"]
    with (sweep / "report.csv").open() as f:
        rows = {row["seed"]: row for row in csv.DictReader(f)}
    for seed, row in rows.items():
        after = json.loads((sweep / f"seed={seed}" / "summary.json").read_text())["episodes"]["after"]
        assert float(row["episode_return"]) == pytest.approx(after["episode_return"])
        assert float(row["upright"]) == pytest.approx(after["upright_fraction"])


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_policy_run_ends_with_its_episodes_and_other_tasks_keep_the_loss_line(tmp_path):
    proc = run_harness("train", *POLICY, "hydra.run.dir=policy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the cartpole defines no return: the episodes' loss, and the upright fraction
    pattern = rf"^done: episode loss ({NUMBER}) -> ({NUMBER}), upright [0-9.]+ -> [0-9.]+ \(2 worlds, 40 steps\), "
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("done:")]
    assert re.search(pattern, line), line
    episodes = json.loads((tmp_path / "policy" / "summary.json").read_text())["episodes"]
    assert set(episodes["after"]) >= {"loss", "upright_fraction"}
    open_loop = run_harness(
        "train", "+env=cartpole", "env.horizon=20", "iterations=2", "hydra.run.dir=ol", cwd=tmp_path
    )
    assert open_loop.returncode == 0, open_loop.stderr
    assert re.search(r"^done: initial loss .* -> final loss ", open_loop.stdout, re.MULTILINE), open_loop.stdout
    assert "episodes" not in json.loads((tmp_path / "ol" / "summary.json").read_text())


def test_the_episodes_only_read_the_training_state_training_is_bit_for_bit_the_same(tmp_path):
    import numpy as np

    from harness import build, config

    overrides = [*SHAC, "iterations=6"]
    values = []
    for name, with_episodes in (("with", True), ("without", False)):
        cfg, choices = config.compose_config("train", overrides)
        config.apply_task_env_defaults(cfg, choices, overrides)
        trainer = build.build_run(cfg, choices).trainer()
        episodes, why = build.episode_evaluator(cfg, choices) if with_episodes else (None, None)
        assert why is None
        summary = trainer.fit(tmp_path / name, episodes=episodes)
        assert ("episodes" in summary) is with_episodes
        values.append(trainer.step.eval_values())
    for group, arrays in values[0].items():
        for key, array in arrays.items():
            assert np.array_equal(array, values[1][group][key]), (group, key)
