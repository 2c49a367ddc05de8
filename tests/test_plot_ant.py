"""scripts/plot_ant.py, run as a process (its colours read from the script itself): ``--from``
draws a committed plot again from the JSON it wrote (the run folders behind
docs/img/ant_ablation.png are gone), run folders given with it add to it or replace a curve, and
the runs' colours are never a published curve's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from tests.helpers import ROOT

SCRIPT = ROOT / "scripts" / "plot_ant.py"


def plot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_a_plot_is_drawn_again_from_its_json_with_the_same_curves(tmp_path):
    source = ROOT / "docs" / "img" / "ant_ablation.json"
    done = plot("--from", str(source), "--out", str(tmp_path / "again"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads(source.read_text())
    assert (tmp_path / "again.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _run_folder(folder, *, seed: int, worlds: int, returns: dict[int, float], held_out: float | None = None):
    """A task=shac run folder as the trainer leaves it, in the parts the script reads: its
    config.yaml and ``episode/return`` in a TensorBoard event file (the harness's own writer)."""
    from harness import tags
    from harness.events import EventWriter

    config = {"seed": seed, "iterations": 2000, "env": {"world_count": worlds},
              "task": {"_target_": "harness.tasks.SHAC", "window": 32, "auto": {"ceiling": 32}}}  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    writer = EventWriter(folder)
    for step, value in returns.items():
        writer.scalars(step, {tags.EPISODE_RETURN: value})
    writer.close()
    if held_out is not None:
        report = {
            "iteration": 2000,
            "figures": {"episode_return": held_out, "forward_speed": 7.0, "fall_fraction": 0.0},
        }
        (folder / "eval.json").write_text(json.dumps(report))
    return folder


def test_run_folders_with_from_are_added_and_replace_the_same_method_seed_and_worlds(tmp_path):
    first = _run_folder(tmp_path / "a", seed=0, worlds=64, returns={0: 70.0, 2000: 7000.0}, held_out=7340.0)
    second = _run_folder(tmp_path / "b", seed=0, worlds=128, returns={0: 78.0, 200: 4938.0})
    done = plot(str(first), str(second), "--out", str(tmp_path / "earlier"))
    assert done.returncode == 0, done.stderr
    earlier = json.loads((tmp_path / "earlier.json").read_text())["runs"]
    assert [(c["seed"], c["worlds"]) for c in earlier] == [(0, 64), (0, 128)]

    new_seed = _run_folder(
        tmp_path / "c", seed=1, worlds=128, returns={0: 80.0, 200: 4494.0, 2000: 9000.5}, held_out=8999.0
    )
    again = _run_folder(tmp_path / "d", seed=0, worlds=128, returns={0: 78.0, 200: 4938.0, 2000: 8901.0})
    done = plot("--from", str(tmp_path / "earlier.json"), str(new_seed), str(again), "--out", str(tmp_path / "both"))
    assert done.returncode == 0, done.stderr
    runs = json.loads((tmp_path / "both.json").read_text())["runs"]
    assert [c["run"] for c in runs] == [str(first), str(again), str(new_seed)]  # replaced in place, then added
    assert runs[0] == earlier[0]  # as read then
    assert (runs[1]["iterations"], runs[1]["return"]) == ([0, 200, 2000], [78.0, 4938.0, 8901.0])
    added = runs[2]
    assert (added["seed"], added["steps"], added["return"]) == (
        1,
        [0, 200 * 32 * 128, 2000 * 32 * 128],
        [80.0, 4494.0, 9000.5],
    )
    assert added["held_out"]["episode_return"] == 8999.0 and added["held_out"]["steps"] == 2000 * 32 * 128
    assert (tmp_path / "both.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_run_folders_of_the_same_method_seed_and_worlds_are_refused_and_nothing_is_written(tmp_path):
    one = _run_folder(tmp_path / "one", seed=1, worlds=128, returns={0: 80.0})
    two = _run_folder(tmp_path / "two", seed=1, worlds=128, returns={0: 81.0})
    done = plot(str(one), str(two), "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(f"runs: '{one}' and '{two}' are both SHAC, seed 1, 128 worlds; give one")
    )
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "x.json").exists()


def test_neither_run_folders_nor_from_is_refused_and_nothing_is_written(tmp_path):
    done = plot("--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[-1].endswith("runs: give run folders, --from an earlier <out>.json, or both")
    )
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "x.json").exists()


def test_no_run_is_drawn_in_a_published_curves_colour():
    spec = importlib.util.spec_from_file_location("plot_ant", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.RUN_COLOURS).isdisjoint(module.REFERENCE_COLOURS)
    assert len(set(module.RUN_COLOURS)) == len(module.RUN_COLOURS)
