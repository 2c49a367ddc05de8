"""Small builders shared by the tests (real Newton envs, short horizons)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig

from envs.cartpole import CartpoleEnv
from harness import config
from harness.clip import clip_by_global_norm
from harness.losses import WeightedLoss
from harness.optim import adam
from harness.training import Trainer, TrainSettings

UPRIGHT_TERMS = {
    "pose": {"source": "joint_q", "dim_weights": [0.1, 1.0, 1.0]},
    "velocity": {"source": "joint_qd", "dim_weights": [0.01, 0.1, 0.1]},
    "effort": {"source": "controls", "weight": 1e-3},
}


ROOT = Path(__file__).resolve().parent.parent


def _devices() -> list:
    import pytest
    import warp as wp

    found = [d.alias for d in wp.get_devices()]
    return ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif("cuda:0" not in found, reason="no CUDA device"))]


DEVICES = _devices()
"""The devices a device-parametrized test runs on: the CPU always, ``cuda:0`` when Warp sees one."""


def exact_on(device: str) -> bool:
    """Whether runs on ``device`` are bit-reproducible: the CPU always; CUDA only with
    ``HARNESS_DETERMINISTIC`` set (float atomics otherwise sum in any order)."""
    import warp as wp

    return device == "cpu" or wp.config.deterministic != wp.DeterministicMode.NOT_GUARANTEED


def make_trainer(
    *,
    horizon: int = 30,
    world_count: int = 2,
    iterations: int = 10,
    log_every: int = 5,
    lr: float = 0.5,
    max_norm: float = 1.0,
    loss_terms: dict | None = None,
    optimizer=None,
    clip=None,
    schedule=None,
    capture: bool | str = "auto",
    device: str = "cpu",
    plot_every: int | None = None,
    adjoint: dict | None = None,
    task=None,
    **env_kw,
) -> Trainer:
    """A trainer on the real cartpole; Adam(lr), norm clip at max_norm and the upright loss by
    default (open-loop actions unless ``task`` is given); no rollout images unless ``plot_every``
    is given (they cost matplotlib time)."""
    env = CartpoleEnv(horizon=horizon, world_count=world_count, device=device, **env_kw)
    return Trainer(
        env=env,
        loss=WeightedLoss(loss_terms or UPRIGHT_TERMS),
        optimizer=optimizer or adam(lr),
        clip=clip or clip_by_global_norm(max_norm),
        settings=TrainSettings(
            iterations=iterations,
            log_every=log_every,
            seed=0,
            device=device,
            capture=capture,
            plot_every=plot_every,
        ),
        schedule=schedule,
        adjoint=adjoint,
        task=task,
    )


class EagerOnlyCartpole(CartpoleEnv):
    """The cartpole declaring itself not capturable (what an env that cannot keep the
    capture contract does), for the capture=auto/true tests."""

    name = "cartpole_eager"
    capturable = False
    capture_note = "a test env that declares itself eager-only"


def harness_env(extra: dict | None = None) -> dict:
    """The environment of a ``python -m harness`` subprocess: this checkout first on the path."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def run_harness(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python -m harness ARGS`` to completion, capturing its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env=harness_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_harness_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` run by :func:`harness.cli.main` inside this process, in
    ``cwd``: what a refusal test needs (exit code, stdout, stderr) without a new interpreter's
    imports, seconds each. Only for command lines refused by :func:`harness.build.precheck`: one
    it lets through fails here instead of training in the test's process. What the command
    writes to stderr is all there, as a process would show it: Python's ``sys.stderr``, file
    descriptor 2 (native code: Warp, LLVM) and every warning raised meanwhile, one line each.
    The signal handlers, the working folder and what ``precheck`` keeps for the run are put back
    afterwards. A few of each kind of refusal still run as a real process (:func:`run_harness`)."""
    import io
    import signal
    import tempfile
    import traceback
    import warnings

    from harness import build, cli

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    out, err, code = io.StringIO(), io.StringIO(), 0
    checked = build.precheck

    def refused_or_fail(*a, **k):
        checked(*a, **k)
        raise AssertionError(f"not refused by precheck: {' '.join(args)} (run_harness_here is for refusals)")

    here = os.getcwd()
    native = tempfile.TemporaryFile(mode="w+b")
    sys.stderr.flush()
    fd2 = os.dup(2)
    try:
        os.chdir(cwd)
        os.dup2(native.fileno(), 2)
        build.precheck = refused_or_fail
        with (
            warnings.catch_warnings(record=True) as raised,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            warnings.simplefilter("always")
            try:
                cli.main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)
            except Exception:  # what an uncaught error prints from a real process
                traceback.print_exc()
                code = 1
        for warning in raised:
            err.write(f"{warning.filename}:{warning.lineno}: {warning.category.__name__}: {warning.message}\n")
    finally:
        build.precheck = checked
        build.PRECHECKED.clear()
        build._PREBUILT.clear()
        os.dup2(fd2, 2)
        os.close(fd2)
        os.chdir(here)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    native.seek(0)
    written = native.read().decode(errors="replace")
    native.close()
    return subprocess.CompletedProcess(["harness", *args], code, out.getvalue(), written + err.getvalue())


def refused_train(request, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m harness train ARGS`` for a parametrized refusal test: its first case as a
    real process (:func:`run_harness`), the others in-process (:func:`run_harness_here`)."""
    first = all(index == 0 for index in request.node.callspec.indices.values())
    return run_harness("train", *args, cwd=cwd) if first else run_harness_here("train", *args, cwd=cwd)


def start_harness(*args: str, cwd: Path, **popen) -> subprocess.Popen:
    """Start ``python -m harness ARGS`` in the background."""
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=cwd, env=harness_env(), **popen)


def compose_run(*overrides: str, config_name: str = "train") -> tuple[DictConfig, dict]:
    """Compose a config as the CLI would; returns (config without hydra, group choices)."""
    return config.compose_config(config_name, list(overrides))


def rollout_results(env, params, trajectory, total) -> dict:
    """Host copies of what a forward + backward produced: the loss, the parameter gradient,
    every observable and every model array's gradient (what segment tests compare bit for bit)."""
    import numpy as np
    import warp as wp

    found = {"loss": total.numpy(), "parameter gradient": params.grad.numpy()}
    found.update({f"observable {k}": v.numpy() for k, v in trajectory.items()})
    found.update(
        {
            f"model.{k}.grad": v.grad.numpy()
            for k, v in vars(env.model).items()
            if isinstance(v, wp.array) and v.grad is not None
        }
    )
    return {k: np.array(v, copy=True) for k, v in found.items()}
