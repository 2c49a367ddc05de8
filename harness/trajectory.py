"""The trajectory file format: ``python -m harness record`` writes it, ``task=sysid`` fits to it.

A trajectory file is an ``.npz`` archive (numpy's), so data measured on a real system can
be brought in by writing the same arrays. Shapes use ``H`` steps, ``W`` worlds (independent
experiments), ``A`` the env's action width:

``format``            ``"harness.trajectory/1"``
``env``               the env's name (``cartpole``)
``dt``                the step [s] the observations are ``dt`` apart by
``controls``          float32 ``(H, W, A)``: the input applied at step ``t`` (cartpole: cart force [N])
``obs/<name>``        float32 ``(H, W, dim)``: observable ``<name>`` after step ``t`` (cartpole:
                      ``joint_q`` cart position [m] and pole angles [rad], ``joint_qd`` their rates)
``initial/<field>``   float32 ``(W, k)``: each world's state before step 0 (cartpole:
                      ``joint_q`` and ``joint_qd``, 3 entries each)
``noise_std``         the standard deviation of the Gaussian noise added to every ``obs``
                      entry (0 for a clean recording; informational)
``excitation``        how ``controls`` were made (text; informational)
``quantities/<name>`` the true values of the env's quantities while recording (informational:
                      a fit never reads them; its last line shows them beside the fitted values)

Every array except the informational ones is checked when a run loads a file, with a
one-line refusal naming the file and what does not fit.
"""

from __future__ import annotations

import dataclasses
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FORMAT",
    "Reference",
    "TrajectoryFileError",
    "excitation",
    "load_reference",
    "save_trajectory",
]

FORMAT = "harness.trajectory/1"
"""The ``format`` entry this version writes and reads."""


class TrajectoryFileError(ValueError):
    """A trajectory file that cannot be used: one line naming the file and what is wrong."""


@dataclass
class Reference:
    """A loaded, checked trajectory (host arrays)."""

    path: Path
    env: str
    dt: float
    controls: np.ndarray
    observed: dict[str, np.ndarray]
    initial: dict[str, np.ndarray]
    noise_std: float = 0.0
    quantities: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """The true values the file says it was recorded with (``quantities/<name>``; informational)."""

    @property
    def steps(self) -> int:
        return int(self.controls.shape[0])

    @property
    def worlds(self) -> int:
        return int(self.controls.shape[1])


EXCITATION_HZ = (0.5, 1.0, 2.0, 3.5, 5.0)
"""Frequencies of the multisine excitation [Hz]."""


def excitation(steps: int, worlds: int, action_dim: int, dt: float, *, amplitude: float, seed: int) -> np.ndarray:
    """A multisine input ``(steps, worlds, action_dim)``: five sines at 0.5, 1, 2, 3.5 and 5 Hz
    with phases drawn per world and action (seeded), scaled so every channel's peak is
    ``amplitude``. A sum of sines over a decade of frequency excites the slow (pendulum) and
    fast (cart) motion alike, which is what makes masses identifiable from one record
    (multisines as identification inputs: Ljung, System Identification: Theory for the User,
    2nd ed., ch. 13)."""
    rng = np.random.default_rng(seed)
    time = np.arange(steps)[:, None, None] * dt
    signal = np.zeros((steps, worlds, action_dim))
    for f in EXCITATION_HZ:
        phase = rng.uniform(0.0, 2.0 * math.pi, size=(1, worlds, action_dim))
        signal += np.sin(2.0 * math.pi * f * time + phase)
    peak = np.abs(signal).max(axis=0, keepdims=True)
    return (amplitude * signal / np.maximum(peak, 1e-12)).astype(np.float32)


