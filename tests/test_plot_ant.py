"""scripts/plot_ant.py, run as a process (its colours read from the script itself): ``--from``
draws a committed plot again from the JSON it wrote (the run folders behind
docs/img/ant_ablation.png are gone), and the runs' colours are never a published curve's."""

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


def test_run_folders_and_from_together_are_refused_and_nothing_is_written(tmp_path):
    done = plot(str(tmp_path), "--from", str(ROOT / "docs" / "img" / "ant_ablation.json"), "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("runs: give run folders, or --from an earlier <out>.json, not both")
    )
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "x.json").exists()


def test_no_run_is_drawn_in_a_published_curves_colour():
    spec = importlib.util.spec_from_file_location("plot_ant", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.RUN_COLOURS).isdisjoint(module.REFERENCE_COLOURS)
    assert len(set(module.RUN_COLOURS)) == len(module.RUN_COLOURS)
