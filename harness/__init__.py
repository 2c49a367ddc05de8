"""harness: train through differentiable simulators with first-class gradient clipping.

Modules: ``params`` (flat parameter/gradient buffers), ``stats`` (gradient statistics on
the device), ``clip`` (clip policies), ``optim`` (optimizers), ``losses`` (loss terms),
``trainer`` (the loop), ``runlog`` (TensorBoard and progress line), ``gradcheck``
(finite-difference checks), ``config`` (Hydra config to typed objects).
"""

import warp as wp

wp.config.log_level = wp.LOG_WARNING  # no start-up banner; warnings and errors still show

__version__ = "0.1.0"
