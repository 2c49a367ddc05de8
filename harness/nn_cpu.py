"""The CPU code path of :mod:`harness.nn`: an MLP call as one single-threaded C++ kernel.

Warp runs a CPU kernel on one thread, and its CPU code of tile operations is scalar: the
fused tile kernel of :mod:`harness.nn` spends about 3.4 ms on forward + backward of SHAC's
critic over 512 rows, where ``torch`` on one thread takes about 1.2 ms (scripts/bench_nn.py).
Plain per-thread Warp loops are no faster (a 512 x 64 x 64 product: 1.6 ms; the same loop in
C++ with the sizes known to the compiler: 0.08 ms, vectorised by clang). So on the CPU each
call is one launch of a C++ snippet (``wp.func_native``) generated here from the same layer
descriptions (:attr:`harness.nn.Layer.key`) as the tile kernel, with every width a constant:

- :func:`forward_kernel`: ``y[i] = mlp(x[i])`` (or ``x[indices[i]]``), recorded by a
  ``wp.Tape`` like any kernel: its adjoint recomputes the forward pass block by block and
  adds into ``theta.grad`` and ``x.grad``, consuming ``y.grad`` (zeroing what it read, as
  the tile kernel's ``tile_store`` adjoint does);
- :func:`mse_kernel`: a whole gradient step's worth of work for a regression (the critic's
  minibatch): forward, the mean squared error against targets, backward; the loss and the
  gradient are written, not added, so a minibatch update needs no zeroing launch.

The math is the tile kernel's, term for term (:mod:`harness.nn`'s module docstring): hidden
layers ``norm(act(W h + b))``, LayerNorm with the biased variance and ``1 / sqrt(var + eps)``,
the output ``W h + b`` or ``scale * tanh(W h + b)``; the activations' derivatives are those
Warp's autodiff takes of :data:`harness.nn.ACTIVATIONS` (ELU: ``exp(z)`` where ``z <= 0``;
ReLU: 0 at ``z = 0``). Only the order of the floating-point sums differs (a row's products
over the input in order; LayerNorm's sums over features in 16 interleaved partial sums, then
those pairwise; a parameter's gradient over the rows in order), so the two paths agree to
float32 rounding (tests/test_nn.py compares them on the CPU). Every sum has a fixed order:
a replayed graph equals an eager call bit for bit.

Rows are processed in blocks of :data:`BLOCK_ROWS`; a block's activations, the transposed
weights and the gradient scratch live on the C++ stack (:func:`stack_bytes`); an MLP whose
buffers exceed :data:`STACK_BUDGET` takes the tile path (:meth:`harness.nn.MLP.path`).
"""

from typing import Any

import warp as wp

__all__ = ["BLOCK_ROWS", "LANES", "STACK_BUDGET", "forward_kernel", "mse_kernel", "stack_bytes"]

BLOCK_ROWS = 32
"""Rows per block: the activations of one block stay in the first-level cache."""

LANES = 16
"""Interleaved partial sums of LayerNorm's reductions (one AVX-512 register of floats)."""

STACK_BUDGET = 1024 * 1024
"""Bytes of C++ stack one call may use (a Python thread's stack is 8 MiB on Linux)."""

_KERNELS: dict[tuple, Any] = {}

WIDE_VECTORS = "-mprefer-vector-width=512"
"""Added to Warp's CPU compiler flags for these kernels: clang then uses 512-bit registers where
the CPU has them (AVX-512), which made a critic step 27% faster here; the sums' order, and so
every result, is the same at any width. A no-op on CPUs without them."""


def _options() -> dict:
    """The module options of this module's kernels: Warp's CPU flags of the moment, plus
    :data:`WIDE_VECTORS`."""
    flags = wp.config.cpu_compiler_flags if wp.config.cpu_compiler_flags is not None else "-march=native"
    return {"cpu_compiler_flags": f"{flags} {WIDE_VECTORS}"}


