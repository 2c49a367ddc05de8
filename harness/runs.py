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
folder and renamed over the final name when complete, so a killed command leaves the
previous file as it was, never a truncated one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import checkpoint as ckpt

__all__ = ["RunError", "RunFolder", "atomic_output", "write_bytes", "write_json"]


class RunError(ValueError):
    """A folder or file a command cannot use: one line naming the argument and what is accepted."""


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to, renamed over ``path`` when the block
    ends without an error (removed when it raises). The temporary name keeps the suffix, so a
    writer that picks the format from the file name (imageio, matplotlib) still does."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as handle:  # the content on disk before the rename
            os.fsync(handle.fileno())
        os.replace(tmp, path)
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
