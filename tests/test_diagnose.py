"""``harness diagnose``: every number against a linear system's closed form, the command on
the cartpole (its files, its table, a refusal), and ``diagnose.every`` during training."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness import tags
from harness.config import DiagnoseSettings
from harness.diagnose import BOOTSTRAP_BATCHES, diagnose, geometric_horizons, growth_rate
from harness.losses import WeightedLoss
from harness.tasks import OpenLoop, TrainQuantities
from tests.helpers import ROOT, run_harness
from tests.linear_env import LinearEnv

RATE, DT, TARGET, WEIGHT, WORLDS = 2.0, 0.05, 3.0, 1.0, 16
HORIZONS = [2, 4, 8, 16, 32]


def linear_loss() -> WeightedLoss:
    return WeightedLoss({"x": {"source": "x", "weight": WEIGHT, "target": [TARGET], "steps": "last"}})


def make_linear(steps: int, segmented: bool = False) -> LinearEnv:
    return LinearEnv(horizon=steps, world_count=WORLDS, rate=RATE, dt=DT, device="cpu")


def closed_form(steps: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-start gradients of ``w (x_h - c)^2`` with respect to the shared force ``f`` (at 0) and
    to the open-loop actions ``u_0 .. u_{h-1}`` (at 0): ``x_h = alpha^h x_0 + (f + u) terms``."""
    alpha = math.exp(RATE * DT)
    x_h = alpha**steps * starts
    powers = alpha ** np.arange(steps - 1, -1, -1, dtype=np.float64)  # d x_h / d u_s
    residual = 2.0 * WEIGHT * (x_h - TARGET)
    return residual * powers.sum(), residual[:, None] * powers[None, :]


def closed_snr(grads: np.ndarray) -> float:
    mean = grads.mean(axis=0)
    return float(np.linalg.norm(mean) / math.sqrt(np.mean(np.sum((grads - mean) ** 2, axis=-1))))


def closed_snr_batch(grads: np.ndarray, batch: int) -> tuple[float, float]:
    """The snr of the mean of ``batch`` starts drawn with replacement from ``grads``, and the
    bootstrap's tolerance. A draw has mean ``g_bar`` and covariance ``S`` (the starts' spread,
    normalised by their count, as ``snr`` is), so a mean of ``batch`` independent draws has
    ``g_bar`` and ``S / batch``: its snr is ``sqrt(batch) * snr``. Estimated from ``K`` bootstrap
    batches, the mean's error is ``1 / sqrt(K)`` of the batch spread and the spread's relative
    error about ``1 / sqrt(2 K)``: the estimate's standard error is ``sqrt((s^2 / 2 + 1) / K)``;
    the tolerance is four of them."""
    expected = math.sqrt(batch) * closed_snr(grads)
    return expected, 4.0 * math.sqrt((expected**2 / 2 + 1) / BOOTSTRAP_BATCHES)


def test_geometric_horizons_halve_the_horizon_down_to_the_shortest():
    assert geometric_horizons(240) == [15, 30, 60, 120, 240]
    assert geometric_horizons(2000) == [16, 31, 62, 125, 250, 500, 1000, 2000]
    assert geometric_horizons(2000, shortest=20) == [31, 62, 125, 250, 500, 1000, 2000]
    assert geometric_horizons(5) == [5]


def test_the_growth_rate_is_the_slope_of_the_log():
    t = np.array([0.1, 0.5, 2.0])
    assert growth_rate(t, 3.0 * np.exp(1.7 * t)) == pytest.approx(1.7, rel=1e-12)
    assert math.isnan(growth_rate(t[:1], np.ones(1)))


@pytest.fixture(scope="module")
def shared():
    """``task=physical`` on the shared force: one backward pass per start, other worlds masked."""
    settings = DiagnoseSettings(samples=WORLDS, zo_pairs=6, fd_directions=2, zo_scale=1.0)
    return diagnose(
        make_linear, TrainQuantities(), linear_loss(), settings, horizons=HORIZONS, training_worlds=4, env_name="linear"
    )


