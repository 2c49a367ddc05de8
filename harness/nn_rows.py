"""The rows code path of :mod:`harness.nn`: an MLP call as one C++ kernel with a thread per row.

On CUDA the tile path's kernel is slow to build: NVRTC takes 100 to 174 s of CPU (on this
project's 2-core machine) to compile SHAC's Ant actor's tile kernel for sm_90, and on an H200
machine 4.5 minutes plus a MathDx link step, for every network shape. This path builds the
same layers (:attr:`harness.nn.Layer.key`) as plain scalar C++ (a ``wp.func_native`` snippet
with every width a constant, as :mod:`harness.nn_cpu` does), one thread per row, which NVRTC
compiles in 0.8 to 4.7 s per kernel of a run there (the Ant actor's the longest;
scripts/bench_nn_compile.py). The same text compiles for the CPU and CUDA: there
is no ``#ifdef``; the only primitive that differs is Warp's own ``wp::atomic_add`` (a plain
``+=`` on the CPU, whose kernel runs its rows one after another on one thread), so the CPU
tests (tests/test_nn_rows.py) run exactly the code a GPU runs.

- :func:`forward_kernel`: ``y[i] = mlp(x[i])`` (or ``x[indices[i]]``), launched with
  ``dim=rows``. Recorded by a ``wp.Tape`` like any kernel: thread ``i``'s adjoint recomputes
  row ``i``'s forward pass, reads ``y.grad[i]`` and zeroes it (consuming it, as the CPU path's
  adjoint and the tile kernel's ``tile_store`` adjoint do), backpropagates through the row and
  adds atomically into ``theta``'s gradient and into ``x``'s gradient at the row it read (a
  row gathered twice gets both contributions).
- :func:`mse_kernel`: one regression step's work over a minibatch, launched with
  ``dim=rows``: each thread its row's forward pass, its share of the mean squared error and of
  the gradient, both added atomically. The caller zeroes the gradient and the loss first
  (two memsets, :class:`harness.nn.Regression`): together they are written, not added.

The math is the other paths', term for term (:mod:`harness.nn_cpu`'s module docstring): hidden
layers ``norm(act(W h + b))``, LayerNorm with the biased variance and ``1 / sqrt(var + eps)``,
the output ``W h + b`` or ``scale * tanh(W h + b)``, the derivatives Warp's autodiff takes of
:data:`harness.nn.ACTIVATIONS` (ELU through ``wp::exp``). A row's sums run in order (the
products along the inputs from the bias on, LayerNorm's over the features), so the result of
a row does not depend on the others; the parameters' gradients add the rows' terms in the
order the threads reach the atomics: in row order on the CPU (a replayed graph equals an eager
call bit for bit), in no fixed order on a GPU (results there differ from run to run in the
last bits, as any atomically summed gradient does).

Each thread keeps its row's values in local arrays sized by the widths (:func:`row_bytes`): the
input, per layer its outputs, activation derivatives, gradient and, with LayerNorm, the
normalised values. An MLP needing more than :data:`ROW_BUDGET` is refused (on CUDA every
resident thread reserves that much local memory); ``auto`` (:meth:`harness.nn.MLP.path`) then
takes the tile path.
"""

from typing import Any

import warp as wp

from harness.nn_cpu import _activation, _f, _forward_args, _mse_args, _signature

__all__ = ["ROW_BUDGET", "forward_kernel", "mse_kernel", "row_bytes"]

ROW_BUDGET = 16 * 1024
"""Bytes of local arrays one thread may use. CUDA reserves a kernel's local memory for every
thread a GPU can hold at once (2,048 per multiprocessor: 4.4 GB at this budget on an H100's
132); SHAC's Ant actor (37 -> 128 -> 64 -> 32 -> 8, LayerNorm) needs 3.9 KiB, its humanoid actor
(76 -> 256 -> 128 -> 21) 6.8 KiB."""

_KERNELS: dict[tuple, Any] = {}


