"""harness: train through differentiable simulators with first-class gradient clipping.

Modules: ``params`` (flat parameter/gradient buffers), ``stats`` (gradient statistics on
the device), ``clip`` (clip policies), ``optim`` (optimizers), ``losses`` (loss terms),
``env`` and ``newton_env`` (the env interface), ``tasks`` (what is trained),
``training`` (the loop), ``events`` (TensorBoard files), ``gradcheck``
(finite-difference checks), ``diagnose`` (can a gradient be trusted, over how many steps,
where to clip), ``report`` (sweep reports), ``config`` and ``sweep``
(Hydra config to typed objects; multirun callbacks).

:func:`init_warp` initialises Warp without the CUDA driver warning that Warp's native
library prints on machines without an NVIDIA driver (the harness needs none).

Importing the package does not import Warp, so that ``--help``, config printing and every
refusal of bad input stay fast (docs/startup.md). It sets Warp's log level and determinism
the moment Warp is imported, by whichever module, before Warp initialises and before any
kernel module exists (at once when Warp was imported before the package). The log level is
``warning`` by default (no start-up banner), or the one named by ``HARNESS_WARP_LOG_LEVEL``
(``debug``, ``info``, ``warning``, ``error``); ``info`` shows every kernel module load and
whether it was compiled or taken from the kernel cache. The same import hook holds SIGINT and
SIGTERM while Newton or Pixar's USD (``pxr``) loads (:func:`_holds_signals` says why).

``HARNESS_DETERMINISTIC`` (``run_to_run`` or ``gpu_to_gpu``) sets
``warp.config.deterministic`` before any kernel module exists, asking Warp for bit-exact
float atomics on CUDA (see docs/checkpoints.md); CPU runs are deterministic without it.
"""

import contextlib
import importlib.abc
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

_LEVELS = ("debug", "info", "warning", "error")
"""The values ``HARNESS_WARP_LOG_LEVEL`` takes (Warp's ``LOG_<NAME>``); any other reads as ``warning``."""

_DETERMINISM = {"run_to_run": "RUN_TO_RUN", "gpu_to_gpu": "GPU_TO_GPU", "": "NOT_GUARANTEED"}
"""``HARNESS_DETERMINISTIC``'s values and the ``warp.DeterministicMode`` each sets."""

_mode = os.environ.get("HARNESS_DETERMINISTIC", "").lower()


def _configure_warp(wp: Any) -> None:
    """Set the Warp module ``wp``'s log level and determinism from the environment; install
    :mod:`harness.warp_fixes`."""
    level = os.environ.get("HARNESS_WARP_LOG_LEVEL", "warning").lower()
    wp.config.log_level = getattr(wp, f"LOG_{(level if level in _LEVELS else 'warning').upper()}")
    if _mode in _DETERMINISM:
        wp.config.deterministic = getattr(wp.DeterministicMode, _DETERMINISM[_mode])
    from harness import compile as kernel_compile
    from harness import warp_fixes

    warp_fixes.install()
    kernel_compile.install()  # a compile in progress no longer holds a signal back
    # CUDA modules as CUBIN for the device's own architecture, never PTX: the files
    # `harness compile ... arch=N` writes ahead of time on a machine without a GPU (Warp picks
    # PTX by itself where the driver is at least as new as its toolkit; not in the module hash)
    wp.config.cuda_output = "cubin"


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held until the block ends, then delivered to the handler in place
    (once, the first that arrived). Outside the main thread (no handlers there) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        if held:
            signal.raise_signal(held[0])  # the restored handler runs: the signal is not lost


def _holds_signals(name: str) -> bool:
    """Newton, and Pixar's USD (``pxr``, which Newton imports as it loads): a signal landing
    inside one of USD's native module initialisations is caught there, printed as a warning
    and dropped, leaving USD's type converters half-registered, so the import fails later with
    an unrelated ``TypeError`` (exit 1, not the signal's code). Held, a signal waits at most
    for the import (about 2 s on a 2-core CPU) and then stops the command as anywhere else."""
    return name == "newton" or name == "pxr" or name.startswith("pxr.")


class _HookedLoader(importlib.abc.Loader):
    """A module's own loader, with signals held while it loads (:func:`_holds_signals`), and
    followed by :func:`_configure_warp` once Warp's package has run."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...: the wrapped loader's
        return getattr(self._loader, name)

    def _hold(self) -> Any:
        return _signals_held() if _holds_signals(self._name) else contextlib.nullcontext()

    def create_module(self, spec: Any) -> Any:
        with self._hold():  # an extension module initialises here
            return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with self._hold():
            self._loader.exec_module(module)
        if self._name == "warp":
            _configure_warp(module)
        if "warp" in sys.modules and "newton" in sys.modules:  # nothing left to hook
            sys.meta_path[:] = [finder for finder in sys.meta_path if not _is_hook(finder)]


class _ImportHook(importlib.abc.MetaPathFinder):
    """Finds ``warp``, ``newton`` and ``pxr``'s modules as the other finders do and wraps their
    loaders in :class:`_HookedLoader`; off ``sys.meta_path`` once Warp and Newton are imported."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "warp" and not _holds_signals(name):
            return None
        for finder in sys.meta_path:
            if _is_hook(finder):
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, name)
                return spec
        return None


def _is_hook(finder: Any) -> bool:
    return type(finder).__name__ == "_ImportHook"  # also one of an earlier import of this module


if "warp" in sys.modules:
    _configure_warp(sys.modules["warp"])
if not ("warp" in sys.modules and "newton" in sys.modules) and not any(_is_hook(f) for f in sys.meta_path):
    sys.meta_path.insert(0, _ImportHook())


def environment_error() -> str | None:
    """What is wrong with the harness's environment variables, in one line (None: nothing).
    Importing the package never exits; :func:`init_warp` raises this as a ``ValueError`` and
    the command line prints it and exits 2."""
    if _mode not in _DETERMINISM:
        return f"HARNESS_DETERMINISTIC: '{_mode}' is not one of run_to_run, gpu_to_gpu (or unset)"
    return None


__version__ = "0.1.0"

_NO_DRIVER = "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver"


def init_warp(*, check_environment: bool = True) -> None:
    """Initialise Warp (``wp.init()``), passing on everything it prints to stderr except the
    native library's line saying that no NVIDIA CUDA driver was found: on a machine without
    one the harness runs on the CPU as documented, and a CUDA device asked for by name is
    refused with its own one-line error. Idempotent; imports Warp (configured as the module
    docstring says).

    Args:
        check_environment: Refuse an invalid harness environment variable first. False (the
            library's own calls, before an env's first array): initialise all the same, the
            invalid value ignored, as Warp's own first use would.

    Raises:
        ValueError: A harness environment variable holds a value it does not accept
            (:func:`environment_error`), with ``check_environment``.
    """
    global _initialised
    problem = environment_error()
    if problem is not None and check_environment:
        raise ValueError(problem)
    if _initialised:
        return
    import tempfile

    import warp as wp

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)  # the native library writes to file descriptor 2 directly
        try:
            wp.init()
        finally:  # also when wp.init() raises: what it printed is passed on
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not line.startswith(_NO_DRIVER))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
    _initialised = True


_initialised = False