def test_a_shared_parameter_matches_the_linear_systems_closed_form(shared):
    starts = make_linear(2).starts()
    norms = []
    for h in shared.horizons:
        force_grads, _ = closed_form(h.steps, starts)
        expected = np.abs(force_grads)
        norms.append(np.median(expected))
        assert h.grad_norm_median == pytest.approx(np.median(expected), rel=2e-4)
        assert h.grad_norm_p90 == pytest.approx(np.percentile(expected, 90), rel=2e-4)
        assert h.snr == pytest.approx(closed_snr(force_grads[:, None]), rel=2e-3)
        expected, tolerance = closed_snr_batch(force_grads[:, None], 4)  # training_worlds=4
        assert h.snr_batch == pytest.approx(expected, abs=tolerance)
        # The loss is quadratic in the force: central differences are exact, both estimates agree.
        assert h.zo_cosine == pytest.approx(1.0, abs=1e-4)
        assert h.fd_rel_error < 1e-3
    times = np.array(HORIZONS) * DT
    assert shared.growth_rate_per_s == pytest.approx(growth_rate(times, np.array(norms)), rel=1e-3)
    # The state adjoint of x' = a x grows by exp(a) per second backwards: exactly a.
    assert shared.adjoint_growth_rate_per_s == pytest.approx(RATE, rel=1e-3)


def test_trust_ends_where_a_batchs_mean_gradient_is_noise_and_the_window_is_the_longest_trusted(shared):
    starts = make_linear(2).starts()
    batch_snr = [closed_snr_batch(closed_form(h, starts)[0][:, None], 4) for h in HORIZONS]
    assert all(abs(s - 1.0) > 2 * tol for s, tol in batch_snr)  # every case far from the threshold
    expected = [s >= 1.0 for s, _ in batch_snr]
    assert [h.trusted for h in shared.horizons] == expected
    assert expected[0] and not expected[-1]  # the case covers both sides of the threshold
    # The rule judges the mean of training's 4 starts, not one start: at 16 steps one start's
    # snr is below 1 (0.86) and the horizon is trusted, since the batch's mean has snr 1.7.
    at16 = shared.horizons[HORIZONS.index(16)]
    assert at16.snr < 1.0 and at16.snr_batch >= 1.0 and at16.trusted
    assert shared.trust_rule.startswith("snr_batch >= snr_min")
    longest = max(h for h, ok in zip(HORIZONS, expected, strict=True) if ok)
    assert shared.window == longest
    at = next(h for h in shared.horizons if h.steps == longest)
    assert shared.clip_max_norm == at.batch_grad_norm_p90
    # A shared parameter's training gradient averages 4 starts: its p90 lies below one start's.
    assert 0 < at.batch_grad_norm_p90 <= at.grad_norm_p90 * (1 + 1e-6)
    verdict = shared.verdict()
    assert f"up to {longest} steps" in verdict and f"clip.max_norm={shared.clip_max_norm:.3g}" in verdict
    last = shared.horizons[-1]  # the verdict names the measure that failed there, with one start's beside it
    assert (
        f"At 32 steps the mean gradient of a 4-world batch is mostly sampling noise (snr_batch {last.snr_batch:.3g}"
        in verdict
    )
    assert f"one start's snr {last.snr:.3g}" in verdict and "zo_cosine 1" not in verdict


def test_the_batch_snr_grows_as_the_square_root_of_training_worlds():
    """The same 16 starts judged for batches of 1 and 64: ``sqrt(B)`` times one start's snr."""
    settings = DiagnoseSettings(samples=WORLDS, zo_pairs=2, fd_directions=0)
    starts = make_linear(2).starts()
    for batch in (1, 64):
        found = diagnose(
            make_linear, TrainQuantities(), linear_loss(), settings, horizons=[8, 24, 64], training_worlds=batch
        )
        for h in found.horizons:
            force_grads, _ = closed_form(h.steps, starts)
            expected, tolerance = closed_snr_batch(force_grads[:, None], batch)
            assert h.snr_batch == pytest.approx(expected, abs=tolerance), (batch, h.steps)
        # 64 starts average out the disagreement one start alone fails on at 24 steps (snr 0.37 -> 3.0).
        assert [h.trusted for h in found.horizons] == ([True, False, False] if batch == 1 else [True, True, False])


