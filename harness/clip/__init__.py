"""Gradient clipping after backward: policies over the flat gradient, the non-finite
wrappers and a PyTorch-style functional API.

The package is split the way Newton splits device code from host code:

* :mod:`harness.clip.kernels`: every clip kernel and the launches that run them.
* :mod:`harness.clip.policies`: the clip policies (:class:`ClipPolicy`, transformations of
  :mod:`harness.transform`), each built by a factory that can be the ``_target_`` of a
  Hydra config under ``configs/clip/``:
  :func:`no_clip`, :func:`clip_by_value`, :func:`clip_by_global_norm`,
  :func:`clip_by_norm_per_param`, :func:`adaptive_grad_clip` (AGC), :func:`autoclip`,
  :func:`zclip` and :func:`chain_clips` (:data:`CLIP_POLICIES`; a factory of your own joins
  them through :func:`register_clip_policy`).
* :mod:`harness.clip.nonfinite`: wrappers around any transformation for nan/inf gradients
  (:func:`skip_if_nonfinite`, :func:`zero_nonfinite`, :func:`error_if_nonfinite`, picked by
  ``clip.nonfinite`` through :func:`with_nonfinite`; the trainer wraps its whole update),
  :class:`NonFiniteGradientError` and :class:`SkipGuard`, which undoes an update on the device.
* :mod:`harness.clip.functional`: :func:`clip_grad_norm_` and :func:`clip_grad_value_` over a
  list of Warp arrays of any float dtype.

Clipping inside the backward pass is :mod:`harness.adjoint` (the trainer's ``adjoint``
setting, configured as ``clip.adjoint``); clipping at one point of a kernel is
:mod:`harness.adjoint_funcs`.
"""

from harness.clip.functional import clip_grad_norm_, clip_grad_value_
from harness.clip.nonfinite import (
    NONFINITE_MODES,
    NonFinite,
    NonFiniteGradientError,
    SkipGuard,
    error_if_nonfinite,
    skip_if_nonfinite,
    with_nonfinite,
    zero_nonfinite,
)
from harness.clip.policies import (
    CLIP_POLICIES,
    ClipPolicy,
    ClipRule,
    adaptive_grad_clip,
    agc_units,
    autoclip,
    chain_clips,
    clip_by_global_norm,
    clip_by_norm_per_param,
    clip_by_value,
    no_clip,
    register_clip_policy,
    zclip,
)

__all__ = [
    "CLIP_POLICIES",
    "NONFINITE_MODES",
    "ClipPolicy",
    "ClipRule",
    "NonFinite",
    "NonFiniteGradientError",
    "SkipGuard",
    "adaptive_grad_clip",
    "agc_units",
    "autoclip",
    "chain_clips",
    "clip_by_global_norm",
    "clip_by_norm_per_param",
    "clip_by_value",
    "clip_grad_norm_",
    "clip_grad_value_",
    "error_if_nonfinite",
    "no_clip",
    "register_clip_policy",
    "skip_if_nonfinite",
    "with_nonfinite",
    "zclip",
    "zero_nonfinite",
]