def save_trajectory(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` (the arrays of the module docstring) atomically: a temporary file in
    the same folder, then a rename, so an existing file is never left half written."""
    from harness.runs import atomic_output

    with atomic_output(Path(path)) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **{key: np.asarray(value) for key, value in payload.items()})


def load_reference(
    path: str | Path,
    *,
    env: str,
    dt: float,
    observables: dict[str, int],
    action_dim: int,
    field: str = "task.reference",
) -> Reference:
    """Load and check a trajectory file against an env (its name, dt, observable widths and action width).

    Raises:
        TrajectoryFileError: One line: not a file, not an npz archive, a missing array, another
            env, another dt, arrays of the wrong shape or with non-finite values.
    """
    import os
    import stat

    from harness import files

    path = Path(path)
    where = f"{field}: '{path}'"
    accepted = "a trajectory written by python -m harness record"
    try:  # type and size before the file is opened, every array's header before its data
        size = files.check_file(path, field, limit=files.read_limit(), accepted=accepted)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # never blocks, even if swapped for a FIFO
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                raise files.FileCheckError(f"{where} changed while it was read; accepted: {accepted}")
            with zipfile.ZipFile(handle) as archive:
                files.check_npz(archive, field, f"'{path}'", limit=files.read_limit(), compressed=True)
            handle.seek(0)
            with np.load(handle, allow_pickle=False) as archive:
                arrays = {key: archive[key] for key in archive.files}
    except files.FileCheckError as exc:
        raise TrajectoryFileError(str(exc)) from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise TrajectoryFileError(f"{where} is not an npz trajectory file ({type(exc).__name__})") from None
    for key in ("format", "env", "dt", "controls"):
        if key not in arrays:
            raise TrajectoryFileError(
                f"{where} lacks the array '{key}'; a trajectory holds format, env, dt, controls, "
                "obs/<name>, initial/<field> (docs/tasks.md, Recordings)"
            )
    if str(arrays["format"]) != FORMAT:
        raise TrajectoryFileError(f"{where} has format '{arrays['format']}'; accepted: '{FORMAT}'")
    if str(arrays["env"]) != env:
        raise TrajectoryFileError(f"{where} was recorded from env '{arrays['env']}'; this run's env is '{env}'")
    try:
        recorded_dt = float(np.asarray(arrays["dt"], dtype=np.float64).item())
    except (TypeError, ValueError):
        raise TrajectoryFileError(f"{where}: dt is not one number; accepted: the step in seconds") from None
    if not math.isclose(recorded_dt, dt, rel_tol=1e-6):
        raise TrajectoryFileError(
            f"{where} has dt={recorded_dt:g} s; env.dt is {dt:g} s; accepted: a trajectory recorded at the env's dt"
        )
    controls = arrays["controls"]
    if controls.ndim != 3 or controls.shape[2] != action_dim or 0 in controls.shape:
        raise TrajectoryFileError(
            f"{where}: controls has shape {controls.shape}; accepted: (steps, worlds, {action_dim}) for this env"
        )
    steps, worlds = controls.shape[:2]
    observed = {key[4:]: value for key, value in arrays.items() if key.startswith("obs/")}
    if not observed:
        raise TrajectoryFileError(f"{where} has no obs/<name> arrays; accepted: one or more of {sorted(observables)}")
    for name, value in observed.items():
        if name not in observables:
            raise TrajectoryFileError(
                f"{where}: obs/{name} is not an observable of env '{env}'; accepted: {sorted(observables)}"
            )
        want = (steps, worlds, observables[name])
        if value.shape != want:
            raise TrajectoryFileError(f"{where}: obs/{name} has shape {value.shape}; accepted: {want} (as controls)")
    initial = {key[8:]: value for key, value in arrays.items() if key.startswith("initial/")}
    if not initial:
        raise TrajectoryFileError(f"{where} has no initial/<field> arrays (each world's state before step 0)")
    for name, value in initial.items():
        if value.ndim != 2 or value.shape[0] != worlds:
            raise TrajectoryFileError(f"{where}: initial/{name} has shape {value.shape}; accepted: ({worlds}, k)")
    for name, value in [("controls", controls), *((f"obs/{k}", v) for k, v in observed.items()),
                        *((f"initial/{k}", v) for k, v in initial.items())]:  # fmt: skip
        if not np.issubdtype(value.dtype, np.number) or not np.all(np.isfinite(value)):
            raise TrajectoryFileError(f"{where}: {name} holds non-finite or non-numeric values")
    return Reference(
        path=path,
        env=env,
        dt=recorded_dt,
        controls=controls.astype(np.float32),
        observed={k: v.astype(np.float32) for k, v in observed.items()},
        initial={k: v.astype(np.float32) for k, v in initial.items()},
        noise_std=float(np.asarray(arrays.get("noise_std", 0.0), dtype=np.float64).ravel()[0])
        if np.size(arrays.get("noise_std", 0.0)) == 1
        else 0.0,
        quantities={
            key[len("quantities/") :]: value.astype(np.float64)
            for key, value in arrays.items()
            if key.startswith("quantities/") and np.issubdtype(value.dtype, np.number)
        },
    )
