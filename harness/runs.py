"""Run folders: where a run's files live, how a command opens one, and how every file is written.

A run folder (``outputs/<env>/<time>_<overrides>``, or a sweep's job folder) holds Hydra's
``.hydra/`` (the command-line overrides it was trained with), ``config.yaml``, TensorBoard's
events, ``checkpoints/`` and ``summary.json``, and later what ``evaluate`` and ``render`` add.
:class:`RunFolder` is the one way a command opens a finished or interrupted run: the
overrides its config is composed from (:func:`harness.config.run_overrides`) and its newest
or a named checkpoint, read and verified (:mod:`harness.checkpoint`, which owns the identity
checks that follow).

Every file the harness writes besides the events goes through :func:`atomic_output` (or
:func:`write_json`, :func:`write_bytes`): it is written under a temporary name in the same
folder, ``.<stem>.<pid>-<host>.partial<suffix>``, flushed to disk and renamed over the final
name when complete, so a killed command leaves the previous file as it was, never a truncated
one. A command killed with SIGKILL leaves its temporary file behind; the next write into the
same folder removes the temporary files of processes of this host that no longer run
(:func:`remove_stale_partials`). A destination that cannot be written (a folder of that name,
a read-only file or folder, a full disk) is one line (:class:`OutputError`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import checkpoint as ckpt

__all__ = [
    "OutputError",
    "RunError",
    "RunFolder",
    "atomic_output",
    "check_writable",
    "remove_stale_partials",
    "write_bytes",
    "write_json",
]


class RunError(ValueError):
    """A folder or file a command cannot use: one line naming the argument and what is accepted."""


class OutputError(RunError):
    """A file the harness cannot write (a folder of that name, read-only, a full disk): one line
    naming the file and why."""


_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"
"""This machine's name as it appears in temporary file names (letters, digits and ``-``)."""

_PARTIAL = re.compile(r"^\.(?P<stem>.*)\.(?P<pid>\d+)-(?P<host>[A-Za-z0-9-]+)\.partial(?P<suffix>(\.[^.]*)?)$")
"""A temporary name :func:`atomic_output` makes: ``.<stem>.<pid>-<host>.partial<suffix>``."""

_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
"""Errors of a write whatever file they name."""
_PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.ENOENT, errno.ENAMETOOLONG})
"""Errors that are about the output only when they name its temporary or final path."""