def stack_bytes(layers: tuple[tuple, ...]) -> int:
    """Stack bytes of one call (:func:`_prologue`): the transposed weights and gradient sums,
    one block's input and stored activations, two gradient buffers of the widest layer."""
    widths = [layers[0][0], *(layer[1] for layer in layers)]
    floats = BLOCK_ROWS * widths[0] + 2 * BLOCK_ROWS * max(widths)
    for k, n, _, norm, _ in layers:
        floats += (0 if _dots(n) else k * n) + (k * n if _transposed(k, n) else 0)
        floats += BLOCK_ROWS * n * (3 if norm else 2) + (BLOCK_ROWS if norm else 0)
    return 4 * floats


# -- C++ text ---------------------------------------------------------------------------------------
# Layer ``li`` of ``layers`` has ``k`` inputs and ``n`` outputs; ``offsets.c[4 li + 0..3]`` are
# where its weight, bias, LayerNorm gain and shift start in the flat buffer.

_EXP = """auto exp_low = [](float z) -> float {
z = z < -87.0f ? -87.0f : z;
const float n = __builtin_rintf(z * 1.44269504088896341f);
const float r = (z - n * 0.693359375f) - n * -2.12194440e-4f;
float q = 1.98412698e-4f;
q = q * r + 1.38888889e-3f; q = q * r + 8.33333333e-3f; q = q * r + 4.16666667e-2f;
q = q * r + 1.66666667e-1f; q = q * r + 0.5f; q = q * r + 1.0f; q = q * r + 1.0f;
const int bits = ((int)n + 127) << 23; float two_n; __builtin_memcpy(&two_n, &bits, 4);
return q * two_n; };"""
"""``exp_low(z)``: ``exp(z)`` for ``z <= 0`` in straight-line code the compiler vectorises (libm's
``expf`` is a call per entry: 80% of a critic update's time with it): ``z = n ln 2 + r`` with
``|r| <= ln(2) / 2`` (Cody and Waite's reduction, ``ln 2`` split in 0.693359375 and
-2.1219444e-4), ``exp(r)`` by its Taylor polynomial of degree 7 (truncation below 5e-9
relative), times ``2^n`` put together in the exponent bits. Below -87 it returns ``exp(-87)``
(1.6e-38, the smallest normal float's order: an ELU there is -1 and its derivative 0 to
float32's precision either way). Within 2 ulp of the float64 ``exp`` (tests/test_nn.py)."""


def _activation(kind: str | None, exp: str = "exp_low") -> str:
    """C++ that sets ``av`` (the activation of ``zv``) and ``dv`` (its derivative), branch-free;
    ``exp``: the exponential ELU calls (:data:`_EXP`'s ``exp_low`` here, ``wp::exp`` on the rows
    path, :mod:`harness.nn_rows`)."""
    if kind is None:
        return "const float av = zv; const float dv = 1.0f;"
    if kind == "tanh":
        return "const float av = wp::tanh(zv); const float dv = 1.0f - av * av;"
    if kind == "elu":
        return (
            f"const float e = {exp}(zv < 0.0f ? zv : 0.0f); const float av = zv > 0.0f ? zv : e - 1.0f;"
            " const float dv = zv > 0.0f ? 1.0f : e;"
        )
    if kind == "relu":
        return "const float av = zv > 0.0f ? zv : 0.0f; const float dv = zv > 0.0f ? 1.0f : 0.0f;"
    raise ValueError(f"no C++ form of activation {kind!r}")


def _f(value: float) -> str:
    """A C++ float literal of ``value``."""
    return f"{float(value)!r}f"


def _chunks(n: int, size: int = 64) -> list[tuple[int, int]]:
    """``(start, width)`` of the column chunks a row is accumulated in (registers)."""
    return [(start, min(size, n - start)) for start in range(0, n, size)]


def _accumulate(n: int, init: str, loop: str, pick: str, out: str) -> str:
    """C++: for each chunk of ``n`` columns, ``acc[j] = init``, then for every ``loop`` iteration
    (``pick`` sets the scalar ``s`` and the row pointer ``v``) ``acc[j] += s * v[j]``, then
    ``out = acc[j]``; ``c0`` is the chunk's first column in ``init``, ``pick`` and ``out``."""
    lines = []
    for start, width in _chunks(n):
        lines += [
            f"{{ const int c0 = {start}; float acc[{width}]; for (int j = 0; j < {width}; ++j) acc[j] = {init};",
            f"for ({loop}) {{ {pick} for (int j = 0; j < {width}; ++j) acc[j] += s * v[j]; }}",
            f"for (int j = 0; j < {width}; ++j) {out} = acc[j]; }}",
        ]
    return "\n".join(lines)