def row_bytes(layers: tuple[tuple, ...]) -> int:
    """Local-array bytes of one thread in backward (the larger case): the input row and its
    gradient, per layer its outputs, their activation derivatives and their gradient, with
    LayerNorm the normalised values and the inverse deviation."""
    floats = 2 * layers[0][0]
    for _, n, _, norm, _ in layers:
        floats += n * (4 if norm else 3) + (1 if norm else 0)
    return 4 * floats


# -- C++ text ---------------------------------------------------------------------------------------
# Layer ``li`` of ``layers`` has ``k`` inputs and ``n`` outputs; ``offsets.c[4 li + 0..3]`` are
# where its weight, bias, LayerNorm gain and shift start in the flat buffer. The thread's row
# of ``x`` is ``xrow``; its input is ``h_in``, layer ``li``'s output ``h<li>`` (after the
# activation, the scale and LayerNorm), its derivatives ``d<li>`` (of the scaled activation),
# its normalised values ``xh<li>`` and inverse deviation ``iv<li>``, its gradient ``g<li>``;
# the input's gradient ``g_in``.


def _element(array: str, row: str, column: str) -> str:
    """C++ lvalue of ``array[row, column]`` (a 2-d Warp array, any strides)."""
    offset = f"(long)({row}) * ({array}).strides[0] + (long)({column}) * ({array}).strides[1]"
    return f"*(float*)((char*)({array}).data + {offset})"


def _forward(layers: tuple[tuple, ...], eps: float, keep: bool) -> str:
    """Declare the row's arrays, load its input (``xrow`` of ``x``) and run every layer; with
    ``keep``, store what backward needs (``d``, ``xh``, ``iv``)."""
    k0 = layers[0][0]
    lines = [
        "const float* __restrict__ TH = theta.data;",
        f"float h_in[{k0}]; for (int i = 0; i < {k0}; ++i) h_in[i] = {_element('x', 'xrow', 'i')};",
    ]
    for li, (k, n, act, norm, scale) in enumerate(layers):
        src = "h_in" if li == 0 else f"h{li - 1}"
        lines.append(f"float h{li}[{n}];" + (f" float d{li}[{n}];" if keep else ""))
        if norm and keep:
            lines.append(f"float xh{li}[{n}]; float iv{li};")
        lines.append(f"{{ const float* W = TH + offsets.c[{4 * li}]; const float* B = TH + offsets.c[{4 * li + 1}];")
        lines.append(f"for (int o = 0; o < {n}; ++o) {{ const float* wo = W + o * {k}; float zv = B[o];")
        lines.append(f"for (int i = 0; i < {k}; ++i) zv += wo[i] * {src}[i];")
        if scale == 1.0:
            store = f"h{li}[o] = av;" + (f" d{li}[o] = dv;" if keep else "")
        else:
            store = f"h{li}[o] = av * {_f(scale)};" + (f" d{li}[o] = dv * {_f(scale)};" if keep else "")
        lines.append(f"{_activation(act, 'wp::exp')} {store} }}")
        if norm:
            lines.append(
                f"float total = 0.0f; for (int j = 0; j < {n}; ++j) total += h{li}[j];\n"
                f"const float mean = total * {_f(1.0 / n)};\n"
                f"float squares = 0.0f; for (int j = 0; j < {n}; ++j) {{ h{li}[j] -= mean; "
                f"squares += h{li}[j] * h{li}[j]; }}\n"
                f"const float inv = 1.0f / wp::sqrt(squares * {_f(1.0 / n)} + {_f(eps)});\n"
                f"const float* G = TH + offsets.c[{4 * li + 2}]; const float* S = TH + offsets.c[{4 * li + 3}];"
            )
            if keep:
                lines.append(
                    f"iv{li} = inv; for (int j = 0; j < {n}; ++j) {{ xh{li}[j] = h{li}[j] * inv; "
                    f"h{li}[j] = xh{li}[j] * G[j] + S[j]; }}"
                )
            else:
                lines.append(f"for (int j = 0; j < {n}; ++j) h{li}[j] = h{li}[j] * inv * G[j] + S[j];")
        lines.append("}")
    return "\n".join(lines)


