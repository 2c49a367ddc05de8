"""Kernel compilation under the harness's control (harness/compile.py, ``python -m harness
compile``): a signal stops a compile in progress within seconds, leaving nothing half-written in
the kernel cache; a run's modules are found with the block size CUDA launches them with; CUDA
kernels compile for an architecture on this machine, which has no GPU, into the cache a later
load finds them in."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import warp as wp

from harness import compile as kernel_compile

ROOT = Path(__file__).resolve().parent.parent


def _harness(*args: str, cache: Path | None = None, **kwargs) -> subprocess.Popen:
    env = dict(os.environ)
    if cache is not None:
        env["WARP_CACHE_PATH"] = str(cache)
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *args], cwd=kwargs.pop("cwd", ROOT), env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs,
    )  # fmt: skip


def _cache_cold_for(cache: Path, cold: str) -> Path:
    """``cache`` holding every module of this machine's kernel cache except those whose name
    holds ``cold``: a signal test then waits only for the compile it interrupts, not for every
    module before it (a cache that is itself cold leaves all of them to compile, as before)."""
    wp.init()  # sets the cache folder (WARP_CACHE_PATH or Warp's default)
    warm = Path(wp.config.kernel_cache_dir)
    seeded = cache / warm.name  # Warp keeps its modules under a folder named by its version
    seeded.mkdir(parents=True)
    for module in warm.glob("wp_*"):
        if cold in module.name or not module.is_dir() or not list(module.glob("*.meta")):
            continue  # the module left cold, and anything but a complete module (a build folder)
        part = seeded / f"{module.name}.part"
        try:  # copied whole and renamed into place, as Warp writes a module, or not at all
            shutil.copytree(module, part)
            part.rename(seeded / module.name)
        except OSError:  # a module another process replaces meanwhile: left to compile
            shutil.rmtree(part, ignore_errors=True)
    return cache


def _build_folders(cache: Path) -> list[str]:
    """Warp's private build folders (``<module>_p<pid>_t<thread>``) anywhere in ``cache``."""
    return glob.glob(str(cache / "**" / "*_p*_t*"), recursive=True)


def _modules_complete(cache: Path) -> None:
    """Every module folder in the cache holds its metadata and a binary: none is half there."""
    for meta in glob.glob(str(cache / "**" / "*.meta"), recursive=True):
        folder = Path(meta).parent
        binaries = [p for p in folder.iterdir() if p.suffix in (".o", ".cubin", ".ptx")]
        assert binaries, f"{folder} holds metadata and no binary"
    for folder in glob.glob(str(cache / "*" / "wp_*")):
        assert glob.glob(os.path.join(folder, "*.meta")), f"{folder} holds no metadata"


def _stop_while_compiling(
    proc: subprocess.Popen, cache: Path, sig: int, *, module: str = "", settle_s: float = 0.5, limit_s: float = 240
) -> float:
    """Wait until ``proc`` is inside a compile (a build folder of Warp's exists; with ``module``,
    one of a module whose name holds it), send ``sig``, and return the seconds it took to exit."""
    start = time.monotonic()
    while not [f for f in _build_folders(cache) if module in Path(f).name]:
        assert proc.poll() is None, f"ended before compiling anything: {proc.communicate()}"
        assert time.monotonic() - start < limit_s, "no compile started"
        time.sleep(0.05)
    time.sleep(settle_s)  # inside the compiler
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("still running 30 s after the signal") from None
    return time.monotonic() - sent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_cold_cpu_compile_at_once(tmp_path: Path, sig: int) -> None:
    """Before, the signal waited for the module in hand: here Newton's Featherstone module, about
    20 s on this CPU. Now the command ends within a second or two, with its one line and 128 +
    the signal, and the cache holds no build folder and no half module."""
    cache = _cache_cold_for(tmp_path / "cache", "featherstone")
    proc = _harness("compile", "+env=cartpole", cache=cache)
    took = _stop_while_compiling(proc, cache, sig, module="featherstone")
    _, err = proc.communicate()
    assert proc.returncode == 128 + sig, err
    assert took < 10
    name = signal.Signals(sig).name
    assert err.strip().splitlines() == [f"compile: interrupted by {name}; no file was left half-written"]
    assert _build_folders(cache) == []
    _modules_complete(cache)


