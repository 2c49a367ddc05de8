"""Kernel compilation under the harness's control: stoppable, listed, and ahead of time for CUDA.

Warp compiles a kernel module the first time one of its kernels is launched on a device, and
keeps the binary in its kernel cache (``WARP_CACHE_PATH``, by default
``~/.cache/warp/<version>``), under a folder named by the module's content hash and its
``block_dim``. Two things follow, and this module handles both.

**A compile is stoppable** (:func:`install`, from the moment Warp is imported). Warp compiles
inside one native call (clang for the CPU, NVRTC for CUDA: seconds on the CPU, minutes for a
tile network on CUDA), and Python runs a signal handler only between two bytecodes of the main
thread, so a SIGINT or SIGTERM used to wait for the module in hand. Here every compile Warp
starts from the main thread runs in a worker thread (the native calls release the GIL) while
the main thread waits in steps of 50 ms, where handlers run: a signal raises its exception
(:mod:`harness.cli`) at once. The compile is abandoned, not cancelled (a native call cannot be):
the worker's private build folder (``<module>_p<pid>_t<thread>``, Warp's) is removed, no later
compile starts, and the process ends while the worker is still in the compiler. Warp writes a
module's files into that private folder and renames it into place only when they are complete,
so the cache never holds half a module. While the main thread waits, :func:`compiling` is True
(the training loop's first-signal handler then stops at once instead of waiting for the
iteration to end).

**A run's kernels can be compiled ahead of time for a CUDA architecture, on any machine**
(:func:`record_loads` and :func:`compile_for_arch`; the command ``python -m harness compile``).
The modules a run loads are found by running one tiny iteration of it on the CPU
(:func:`harness.build.tiny_iteration`), with Warp's
module loads recorded, together with the ``block_dim`` each launch asked for (a CUDA launch
without one uses 256; a CPU one always 1). Each recorded module is then compiled for the
architecture with NVRTC, which Warp ships and which needs no GPU or driver, into the kernel
cache under the name a CUDA load of the same module looks for, so a run on a GPU of that
architecture finds every module compiled. Where the harness's own code differs by device (an
MLP runs on the ``rows`` path on CUDA and the ``cpu`` path on the CPU), the tiny iteration runs
the CUDA choice (:func:`cuda_kernels`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import glob
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "CompileRecord",
    "LoadedModule",
    "ModuleCompileError",
    "compile_for_arch",
    "compiling",
    "cuda_kernels",
    "install",
    "known_archs",
    "record_loads",
    "time_compiles",
]

_POLL_S = 0.05
"""How often the main thread looks up from a compile in progress (signal handlers run then)."""

_ORIGINAL: dict[str, Any] = {}
_STATE = {"waiting": 0, "abandoned": False}
_LOCAL = threading.local()
_CUDA_TARGET = {"on": False}


def compiling() -> bool:
    """True while the main thread waits for a kernel compile (:func:`install`)."""
    return _STATE["waiting"] > 0


def time_compiles(timings: list[tuple[str, float]] | None) -> None:
    """From now on append (module name, seconds) to ``timings`` for every module the main
    thread compiles (None: stop)."""
    _LOCAL.timings = timings


def cuda_kernels() -> bool:
    """True while the harness should pick the kernels a CUDA device would run, whatever device
    it runs on (:func:`record_loads` with ``cuda=True``)."""
    return _CUDA_TARGET["on"]


def _build_dirs(thread_id: int) -> list[str]:
    """Warp's private build folders of thread ``thread_id`` of this process."""
    import warp as wp

    pattern = os.path.join(glob.escape(str(wp.config.kernel_cache_dir)), f"*_p{os.getpid()}_t{thread_id}")
    return glob.glob(pattern)


def _abandon(worker: threading.Thread) -> None:
    """Stop caring about a compile in progress: no further compile starts, the worker's
    private build folders are removed (again when it comes back from the compiler), and the
    process's native stderr is closed once its own last line is out (:func:`_quiet_exit`)."""
    if not _STATE["abandoned"]:
        atexit.register(_quiet_exit)  # runs before Warp's own exit handlers (registered earlier)
    _STATE["abandoned"] = True
    for folder in _build_dirs(worker.ident or 0):
        shutil.rmtree(folder, ignore_errors=True)


