"""Nothing empty is left behind: composing a config whose file sets ``hydra.sweep.dir`` (an
experiment) claims no folder for train.yaml's default name (harness.config._merge_lookup).

Before: OmegaConf resolved train.yaml's ``${harness.unique:multirun/${now:...}}`` while it
merged the experiment's folder over it, and the resolver created ``multirun/<time>``: once in
the launching process and once per job in every joblib worker (15 empty folders beside a
15-job sweep), and once wherever pytest ran tests/test_configs.py. The basic launcher's jobs did the same."""

from __future__ import annotations

import pytest

from harness import config
from tests.helpers import compose_run, run_harness


def test_composing_an_experiment_creates_no_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    compose_run("+experiment=cartpole_clip_sweep", "device=cpu")
    assert list(tmp_path.iterdir()) == []


def test_the_name_is_still_claimed_once_where_it_is_used(tmp_path, monkeypatch):
    """Outside a merge the resolver claims as before: a taken name gets ``_2``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "multirun" / "a").mkdir(parents=True)
    assert config.unique_folder("multirun/a") == "multirun/a_2"
    assert config.unique_folder("multirun/a") == "multirun/a_2"  # the same answer for the process
    assert sorted(p.name for p in (tmp_path / "multirun").iterdir()) == ["a", "a_2"]


@pytest.mark.parametrize("launcher", ["basic", pytest.param("joblib", marks=pytest.mark.slow)])
def test_a_sweep_of_an_experiment_leaves_only_its_own_folder(launcher, tmp_path):
    """Each job composes the sweep's config again (Hydra's ``load_sweep_config``): in this
    process (basic) or in a joblib worker, the experiment's own launcher."""
    proc = run_harness(
        "train",
        "-m",
        "+experiment=cartpole_clip_sweep",
        f"hydra/launcher={launcher}",
        "iterations=1",
        "env.horizon=4",
        "seed=0",  # the command line's sweep replaces the experiment's for these two keys
        "clip.max_norm=1,10,100",
        cwd=tmp_path,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in (tmp_path / "multirun").iterdir()) == ["cartpole_clip_sweep"]
    (sweep,) = (tmp_path / "multirun" / "cartpole_clip_sweep").iterdir()
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [
        "clip.max_norm=1",
        "clip.max_norm=10",
        "clip.max_norm=100",
    ]
    assert not (tmp_path / "outputs").exists()


def test_printing_the_resolved_config_keeps_no_folder_it_names(tmp_path):
    """``--cfg hydra --resolve`` resolves the run's and the sweep's folder names (claiming
    them) and prints them; the folders, still empty, are removed before the command ends."""
    proc = run_harness("train", "+env=cartpole", "--cfg", "hydra", "--resolve", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "dir: outputs/cartpole/" in proc.stdout and "dir: multirun/" in proc.stdout
    assert list(tmp_path.iterdir()) == []