def test_the_verdict_says_which_measure_failed(shared):
    """snr_batch, zo_cosine or both: the verdict names each one below its threshold."""
    good = shared.horizons[0]
    for snr_batch, zo_cosine, names in ((0.5, 0.9, ["snr_batch 0.5 < 1"]), (3.0, 0.2, ["zo_cosine 0.2 < 0.5"]),
                                        (0.5, 0.2, ["snr_batch 0.5 < 1", "zo_cosine 0.2 < 0.5"])):  # fmt: skip
        bad = dataclasses.replace(good, steps=64, snr=0.25, snr_batch=snr_batch, zo_cosine=zo_cosine, trusted=False)
        verdict = dataclasses.replace(shared, horizons=[good, bad], window=good.steps).verdict()
        at = verdict[verdict.index("At 64 steps") :]
        assert all(name in at for name in names), (names, at)
        assert ("snr_batch" in at) == (snr_batch < 1) and ("zo_cosine 0" in at) == (zo_cosine < 0.5), at
        if snr_batch < 1:  # the batch that would reach the threshold: (1 / 0.25)^2 starts
            assert "one start's snr 0.25, about 16 starts per batch would reach 1" in at


def test_per_world_parameters_give_every_starts_gradient_in_one_backward_and_trust_rests_on_zo_cosine():
    settings = DiagnoseSettings(samples=WORLDS, zo_pairs=6, fd_directions=2)
    found = diagnose(make_linear, OpenLoop(), linear_loss(), settings, horizons=[4, 32], training_worlds=4)
    starts = make_linear(2).starts()
    for h in found.horizons:
        _, grads = closed_form(h.steps, starts)
        norms = np.linalg.norm(grads, axis=1)
        assert h.grad_norm_median == pytest.approx(np.median(norms), rel=2e-4)
        assert h.snr == pytest.approx(closed_snr(grads), rel=2e-3)
        assert math.isnan(h.snr_batch)  # a batch averages nothing: not measured
        assert h.zo_cosine == pytest.approx(1.0, abs=1e-4)
        assert h.fd_rel_error < 1e-3
        # Each world trains its own actions: a batch averages no starts, so snr is not in the rule.
        assert h.trusted
        # A 4-world batch stacks its starts' gradients, each divided by 4.
        assert h.batch_grad_norm_p90 <= np.max(norms) / 2 * (1 + 1e-6)
    assert found.horizons[-1].snr < 1.0  # the starts disagree here, and it is still trusted
    assert found.window == 32 and "snr" not in found.trust_rule
    assert found.adjoint_growth_rate_per_s == pytest.approx(RATE, rel=1e-3)


def test_a_rollout_that_blows_up_is_reported_as_not_finite_never_as_agreement():
    settings = DiagnoseSettings(samples=4, zo_pairs=2, fd_directions=2)
    make = lambda steps, segmented: LinearEnv(horizon=steps, world_count=4, rate=60.0, dt=DT, device="cpu")  # noqa: E731
    found = diagnose(make, TrainQuantities(), linear_loss(), settings, horizons=[2, 32], training_worlds=4)
    short, long = found.horizons  # x ~ exp(60 * 0.05 * 32) = e^96 overflows float32 at 32 steps
    assert math.isfinite(short.loss) and not math.isfinite(long.loss)
    assert math.isnan(long.fd_rel_error) and not long.trusted
    assert json.loads(json.dumps(found.as_json(), allow_nan=False))["horizons"][1]["fd_rel_error"] is None
    assert "not finite" in found.verdict()


