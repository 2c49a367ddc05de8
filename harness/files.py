"""Files a user names, checked before they are read.

A path a user names is ``stat``-ed first and
must be a regular file (a FIFO would block the open forever, ``/dev/zero`` never ends, a folder
fails to read) no larger than a bound the caller derives from what the file can hold; an
``.npz`` archive's members are read header first (``.npy`` magic, shape and dtype) and refused
when compressed, pickled (object arrays), or declaring more bytes than the member holds, before
any array is read.

Used by :mod:`harness.checkpoint` (resume) and :mod:`harness.trajectory` (a sysid reference).
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
from pathlib import Path
from typing import Any

__all__ = [
    "FileCheckError",
    "available_host_bytes",
    "check_file",
    "check_npz",
    "format_bytes",
    "read_limit",
    "read_small_text",
]

GIB = 1024**3
MIB = 1024**2


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_free() -> int | None:
    """Bytes the process's memory cgroup still allows (v2 or v1), None without a limit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    free = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":  # v2
            places = [(Path("/sys/fs/cgroup") / rel, "memory.max", "memory.current")]
        elif "memory" in controllers.split(","):
            places = [(Path("/sys/fs/cgroup/memory") / rel, "memory.limit_in_bytes", "memory.usage_in_bytes")]
        else:
            continue
        for folder, limit_name, usage_name in places:
            limit, usage = _read_int(folder / limit_name), _read_int(folder / usage_name)
            if limit is not None and usage is not None and limit < 2**60:
                free.append(max(limit - usage, 0))
    return min(free) if free else None


def available_host_bytes() -> int | None:
    """Host memory a new allocation can have: ``MemAvailable``, less where a cgroup leaves less
    (None where neither can be read)."""
    found = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError):
        found = None
    cgroup = _cgroup_free()
    if cgroup is not None:
        found = cgroup if found is None else min(found, cgroup)
    return found


def format_bytes(count: float) -> str:
    """``58.1 GiB``, ``310 MiB``."""
    if count >= 1024 * GIB:
        return f"{count / (1024 * GIB):.1f} TiB"
    if count >= GIB:
        return f"{count / GIB:.1f} GiB"
    return f"{count / MIB:.0f} MiB"


# -- the check ------------------------------------------------------------------------------------


class FileCheckError(ValueError):
    """A file refused before it is read: one line (the caller's field starts it)."""


def check_file(path: Path, field: str, *, limit: int, accepted: str) -> int:
    """``stat`` ``path`` without opening it: a regular file of at most ``limit`` bytes.

    Returns:
        Its size in bytes.

    Raises:
        FileCheckError: One line starting with ``field``: missing, not a regular file (a
            folder, a FIFO, a device), or larger than ``limit``.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise FileCheckError(f"{field}: '{path}' is not a file ({exc.strerror}); accepted: {accepted}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = (
            "a folder"
            if stat.S_ISDIR(info.st_mode)
            else "a FIFO"
            if stat.S_ISFIFO(info.st_mode)
            else "a device"
            if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
            else "not a regular file"
        )
        raise FileCheckError(f"{field}: '{path}' is {kind}, not a regular file; accepted: {accepted}")
    if info.st_size > limit:
        raise FileCheckError(
            f"{field}: '{path}' is {format_bytes(info.st_size)}, more than {format_bytes(limit)} "
            f"(what such a file can hold here); accepted: {accepted}"
        )
    return int(info.st_size)


SMALL_FILE_LIMIT = 16 * MIB
"""The most bytes a small text file the harness reads (a run's overrides, a summary) may have."""


def read_small_text(path: Path, field: str, *, accepted: str, limit: int = SMALL_FILE_LIMIT) -> str:
    """A small text file a run folder holds (``.hydra/overrides.yaml``, ``summary.json``), read
    only when it is a regular file of at most ``limit`` bytes (:func:`check_file`; opened
    without blocking, so a FIFO swapped in after the check cannot hang the reader either).

    Raises:
        FileCheckError: One line starting with ``field``.
    """
    size = check_file(path, field, limit=limit, accepted=accepted)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise FileCheckError(f"{field}: '{path}' cannot be read ({exc.strerror}); accepted: {accepted}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileCheckError(f"{field}: '{path}' changed while it was read; accepted: {accepted}")
        data = os.read(fd, size + 1)
    finally:
        os.close(fd)
    return data[: size + 1].decode("utf-8", errors="replace")


def read_limit(fraction: float = 0.25) -> int:
    """The most bytes a file read whole into memory may have: ``fraction`` of the available host
    memory (reading and decoding it takes a few times its size), at least 64 MiB."""
    free = available_host_bytes()
    return max(int((free if free is not None else 8 * GIB) * fraction), 64 * MIB)


def check_npz(
    archive: zipfile.ZipFile, field: str, where: str, *, limit: int, compressed: bool = False
) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Read the ``.npy`` header of every member of an open ``.npz`` archive, no payload.

    A compressed member (``np.savez_compressed``, with ``compressed``) is bounded by the size
    its zip entry declares: the header may not declare more, zipfile never inflates past it, and
    the declared sizes must add up to at most ``limit`` (no zip bomb is inflated).

    Returns:
        Each member's ``(shape, dtype)`` by name (without ``.npy``).

    Raises:
        FileCheckError: One line starting with ``field``: members declaring more than ``limit``
            bytes in all, a member that is compressed (unless ``compressed``), not an ``.npy``
            array, an object (pickled) array, or one whose header declares more bytes than the
            member holds.
    """
    import numpy as np

    found: dict[str, tuple[tuple[int, ...], Any]] = {}
    declared = sum(info.file_size for info in archive.infolist())
    if declared > limit:
        raise FileCheckError(
            f"{field}: {where} holds {format_bytes(declared)} uncompressed, more than {format_bytes(limit)} fit here"
        )
    for info in archive.infolist():
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        if info.compress_type != zipfile.ZIP_STORED and not compressed:
            raise FileCheckError(f"{field}: {where}: member '{name}' is compressed; accepted: np.savez (uncompressed)")
        try:
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, _fortran, dtype = np.lib.format.read_array_header_1_0(member)
                elif version == (2, 0):
                    shape, _fortran, dtype = np.lib.format.read_array_header_2_0(member)
                else:
                    raise ValueError(f"npy version {version}")
                header = member.tell()
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise FileCheckError(f"{field}: {where}: member '{name}' is not a numpy array ({exc})") from None
        if dtype.hasobject:
            raise FileCheckError(f"{field}: {where}: member '{name}' holds Python objects; accepted: numeric arrays")
        nbytes = math.prod(shape) * dtype.itemsize
        if header + nbytes > info.file_size:
            raise FileCheckError(
                f"{field}: {where}: member '{name}' declares shape {shape} ({format_bytes(nbytes)}) "
                f"but holds {format_bytes(info.file_size)}; truncated or forged"
            )
        found[name] = (tuple(shape), dtype)
    return found
