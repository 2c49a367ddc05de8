"""System identification: ``record`` writes a trajectory, ``task=sysid`` recovers the cartpole's
pole masses from it (also with noise), ``sysid/*`` curves, and one-line refusals of
reference files that do not fit."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envs.cartpole import CartpoleEnv
from harness.gradcheck import check_gradients
from harness.losses import WeightedLoss
from harness.tasks import TrainQuantities
from tests.helpers import UPRIGHT_TERMS, run_harness

SHORT = ["env.world_count=2"]  # the default 240 steps (1 s)


def record(tmp_path, masses, *extra: str, name: str = "traj.npz"):
    proc = run_harness(
        "record", "+env=cartpole", *SHORT, f"env.pole_masses=[{masses[0]},{masses[1]}]", f"out={name}", *extra,
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return tmp_path / name, proc.stdout


def test_pole_mass_gradients_match_finite_differences():
    env = CartpoleEnv(horizon=60, world_count=2, device="cpu", tilt=0.2)
    task = TrainQuantities(quantities=["pole_masses"], kind="physical")
    result, params = check_gradients(env, WeightedLoss(UPRIGHT_TERMS), samples=4, seed=0, device="cpu", task=task)
    assert result.passed, result.table(params)
    assert np.all(np.abs(result.tape) > 0)  # the masses reach the dynamics (Featherstone's spatial inertia)


def test_record_writes_the_documented_format(tmp_path):
    path, out = record(tmp_path, (0.3, 0.2), "noise=0.01", "amplitude=8")
    assert "240 steps x 2 worlds" in out and "noise std 0.01" in out
    with np.load(path) as f:
        data = {k: f[k] for k in f.files}
    assert str(data["format"]) == "harness.trajectory/1" and str(data["env"]) == "cartpole"
    assert float(data["dt"]) == pytest.approx(1.0 / 240.0)
    assert data["controls"].shape == (240, 2, 1) and np.abs(data["controls"]).max() == pytest.approx(8.0, rel=1e-5)
    assert data["obs/joint_q"].shape == (240, 2, 3) and data["obs/joint_qd"].shape == (240, 2, 3)
    assert data["initial/joint_q"].shape == (2, 3)
    np.testing.assert_allclose(data["quantities/pole_masses"], [[0.3, 0.2], [0.3, 0.2]])
    assert float(data["noise_std"]) == 0.01 and "multisine" in str(data["excitation"])


@pytest.mark.parametrize(
    ("masses", "noise", "shared"),
    [
        pytest.param((0.325, 0.175), "0", "false", marks=pytest.mark.slow),
        ((0.175, 0.325), "0.01", "true"),
    ],
    ids=["plus_minus_30pct_clean_per_world", "minus_plus_30pct_noisy_shared"],
)
def test_sysid_recovers_masses_perturbed_by_30_percent_within_2_percent(tmp_path, masses, noise, shared):
    """From the URDF's 0.25 kg each, masses 30% off are fitted to within 2%: one value per
    world from a clean recording, and one shared value from a recording with Gaussian noise
    of standard deviation 0.01 (rad, m, rad/s, m/s) on every observation."""
    path, _ = record(tmp_path, masses, f"noise={noise}")
    proc = run_harness(
        "train", "+env=cartpole", "task=sysid", f"task.reference={path}", f"task.shared={shared}",
        "iterations=150", "log_every=50", "plot_every=null", "hydra.run.dir=run", cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    fitted = np.array(summary["parameters"]["pole_masses"])
    assert fitted.shape == ((2,) if shared == "true" else (2, 2))  # per world: the recording's 2, not the env's 4
    error = np.abs(fitted / np.array(masses) - 1.0)
    assert error.max() < 0.02, fitted
    # The end of the run shows the fit: start values, fitted values, and the recording's truth.
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("pole_masses: ")]
    copies = 1 if shared == "true" else 2  # one shared value, or one per world of the recording
    truth = "[" + ", ".join(f"{m:g}" for m in masses * copies) + "]"
    start = "[" + ", ".join(["0.25"] * 2 * copies) + "]"
    shown = "[" + ", ".join(f"{v:.5g}" for v in fitted.ravel()) + "]"
    assert line == f"pole_masses: start {start} -> fitted {shown} (truth {truth})"
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    tag = "sysid/pole_masses/0" if shared == "true" else "sysid/pole_masses/0.0"
    curve = [e.value for e in acc.Scalars(tag)]
    assert len(curve) == 150 and curve[-1] == pytest.approx(fitted.ravel()[0], rel=1e-6)
    assert abs(curve[0] - 0.25) < abs(curve[-1] - 0.25)  # the curve starts next to the URDF's value


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def good_arrays(steps=120, worlds=2) -> dict:
    return {
        "format": "harness.trajectory/1",
        "env": "cartpole",
        "dt": 1.0 / 240.0,
        "controls": np.zeros((steps, worlds, 1), np.float32),
        "obs/joint_q": np.zeros((steps, worlds, 3), np.float32),
        "initial/joint_q": np.zeros((worlds, 3), np.float32),
        "initial/joint_qd": np.zeros((worlds, 3), np.float32),
    }


def bad_files(tmp_path) -> dict:
    files = {}
    (tmp_path / "text.npz").write_text("not an archive")
    files["not_npz"] = (tmp_path / "text.npz", "is not an npz trajectory file")
    files["missing"] = (tmp_path / "nothing.npz", "is not a file")
    a = good_arrays()
    a["env"] = "ball"
    files["other_env"] = (write_npz(tmp_path / "ball.npz", **a), "was recorded from env 'ball'")
    a = good_arrays()
    a["dt"] = 0.01
    files["wrong_dt"] = (write_npz(tmp_path / "dt.npz", **a), "has dt=0.01 s")
    a = good_arrays()
    a["obs/joint_q"] = np.zeros((100, 2, 3), np.float32)
    files["wrong_shape"] = (write_npz(tmp_path / "shape.npz", **a), "obs/joint_q has shape (100, 2, 3)")
    a = good_arrays()
    del a["controls"]
    files["missing_array"] = (write_npz(tmp_path / "nocontrols.npz", **a), "lacks the array 'controls'")
    a = good_arrays()
    a["obs/joint_q"][3, 1, 2] = np.nan
    files["nonfinite"] = (write_npz(tmp_path / "nan.npz", **a), "non-finite")
    return files


BAD = ["not_npz", "missing", "other_env", "wrong_dt", "wrong_shape", "missing_array", "nonfinite"]


@pytest.mark.parametrize("case", BAD)
def test_a_reference_that_does_not_fit_is_refused_in_one_line(tmp_path, case):
    """Each misfit names the file and what is wrong (checked where the run is validated)."""
    from harness import build, config

    path, message = bad_files(tmp_path)[case]
    cfg, choices = config.compose_config("train", ["+env=cartpole", "task=sysid", f"task.reference={path}"])
    with pytest.raises(config.ConfigError) as caught:
        build.validate(cfg, choices)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"task.reference: '{path}'") and message in line, line


def test_a_reference_that_does_not_fit_stops_the_command_with_exit_2_before_anything_is_written(tmp_path):
    path, _ = bad_files(tmp_path)["wrong_dt"]
    proc = run_harness(
        "train", "+env=cartpole", "task=sysid", f"task.reference={path}", "iterations=1", cwd=tmp_path, timeout=120
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    expected = f"error: task.reference: '{path}' has dt=0.01 s; env.dt is 0.00416667 s; "
    assert lines[0] == expected + "accepted: a trajectory recorded at the env's dt"
    assert not (tmp_path / "outputs").exists()


def test_sysid_without_a_reference_and_reference_terms_without_sysid_are_refused(tmp_path):
    proc = run_harness("train", "+env=cartpole", "task=sysid", "iterations=1", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "task.reference: required" in proc.stderr
    proc = run_harness(
        "train", "+env=cartpole", "iterations=1", "+loss.terms.pose.kind=reference", cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 2 and "loss.terms.pose.kind: reference" in proc.stderr and "task=sysid" in proc.stderr


def test_record_without_out_writes_under_outputs_never_into_the_working_folder(tmp_path):
    refused = run_harness("record", "+env=cartpole", "env.horizon=-3", cwd=tmp_path, timeout=300)
    assert refused.returncode == 2 and not list(tmp_path.iterdir())  # a refusal makes no folder
    args = ("record", "+env=cartpole", "env.horizon=4", "env.world_count=1")
    first, second = (run_harness(*args, cwd=tmp_path, timeout=300) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]
    written = sorted((tmp_path / "outputs" / "cartpole" / "recordings").iterdir())
    assert len(written) == 2 and all(p.suffix == ".npz" for p in written)  # the second did not replace the first
    assert "(4 steps x 1 world: " in first.stdout  # one world, said in the singular
    assert f"trajectory: {written[0].relative_to(tmp_path)} " in first.stdout + second.stdout


def test_record_refuses_bad_options_and_keeps_an_existing_file(tmp_path):
    existing = tmp_path / "keep.npz"
    existing.write_bytes(b"precious")
    proc = run_harness("record", "+env=cartpole", "noise=-1", "out=keep.npz", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "record: noise must be a finite number >= 0" in proc.stderr
    proc = run_harness("record", "out=keep.npz", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "+env=cartpole" in proc.stderr
    proc = run_harness("record", "+env=ball", "out=keep.npz", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "takes no actions" in proc.stderr
    proc = run_harness("record", "+env=cartpole", "bogus=1", "out=keep.npz", cwd=tmp_path, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert proc.returncode == 2 and lines == [lines[0]] and "record: bogus: no such key" in lines[0], proc.stderr
    assert existing.read_bytes() == b"precious"


@pytest.fixture(scope="module")
def short_recording(tmp_path_factory):
    root = tmp_path_factory.mktemp("recording")
    path, _ = record(root, (0.3, 0.2), "env.horizon=30", name="short.npz")
    return path


def sysid_env(path, **kw):
    from envs.cartpole import CartpoleConfig
    from harness.tasks import SystemId

    task = SystemId(reference=str(path), weights={"joint_q": 1.0, "joint_qd": 0.1}, **kw)
    config = CartpoleConfig()
    task.check_env("cartpole", config)
    return task, CartpoleEnv(task.training_config(config), device="cpu"), task.replace_loss(None)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per_world"])
def test_sysid_gradients_match_finite_differences(short_recording, shared):
    task, env, loss = sysid_env(short_recording, shared=shared)
    result, params = check_gradients(env, loss, samples=4, seed=0, device="cpu", task=task)
    assert result.passed, result.table(params)


def test_sysid_rollout_is_capturable_bit_for_bit(short_recording):
    from harness.training.step import check_capture

    task, env, loss = sysid_env(short_recording)
    check_capture(env, loss, task, device="cpu")
