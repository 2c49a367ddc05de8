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
    "ModuleCompileError",
    "Recording",
    "abandoned",
    "compile_module",
    "compiling",
    "cuda_kernels",
    "exit_now",
    "install",
    "known_archs",
    "record_loads",
    "time_compiles",
]

_POLL_S = 0.05
"""How often the main thread looks up from a compile in progress (signal handlers run then)."""

_ORIGINAL: dict[str, Any] = {}
_STATE = {"waiting": 0}
_ABANDONED: set[int] = set()
"""The thread ids of the workers whose compile the main thread gave up on (a signal)."""
_LOCAL = threading.local()
_CUDA_TARGET = {"on": False}


def compiling() -> bool:
    """True while the main thread waits for a kernel compile (:func:`install`)."""
    return _STATE["waiting"] > 0


def time_compiles(timings: list[tuple[str, float]] | None) -> None:
    """From now on append (module name, seconds) to ``timings`` for every module the main
    thread compiles for the CPU (None: stop)."""
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


def _remove_abandoned() -> None:
    for thread_id in _ABANDONED:
        for folder in _build_dirs(thread_id):
            shutil.rmtree(folder, ignore_errors=True)


def _abandon(worker: threading.Thread) -> None:
    """Give up on a compile in progress: its worker goes on (a native call cannot be stopped)
    and removes its private build folder when it comes back; if the process ends first, the
    folder is removed on the way out (:func:`exit_now`, or at exit). A process that goes on
    (a caught ``KeyboardInterrupt`` in a notebook) compiles as before."""
    if not _STATE.get("exit_handler"):
        atexit.register(_at_exit)  # runs before Warp's own exit handlers (registered earlier)
        _STATE["exit_handler"] = 1
    _ABANDONED.add(worker.ident or 0)


def abandoned() -> bool:
    """True when this process gave up on a compile that is still running."""
    return bool(_ABANDONED)


def _at_exit() -> None:
    """At exit after an abandoned compile: remove the workers' build folders, and send the
    process's native stderr to /dev/null (the compiler, still running, fails once its folder or
    Warp's precompiled headers are gone, and would say so after the command's one line)."""
    if not _ABANDONED:  # every abandoned compile came back meanwhile
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    _remove_abandoned()


def exit_now(code: int) -> None:
    """End the process with ``code`` at once when a compile was abandoned (:func:`abandoned`):
    streams flushed, build folders removed, no interpreter shutdown (which would wait on nothing
    useful and run Warp's exit handlers while the compiler still works). Otherwise return."""
    if not _ABANDONED:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    _remove_abandoned()
    os._exit(code)


class ModuleCompileError(RuntimeError):
    """A module that does not compile for the architecture asked for (NVRTC's own messages are
    on stderr above it)."""


def _compile(module: Any, *args: Any, **kwargs: Any) -> Any:
    """``Module._compile``, run in a worker thread when called from the main thread."""
    original = _ORIGINAL["_compile"]
    if threading.current_thread() is not threading.main_thread():
        return original(module, *args, **kwargs)
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = original(module, *args, **kwargs)
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            if threading.get_ident() in _ABANDONED:  # nobody waits: leave nothing half-built
                for folder in _build_dirs(threading.get_ident()):
                    shutil.rmtree(folder, ignore_errors=True)
                _ABANDONED.discard(threading.get_ident())  # done; its id may be reused

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
    device = args[0] if args else kwargs.get("device")
    timings = getattr(_LOCAL, "timings", None)
    if timings is not None and outcome.get("value") and device is not None and device.is_cpu:
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


# -- which modules a run loads, compiled for an architecture -------------------------------------


CUDA_DEFAULT_BLOCK_DIM = 256
"""Threads per block of a CUDA launch that names none (Warp 1.19's ``wp.launch``)."""

NEWTON_NARROW_PHASE = (("narrow_phase", "newton._src.geometry.narrow_phase"), 128)
"""Newton's narrow phase launches most of its kernels with a block size it picks by device: 1
on the CPU, 128 on CUDA (``newton/_src/geometry/narrow_phase.py``, ``self.block_dim = 1 if
device_obj.is_cpu else 128``). A CPU run asks for 1; CUDA's is this."""


@dataclasses.dataclass(frozen=True)
class CompileRecord:
    """One module version a run loads: compiled for the architecture, found in the cache, or
    left to the GPU run (``skipped``: why)."""

    name: str
    block_dim: int
    identifier: str
    seconds: float = 0.0
    compiled: bool = False
    skipped: str | None = None


