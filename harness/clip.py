"""Gradient clip policies as small ``init``/``update`` pairs.

A policy is a :class:`ClipPolicy` built by a factory named after what it does
(:func:`no_clip`, :func:`clip_by_global_norm`). The factories take plain keyword floats so
that they can be the ``_target_`` of Hydra configs (``configs/clip/none.yaml``,
``configs/clip/norm.yaml``); adding a policy is one factory here plus one YAML file.

``update`` rescales ``params.grad`` in place from statistics of the gradient that the
caller has already computed (:class:`~harness.stats.FlatStats` on ``params.grad``), and
records the applied coefficient in device arrays, so a clipped step never goes back to
the host and can be captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import warp as wp

from harness.params import ParamSet
from harness.stats import FlatStats

__all__ = ["ClipPolicy", "clip_by_global_norm", "no_clip"]


@dataclasses.dataclass(frozen=True)
class ClipPolicy:
    """A gradient clip policy.

    Attributes:
        name: Short name for logs (``"none"``, ``"global_norm"``).
        init: Allocates the policy state on the parameters' device. The state always holds
            ``"coef"`` (float32 ``(1,)``, the factor applied to the gradient at the last
            update) and ``"clipped"`` (int32 ``(1,)``, 1 when that factor was below 1).
        update: ``update(params, state, stats)`` rescales ``params.grad`` in place using
            ``stats``, the pre-clip statistics of ``params.grad``, and writes the state.
    """

    name: str
    init: Callable[[ParamSet], dict[str, wp.array]]
    update: Callable[[ParamSet, dict[str, wp.array], FlatStats], None]


def _init_coef_state(params: ParamSet) -> dict[str, wp.array]:
    return {
        "coef": wp.ones(1, dtype=wp.float32, device=params.device),
        "clipped": wp.zeros(1, dtype=wp.int32, device=params.device),
    }


def no_clip() -> ClipPolicy:
    """Leave gradients untouched; the state reads ``coef = 1``, ``clipped = 0`` forever.

    Returns:
        The policy.
    """

    def update(params: ParamSet, state: dict[str, wp.array], stats: FlatStats) -> None:
        del params, state, stats

    return ClipPolicy(name="none", init=_init_coef_state, update=update)


@wp.kernel
def _scale_by_global_norm_kernel(
    max_norm: float,
    norm: wp.array(dtype=wp.float32),
    grad: wp.array(dtype=wp.float32),
    coef_out: wp.array(dtype=wp.float32),
    clipped_out: wp.array(dtype=wp.int32),
):
    i = wp.tid()
    coef = max_norm / (norm[0] + 1.0e-6)
    # Clamp with a comparison rather than min() so that a nan coefficient stays nan.
    if coef > 1.0:
        coef = wp.float32(1.0)
    grad[i] = grad[i] * coef
    if i == 0:
        coef_out[0] = coef
        if coef < 1.0:
            clipped_out[0] = 1
        else:
            clipped_out[0] = 0


def clip_by_global_norm(max_norm: float) -> ClipPolicy:
    """Rescale all gradients together so that their global L2 norm is at most ``max_norm``.

    Same rule as PyTorch's ``torch.nn.utils.clip_grad_norm_``:
    ``coef = min(1, max_norm / (total + 1e-6))`` and ``grad *= coef`` applied
    unconditionally (a multiply by 1 when under the limit, no host branch), where
    ``total`` is ``stats.norm``. Consequences: a zero gradient stays zero;
    ``max_norm = 0`` zeroes every gradient; an infinite ``total`` zeroes the finite entries
    (and turns the infinite ones into nan, ``inf * 0``); a nan ``total`` makes every entry
    nan. ``state["clipped"]`` is 1 when ``coef < 1``, hence 0 for a nan coefficient
    (non-finite gradients are reported by ``stats.nonfinite``).

    One launch over the flat gradient.

    Args:
        max_norm: Largest allowed global L2 norm of the gradient, ``>= 0``.

    Returns:
        The policy.

    Raises:
        ValueError: If ``max_norm`` is negative or nan.
    """
    max_norm = float(max_norm)
    if not max_norm >= 0.0:
        raise ValueError(f"clip.max_norm must be >= 0, got {max_norm}")

    def update(params: ParamSet, state: dict[str, wp.array], stats: FlatStats) -> None:
        if stats.size != params.size:
            raise ValueError(f"clip: stats are for {stats.size} entries, params have {params.size}")
        wp.launch(
            _scale_by_global_norm_kernel,
            dim=params.size,
            inputs=[max_norm, stats.norm, params.grad, state["coef"], state["clipped"]],
            device=params.device,
        )

    return ClipPolicy(name="global_norm", init=_init_coef_state, update=update)