def _backward(layers: tuple[tuple, ...], grad: str, input_grad: bool) -> str:
    """From ``g<last>`` (the gradient of the row's outputs) back through every layer: the
    parameters' gradients added atomically at ``grad`` (a pointer to the flat buffer's
    gradient; null: none) and, with ``input_grad``, the input's gradient into ``g_in``."""
    lines = [f"float* const GRAD = {grad};"]
    for li in reversed(range(len(layers))):
        k, n, _, norm, _ = layers[li]
        src = "h_in" if li == 0 else f"h{li - 1}"
        g = f"g{li}"
        lines.append("{")
        if norm:
            # with c = dy * gain: dx = inv (c - mean(c) - xh mean(c xh)) (Ba et al. 2016)
            lines.append(
                f"const float* G = TH + offsets.c[{4 * li + 2}];\n"
                f"if (GRAD) {{ float* GG = GRAD + offsets.c[{4 * li + 2}]; float* GS = GRAD + offsets.c[{4 * li + 3}];"
                f" for (int j = 0; j < {n}; ++j) {{ wp::atomic_add(GG + j, {g}[j] * xh{li}[j]);"
                f" wp::atomic_add(GS + j, {g}[j]); }} }}\n"
                f"float s_g = 0.0f; float s_gx = 0.0f;\n"
                f"for (int j = 0; j < {n}; ++j) {{ {g}[j] *= G[j]; s_g += {g}[j]; s_gx += {g}[j] * xh{li}[j]; }}\n"
                f"const float a1 = s_g * {_f(1.0 / n)}; const float a2 = s_gx * {_f(1.0 / n)};\n"
                # and through the activation in the same pass: dz = dx * act'(z)
                f"for (int j = 0; j < {n}; ++j) {g}[j] = iv{li} * ({g}[j] - a1 - xh{li}[j] * a2) * d{li}[j];"
            )
        else:
            lines.append(f"for (int j = 0; j < {n}; ++j) {g}[j] *= d{li}[j];")  # through the activation
        lines.append(
            f"if (GRAD) {{ float* GW = GRAD + offsets.c[{4 * li}]; float* GB = GRAD + offsets.c[{4 * li + 1}];\n"
            f"for (int o = 0; o < {n}; ++o) {{ const float c = {g}[o]; wp::atomic_add(GB + o, c); "
            f"float* gw = GW + o * {k}; for (int i = 0; i < {k}; ++i) wp::atomic_add(gw + i, c * {src}[i]); }} }}"
        )
        if li > 0 or input_grad:
            # the input's gradient, dh = dz W (the rows of W in order)
            dst = "g_in" if li == 0 else f"g{li - 1}"
            lines.append(
                f"{{ const float* W = TH + offsets.c[{4 * li}];\n"
                f"for (int i = 0; i < {k}; ++i) {dst}[i] = 0.0f;\n"
                f"for (int o = 0; o < {n}; ++o) {{ const float c = {g}[o]; const float* wo = W + o * {k}; "
                f"for (int i = 0; i < {k}; ++i) {dst}[i] += c * wo[i]; }} }}"
            )
        lines.append("}")
    return "\n".join(lines)


def _gradient_arrays(layers: tuple[tuple, ...], input_grad: bool) -> str:
    lines = [f"float g{li}[{n}];" for li, (_, n, *_rest) in enumerate(layers)]
    if input_grad:
        lines.append(f"float g_in[{layers[0][0]}];")
    return " ".join(lines)


def _row(gather: bool) -> str:
    """C++ that sets ``xrow``, the row of ``x`` thread ``tid`` reads."""
    if gather:
        return "const long xrow = *(const int*)((const char*)indices.data + (long)tid * indices.strides[0]);"
    return "const long xrow = tid;"


