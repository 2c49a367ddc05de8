"""``python -m harness record +env=NAME [overrides] [out=PATH] [amplitude=N] [noise=STD]``: a
trajectory file for ``task=sysid``; without ``out=`` it goes to
``outputs/<env>/recordings/<date>_<time>.npz``.

The env, driven by a multisine from its own initial states, is simulated once and its
observables written in the documented format (:mod:`harness.trajectory`), optionally with
Gaussian noise on every observation; the file is written under a temporary name and renamed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.commands.common import collector_paused, fail

__all__ = ["main", "record_trajectory"]


def record_trajectory(
    overrides: list[str], out: Path | None, *, amplitude: float = 10.0, noise: float = 0.0, device: str | None = None
) -> dict[str, Any]:
    """Simulate the env driven by a multisine (:func:`harness.trajectory.excitation`) from its
    own initial states and write the trajectory file (:mod:`harness.trajectory`), with
    Gaussian noise of standard deviation ``noise`` added to every observation (seeded by the
    run seed). ``out=None``: :func:`default_out`, made once the command line has passed its checks.

    Returns:
        What was written: path, steps, worlds, observables, noise, the env's quantities.

    Raises:
        TrajectoryFileError: One line: a config that does not compose or validate, an env without
            actions or initial state, an output path that cannot be written.
    """
    import warp as wp

    from harness import build, config
    from harness.env import Identifiable
    from harness.runs import OutputError, check_writable
    from harness.tasks.base import Task, rollout
    from harness.trajectory import EXCITATION_HZ, FORMAT, TrajectoryFileError, excitation, save_trajectory

    out = Path(out) if out is not None else None
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        raise TrajectoryFileError(
            f"out: '{out}' is not a file in an existing folder; accepted: out=<folder>/<name>.npz"
        )
    if out is not None:
        try:
            check_writable(out)  # before the simulation
        except OutputError as exc:
            raise TrajectoryFileError(f"out: {exc}") from None
    try:
        cfg, _choices, _ = config.compose_command("train", [*overrides, *([f"device={device}"] if device else [])])
        from harness.limits import check_memory  # refused before anything is allocated

        check_memory(cfg)
        from harness import devices  # device=null: the faster device for this many worlds, as a run's

        name, _ = devices.resolve(config.check_device(cfg.get("device")), int(cfg.env.world_count))
        env = build.build_env(cfg, name)
    except config.ConfigError as exc:
        raise TrajectoryFileError(f"record: {exc}") from None
    if env.action_dim < 1:
        raise TrajectoryFileError(f"record: env '{env.name}' takes no actions; accepted: an env with inputs to excite")
    if not isinstance(env, Identifiable):
        raise TrajectoryFileError(
            f"record: env '{env.name}' does not play the role Identifiable ({Identifiable.summary}); "
            "a recording stores each world's initial state"
        )
    if out is None:
        out = default_out(env.name)
    initial = env.initial_state()
    seed = int(cfg.get("seed", 0))
    controls = excitation(env.horizon, env.world_count, env.action_dim, env.dt, amplitude=amplitude, seed=seed)
    inputs = wp.array(controls, dtype=wp.float32, device=env.device)

    class _Replay(Task):
        name = "replay"

        def parameter_shapes(self, config: Any) -> dict[str, tuple[int, ...]]:
            return {}

        def parameter_specs(self, env: Any) -> list:
            return []

        def begin(self, env: Any, params: Any) -> None:
            env.reset()

        def act(self, env: Any, params: Any, t: int) -> None:
            env.act(t, inputs)

    env.request(dict.fromkeys(env.observables, "all"))
    trajectory = rollout(env, _Replay(), None)
    rng = np.random.default_rng(seed + 1)
    payload: dict[str, Any] = {
        "format": FORMAT,
        "env": env.name,
        "dt": float(env.dt),
        "controls": controls,
        "noise_std": float(noise),
        "excitation": f"multisine {', '.join(f'{f:g}' for f in EXCITATION_HZ)} Hz, peak {amplitude:g}, seed {seed}",
    }
    observed = []
    for name, array in trajectory.items():
        value = array.numpy().astype(np.float32)
        if name == "controls" or value.shape[:2] != (env.horizon, env.world_count):
            continue  # the inputs are stored once, as controls; last-step-only observables are not a trajectory
        if noise > 0:
            value = value + rng.normal(0.0, noise, size=value.shape).astype(np.float32)
        payload[f"obs/{name}"] = value
        observed.append(name)
    for name, array in initial.items():
        payload[f"initial/{name}"] = array.numpy().astype(np.float32).reshape(env.world_count, -1)
    quantities = {}
    for name in env.config.quantities():
        quantities[name] = env.quantity_value(name)
        payload[f"quantities/{name}"] = quantities[name]
    try:
        save_trajectory(out, payload)
    except OutputError as exc:
        raise TrajectoryFileError(f"out: {exc}") from None
    except OSError as exc:
        raise TrajectoryFileError(f"out: cannot write '{out}' ({exc.strerror or exc})") from None
    return {
        "path": str(out),
        "steps": env.horizon,
        "worlds": env.world_count,
        "observables": observed,
        "noise_std": float(noise),
        "quantities": {k: np.asarray(v).tolist() for k, v in quantities.items()},
    }


def default_out(env: str) -> Path:
    """Where a recording goes without ``out=``: ``outputs/<env>/recordings/<date>_<time>.npz``
    (the folder made; a second recording in the same second gets ``_2``, ``_3``, ...), so
    nothing lands in the working folder."""
    import time

    folder = Path("outputs") / env / "recordings"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    out, n = folder / f"{stamp}.npz", 1
    while out.exists():
        n += 1
        out = folder / f"{stamp}_{n}.npz"
    return out


def main(args: list[str]) -> None:
    """``record +env=NAME [overrides] [out=PATH] [amplitude=N] [noise=STD]``: a trajectory file for ``task=sysid``."""
    from harness import init_warp
    from harness.trajectory import TrajectoryFileError

    options, overrides = {}, []
    for arg in args:
        key, eq, value = arg.partition("=")
        (options.__setitem__(key, value) if eq and key in ("out", "amplitude", "noise") else overrides.append(arg))
    numbers = {}
    for key, default, least in (("amplitude", 10.0, 0.0), ("noise", 0.0, 0.0)):
        try:
            numbers[key] = float(options.get(key, default))
        except ValueError:
            numbers[key] = float("nan")
        if not numbers[key] >= least or numbers[key] == float("inf"):
            fail(f"record: {key} must be a finite number >= {least:g}, got {options[key]}")
    if not any(o.lstrip("+").startswith("env=") for o in overrides):
        fail("record: choose the env, e.g. python -m harness record +env=cartpole out=traj.npz")
    init_warp()
    out = Path(options["out"]) if "out" in options else None
    try:
        with collector_paused():  # Newton's import and the env's build: docs/startup.md
            written = record_trajectory(overrides, out, **numbers)
    except TrajectoryFileError as exc:
        fail(exc)
    quantities = ", ".join(f"{k}={np.round(np.asarray(v), 4).tolist()}" for k, v in written["quantities"].items())
    print(
        f"trajectory: {written['path']} ({written['steps']} step{'s' * (written['steps'] != 1)} x "
        f"{written['worlds']} world{'s' * (written['worlds'] != 1)}: "
        f"{', '.join(written['observables'])}; noise std {written['noise_std']:g}; {quantities or 'no quantities'})",
        flush=True,
    )