def _lane_sum(out: str, expr: str, n: int) -> str:
    """``float out = sum over j < n of expr``: :data:`LANES` interleaved partial sums, then added
    pairwise (lane ``q`` and ``q + 8``, then ``q + 4``, ...): a fixed order the compiler vectorises,
    and a short dependency chain (adding 16 partial sums one after another took longer than
    the 64 products)."""
    return _lane_loop(n, "", [(out, expr)])


def _dots(n: int) -> bool:
    """Whether a layer's outputs are computed one dot product each (in :data:`LANES` partial
    sums along the inputs) rather than accumulated along the outputs: for outputs too few to
    vectorise along (a value, an action)."""
    return n < LANES


def _lane_loop(n: int, body: str, sums: list[tuple[str, str]]) -> str:
    """C++: for every ``j < n`` run ``body`` and add each ``expr`` of ``sums`` to its own sum
    (``float name``), in :func:`_lane_sum`'s order: several passes over a row fused into one
    (rows of 64 are short enough that loads and stores, not arithmetic, set the pace)."""
    full = n - n % LANES
    declare = " ".join(f"float {name};" for name, _ in sums)
    parts = " ".join(f"float part_{name}[{LANES}];" for name, _ in sums)
    zero = " ".join(f"part_{name}[q] = 0.0f;" for name, _ in sums)
    add = " ".join(f"part_{name}[q] += {expr};" for name, expr in sums)
    tail = " ".join(f"part_{name}[j - {full}] += {expr};" for name, expr in sums)
    lines = [
        f"{declare} {{ {parts} for (int q = 0; q < {LANES}; ++q) {{ {zero} }}",
        f"for (int j0 = 0; j0 < {full}; j0 += {LANES}) for (int q = 0; q < {LANES}; ++q) {{ const int j = j0 + q; "
        f"{body} {add} }}",
        f"for (int j = {full}; j < {n}; ++j) {{ {body} {tail} }}",
    ]
    half = LANES // 2
    while half:
        step = " ".join(f"part_{name}[q] += part_{name}[q + {half}];" for name, _ in sums)
        lines.append(f"for (int q = 0; q < {half}; ++q) {{ {step} }}")
        half //= 2
    lines.append(" ".join(f"{name} = part_{name}[0];" for name, _ in sums) + " }")
    return "\n".join(lines)


def _transposed(k: int, n: int) -> bool:
    """Whether a layer's weight gradient is summed transposed (in x out, along the outputs) in a
    buffer of its own and added to the gradient after the last block: for inputs too narrow to
    vectorise along (the observation)."""
    return k < LANES <= n


def _prologue(layers: tuple[tuple, ...], backward: bool) -> str:
    """``exp_low``; the transposed weights ``wt<li>`` (in x out, so that a row's products run
    along the outputs); one block's buffers: its input rows ``h_in``, every layer's output
    ``h<li>`` and activation derivative ``d<li>``, with LayerNorm the normalised values
    ``xh<li>`` and inverse deviations ``iv<li>``, two gradient buffers ``gA``, ``gB``; with
    ``backward`` the transposed gradient sums ``gt<li>`` (:func:`_transposed`), zeroed."""
    lines = ["const float* __restrict__ TH = theta.data;", _EXP]
    for li, (k, n, *_rest) in enumerate(layers):
        if not _dots(n):
            lines.append(
                f"float wt{li}[{k * n}]; {{ const float* W = TH + offsets.c[{4 * li}]; "
                f"for (int o = 0; o < {n}; ++o) for (int i = 0; i < {k}; ++i) wt{li}[i * {n} + o] = W[o * {k} + i]; }}"
            )
    widths = [layers[0][0], *(layer[1] for layer in layers)]
    lines.append(f"float h_in[{BLOCK_ROWS * widths[0]}];")
    for li, (_, n, _, norm, _) in enumerate(layers):
        lines.append(f"float h{li}[{BLOCK_ROWS * n}]; float d{li}[{BLOCK_ROWS * n}];")
        if norm:
            lines.append(f"float xh{li}[{BLOCK_ROWS * n}]; float iv{li}[{BLOCK_ROWS}];")
    lines.append(f"float gA[{BLOCK_ROWS * max(widths)}]; float gB[{BLOCK_ROWS * max(widths)}];")
    for li, (k, n, *_rest) in enumerate(layers):
        if backward and _transposed(k, n):
            lines.append(f"float gt{li}[{k * n}]; for (int e = 0; e < {k * n}; ++e) gt{li}[e] = 0.0f;")
    return "\n".join(lines)