def test_a_signal_while_a_training_run_compiles_stops_it_at_once(tmp_path: Path) -> None:
    """A training run's first signal normally finishes the iteration and writes a checkpoint;
    inside the first iteration's compile (the policy's network, cold: about 1.6 s here) that
    would wait for the compiler, so the run stops at once and says why."""
    cache, run = _cache_cold_for(tmp_path / "cache", "mlp"), tmp_path / "run"
    proc = _harness("train", "+env=cartpole", "task=policy", "iterations=3", f"hydra.run.dir={run}", cache=cache)
    first = proc.stdout.readline()  # printed once the env is built (its modules compiled)
    assert first.startswith("device: cpu"), first
    took = _stop_while_compiling(proc, cache, signal.SIGTERM, module="mlp", settle_s=0.2)
    _, err = proc.communicate()
    assert proc.returncode == 143, err
    assert took < 10
    assert err.strip().splitlines() == [
        "stopped at once while Warp compiled kernels (SIGTERM) in iteration 1; no checkpoint was written"
    ]
    assert _build_folders(cache) == []
    _modules_complete(cache)
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())


@wp.kernel(module="unique")
def _double(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = 2.0 * x[i]


@wp.kernel(module="unique")
def _tile_sum(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    t = wp.tile_load(x, shape=8)
    wp.tile_store(y, wp.tile_sum(t))


def test_loads_are_recorded_with_the_block_size_cuda_would_launch_them_with() -> None:
    """A plain launch: CUDA's default 256 (the CPU runs it with 1); a tiled launch: the size it
    asks for; a tape's adjoint launch (which passes the CPU's resolved 1) adds nothing; a launch
    that asks for 1 is left to the GPU run, said so."""
    x = wp.array(np.arange(8, dtype=np.float32), requires_grad=True, device="cpu")
    y = wp.zeros(8, dtype=float, requires_grad=True, device="cpu")
    s = wp.zeros(1, dtype=float, device="cpu")
    with kernel_compile.record_loads(cuda=False) as recording:
        tape = wp.Tape()
        with tape:
            wp.launch(_double, dim=8, inputs=[x], outputs=[y], device="cpu")
        tape.backward(grads={y: wp.ones(8, dtype=float, device="cpu")})
        wp.launch_tiled(_tile_sum, dim=1, inputs=[x], outputs=[s], block_dim=64, device="cpu")
        wp.launch(_halve, dim=8, inputs=[x], outputs=[y], block_dim=1, device="cpu")
    found = [(r.name, r.block_dim, r.skipped is None) for r in recording.records]
    assert found == [
        (_double.module.name, 256, True),
        (_tile_sum.module.name, 64, True),
        (_halve.module.name, 1, False),
    ]
    assert recording.records[0].identifier == _double.module.get_module_identifier(256)
    assert np.allclose(x.grad.numpy(), 2.0) and s.numpy()[0] == 28.0
    assert not kernel_compile.cuda_kernels()


@wp.kernel(module="unique")
def _halve(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = 0.5 * x[i]


@wp.kernel(module="unique")
def _scaled(x: wp.array(dtype=Any), y: wp.array(dtype=Any)):
    i = wp.tid()
    y[i] = x[i] + x[i]


def test_every_version_of_a_module_that_changes_during_a_run_is_recorded() -> None:
    """A generic kernel's first launch with new argument types adds an overload, which changes
    its module's hash: a GPU run loads both versions, so both are recorded (and compiled)."""
    x32 = wp.array(np.ones(4, np.float32), device="cpu")
    x64 = wp.array(np.ones(4, np.float64), device="cpu")
    with kernel_compile.record_loads(cuda=False) as recording:
        wp.launch(_scaled, dim=4, inputs=[x32], outputs=[wp.zeros_like(x32)], device="cpu")
        wp.launch(_scaled, dim=4, inputs=[x64], outputs=[wp.zeros_like(x64)], device="cpu")
    versions = [r.identifier for r in recording.records if r.name == _scaled.module.name]
    assert len(versions) == 2 and versions[0] != versions[1]


def test_a_module_compiled_for_sm_90_is_where_a_cuda_load_of_it_looks(tmp_path: Path, monkeypatch) -> None:
    """What a CUDA load on an sm_90 GPU looks for, asked of Warp itself with a stand-in device
    (there is none here): by itself Warp picks PTX when the driver is at least as new as its
    toolkit and CUBIN otherwise; the harness sets CUBIN (harness/__init__.py), which is what
    ``compile_module`` writes. Both driver cases find the file."""
    import types

    from warp._src import context

    monkeypatch.setattr(wp.config, "kernel_cache_dir", str(tmp_path))
    assert wp.config.cuda_output == "cubin"
    module = _halve.module
    record = kernel_compile.compile_module(module, 256, 90)
    assert record.compiled
    toolkit = context.runtime.toolkit_version
    for driver in [(toolkit[0] - 1, 0), toolkit, (toolkit[0] + 1, 0)]:
        runtime = types.SimpleNamespace(driver_version=driver, toolkit_version=toolkit)
        device = types.SimpleNamespace(is_cpu=False, is_cuda=True, is_cubin_supported=True, runtime=runtime, arch=90)
        device.get_cuda_output_format = lambda preferred=None, d=device: context.Device.get_cuda_output_format(
            d, preferred
        )
        device.get_cuda_compile_arch = lambda d=device: context.Device.get_cuda_compile_arch(d)
        device._get_cuda_arch_suffix = lambda arch: ""
        device.alias = "cuda:0"
        name = module._get_compile_output_name(device, block_dim=256)
        folder = tmp_path / module.get_module_identifier(256)
        assert (folder / name).is_file(), (driver, name, sorted(p.name for p in folder.iterdir()))
        assert (folder / module._get_meta_name(block_dim=256)).is_file()
    assert kernel_compile.compile_module(module, 256, 90).compiled is False  # found: not compiled again


def test_a_caught_interrupt_during_a_compile_leaves_the_process_able_to_compile(tmp_path: Path) -> None:
    """In a notebook a Ctrl-C during a compile is caught and the session goes on: later compiles
    work, the interrupted kernel too, and no build folder is left."""
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK)
    env = {**os.environ, "WARP_CACHE_PATH": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["caught", "small", "big", "clean"], done.stdout + done.stderr


NOTEBOOK = """
import glob, os, signal, sys, threading, time
import numpy as np
import harness  # installs the compile in a worker thread as Warp is imported
import warp as wp

# Ctrl-C as an interactive session has it: a suite started in the background (`pytest &` in a
# script) ignores SIGINT, a child inherits that, and Python would never raise KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)

wp.init()

@wp.kernel(module="unique")
def big(x: wp.array(dtype=float)):
    i = wp.tid()
    v = x[i]
    for k in range(wp.static(4000)):
        v = wp.sin(v) * 1.0001 + wp.float32(k) * 1e-7
    x[i] = v

@wp.kernel(module="unique")
def small(x: wp.array(dtype=float)):
    x[wp.tid()] = 1.0

x = wp.zeros(4, dtype=float, device="cpu")
building = os.path.join(str(wp.config.kernel_cache_dir), f"*_p{os.getpid()}_t*")


def interrupt_once_compiling():  # Ctrl-C while the compiler works, not at a guessed time
    deadline = time.monotonic() + 120
    while not glob.glob(building) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGINT)


threading.Thread(target=interrupt_once_compiling, daemon=True).start()
began = time.monotonic()
try:
    wp.launch(big, dim=4, inputs=[x], device="cpu")
    print("not interrupted")
    print(f"big launched in {time.monotonic() - began:.2f} s, cache {wp.config.kernel_cache_dir}", file=sys.stderr)
except KeyboardInterrupt:
    print("caught")
wp.launch(small, dim=4, inputs=[x], device="cpu")
print("small" if x.numpy().sum() == 4.0 else "small wrong")
wp.launch(big, dim=4, inputs=[x], device="cpu")
print("big")
deadline = time.monotonic() + 120
while glob.glob(os.path.join(str(wp.config.kernel_cache_dir), "*_p*_t*")) and time.monotonic() < deadline:
    time.sleep(0.2)  # the interrupted worker removes its own folder when it comes back
print("clean" if not glob.glob(os.path.join(str(wp.config.kernel_cache_dir), "*_p*_t*")) else "left")
"""


def test_compile_refuses_bad_values_in_one_line(tmp_path: Path) -> None:
    archs = kernel_compile.known_archs()
    assert 90 in archs  # Warp's NVRTC compiles sm_90 on this machine, which has no GPU
    listed = ", ".join(map(str, archs))
    cases = {
        ("device=cuda",): (
            f"error: arch: required for device=cuda on a machine without a GPU; accepted: {listed} (90: H100, H200)"
        ),
        ("device=cuda", "arch=12"): f"error: arch: 12 is not an architecture NVRTC compiles for; accepted: {listed}",
        (
            "device=cpu",
            "arch=90",
        ): "error: arch: 90 is for CUDA kernels, and device=cpu; accepted: arch=null, or device=cuda",
        ("device=gpu",): "error: device: 'gpu' is not a device compile knows; accepted: cpu, cuda, cuda:N",
        ("env.horizon=0",): "error: env.horizon: must be an integer >= 1, got 0",
    }
    for extra, line in cases.items():
        proc = _harness("compile", "+env=cartpole", *extra, cache=tmp_path / "cache", cwd=tmp_path)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (extra, err)
        assert err.strip().splitlines() == [line], extra
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"] or not any(tmp_path.iterdir())


@pytest.mark.slow
def test_sigterm_20_s_into_a_cold_ant_compile_for_sm_90_and_a_rerun_finishes(tmp_path: Path) -> None:
    """The issue's check: SIGTERM 20 s into a cold ``compile +env=ant task=shac device=cuda
    arch=90`` ends it within 10 s (143, one line); a rerun on the cache it left finishes; a
    third run finds every module compiled (what a CUDA load of sm_90 looks for)."""
    cache = tmp_path / "cache"
    args = ("compile", "+env=ant", "task=shac", "device=cuda", "arch=90")
    proc = _harness(*args, cache=cache, cwd=tmp_path)
    time.sleep(20)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["compile: interrupted by SIGTERM; no file was left half-written"]
    assert _build_folders(cache) == []
    _modules_complete(cache)
    proc = _harness(*args, cache=cache, cwd=tmp_path)
    out, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err
    assert "modules compiled for sm_90" in out
    proc = _harness(*args, cache=cache, cwd=tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("done: 0 modules compiled for sm_90"), out
    cubins = glob.glob(str(cache / "**" / "*.sm90.cubin"), recursive=True) + glob.glob(
        str(cache / "**" / "*.sm90.ptx"), recursive=True
    )
    found = int(re.search(r"(\d+) found in the cache", last).group(1))
    assert len(cubins) >= found > 10
    assert list(tmp_path.iterdir()) == [cache]  # nothing but the cache written
    _modules_complete(cache)


@pytest.mark.slow
def test_a_sweeps_warm_up_compiles_the_jobs_cuda_kernels_for_an_arch(tmp_path: Path) -> None:
    """``hydra.callbacks.warm_kernel_cache.arch=90``: the launching process (no GPU here)
    compiles the sweep's CUDA kernels for sm_90 before the jobs run, into the shared cache."""
    cache = tmp_path / "cache"
    proc = _harness(
        "train", "-m", "+env=cartpole", "iterations=1", "clip.max_norm=1,10",
        "hydra.callbacks.warm_kernel_cache.arch=90", f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cache=cache, cwd=tmp_path,
    )  # fmt: skip
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err
    assert "kernel cache warmed for sm_90 in" in out
    assert glob.glob(str(cache / "**" / "wp_newton._src.solvers.featherstone.kernels_*" / "*.sm90.*"), recursive=True)
    assert _build_folders(cache) == []