def partial_name(path: str | Path) -> Path:
    """The temporary path this process writes ``path``'s content to before the rename."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{os.getpid()}-{_HOST}.partial{path.suffix}")


def _running(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (a zombie counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def remove_stale_partials(folder: str | Path) -> list[Path]:
    """Remove the temporary files :func:`atomic_output` left in ``folder`` when its process was
    killed: those made on this host by a process that no longer runs. Temporary files of
    running processes and of other hosts (a shared file system) are kept.

    Returns:
        The files removed.
    """
    removed = []
    with contextlib.suppress(OSError):
        for candidate in Path(folder).glob(".*.partial*"):
            found = _PARTIAL.match(candidate.name)
            if found is None or found["host"] != _HOST or _running(int(found["pid"])):
                continue
            with contextlib.suppress(OSError):
                candidate.unlink()
                removed.append(candidate)
    return removed


def check_writable(path: str | Path) -> None:
    """Refuse, in one line, a destination :func:`atomic_output` could not write.

    Raises:
        OutputError: ``path`` is a folder or another file that is not a regular one (a device
            such as ``/dev/null``, which the rename would replace), its folder does not exist
            or is read-only, or it is a read-only file.
    """
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise OutputError(f"cannot write '{path}': a folder has that name; accepted: a file name (move the folder)")
    if path.exists() and not path.is_file():  # a device (/dev/null), a FIFO, a socket: never replaced
        raise OutputError(f"cannot write '{path}': it is not a regular file; accepted: a file name")
    if not folder.is_dir():
        raise OutputError(f"cannot write '{path}': '{folder}' is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write '{path}': the folder '{folder}' is read-only")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"cannot write '{path}': the file is read-only (chmod u+w to replace it)")


def _fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (the rename) to disk; where a folder cannot be opened, nothing."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to, renamed over ``path`` when the block
    ends without an error (removed when it raises). The temporary name
    (:func:`partial_name`) keeps the suffix, so a writer that picks the format from the file
    name (imageio, matplotlib) still does. A block that writes nothing leaves ``path`` as it was.

    Before the block, stale temporary files in the folder are removed
    (:func:`remove_stale_partials`) and the destination is checked (:func:`check_writable`).

    Raises:
        OutputError: One line: the destination cannot be written (checked before the block, or
            an error writing the temporary file or renaming it: no space, read-only, ...).
    """
    path = Path(path)
    check_writable(path)
    remove_stale_partials(path.parent)
    tmp = partial_name(path)
    try:
        yield tmp
        if not tmp.exists():
            return
        with open(tmp, "rb+") as handle:  # the content on disk before the rename
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_folder(path.parent)
    except OSError as exc:
        ours = exc.filename in (str(tmp), str(path), tmp, path) or exc.filename2 in (str(tmp), str(path))
        if exc.errno in _WRITE_ERRNOS or (exc.errno in _PATH_ERRNOS and ours):
            raise OutputError(f"cannot write '{path}' ({exc.strerror or exc})") from None
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_output`)."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON atomically (:func:`atomic_output`)."""
    write_bytes(path, (json.dumps(payload, indent=2, allow_nan=True) + "\n").encode())


class RunFolder:
    """An existing run folder, as ``evaluate``, ``render`` and a resume open it.

    Args:
        path: The folder.
        command: The command opening it (starts the messages).

    Raises:
        RunError: One line: the folder is not a run folder (no ``.hydra/overrides.yaml``).
    """

    def __init__(self, path: str | Path, command: str):
        from harness.config import ConfigError, run_overrides

        self.path = Path(path)
        self.command = command
        try:
            self.overrides = run_overrides(self.path, command)
        except ConfigError as exc:
            raise RunError(str(exc)) from None

    @property
    def checkpoints(self) -> Path:
        return ckpt.checkpoint_dir(self.path)

    def checkpoint(self, name: str | None = None, *, field: str = "checkpoint") -> ckpt.Checkpoint:
        """The newest checkpoint (``name`` None or ``auto``), or the one ``name`` points at (a
        file, or another run folder's newest), read and verified.

        Raises:
            RunError: One line: no checkpoint, or one that cannot be read or is damaged.
        """
        try:
            path = ckpt.resolve(name or "auto", self.path, field=field)
            if path is None:
                raise RunError(
                    f"{self.command}: no checkpoint in '{self.checkpoints}'; accepted: a finished or interrupted run"
                )
            return ckpt.load(path, field=field)
        except ckpt.CheckpointError as exc:
            raise RunError(str(exc)) from None


# --- Who owns a run folder --------------------------------------------------------------

LOCK_NAME = ".lock"
"""The lock file of a run folder: a process that writes into the folder holds an exclusive
``flock`` on it for as long as it lives (the kernel drops the lock when the process dies,
SIGKILL included), and writes its pid into it for the refusal message."""

RUN_MARKERS = ("summary.json", "config.yaml", "checkpoints", ".hydra/overrides.yaml")
"""What makes a folder hold a run: any of these (a run that was killed before its first
checkpoint still has Hydra's ``.hydra/overrides.yaml``)."""

_held: dict[Path, int] = {}  # folder -> the open descriptor whose flock this process holds


def holds_run(folder: str | Path, *, own_hydra: bool = False) -> bool:
    """Whether ``folder`` holds (the beginning of) a run: :data:`RUN_MARKERS`; with
    ``own_hydra``, not counting ``.hydra/`` (which Hydra has just written for this process)."""
    folder = Path(folder)
    markers = [m for m in RUN_MARKERS if not (own_hydra and m.startswith(".hydra/"))]
    return any((folder / marker).exists() for marker in markers)


def run_status(folder: str | Path) -> str:
    """A short description of the run in ``folder`` for messages: its summary's status and
    iterations, or what is there when it has no summary."""
    try:
        from harness.files import read_small_text

        summary = json.loads(read_small_text(Path(folder) / "summary.json", "summary.json", accepted="a file"))
        status = str(summary.get("status", "unknown"))
        done = summary.get("iterations_done")
        return f"a {status} run" + (f" of {done} iterations" if isinstance(done, int) else "")
    except (OSError, ValueError, AttributeError):
        return "a run without summary.json (interrupted or killed)"


def lock_run_folder(folder: str | Path, field: str = "hydra.run.dir") -> None:
    """Make this process the one writer of ``folder`` (created if missing) for as long as it
    lives; a second call for the same folder does nothing.

    Raises:
        RunError: One line: another live process holds the folder (its pid when known).
    """
    import fcntl

    folder = Path(folder).absolute()
    if folder in _held:
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f"process {holder}" if holder.isdigit() else "another process"
        raise RunError(
            f"{field}: '{folder}' is in use by {who}, which is writing a run there; "
            "accepted: another folder, or wait until that run ends"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held[folder] = fd


def claim_run_folder(
    folder: str | Path, *, resume: bool, overwrite: bool, own_hydra: bool = False, field: str = "hydra.run.dir"
) -> bool:
    """Lock ``folder`` for a run (:func:`lock_run_folder`) and check that the run may write
    there: a folder that already holds a run is continued only by a resume and replaced only
    with ``overwrite=true``. ``own_hydra``: Hydra has already written this process's
    ``.hydra/`` into it, which does not count as a run.

    Returns:
        Whether the folder holds a run that ``overwrite=true`` replaces: the caller removes it
        (:func:`clear_run_folder`) once the new run has passed every check.

    Raises:
        RunError: One line: the folder is in use, or holds a run and neither resume nor
            overwrite was asked for.
    """
    folder = Path(folder)
    lock_run_folder(folder, field)
    if resume or not holds_run(folder, own_hydra=own_hydra):
        return False
    if not overwrite:
        raise RunError(
            f"{field}: '{folder}' holds {run_status(folder)}; accepted: resume=auto to continue it, "
            "overwrite=true to replace it, or another folder"
        )
    return True


def clear_run_folder(folder: str | Path) -> None:
    """Remove an earlier run's files from ``folder`` (``overwrite=true``), all but the lock and
    Hydra's ``.hydra/`` of the process that replaces it."""
    import shutil

    for entry in Path(folder).iterdir():
        if entry.name in (LOCK_NAME, ".hydra"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