def _load_rows(k0: int, row: str) -> str:
    """The block's ``np`` input rows into ``h_in`` (``row``: the index in ``x`` of block row ``p``)."""
    return (
        f"for (int p = 0; p < np; ++p) {{ const long row = {row};\n"
        f"const char* xr = (const char*)x.data + row * (long)x.strides[0];\n"
        f"for (int i = 0; i < {k0}; ++i) h_in[p * {k0} + i] = *(const float*)(xr + (long)i * x.strides[1]); }}"
    )


def _forward(layers: tuple[tuple, ...], eps: float) -> str:
    """Every layer over the block's ``np`` rows, keeping what backward needs (``h``, ``d``, ``xh``, ``iv``)."""
    lines = []
    for li, (k, n, act, norm, scale) in enumerate(layers):
        src = "h_in" if li == 0 else f"h{li - 1}"
        lines.append(f"{{ const float* B = TH + offsets.c[{4 * li + 1}];")
        lines.append(f"for (int p = 0; p < np; ++p) {{ const float* hr = {src} + p * {k}; float* zr = h{li} + p * {n};")
        if _dots(n):
            lines.append(f"for (int o = 0; o < {n}; ++o) {{ const float* wo = TH + offsets.c[{4 * li}] + o * {k};")
            lines.append(_lane_sum("s_dot", "hr[j] * wo[j]", k))
            lines.append("zr[o] = B[o] + s_dot; }")
        else:
            lines.append(
                _accumulate(
                    n,
                    "B[c0 + j]",
                    f"int i = 0; i < {k}; ++i",
                    f"const float s = hr[i]; const float* v = wt{li} + i * {n} + c0;",
                    "zr[c0 + j]",
                )
            )
        store = "zr[j] = av; dr[j] = dv;" if scale == 1.0 else f"zr[j] = av * {_f(scale)}; dr[j] = dv * {_f(scale)};"
        lines.append(f"float* dr = d{li} + p * {n};")
        activate = f"const float zv = zr[j]; {_activation(act)} {store}"
        if not norm:
            lines.append(f"for (int j = 0; j < {n}; ++j) {{ {activate} }}")
        else:
            # the activation with the row's sum, the centring with its sum of squares, then the
            # normalised values with gain and shift: three passes over the row
            lines.append(
                f"const float* G = TH + offsets.c[{4 * li + 2}]; const float* S = TH + offsets.c[{4 * li + 3}];"
            )
            lines.append(_lane_loop(n, activate, [("s_total", "zr[j]")]))
            lines.append(f"const float mean = s_total * {_f(1.0 / n)};")
            lines.append(_lane_loop(n, "zr[j] = zr[j] - mean;", [("s_squares", "zr[j] * zr[j]")]))
            lines.append(f"const float inv = 1.0f / wp::sqrt(s_squares * {_f(1.0 / n)} + {_f(eps)});")
            lines.append(f"iv{li}[p] = inv; float* xr = xh{li} + p * {n};")
            lines.append(f"for (int j = 0; j < {n}; ++j) {{ xr[j] = zr[j] * inv; zr[j] = xr[j] * G[j] + S[j]; }}")
        lines.append("} }")
    return "\n".join(lines)


