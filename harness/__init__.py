"""harness: train through differentiable simulators with first-class gradient clipping.

Modules: ``params`` (flat parameter/gradient buffers), ``stats`` (gradient statistics on
the device), ``clip`` (clip policies), ``optim`` (optimizers), ``losses`` (loss terms),
``trainer`` (the loop), ``runlog`` (TensorBoard and progress line), ``gradcheck``
(finite-difference checks), ``report`` (sweep reports), ``config`` and ``sweep``
(Hydra config to typed objects; multirun callbacks).

Importing the package sets Warp's log level before Warp initialises: ``warning`` by
default (no start-up banner), or the level named by ``HARNESS_WARP_LOG_LEVEL``
(``debug``, ``info``, ``warning``, ``error``); ``info`` shows every kernel module load
and whether it was compiled or taken from the kernel cache.
"""

import os

import warp as wp

_LEVELS = {"debug": wp.LOG_DEBUG, "info": wp.LOG_INFO, "warning": wp.LOG_WARNING, "error": wp.LOG_ERROR}
wp.config.log_level = _LEVELS.get(os.environ.get("HARNESS_WARP_LOG_LEVEL", "warning").lower(), wp.LOG_WARNING)

__version__ = "0.1.0"
