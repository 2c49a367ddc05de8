"""Sizes (issue 26, class 5): a run that will not fit in memory is refused before anything is
allocated, and the files a run reads are checked by type and size, headers before payloads.

Real processes where a command line is the subject (a FIFO must not hang a command: each such
run has a timeout, so a hang fails the test instead of hanging CI); the loaders in-process."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import resource
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness import checkpoint, limits
from harness.trajectory import TrajectoryFileError, load_reference
from tests.helpers import run_harness
from tests.test_startup import HEAVY, imported, run_cli

ENV = ["+env=cartpole"]
TIMEOUT = 120
"""A command that hangs (a FIFO opened for reading) fails its test after this many seconds."""


def run_timed(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``python -m harness ARGS``; also return the CPU seconds it used (user + system): the
    test's speed bound, unaffected by how loaded the machine is."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = run_harness(*args, cwd=cwd, timeout=TIMEOUT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def assert_refused(proc: subprocess.CompletedProcess, *needles: str, cwd: Path) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (cwd / "outputs").exists() and not (cwd / "multirun").exists()
    return lines[0]


# -- memory ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "named", "accepted"),
    [
        ("env.world_count=100000000", "env.world_count=100000000 x env.horizon=240", "fewer worlds"),
        ("env.horizon=100000000", "env.world_count=4 x env.horizon=100000000", "memory.segment_steps=auto"),
        ("log_every=100000000000", "log_every=100000000000", "a smaller log_every"),
    ],
    ids=["worlds", "horizon", "log_every"],
)
def test_a_size_far_beyond_the_machine_is_refused_in_one_line_before_anything_is_built(
    override, named, accepted, tmp_path
):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, modules, stderr = run_cli(["train", *ENV, override], tmp_path)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [line for line in stderr.splitlines() if line.strip() and "CUDA" not in line]
    assert code == 2 and len(lines) == 1, stderr
    for needle in ("error: ", named, "the run needs at least", "is available", accepted):
        assert needle in lines[0], lines[0]
    assert not imported(modules, HEAVY), "the floor is checked before Newton is imported or a kernel compiles"
    assert cpu < 2.0, f"{cpu:.2f} s of CPU"
    assert not (tmp_path / "outputs").exists()


def test_record_and_evaluate_check_the_env_they_build(tmp_path):
    proc, cpu = run_timed("record", *ENV, "env.world_count=100000000", f"out={tmp_path / 't.npz'}", cwd=tmp_path)
    assert_refused(proc, "record: env.world_count=100000000", "fewer worlds or a shorter horizon", cwd=tmp_path)
    assert cpu < 2.0
    assert not (tmp_path / "t.npz").exists()
    folder = tmp_path / "run"  # a run folder as evaluate reads it first (its overrides), no checkpoint needed
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text('["+env=cartpole"]\n')
    proc, cpu = run_timed("evaluate", str(folder), "env.horizon=100000000", cwd=tmp_path)
    assert_refused(proc, "evaluate: env.world_count=4 x env.horizon=100000000", cwd=tmp_path)
    assert cpu < 2.0
    assert sorted(p.name for p in folder.iterdir()) == [".hydra"]


@pytest.fixture(scope="module")
def cartpole_run():
    """A validated cartpole run of 64 worlds and 100 steps (nothing built)."""
    from harness import build
    from harness.config import compose_command

    cfg, choices, _ = compose_command("train", [*ENV, "env.world_count=64", "env.horizon=100", "device=cpu"])
    return cfg, build.validate(cfg, choices)


def test_the_estimate_refuses_a_run_just_over_what_is_free_and_accepts_one_just_under(monkeypatch, cartpole_run):
    from harness.config import ConfigError

    cfg, run = cartpole_run
    monkeypatch.setattr(limits, "available_host_bytes", lambda: 2**50)
    estimate = limits.check_memory(cfg, run)
    assert not estimate.floor and estimate.parts["device/env"] > 0
    needed = estimate.host * limits.MARGIN
    monkeypatch.setattr(limits, "available_host_bytes", lambda: int(needed * 1.05))
    limits.check_memory(cfg, run)
    monkeypatch.setattr(limits, "available_host_bytes", lambda: int(needed * 0.95))
    with pytest.raises(
        ConfigError, match=r"^env.world_count=64 x env.horizon=100: the run needs about .* is available"
    ):
        limits.check_memory(cfg, run)


def test_the_probe_envs_predict_the_arrays_a_bigger_env_holds(cartpole_run):
    """``a + b W + S (c + d W)`` from envs of 1 and 2 worlds and steps is exact for 8 x 30."""
    from harness.config import check_env_fields

    cfg, _ = cartpole_run
    env_class, fields = check_env_fields(cfg)
    (a, b, c, d), _ = limits.probe_env(env_class, fields, "cpu")
    env = env_class(dataclasses.replace(fields, world_count=8, horizon=30), device="cpu")
    held = limits._array_bytes(limits._walk_arrays(env))
    assert held == pytest.approx(a + b * 8 + 30 * (c + d * 8), rel=0.02)


def test_the_probes_are_the_same_with_the_collector_paused_and_its_last_three_are_freed():
    """Inside ``collector_paused`` (a command's precheck) the probe freezes what its first probe
    made before building the other three: the same figures as with the collector running, and
    the last three probes' models are collected when it returns (the first's may stay)."""
    import gc
    import weakref

    from envs.cartpole import CartpoleConfig, CartpoleEnv
    from harness.commands.common import collector_paused

    models: list[weakref.ref] = []

    class Tracked(CartpoleEnv):
        def build_model(self):
            model = super().build_model()
            models.append(weakref.ref(model))
            return model

    config = CartpoleConfig(world_count=1, horizon=1)
    running = limits.probe_env(Tracked, config, "cpu")
    # (the first probe of a process whose build imports Newton stays referenced after the
    # collection, with or without the pause: seen, its referrer not traced)
    assert len(models) == 4 and all(ref() is None for ref in models[1:])
    models.clear()
    with collector_paused():
        assert not gc.isenabled()
        paused = limits.probe_env(Tracked, config, "cpu")
        assert len(models) == 4 and all(ref() is None for ref in models[1:])
    assert gc.isenabled()
    assert paused == running


def _mem_available() -> int:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return int(meminfo["MemAvailable"].split()[0]) * 1024


def test_the_host_cost_per_step_follows_the_arrays_a_step_holds_and_the_segment_graphs():
    """The swing-up's four Featherstone substeps hold about four times the cartpole's arrays per
    step: its tape and graph are estimated per array, never below the floors calibrated on the
    cartpole. Segments that share their captured graphs count three segments of graph, not the
    horizon."""
    from envs.cartpole import CartpoleConfig, CartpoleEnv
    from envs.cartpole_swingup import CartpoleSwingupEnv, SwingupConfig

    _, cartpole = limits.probe_env(CartpoleEnv, CartpoleConfig(world_count=1, horizon=1), "cpu")
    _, swingup = limits.probe_env(CartpoleSwingupEnv, SwingupConfig(world_count=1, horizon=1), "cpu")
    assert swingup > 3 * cartpole > 0
    config = SwingupConfig(world_count=4, horizon=2000)
    common = {"shapes": {"x": (1,)}, "capture": True, "log_every": 10, "iterations": 10}
    for arrays in (cartpole, swingup):
        parts = limits.estimate_run(config, segment_steps=None, step_arrays=arrays, **common).parts
        per_step = max(limits.STEP_HOST_BYTES, limits.HOST_BYTES_PER_STEP_ARRAY * arrays)
        assert parts["host/tape"] == per_step * 2000
        assert parts["host/graph"] == max(limits.GRAPH_BYTES_PER_STEP, limits.HOST_BYTES_PER_STEP_ARRAY * arrays) * 2000
    one, shared = (
        limits.estimate_run(config, segment_steps=45, step_arrays=swingup, segment_graphs=graphs, **common).parts
        for graphs in (False, True)
    )
    assert one["host/graph"] == 2000 * limits.HOST_BYTES_PER_STEP_ARRAY * swingup
    assert shared["host/graph"] == 3 * 45 * limits.HOST_BYTES_PER_STEP_ARRAY * swingup
    assert one["host/tape"] == shared["host/tape"]
    assert one["host/segments"] == 2000 * limits.SEGMENT_HOST_BYTES_PER_STEP_ARRAY * swingup


def test_available_memory_is_read_from_meminfo_and_never_above_it():
    # Other processes (the other test worker) change MemAvailable between two reads: it is
    # read before and after, and 5% allowed over the larger (a unit slip is a factor of 1024).
    before = _mem_available()
    free = limits.available_host_bytes()
    after = _mem_available()
    assert 0 < free <= 1.05 * max(before, after)


# -- files ----------------------------------------------------------------------------------------


def make_fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def test_a_fifo_as_the_resume_checkpoint_is_refused_without_hanging(tmp_path):
    fifo = make_fifo(tmp_path / "run" / "checkpoints" / "ckpt_00000001.hckpt")
    proc, _ = run_timed("train", *ENV, f"resume={fifo}", cwd=tmp_path)
    assert_refused(proc, "resume:", "is a FIFO, not a regular file", cwd=tmp_path)


def test_a_fifo_as_the_sysid_reference_is_refused_without_hanging(tmp_path):
    fifo = make_fifo(tmp_path / "traj.npz")
    proc, _ = run_timed("train", *ENV, "task=sysid", f"task.reference={fifo}", cwd=tmp_path)
    assert_refused(proc, "task.reference:", "is a FIFO, not a regular file", cwd=tmp_path)


def npy(array_header: dict, data: bytes) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, array_header)
    return buffer.getvalue() + data


def npz(members: dict[str, bytes], *, compress: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compress) as archive:
        for name, blob in members.items():
            archive.writestr(f"{name}.npy", blob)
    return buffer.getvalue()


def saved(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


GIGANTIC = npy({"descr": "<f4", "fortran_order": False, "shape": (10**12,)}, b"\0" * 16)
"""An ``.npy`` member whose header declares 4 TB and which holds 16 bytes."""


def forged_checkpoint(path: Path, members: dict[str, bytes], **kwargs) -> Path:
    meta = saved(np.frombuffer(json.dumps({"iteration": 1}).encode(), dtype=np.uint8))
    payload = npz({"meta": meta, **members}, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(checkpoint.MAGIC + hashlib.sha256(payload).digest() + payload)  # a valid checksum
    return path


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)  # no disk used
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: (d / "ckpt_00000001.hckpt").mkdir() or d / "ckpt_00000001.hckpt", "is a folder, not a regular file"),
        (lambda d: Path("/dev/zero"), "is a device, not a regular file"),
        (lambda d: sparse(d / "huge.hckpt", 100 * 1024**3), "is 100.0 GiB, more than"),
        (lambda d: forged_checkpoint(d / "big.hckpt", {"a/params/data": GIGANTIC}), "declares shape (1000000000000,)"),
        (
            lambda d: forged_checkpoint(d / "obj.hckpt", {"a/params/data": saved(np.array([{}], dtype=object))}),
            "holds Python objects",
        ),
        (
            lambda d: forged_checkpoint(d / "zip.hckpt", {"a/x": saved(np.zeros(3))}, compress=zipfile.ZIP_DEFLATED),
            "is compressed",
        ),
        (lambda d: forged_checkpoint(d / "nometa.hckpt", {}) and _drop_meta(d / "nometa.hckpt"), "no meta entry"),
    ],
    ids=["folder", "dev_zero", "sparse_100GiB", "gigantic_header", "object_array", "compressed", "no_meta"],
)
def test_a_checkpoint_that_is_not_a_regular_bounded_file_is_refused_before_it_is_read(make, message, tmp_path):
    path = make(tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match=r"^resume: ") as caught:
        checkpoint.load(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def _drop_meta(path: Path) -> Path:
    payload = npz({"a/x": saved(np.zeros(3, np.float32))})
    path.write_bytes(checkpoint.MAGIC + hashlib.sha256(payload).digest() + payload)
    return path


def test_resume_auto_refuses_a_folder_named_like_the_newest_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "ckpt_00000009.hckpt").mkdir(parents=True)
    proc, _ = run_timed("train", *ENV, "resume=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert_refused(proc, "resume:", "is a folder, not a regular file", cwd=tmp_path)


def reference_kwargs() -> dict:
    return {"env": "cartpole", "dt": 1 / 240, "observables": {"joint_q": 3, "joint_qd": 3}, "action_dim": 1}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: (d / "t.npz").mkdir() or d / "t.npz", "is a folder, not a regular file"),
        (lambda d: Path("/dev/zero"), "is a device, not a regular file"),
        (lambda d: sparse(d / "t.npz", 100 * 1024**3), "is 100.0 GiB, more than"),
        (lambda d: (d / "t.npz").write_bytes(npz({"controls": GIGANTIC})) and d / "t.npz", "declares shape"),
        (
            lambda d: (
                (d / "t.npz").write_bytes(npz({"controls": saved(np.array([None], dtype=object))})) and d / "t.npz"
            ),
            "holds Python objects",
        ),
    ],
    ids=["folder", "dev_zero", "sparse_100GiB", "gigantic_header", "object_array"],
)
def test_a_reference_that_is_not_a_regular_bounded_file_is_refused_before_it_is_read(make, message, tmp_path):
    path = make(tmp_path)
    with pytest.raises(TrajectoryFileError, match=r"^task.reference: ") as caught:
        load_reference(path, **reference_kwargs())
    assert message in str(caught.value) and "\n" not in str(caught.value)