def _backward(layers: tuple[tuple, ...], grad: str, input_grad: str | None) -> str:
    """From ``gA`` (the gradient of the block's outputs) back through every layer: the
    parameters' gradients added at ``grad`` (a pointer to the flat buffer's gradient; null:
    none) and, with ``input_grad``, the inputs' gradient (C++ run for block row ``p``, whose
    ``i``-th input gradient is ``gi[i]``)."""
    lines = [f"float* const GRAD = {grad};", "float* cur = gA; float* nxt = gB;"]
    for li in reversed(range(len(layers))):
        k, n, _, norm, _ = layers[li]
        src = "h_in" if li == 0 else f"h{li - 1}"
        lines.append("{")
        if norm:
            # per row, with c = dy * gain: dx = inv (c - mean(c) - xh mean(c xh)) (Ba et al. 2016)
            lines.append(f"const float* G = TH + offsets.c[{4 * li + 2}];")
            lines.append(
                f"for (int p = 0; p < np; ++p) {{ float* c = cur + p * {n}; const float* xr = xh{li} + p * {n};"
            )
            lines.append(
                f"if (GRAD) {{ float* GG = GRAD + offsets.c[{4 * li + 2}]; float* GS = GRAD + offsets.c[{4 * li + 3}];"
                f" for (int j = 0; j < {n}; ++j) {{ GG[j] += c[j] * xr[j]; GS[j] += c[j]; }} }}"
            )
            lines.append(_lane_loop(n, "c[j] = c[j] * G[j];", [("s_g", "c[j]"), ("s_gx", "c[j] * xr[j]")]))
            lines.append(f"const float a1 = s_g * {_f(1.0 / n)}; const float a2 = s_gx * {_f(1.0 / n)};")
            lines.append(f"const float inv = iv{li}[p]; const float* dr = d{li} + p * {n};")
            # and through the activation in the same pass: dz = dx * act'(z)
            lines.append(f"for (int j = 0; j < {n}; ++j) c[j] = inv * (c[j] - a1 - xr[j] * a2) * dr[j]; }}")
        else:
            lines.append(f"for (int e = 0; e < np * {n}; ++e) cur[e] = cur[e] * d{li}[e];")  # through the activation
        # the bias's and the weight's gradients, summed over the block's rows in order
        lines.append(
            f"if (GRAD) {{ float* GB = GRAD + offsets.c[{4 * li + 1}]; float* GW = GRAD + offsets.c[{4 * li}];"
        )
        lines.append(
            _accumulate(
                n,
                "GB[c0 + j]",
                "int p = 0; p < np; ++p",
                f"const float s = 1.0f; const float* v = cur + p * {n} + c0;",
                "GB[c0 + j]",
            )
        )
        if _transposed(k, n):
            lines.append(f"for (int i = 0; i < {k}; ++i) {{ float* gw = gt{li} + i * {n};")
            lines.append(
                _accumulate(
                    n,
                    "gw[c0 + j]",
                    "int p = 0; p < np; ++p",
                    f"const float s = {src}[p * {k} + i]; const float* v = cur + p * {n} + c0;",
                    "gw[c0 + j]",
                )
            )
        else:
            lines.append(f"for (int o = 0; o < {n}; ++o) {{ float* gw = GW + o * {k};")
            lines.append(
                _accumulate(
                    k,
                    "gw[c0 + j]",
                    "int p = 0; p < np; ++p",
                    f"const float s = cur[p * {n} + o]; const float* v = {src} + p * {k} + c0;",
                    "gw[c0 + j]",
                )
            )
        lines.append("} }")
        if li > 0 or input_grad is not None:
            # the inputs' gradient, dh = dz W (the rows of W in order)
            lines.append(f"{{ const float* W = TH + offsets.c[{4 * li}];")
            lines.append(f"for (int p = 0; p < np; ++p) {{ const float* c = cur + p * {n}; float* gi = nxt + p * {k};")
            lines.append(
                _accumulate(
                    k,
                    "0.0f",
                    f"int o = 0; o < {n}; ++o",
                    f"const float s = c[o]; const float* v = W + o * {k} + c0;",
                    "gi[c0 + j]",
                )
            )
            lines.append(input_grad if li == 0 else "")
            lines.append("} }")
            lines.append("{ float* t = cur; cur = nxt; nxt = t; }")
        lines.append("}")
    return "\n".join(lines)


