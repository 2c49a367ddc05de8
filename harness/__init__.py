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
whether it was compiled or taken from the kernel cache.

``HARNESS_DETERMINISTIC`` (``run_to_run`` or ``gpu_to_gpu``) sets
``warp.config.deterministic`` before any kernel module exists, asking Warp for bit-exact
float atomics on CUDA (see docs/checkpoints.md); CPU runs are deterministic without it.
"""

import importlib.abc
import os
import sys
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
    from harness import warp_fixes

    warp_fixes.install()


class _ConfigureAfter(importlib.abc.Loader):
    """Warp's own loader, followed by :func:`_configure_warp` once the package has run."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...: the wrapped loader's
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _configure_warp(module)
        sys.meta_path[:] = [finder for finder in sys.meta_path if not _is_hook(finder)]


class _WarpImportHook(importlib.abc.MetaPathFinder):
    """Finds ``warp`` as the other finders do and wraps its loader in :class:`_ConfigureAfter`,
    which takes the hook off ``sys.meta_path`` once Warp is imported."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "warp":
            return None
        for finder in sys.meta_path:
            if _is_hook(finder):
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ConfigureAfter(spec.loader)
                return spec
        return None


def _is_hook(finder: Any) -> bool:
    return type(finder).__name__ == "_WarpImportHook"  # also one of an earlier import of this module


if "warp" in sys.modules:
    _configure_warp(sys.modules["warp"])
elif not any(_is_hook(finder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _WarpImportHook())


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
