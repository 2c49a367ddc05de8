"""harness: train through differentiable simulators with first-class gradient clipping.

Modules: ``params`` (flat parameter/gradient buffers), ``stats`` (gradient statistics on
the device), ``clip`` (clip policies), ``optim`` (optimizers), ``losses`` (loss terms),
``env`` and ``newton_env`` (the env interface), ``tasks`` (what is trained),
``training`` (the loop), ``events`` (TensorBoard files), ``gradcheck``
(finite-difference checks), ``report`` (sweep reports), ``config`` and ``sweep``
(Hydra config to typed objects; multirun callbacks).

:func:`init_warp` initialises Warp without the CUDA driver warning that Warp's native
library prints on machines without an NVIDIA driver (the harness needs none).

Importing the package sets Warp's log level before Warp initialises: ``warning`` by
default (no start-up banner), or the level named by ``HARNESS_WARP_LOG_LEVEL``
(``debug``, ``info``, ``warning``, ``error``); ``info`` shows every kernel module load
and whether it was compiled or taken from the kernel cache.

``HARNESS_DETERMINISTIC`` (``run_to_run`` or ``gpu_to_gpu``) sets
``warp.config.deterministic`` before any kernel module exists, asking Warp for bit-exact
float atomics on CUDA (see docs/checkpoints.md); CPU runs are deterministic without it.
"""

import os
import sys
import tempfile

import warp as wp

_LEVELS = {"debug": wp.LOG_DEBUG, "info": wp.LOG_INFO, "warning": wp.LOG_WARNING, "error": wp.LOG_ERROR}
wp.config.log_level = _LEVELS.get(os.environ.get("HARNESS_WARP_LOG_LEVEL", "warning").lower(), wp.LOG_WARNING)

_DETERMINISM = {
    "run_to_run": wp.DeterministicMode.RUN_TO_RUN,
    "gpu_to_gpu": wp.DeterministicMode.GPU_TO_GPU,
    "": wp.DeterministicMode.NOT_GUARANTEED,
}
_mode = os.environ.get("HARNESS_DETERMINISTIC", "").lower()
if _mode in _DETERMINISM:
    wp.config.deterministic = _DETERMINISM[_mode]


def environment_error() -> str | None:
    """What is wrong with the harness's environment variables, in one line (None: nothing).
    Importing the package never exits; :func:`init_warp` raises this as a ``ValueError`` and
    the command line prints it and exits 2."""
    if _mode not in _DETERMINISM:
        return f"HARNESS_DETERMINISTIC: '{_mode}' is not one of run_to_run, gpu_to_gpu (or unset)"
    return None


__version__ = "0.1.0"

_NO_DRIVER = "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver"


def init_warp() -> None:
    """Initialise Warp (``wp.init()``), passing on everything it prints to stderr except the
    native library's line saying that no NVIDIA CUDA driver was found: on a machine without
    one the harness runs on the CPU as documented, and a CUDA device asked for by name is
    refused with its own one-line error. Idempotent.

    Raises:
        ValueError: A harness environment variable holds a value it does not accept
            (:func:`environment_error`).
    """
    global _initialised
    problem = environment_error()
    if problem is not None:
        raise ValueError(problem)
    if _initialised:
        return
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