@dataclasses.dataclass
class Recording:
    """What :func:`record_loads` saw: every version of every module loaded, once each."""

    records: list[CompileRecord] = dataclasses.field(default_factory=list)

    @property
    def compiled(self) -> list[CompileRecord]:
        return [r for r in self.records if r.compiled]

    @property
    def cached(self) -> list[CompileRecord]:
        return [r for r in self.records if not r.compiled and r.skipped is None]

    @property
    def skipped(self) -> list[CompileRecord]:
        return [r for r in self.records if r.skipped is not None]


def known_archs() -> list[int]:
    """The CUDA architectures Warp's NVRTC compiles for (``sm_<arch>``); empty without NVRTC."""
    import warp as wp
    from warp._src import context

    wp.init()
    return sorted(int(a) for a in (context.runtime.nvrtc_supported_archs or ()))


def _cuda_block(module: Any, raw: Any) -> int | None:
    """The block size a CUDA launch of ``module`` uses, from the size the CPU launch asked for
    (None: not known, the launch asked for 1: a size its code picks by device)."""
    if raw is None or int(raw) <= 0:
        return CUDA_DEFAULT_BLOCK_DIM
    if int(raw) > 1:
        return int(raw)
    if module.name.startswith(NEWTON_NARROW_PHASE[0]):
        return NEWTON_NARROW_PHASE[1]
    return None


def compile_module(module: Any, block_dim: int, arch: int) -> CompileRecord:
    """Compile ``module`` as it is now, for block size ``block_dim``, for ``sm_<arch>`` into
    Warp's kernel cache, under the folder and file name a CUDA load of it looks for (a CUBIN:
    the harness sets ``warp.config.cuda_output``); a module already there is not compiled again.

    Raises:
        ModuleCompileError: NVRTC rejects it (one line).
    """
    identifier = module.get_module_identifier(block_dim)  # this version's hash and options
    options = module.resolved_options[block_dim]
    start = time.perf_counter()
    try:
        compiled = module._compile(None, output_arch=int(arch), use_ptx=False, options=options)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ModuleCompileError(
            f"module {module.name} (block {block_dim}) did not compile for sm_{arch}: {type(exc).__name__}: {first}"
        ) from exc
    return CompileRecord(module.name, block_dim, identifier, time.perf_counter() - start, bool(compiled))


@contextlib.contextmanager
def record_loads(
    *, cuda: bool, arch: int | None = None, report: Callable[[CompileRecord], None] | None = None
) -> Iterator[Recording]:
    """Record every kernel module loaded inside the block, with the block size a CUDA launch of
    it uses, and with ``arch`` compile each for ``sm_<arch>`` the moment it loads (a module
    whose kernels change while a run goes on, a generic kernel's new overload, is loaded again
    under another hash: each version is compiled as the GPU run will load it). With ``cuda``,
    the harness picks CUDA's kernels meanwhile (:func:`cuda_kernels`).

    A launch that asks for block size 1 is not compiled ahead (the record says why): a tape's
    adjoint launch passes its forward's resolved size, 1 on the CPU, and code that picks its
    size by device asks the CPU for 1 (Newton's narrow phase excepted,
    :data:`NEWTON_NARROW_PHASE`).

    Yields:
        The :class:`Recording`, filled as the block runs; ``report`` is called with each record.
    """
    import warp as wp
    from warp._src import context

    recording = Recording()
    seen: set[tuple[int, int | None, str | None]] = set()
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

    def note(record: CompileRecord) -> None:
        recording.records.append(record)
        if report is not None:
            report(record)

    def load_recorded(module: Any, device: Any, block_dim: int | None = None, *args: Any, **kwargs: Any) -> Any:
        tiled_raw = getattr(request, "tiled", None)
        raw = tiled_raw if tiled_raw is not None else getattr(request, "raw", None)
        block = _cuda_block(module, raw) if block_dim is not None else int(module.options["block_dim"])
        identifier = module.get_module_identifier(block) if block is not None else None
        key = (id(module), block, identifier)
        if key not in seen:
            seen.add(key)
            if block is None:
                if not any(k[0] == id(module) for k in seen if k != key):  # an adjoint replay otherwise
                    note(CompileRecord(module.name, 1, "", skipped="launched with block size 1 on the CPU"))
            elif arch is None:
                note(CompileRecord(module.name, block, identifier))
            else:
                note(compile_module(module, block, arch))
        return load(module, device, block_dim, *args, **kwargs)

    context._resolve_launch_block_dim = resolve_recorded
    context.Module.load = load_recorded
    wp.launch_tiled = launch_tiled_recorded
    context.launch_tiled = launch_tiled_recorded
    _CUDA_TARGET["on"] = bool(cuda)
    try:
        yield recording
    finally:
        context._resolve_launch_block_dim = resolve
        context.Module.load = load
        wp.launch_tiled = tiled["warp"]
        context.launch_tiled = tiled["context"]
        _CUDA_TARGET["on"] = False