def test_one_start_of_a_shared_parameter_is_judged_by_zo_cosine_alone():
    settings = DiagnoseSettings(samples=2, zo_pairs=3, fd_directions=1)
    make = lambda steps, segmented: LinearEnv(horizon=steps, world_count=1, rate=RATE, dt=DT, device="cpu")  # noqa: E731
    found = diagnose(make, TrainQuantities(), linear_loss(), settings, horizons=[4, 8], training_worlds=1)
    assert all(math.isnan(h.snr) and math.isnan(h.snr_batch) and h.trusted for h in found.horizons)
    assert "one start" in found.trust_rule and "snr" not in found.verdict()


def test_diagnose_on_the_cartpole_writes_its_json_picture_and_table(tmp_path):
    out = tmp_path / "diag"
    done = run_harness(
        "diagnose", "+env=cartpole", "env.horizon=16", "diagnose.horizons=[4,16]", "diagnose.samples=4",
        "diagnose.zo_pairs=4", "diagnose.fd_directions=1", f"hydra.run.dir={out}",
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads((out / "diagnose.json").read_text())
    assert found["env"] == "cartpole" and found["task"] == "open_loop"
    assert [h["steps"] for h in found["horizons"]] == [4, 16]
    for h in found["horizons"]:
        assert set(h) >= {"steps", "grad_norm_median", "grad_norm_p90", "snr", "zo_cosine", "fd_rel_error", "trusted"}
        assert h["grad_norm_median"] > 0 and -1 <= h["zo_cosine"] <= 1
        assert h["snr_batch"] is None  # open loop: every world trains its own actions
    assert set(found["recommended"]) >= {"window", "clip_max_norm"}
    assert "growth_rate_per_s" in found and found["settings"]["zo_pairs"] == 4
    assert (out / "diagnose.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "snr/start snr/batch" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["4"], ["16"])]
    assert [r[0] for r in rows] == ["4", "16"] and all(r[5] == "-" for r in rows)


def test_a_bad_diagnose_setting_is_one_line_and_exit_2(tmp_path):
    done = run_harness("diagnose", "+env=cartpole", "diagnose.samples=1", f"hydra.run.dir={tmp_path / 'd'}", cwd=ROOT)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "diagnose.samples" in lines[0], done.stderr
    assert not (tmp_path / "d" / "diagnose.json").exists()


def test_a_diagnosis_too_big_for_memory_is_refused_before_anything_is_built(tmp_path):
    # In segments sharing their graphs, a policy's observations and actions and the observables
    # still span the horizon: 64 starts x 10^8 steps need hundreds of GiB. On one tape (a task
    # whose segments cannot share graphs, capture=false) far less already does not fit.
    for extra, horizon, where in (([], 10**8, "in segments"), (["capture=false"], 400_000, "on one tape")):
        done = run_harness(
            "diagnose", "+env=cartpole", "task=policy", f"env.horizon={horizon}", f"diagnose.horizons=[{horizon}]",
            "diagnose.samples=64", *extra, f"hydra.run.dir={tmp_path / 'd'}", cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"64 starts x {horizon} steps {where}" in lines[0], lines
        assert "diagnose.samples" in lines[0]
        assert not (tmp_path / "d").exists()


def _scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_diagnose_every_logs_the_measures_and_leaves_training_unchanged(tmp_path):
    common = ["train", "+env=cartpole", "env.horizon=12", "iterations=4", "log_every=2", "plot_every=null"]
    runs = {}
    for name, extra in (("plain", []), ("measured", ["diagnose.every=2", "diagnose.samples=3", "diagnose.zo_pairs=3",
                                                      "diagnose.fd_directions=1"])):  # fmt: skip
        done = run_harness(*common, *extra, f"hydra.run.dir={tmp_path / name}", cwd=ROOT)
        assert done.returncode == 0, done.stderr
        runs[name] = _scalars(tmp_path / name)
    measured = runs["measured"]
    assert [step for step, _ in measured[tags.DIAGNOSE_SNR]] == [2, 4]
    assert tags.DIAGNOSE_SNR_BATCH not in measured  # open loop: a batch averages no starts
    assert all(-1 <= v <= 1 for _, v in measured[tags.DIAGNOSE_ZO_COSINE])
    assert all(v > 0 for _, v in measured[tags.DIAGNOSE_GRAD_NORM_MEDIAN])
    for tag, values in runs["plain"].items():  # training's own curves are the same, bit for bit
        if not tag.startswith("perf/"):  # (speed is not)
            assert measured[tag] == values, tag


def _same_measures(one: list, other: list) -> None:
    for a, b in zip(one, other, strict=True):
        for field in ("steps", "grad_norm_median", "grad_norm_p90", "snr", "snr_batch", "zo_cosine", "fd_rel_error",
                      "trusted", "zo_cosine_full", "batch_grad_norm_p90", "loss"):  # fmt: skip
            x, y = getattr(a, field), getattr(b, field)
            assert x == y or (math.isnan(x) and math.isnan(y)), (a.steps, field, x, y)


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_long_horizons_in_captured_segments_measure_what_one_tape_measures(tmp_path):
    """The cartpole in segments of 5 (the segment graphs, replayed) against one tape, bit for bit:
    open-loop actions (one backward), and sysid's shared pole masses and a policy's weights (a
    masked backward per start)."""
    from envs.cartpole import CartpoleConfig, CartpoleEnv
    from harness.tasks import Policy, SystemId
    from tests.helpers import UPRIGHT_TERMS

    done = run_harness(
        "record", "+env=cartpole", "env.world_count=3", "env.horizon=24", "env.pole_masses=[0.3,0.2]", "out=short.npz",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sysid = SystemId(reference=str(tmp_path / "short.npz"), weights={"joint_q": 1.0, "joint_qd": 0.1}, shared=True)
    sysid.check_env("cartpole", CartpoleConfig())
    cases = {
        "open_loop": (OpenLoop(), WeightedLoss(UPRIGHT_TERMS), CartpoleConfig(world_count=3)),
        "sysid": (sysid, sysid.replace_loss(None), sysid.training_config(CartpoleConfig())),
        "policy": (Policy(hidden=[8], action_scale=20.0), WeightedLoss(UPRIGHT_TERMS), CartpoleConfig(world_count=3)),
    }
    for name, (task, loss, env_config) in cases.items():
        found = {}
        for segment_from in (None, 12):

            def make(steps, segmented, env_config=env_config):
                extra = {"segment_steps": 5} if segmented else {}
                return CartpoleEnv(dataclasses.replace(env_config, horizon=steps), device="cpu", **extra)

            settings = DiagnoseSettings(samples=3, zo_pairs=3, fd_directions=1, segment_from=segment_from)
            found[segment_from] = diagnose(make, task, loss, settings, horizons=[8, 12, 24], training_worlds=3)
        tape, segments = found[None], found[12]
        assert [h.segment_steps for h in segments.horizons] == [None, 5, 5], name
        assert [h.segment_steps for h in tape.horizons] == [None, None, None], name
        _same_measures(tape.horizons, segments.horizons)
        assert np.array_equal(tape.adjoint_profile, segments.adjoint_profile), name
        assert all(h.grad_norm_median > 0 for h in tape.horizons), name
    assert not tape.trust_rule.startswith("zo")  # the policy case: shared parameters, masked passes
    # Training with diagnose.every sizes its measurement as the command does: the recording's 3
    # worlds, not diagnose.samples (which the recording would refuse).
    done = run_harness(
        "train", "+env=cartpole", "task=sysid", "task.reference=short.npz", "iterations=2", "log_every=1",
        "plot_every=null", "diagnose.every=2", "diagnose.samples=4", "diagnose.zo_pairs=2",
        "diagnose.fd_directions=1", "hydra.run.dir=run", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "diagnose at iteration 2: 24 steps, snr_batch " in done.stdout
    logged = _scalars(tmp_path / "run")  # the shared masses: the batch's snr is logged beside one start's
    assert [step for step, _ in logged[tags.DIAGNOSE_SNR_BATCH]] == [2] and tags.DIAGNOSE_SNR in logged