def _forward_source(layers: tuple[tuple, ...], eps: float, gather: bool) -> tuple[str, str]:
    """The snippet and the adjoint snippet of :func:`forward_kernel`."""
    k0, out, last = layers[0][0], layers[-1][1], len(layers) - 1
    forward = (
        f"{_row(gather)}\n{_forward(layers, eps, False)}\n"
        f"for (int j = 0; j < {out}; ++j) {_element('y', 'tid', 'j')} = h{last}[j];"
    )
    adjoint = (
        f"if (!adj_y.data) return;\n{_row(gather)}\n{_forward(layers, eps, True)}\n"
        f"{_gradient_arrays(layers, True)}\n"
        f"for (int j = 0; j < {out}; ++j) {{ float* gy = &{_element('adj_y', 'tid', 'j')};\n"
        f"g{last}[j] = *gy; *gy = 0.0f; }}\n"
        f"{_backward(layers, 'adj_theta.data', True)}\n"
        f"if (adj_x.data) for (int i = 0; i < {k0}; ++i) wp::atomic_add(&{_element('adj_x', 'xrow', 'i')}, g_in[i]);"
    )
    return forward, adjoint


def _mse_source(layers: tuple[tuple, ...], eps: float) -> str:
    """The snippet of :func:`mse_kernel`."""
    out, last = layers[-1][1], len(layers) - 1
    return (
        f"const long xrow = first + tid;\n{_forward(layers, eps, True)}\n"
        f"{_gradient_arrays(layers, False)}\n"
        f"const float norm = (float)(rows * {out}); float row_loss = 0.0f;\n"
        f"for (int j = 0; j < {out}; ++j) {{ const float diff = h{last}[j] - {_element('targets', 'xrow', 'j')};\n"
        f"row_loss += diff * diff / norm; g{last}[j] = 2.0f * diff / norm; }}\n"
        f"wp::atomic_add(loss.data, row_loss);\n"
        f"{_backward(layers, 'grad.data', False)}"
    )


# -- kernels ----------------------------------------------------------------------------------------


def forward_kernel(layers: tuple[tuple, ...], eps: float, gather: bool, offsets_type: Any) -> Any:
    """The kernel ``(theta, offsets, x, indices, y)``, launched with ``dim=rows``: thread ``i``
    writes ``y[i] = mlp(x[i])`` or ``mlp(x[indices[i]])``; its adjoint adds into ``theta``'s and
    ``x``'s gradients and consumes ``y[i]``'s (module docstring). Made once per shape, compiled
    on its first launch."""
    key = ("forward", layers, eps, gather)
    if key not in _KERNELS:
        snippet, adjoint = _forward_source(layers, eps, gather)
        args = _forward_args(offsets_type)

        def apply(theta, offsets, x, indices, y, tid): ...

        apply = wp.func_native(snippet, adj_snippet=adjoint, replay_snippet="")(_signature(apply, {**args, "tid": int}))

        def mlp_rows(theta, offsets, x, indices, y):
            apply(theta, offsets, x, indices, y, wp.tid())

        _KERNELS[key] = wp.kernel(module="unique")(_signature(mlp_rows, args))
    return _KERNELS[key]


def mse_kernel(layers: tuple[tuple, ...], eps: float, offsets_type: Any) -> Any:
    """The kernel ``(theta, offsets, x, targets, first, rows, grad, loss)``, launched with
    ``dim=rows``: thread ``i`` adds row ``first + i``'s share of ``loss[0] = sum (mlp(x_i) -
    t_i)^2 / (rows x outputs)`` into ``loss[0]`` and of its gradient into ``grad`` (the flat
    buffer's gradient), atomically; both zeroed by the caller first."""
    key = ("mse", layers, eps)
    if key not in _KERNELS:
        args = _mse_args(offsets_type)

        def step(theta, offsets, x, targets, first, rows, grad, loss, tid): ...

        step = wp.func_native(_mse_source(layers, eps))(_signature(step, {**args, "tid": int}))

        def mse_rows(theta, offsets, x, targets, first, rows, grad, loss):
            step(theta, offsets, x, targets, first, rows, grad, loss, wp.tid())

        _KERNELS[key] = wp.kernel(module="unique", enable_backward=False)(_signature(mse_rows, args))
    return _KERNELS[key]