def _flush(layers: tuple[tuple, ...], grad: str) -> str:
    """Add the transposed gradient sums into the weights' gradients (after the last block)."""
    lines = [f"if ({grad}) {{"]
    for li, (k, n, *_rest) in enumerate(layers):
        if _transposed(k, n):
            lines.append(
                f"{{ float* GW = {grad} + offsets.c[{4 * li}]; for (int o = 0; o < {n}; ++o) "
                f"for (int i = 0; i < {k}; ++i) GW[o * {k} + i] += gt{li}[i * {n} + o]; }}"
            )
    lines.append("}")
    return "\n".join(lines)


def _blocks(rows: str, first: str, gather: bool, layers: tuple[tuple, ...], eps: float) -> str:
    """Open the loop over blocks of rows ``first .. first + rows`` (of ``x``, or of ``indices``),
    load each block's input rows and run the forward pass (the caller closes the loop)."""
    row = f"indices.data[{first} + r0 + p]" if gather else f"{first} + r0 + p"
    return (
        f"for (int r0 = 0; r0 < {rows}; r0 += {BLOCK_ROWS}) {{\n"
        f"const int np = {rows} - r0 < {BLOCK_ROWS} ? {rows} - r0 : {BLOCK_ROWS};\n"
        f"{_load_rows(layers[0][0], row)}\n{_forward(layers, eps)}"
    )


def _forward_source(layers: tuple[tuple, ...], eps: float, gather: bool) -> tuple[str, str]:
    """The snippet and the adjoint snippet of :func:`forward_kernel`."""
    k0, out, last = layers[0][0], layers[-1][1], len(layers) - 1
    forward = (
        f"{_prologue(layers, False)}\nconst int total = y.shape.dims[0];\n"
        f"{_blocks('total', '0', gather, layers, eps)}\n"
        f"for (int p = 0; p < np; ++p) {{ char* yr = (char*)y.data + (long)(r0 + p) * y.strides[0];\n"
        f"for (int j = 0; j < {out}; ++j) *(float*)(yr + (long)j * y.strides[1]) = h{last}[p * {out} + j]; }} }}"
    )
    row = "indices.data[r0 + p]" if gather else "r0 + p"
    input_grad = (
        f"if (adj_x.data) {{ char* xr = (char*)adj_x.data + (long)({row}) * adj_x.strides[0];\n"
        f"for (int i = 0; i < {k0}; ++i) *(float*)(xr + (long)i * adj_x.strides[1]) += gi[i]; }}"
    )
    adjoint = (
        f"if (!adj_y.data) return;\n{_prologue(layers, True)}\nconst int total = y.shape.dims[0];\n"
        f"{_blocks('total', '0', gather, layers, eps)}\n"
        f"for (int p = 0; p < np; ++p) {{ char* yr = (char*)adj_y.data + (long)(r0 + p) * adj_y.strides[0];\n"
        f"for (int j = 0; j < {out}; ++j) {{ float* g = (float*)(yr + (long)j * adj_y.strides[1]);\n"
        f"gA[p * {out} + j] = *g; *g = 0.0f; }} }}\n"
        f"{_backward(layers, 'adj_theta.data', input_grad)}\n}}\n{_flush(layers, 'adj_theta.data')}"
    )
    return forward, adjoint


def _mse_source(layers: tuple[tuple, ...], eps: float) -> str:
    """The snippet of :func:`mse_kernel`."""
    out, last = layers[-1][1], len(layers) - 1
    return (
        f"{_prologue(layers, True)}\n"
        f"float* GR = grad.data; for (int e = 0; e < grad.shape.dims[0]; ++e) GR[e] = 0.0f;\n"
        f"const float norm = (float)(rows * {out}); float total_loss = 0.0f;\n"
        f"{_blocks('rows', 'first', False, layers, eps)}\n"
        f"for (int p = 0; p < np; ++p) {{ const char* tr = (const char*)targets.data + "
        f"(long)(first + r0 + p) * targets.strides[0];\n"
        f"for (int j = 0; j < {out}; ++j) {{ const float diff = h{last}[p * {out} + j] - "
        f"*(const float*)(tr + (long)j * targets.strides[1]);\n"
        f"total_loss += diff * diff / norm; gA[p * {out} + j] = 2.0f * diff / norm; }} }}\n"
        f"{_backward(layers, 'GR', None)}\n}}\n{_flush(layers, 'GR')}\n"
        f"loss.data[0] = total_loss;"
    )


