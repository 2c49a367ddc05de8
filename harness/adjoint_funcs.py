"""Clipping at one point of a kernel: identity ``wp.func``s whose adjoint is clipped.

The third place to clip a gradient in Warp (docs/clipping.md has the three side by side):
after backward (``clip=<policy>``, a kernel over the flat gradient buffer), inside backward
between steps (``clip.adjoint``, a ``Tape.record_func`` over each world's state adjoint), and
here, at one point of one kernel. Wrapping a value in :func:`clamp_adjoint` changes nothing in
the forward pass (it returns its argument) and clamps the gradient flowing back through that
value, and only that value, to ``[-limit, limit]``; :func:`clip_adjoint_norm` does the same
for a vector, scaling its gradient to a Euclidean norm of at most ``max_norm`` (the rule of
``torch.nn.utils.clip_grad_norm_`` applied to one vector). An env or loss author places them
where a gradient is known to blow up (a contact force, an actuator) without touching the rest
of the tape::

    @wp.kernel
    def apply_force(actions: wp.array(dtype=float), limit: float, joint_f: wp.array(dtype=float)):
        i = wp.tid()
        joint_f[i] = clamp_adjoint(actions[i], limit)

Both are defined with Warp's ``@wp.func_grad`` (a custom adjoint). A NaN gradient passes
through unchanged, so the run's non-finite handling (``clip.nonfinite``) still sees it; an
infinite one is clamped like any other (as ``torch.nn.utils.clip_grad_value_`` does). Warp
does not accept generic (``Any``) arguments on a function with a custom adjoint, so the vector
form has one overload per type: ``vec2``, ``vec3``, ``vec4`` and ``spatial_vector``
(float32). The limits themselves get no gradient.
"""

from __future__ import annotations

import warp as wp

__all__ = ["clamp_adjoint", "clip_adjoint_norm"]


@wp.func
def clamp_adjoint(x: wp.float32, limit: wp.float32) -> wp.float32:
    """``x`` unchanged; backward clamps the gradient through it to ``[-limit, limit]``."""
    return x


@wp.func_grad(clamp_adjoint)
def _clamp_adjoint_grad(x: wp.float32, limit: wp.float32, adj_ret: wp.float32):
    g = adj_ret
    if g > limit:  # comparisons with NaN are false: a NaN passes through
        g = limit
    if g < -limit:
        g = -limit
    wp.adjoint[x] += g


@wp.func
def _norm_clip_scale(norm: wp.float32, max_norm: wp.float32) -> wp.float32:
    scale = wp.float32(1.0)
    if norm > max_norm:  # false for NaN: a NaN gradient passes through unscaled
        scale = max_norm / norm
    return scale


@wp.func
def clip_adjoint_norm(v: wp.vec2, max_norm: wp.float32) -> wp.vec2:
    """``v`` unchanged; backward scales the gradient through it to a norm of at most ``max_norm``."""
    return v


@wp.func_grad(clip_adjoint_norm)
def _clip_adjoint_norm_grad_vec2(v: wp.vec2, max_norm: wp.float32, adj_ret: wp.vec2):
    wp.adjoint[v] += adj_ret * _norm_clip_scale(wp.length(adj_ret), max_norm)


@wp.func
def clip_adjoint_norm(v: wp.vec3, max_norm: wp.float32) -> wp.vec3:  # a Warp overload
    return v


@wp.func_grad(clip_adjoint_norm)
def _clip_adjoint_norm_grad_vec3(v: wp.vec3, max_norm: wp.float32, adj_ret: wp.vec3):
    wp.adjoint[v] += adj_ret * _norm_clip_scale(wp.length(adj_ret), max_norm)


@wp.func
def clip_adjoint_norm(v: wp.vec4, max_norm: wp.float32) -> wp.vec4:  # a Warp overload
    return v


@wp.func_grad(clip_adjoint_norm)
def _clip_adjoint_norm_grad_vec4(v: wp.vec4, max_norm: wp.float32, adj_ret: wp.vec4):
    wp.adjoint[v] += adj_ret * _norm_clip_scale(wp.length(adj_ret), max_norm)


@wp.func
def clip_adjoint_norm(v: wp.spatial_vector, max_norm: wp.float32) -> wp.spatial_vector:
    return v


@wp.func_grad(clip_adjoint_norm)
def _clip_adjoint_norm_grad_spatial(v: wp.spatial_vector, max_norm: wp.float32, adj_ret: wp.spatial_vector):
    wp.adjoint[v] += adj_ret * _norm_clip_scale(wp.length(adj_ret), max_norm)