def _quiet_exit() -> None:
    """At exit after an abandoned compile: the compiler, still running in its worker, fails
    when Warp's exit handlers remove its temporary files (precompiled headers) and prints why
    on the process's stderr after the command's one line; send what comes after to /dev/null."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)


class ModuleCompileError(RuntimeError):
    """A module that does not compile for the architecture asked for (NVRTC's own messages are
    on stderr above it)."""


class CompileAbandoned(RuntimeError):
    """A compile asked for after the process gave up on one (it is ending on a signal)."""


def _compile(module: Any, *args: Any, **kwargs: Any) -> Any:
    """``Module._compile``, run in a worker thread when called from the main thread."""
    original = _ORIGINAL["_compile"]
    if _STATE["abandoned"]:
        raise CompileAbandoned(f"module {module.name}: not compiled, the process is stopping")
    if threading.current_thread() is not threading.main_thread():
        return original(module, *args, **kwargs)
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = original(module, *args, **kwargs)
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            if _STATE["abandoned"]:
                for folder in _build_dirs(threading.get_ident()):
                    shutil.rmtree(folder, ignore_errors=True)

    worker = threading.Thread(target=work, name=f"warp compile {module.name}", daemon=True)
    started = time.perf_counter()
    _STATE["waiting"] += 1
    try:
        worker.start()
        while worker.is_alive():
            worker.join(_POLL_S)
    except BaseException:
        _abandon(worker)
        raise
    finally:
        _STATE["waiting"] -= 1
    timings = getattr(_LOCAL, "timings", None)
    if timings is not None and outcome.get("value"):
        timings.append((module.name, time.perf_counter() - started))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def install() -> None:
    """Route every compile Warp starts from the main thread through :func:`_compile`
    (idempotent; from ``harness/__init__.py`` when Warp is imported)."""
    from warp._src import context

    if "_compile" not in _ORIGINAL:
        _ORIGINAL["_compile"] = context.Module._compile
        context.Module._compile = _compile


# -- which modules a run loads -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadedModule:
    """A kernel module a run loads, and the ``block_dim`` a CUDA launch of it uses."""

    module: Any
    block_dim: int

    @property
    def name(self) -> str:
        return self.module.name


CUDA_DEFAULT_BLOCK_DIM = 256
"""Threads per block of a CUDA launch that names none (Warp 1.19's ``wp.launch``)."""

NEWTON_NARROW_PHASE = ("narrow_phase", 128)
"""Newton's narrow phase launches its kernels (modules ``narrow_phase_*``) with a block size it
picks by device: 1 on the CPU, 128 on CUDA (``newton/_src/geometry/narrow_phase.py``,
``self.block_dim = 1 if device_obj.is_cpu else 128``). A CPU run records 1; CUDA's is this."""


@contextlib.contextmanager
def record_loads(*, cuda: bool) -> Iterator[list[LoadedModule]]:
    """Record every kernel module loaded inside the block, with the block size a CUDA launch of
    it would use; with ``cuda``, the harness picks CUDA's kernels meanwhile (:func:`cuda_kernels`).

    Yields:
        The list the block's loads are appended to (each module and block size once).
    """
    import warp as wp
    from warp._src import context

    found: list[LoadedModule] = []
    seen: set[tuple[int, int]] = set()
    request = threading.local()
    resolve, load = context._resolve_launch_block_dim, context.Module.load
    tiled = {"warp": wp.launch_tiled, "context": context.launch_tiled}

    def resolve_recorded(device: Any, block_dim: Any) -> int:
        if getattr(request, "tiled", None) is None:
            request.raw = block_dim
        return resolve(device, block_dim)

    def launch_tiled_recorded(*args: Any, **kwargs: Any) -> Any:
        request.tiled = kwargs.get("block_dim")
        try:
            return tiled["context"](*args, **kwargs)
        finally:
            request.tiled = None

    def load_recorded(module: Any, device: Any, block_dim: int | None = None, *args: Any, **kwargs: Any) -> Any:
        raw = getattr(request, "tiled", None) or getattr(request, "raw", None)
        cuda_block = int(raw) if raw is not None and int(raw) > 0 else CUDA_DEFAULT_BLOCK_DIM
        if cuda_block == 1 and module.name.startswith(NEWTON_NARROW_PHASE[0]):
            cuda_block = NEWTON_NARROW_PHASE[1]
        if block_dim is None:  # a load outside a launch (force_load): the module's default
            cuda_block = int(module.options["block_dim"])
        replayed = raw is not None and int(raw) == 1 and any(m == id(module) for m, _ in seen)
        key = (id(module), cuda_block)
        if (
            key not in seen and not replayed
        ):  # a tape's adjoint launch passes the forward's resolved size (1 on the CPU)
            seen.add(key)
            found.append(LoadedModule(module, cuda_block))
        return load(module, device, block_dim, *args, **kwargs)

    context._resolve_launch_block_dim = resolve_recorded
    context.Module.load = load_recorded
    wp.launch_tiled = launch_tiled_recorded
    context.launch_tiled = launch_tiled_recorded
    _CUDA_TARGET["on"] = bool(cuda)
    try:
        yield found
    finally:
        context._resolve_launch_block_dim = resolve
        context.Module.load = load
        wp.launch_tiled = tiled["warp"]
        context.launch_tiled = tiled["context"]
        _CUDA_TARGET["on"] = False


# -- compiling for an architecture ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CompileRecord:
    """One module compiled (or found in the cache) for an architecture."""

    name: str
    block_dim: int
    seconds: float
    compiled: bool
    path: str


def known_archs() -> list[int]:
    """The CUDA architectures Warp's NVRTC compiles for (``sm_<arch>``); empty without NVRTC."""
    import warp as wp
    from warp._src import context

    wp.init()
    return sorted(int(a) for a in (context.runtime.nvrtc_supported_archs or ()))


def compile_for_arch(
    modules: list[LoadedModule], arch: int, *, report: Callable[[CompileRecord], None] | None = None
) -> list[CompileRecord]:
    """Compile each module for ``sm_<arch>`` into Warp's kernel cache, under the name a CUDA
    load on a device of that architecture looks for; a module already there is not compiled
    again. Stoppable by a signal as any compile (:func:`install`).

    Args:
        modules: From :func:`record_loads`.
        arch: A CUDA architecture NVRTC knows (:func:`known_archs`).
        report: Called with each module's record as soon as it is done.
    """
    import warp as wp

    records = []
    for loaded in modules:
        module, block = loaded.module, loaded.block_dim
        module.get_module_hash(block)  # resolves this block size's options and hash
        options = module.resolved_options[block]
        start = time.perf_counter()
        try:
            compiled = module._compile(None, output_arch=int(arch), options=options)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ModuleCompileError(
                f"module {module.name} (block {block}) did not compile for sm_{arch}: {type(exc).__name__}: {first}"
            ) from exc
        seconds = time.perf_counter() - start
        folder = os.path.join(str(wp.config.kernel_cache_dir), module.get_module_identifier(block))
        record = CompileRecord(module.name, block, seconds, bool(compiled), folder)
        records.append(record)
        if report is not None:
            report(record)
    return records