# -- kernels ----------------------------------------------------------------------------------------


def _forward_args(offsets_type: Any) -> dict[str, Any]:
    """The arguments of a forward kernel, ``(theta, offsets, x, indices, y)`` (name -> Warp type;
    this module's and :mod:`harness.nn_rows`')."""
    return {
        "theta": wp.array(dtype=wp.float32),
        "offsets": offsets_type,
        "x": wp.array2d(dtype=wp.float32),
        "indices": wp.array(dtype=wp.int32),
        "y": wp.array2d(dtype=wp.float32),
    }


def _mse_args(offsets_type: Any) -> dict[str, Any]:
    """The arguments of a regression step's kernel, ``(theta, offsets, x, targets, first, rows,
    grad, loss)`` (name -> Warp type; this module's and :mod:`harness.nn_rows`')."""
    return {
        "theta": wp.array(dtype=wp.float32),
        "offsets": offsets_type,
        "x": wp.array2d(dtype=wp.float32),
        "targets": wp.array2d(dtype=wp.float32),
        "first": int,
        "rows": int,
        "grad": wp.array(dtype=wp.float32),
        "loss": wp.array(dtype=wp.float32),
    }


def _signature(function: Any, args: dict[str, Any]) -> Any:
    """``function`` with ``args`` (name -> Warp type, in order) as its annotations: a native
    snippet and the kernel that launches it take the same arguments, typed once."""
    function.__annotations__ = dict(args)
    return function


def forward_kernel(layers: tuple[tuple, ...], eps: float, gather: bool, offsets_type: Any) -> Any:
    """The kernel ``(theta, offsets, x, indices, y)``, launched with ``dim=1``: ``y[i] =
    mlp(x[i])`` or ``mlp(x[indices[i]])``; its adjoint adds into ``theta``'s and ``x``'s
    gradients (module docstring). Made once per shape, compiled on its first launch."""
    key = ("forward", layers, eps, gather)
    if key not in _KERNELS:
        snippet, adjoint = _forward_source(layers, eps, gather)
        args = _forward_args(offsets_type)

        def apply(theta, offsets, x, indices, y): ...

        apply = wp.func_native(snippet, adj_snippet=adjoint, replay_snippet="")(_signature(apply, args))

        def mlp_cpu(theta, offsets, x, indices, y):
            apply(theta, offsets, x, indices, y)

        _KERNELS[key] = wp.kernel(module="unique", module_options=_options())(_signature(mlp_cpu, args))
    return _KERNELS[key]


def mse_kernel(layers: tuple[tuple, ...], eps: float, offsets_type: Any) -> Any:
    """The kernel ``(theta, offsets, x, targets, first, rows, grad, loss)``, launched with
    ``dim=1``: over the rows ``first .. first + rows`` of ``x`` and ``targets``, ``loss[0] =
    sum (mlp(x_i) - t_i)^2 / (rows x outputs)`` and ``grad`` (the flat buffer's gradient,
    every entry: 0 outside the MLP's parameters) its gradient, both written, not added."""
    key = ("mse", layers, eps)
    if key not in _KERNELS:
        args = _mse_args(offsets_type)

        def step(theta, offsets, x, targets, first, rows, grad, loss): ...

        step = wp.func_native(_mse_source(layers, eps))(_signature(step, args))

        def mse_cpu(theta, offsets, x, targets, first, rows, grad, loss):
            step(theta, offsets, x, targets, first, rows, grad, loss)

        _KERNELS[key] = wp.kernel(module="unique", enable_backward=False, module_options=_options())(
            _signature(mse_cpu, args)
        )
    return _KERNELS[key]
