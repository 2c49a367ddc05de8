"""Checkpoints: atomic, checksummed, the last K kept; exact resume.

A checkpoint file ``<run>/checkpoints/ckpt_<iteration>.hckpt`` is::

    MAGIC (8 bytes) | SHA-256 of the payload (32 bytes) | payload

where the payload is an uncompressed ``.npz`` archive of named numpy arrays (the flat
parameter buffer, the optimizer, schedule and clip-policy state arrays) plus one ``meta``
entry holding JSON (iteration, env name, parameter layout, the names of the optimizer,
schedule and clip policy, the host tallies, the resolved config). Loading verifies the
magic, the length and the checksum before anything is used, so a truncated or
bit-flipped file is refused with a clear message.

Writing goes to a temporary file in the same folder, is flushed and fsynced, then
renamed over the final name (atomic on POSIX), and the folder is fsynced: a process
killed at any instant leaves either the previous checkpoints alone or the new one
complete. Only after the rename are checkpoints beyond the newest ``keep`` deleted. A run
resumed from an older checkpoint first moves the newer ones of its folder into
``abandoned/after_<iteration>/``, so they are neither pruned nor picked by ``resume=auto``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"HCKPT\x00\x01\x00"
SUFFIX = ".hckpt"
_NAME = re.compile(r"^ckpt_(\d+)\.hckpt$")


RENAMED: dict[str, dict[str, str]] = {
    "clip": {"norm": "global_norm"},
    "schedule": {"cosine": "cosine_decay", "step": "step_decay"},
}
"""Option names that changed, by config group: ``{old: new}``. One thing has one name (the
config file, the factory's suffix, what a checkpoint records); checkpoints and run folders
written under an old name still load, read under the new one."""


def current_name(group: str, name: Any) -> Any:
    """``name`` of an option of ``group`` under its current name (itself unless renamed)."""
    return RENAMED.get(group, {}).get(name, name) if isinstance(name, str) else name


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the reason."""


@dataclasses.dataclass
class Checkpoint:
    """What a checkpoint holds.

    Attributes:
        arrays: Named numpy arrays (``params/data``, ``optim/<key>``, ``clip/<key>``, ...).
        meta: JSON-serialisable run state (iteration, best loss, env, layout, config, ...).
        path: Where it was read from (None before it is written).
    """

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    path: Path | None = None

    @property
    def iteration(self) -> int:
        """Iterations completed when the checkpoint was taken (the next one to run)."""
        return int(self.meta["iteration"])


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoint files in ``folder``, oldest first (by iteration in the name)."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(checkpoint: Checkpoint, folder: Path, *, keep: int) -> Path:
    """Write ``checkpoint`` atomically into ``folder`` and keep the newest ``keep`` files."""
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    meta = np.frombuffer(json.dumps(checkpoint.meta, allow_nan=True).encode(), dtype=np.uint8)
    np.savez(buffer, meta=meta, **{f"a/{k}": v for k, v in checkpoint.arrays.items()})
    payload = buffer.getvalue()
    final = folder / f"ckpt_{checkpoint.iteration:08d}{SUFFIX}"
    tmp = folder / f".{final.name}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(hashlib.sha256(payload).digest())
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as exc:  # a full disk: no partial file stays behind, and the error names the checkpoint
        tmp.unlink(missing_ok=True)
        if exc.filename is None:
            exc.filename = str(final)
        raise
    _fsync_dir(folder)
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink()
    checkpoint.path = final
    return final


def set_aside_newer(resumed: Path, iteration: int) -> list[Path]:
    """Move the checkpoints of the same folder that are newer than ``iteration`` into
    ``abandoned/after_<iteration>/`` (a new sub-folder each time; kept, never deleted), so
    pruning and ``resume=auto`` follow the run that continues from ``resumed``.

    Returns:
        The new paths of the moved files.
    """
    folder = Path(resumed).parent
    newer = [p for p in list_checkpoints(folder) if int(_NAME.match(p.name).group(1)) > iteration]
    if not newer:
        return []
    base = folder / "abandoned" / f"after_{iteration:08d}"
    target, n = base, 1
    while target.exists():
        target, n = base.with_name(f"{base.name}.{n}"), n + 1
    target.mkdir(parents=True)
    moved = []
    for path in newer:
        os.replace(path, target / path.name)
        moved.append(target / path.name)
    return moved


def load(path: Path, *, field: str = "resume", limit: int | None = None) -> Checkpoint:
    """Read and verify a checkpoint file; raises :class:`CheckpointError` when unusable
    (the message starts with ``field``, the setting that named the file).

    The path is checked before it is opened (:func:`harness.files.check_file`: a regular file,
    at most ``limit`` bytes, by default what the available memory can read whole), then the
    magic, the length and the checksum, then every array's ``.npy`` header
    (:func:`harness.files.check_npz`) before any array is read."""
    from harness import files

    path = Path(path)
    accepted = "auto, a run folder or a checkpoint file written by python -m harness train"
    try:
        size = files.check_file(path, field, limit=limit or files.read_limit(), accepted=accepted)
        blob = _read_regular(path, size, field)
    except files.FileCheckError as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"{field}: cannot read checkpoint '{path}' ({exc.strerror})") from None
    header = len(MAGIC) + 32
    if len(blob) < header or blob[: len(MAGIC)] != MAGIC:
        raise CheckpointError(f"{field}: '{path}' is not a harness checkpoint (bad header; truncated or foreign file)")
    view = memoryview(blob)
    digest, payload = view[len(MAGIC) : header], view[header:]
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{field}: checkpoint '{path}' is corrupted (checksum mismatch: truncated or modified)")
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            members = files.check_npz(archive, field, f"checkpoint '{path}'", limit=len(payload))
        if "meta" not in members:
            raise CheckpointError(f"{field}: checkpoint '{path}' has no meta entry (not written by harness)")
        with np.load(io.BytesIO(payload), allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            arrays = {k[2:]: data[k].copy() for k in data.files if k.startswith("a/")}
    except files.FileCheckError as exc:
        raise CheckpointError(str(exc)) from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, UnicodeDecodeError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(
            f"{field}: checkpoint '{path}' cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        ) from None
    if not isinstance(meta, dict) or "iteration" not in meta:
        raise CheckpointError(f"{field}: checkpoint '{path}' has no iteration in its meta entry")
    return Checkpoint(arrays=arrays, meta=meta, path=path)


def _read_regular(path: Path, size: int, field: str) -> bytes:
    """The bytes of ``path``, ``stat``-ed as a regular file of ``size`` bytes: opened without
    blocking and checked again on the open descriptor (a path swapped for a FIFO or a device
    meanwhile is refused), at most ``size`` bytes read (a file that grew is refused)."""
    from harness import files

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            raise files.FileCheckError(f"{field}: '{path}' changed while it was read")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            blob = handle.read(size + 1)
    finally:
        os.close(fd)
    if len(blob) != size:
        raise files.FileCheckError(f"{field}: '{path}' changed while it was read")
    return blob


IDENTITY_MEMBERS = ("optimizer", "schedule", "clip")
"""The update's members a checkpoint names per parameter group (besides its layout)."""


def flat_identity(identity: dict[str, Any]) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
    """A run's identity (or a checkpoint's meta) as parameter shapes and identity entries, by
    flat name: a single-group run has ``layout``, ``optimizer``, ``schedule`` and ``clip`` at the
    top (what checkpoints always recorded); a run with several parameter groups has them per
    group under ``groups``, named ``<group>/<name>`` here."""
    groups = identity.get("groups")
    if groups is None:
        groups, sep = {"": identity}, ""
    else:
        sep = "/"
    shapes: dict[str, tuple[int, ...]] = {}
    entries: dict[str, Any] = {}
    for group, found in groups.items():
        head = f"{group}{sep}"
        shapes.update({f"{head}{name}": tuple(shape) for name, shape, *_ in found.get("layout", [])})
        for key in ("layout", *IDENTITY_MEMBERS):
            if key in found:
                entries[f"{head}{key}"] = found[key]
    return shapes, entries


def check_identity(
    saved: Checkpoint, path: Path, identity: dict[str, Any], *, iterations: int | None = None, field: str = "resume"
) -> None:
    """Refuse a checkpoint that another run wrote: its env, its parameter groups' layouts (name,
    shape, dtype and bounds of every parameter) and their optimizer, schedule and clip policy
    must be ``identity``'s (:meth:`harness.training.step.TrainStep.identity`); one line,
    :class:`CheckpointError`. The one place a checkpoint's identity is checked: by resume,
    evaluate, render and the command line's early check (:func:`check_fits`)."""
    shapes, entries = flat_identity(identity)
    check_fits(saved, path, env=identity["env"], shapes=shapes, iterations=iterations, components=entries, field=field)


def check_fits(
    saved: Checkpoint,
    path: Path,
    *,
    env: str | None = None,
    shapes: dict[str, Any] | None = None,
    iterations: int | None = None,
    components: dict[str, Any] | None = None,
    field: str = "resume",
) -> None:
    """Refuse a checkpoint that another problem wrote; each given criterion is checked.

    Args:
        saved: The loaded checkpoint.
        path: Its file (named in the messages).
        env: This run's env identity (the env class's ``name``).
        shapes: This run's parameter shapes by name (``<group>/<name>`` with several groups).
        iterations: This run's ``iterations`` (must reach the checkpoint's iteration).
        components: Further identity entries that must match, by flat name
            (:func:`flat_identity`: ``layout``, ``optimizer``, ``schedule``, ``clip``).
        field: The setting that named the checkpoint (starts the messages).

    Raises:
        CheckpointError: One line naming the file, what differs and what would fit.
    """
    meta = saved.meta
    saved_shapes, saved_entries = flat_identity(meta)
    if env is not None and meta.get("env") != env:
        raise CheckpointError(
            f"{field}: checkpoint '{path}' was written by env '{meta.get('env')}'; this run's env is '{env}'"
        )
    if shapes is not None:
        mine = {name: tuple(shape) for name, shape in shapes.items()}
        if saved_shapes != mine:
            raise CheckpointError(
                f"{field}: checkpoint '{path}' holds parameters {saved_shapes}; this run's are {mine}"
            )
    if iterations is not None and saved.iteration > iterations:
        raise CheckpointError(
            f"iterations: {iterations} is before the checkpoint's iteration {saved.iteration} ('{path}'); "
            f"accepted: iterations >= {saved.iteration}"
        )
    for key, mine in (components or {}).items():
        theirs = saved_entries.get(key)
        if current_name(key.rpartition("/")[2], theirs) != mine:
            raise CheckpointError(
                f"{field}: checkpoint '{path}' does not fit this run: its {key} is {theirs!r}, this run's is {mine!r}"
            )


def resolve(resume: str, run_dir: Path, *, field: str = "resume") -> Path | None:
    """The checkpoint file ``resume`` points at.

    Args:
        resume: ``auto`` (the newest checkpoint of ``run_dir``, None when there is none),
            a checkpoint file, or a run folder (its newest checkpoint).
        run_dir: This run's folder.
        field: The setting that named the checkpoint (starts the messages).
    """
    if resume == "auto":
        found = list_checkpoints(checkpoint_dir(run_dir))
        return found[-1] if found else None
    path = Path(resume)
    if path.is_dir():
        found = list_checkpoints(checkpoint_dir(path)) or list_checkpoints(path)
        if not found:
            raise CheckpointError(f"{field}: no checkpoint in '{path}' (looked for checkpoints/ckpt_*{SUFFIX})")
        return found[-1]
    if not path.exists():
        raise CheckpointError(f"{field}: '{path}' does not exist; accepted: auto, a run folder or a checkpoint file")
    return path
