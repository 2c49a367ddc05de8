"""Multilayer perceptrons on the device, each call one fused kernel (generated C++ by default).

An :class:`MLP` is a description (widths, activation, LayerNorm, output transform) and the
:class:`~harness.params.ParamSpec` list of its parameters; their values live in a
:class:`~harness.params.ParamSet`, so gradient statistics, clipping and the optimizers treat
them as any other parameter. Hidden layer ``k`` computes

    ``h_k = norm(act(W_k h_{k-1} + b_k))``

with ``act`` tanh, ELU or ReLU and ``norm`` nothing or LayerNorm over the layer's features
(Ba, Kiros and Hinton 2016, "Layer Normalization", arXiv:1607.06450):
``(a - mean(a)) / sqrt(var(a) + eps) * gain + shift``, ``var`` the biased variance, as
PyTorch's ``nn.LayerNorm``. The output layer is ``W h + b``, or ``scale * tanh(W h + b)``.
SHAC's actor and critic (Xu et al. 2022) are ``MLP(..., activation="elu", layer_norm=True)``.

Parameter names, under an optional prefix (``critic.``) so that one ParamSet may hold several
MLPs: ``l1.weight`` ``(out, in)``, ``l1.bias`` ``(out,)``, ``l1.norm.weight`` and
``l1.norm.bias`` ``(out,)`` with LayerNorm, ``l2.weight``, ..., ``out.weight``, ``out.bias``.

One kernel per call, three code paths
-------------------------------------
Every layer (the product, the bias, the activation, LayerNorm, the output transform) runs
inside one kernel, launched once per call. The kernel reads the parameters straight from the
ParamSet's flat buffer (``params.data``, at offsets passed by value), so backward adds every
parameter's gradient into ``params.grad`` itself. Nothing between layers is stored: the
backward kernel recomputes the block's (or the row's) forward pass, so a call needs no buffer
of its own and an :class:`MLP` holds nothing but its description (making one per call is
cheap; the kernels are cached by shape, process-wide). Three kernels implement the same
layers (:data:`PATHS`, :meth:`MLP.path`):

- the **tile path**, any device: one Warp tile kernel over blocks of ``P`` rows
  (``wp.tile_matmul``; :meth:`MLP.tile_width`), its backward Warp's adjoint of it;
- the **CPU path**, the default on the CPU: one C++ kernel (:mod:`harness.nn_cpu`) generated
  from the same :class:`Layer` descriptions, with a hand-written backward. Warp's CPU code of
  tile operations is scalar and runs on one thread; the C++ one, with the widths as constants,
  is vectorised by the compiler: SHAC's critic over a 512-row minibatch takes 0.18 ms forward
  and 0.41 ms backward there against 1.24 and 2.31 ms on the tile path and 0.55 and 0.54 ms
  in torch on one thread (scripts/bench_nn.py). The two agree to float32 rounding (they sum
  in different orders; tests/test_nn.py runs both on the CPU against float64 references and
  each other);
- the **rows path**, the default on CUDA: one C++ kernel (:mod:`harness.nn_rows`) from the
  same descriptions, a thread per row, its backward hand-written too (each thread recomputes
  its row and adds its terms of the gradients atomically). The reason is compile time: NVRTC
  builds the tile kernel of SHAC's Ant actor (37 -> 128 -> 64 -> 32 -> 8, LayerNorm; the
  module holds forward and backward) for sm_90 in 100 to 174 s of CPU on this project's
  2-core machine (two measurements, the machine shared with trainings), and took 4.5 minutes
  and a MathDx link step on an H200 machine; the critic's (37 -> 64 -> 64 -> 1) in 99 s. The
  rows kernels of a SHAC or BPTT run take 0.8 to 4.7 s each (the Ant actor's the longest;
  scripts/bench_nn_compile.py). The same C++, with no device
  branch, runs on the CPU with ``path="rows"`` (tests/test_nn_rows.py checks it there against
  float64 references and the CPU path, and that NVRTC builds it for sm_90); there it is no
  faster than the tile path (SHAC's critic over 512 rows: about 1.1 ms forward, 1.3 ms
  backward), so the CPU keeps the CPU path. Its speed on a GPU is not measured yet (the
  machine has none): the atomic adds, one per weight per row in backward, are its likely
  cost. A network whose row needs more than :data:`harness.nn_rows.ROW_BUDGET` of local
  arrays takes the tile path.

:class:`Regression` does a regression's minibatch step (SHAC's critic): forward, the mean
squared error and backward, the gradient written into ``params.grad``: one launch on the CPU
path, two memsets and a launch on the rows path, a tape on the tile path.

Both ways to apply it, on every path, are recorded by a ``wp.Tape`` (gradients for the
inputs and every parameter) and capture-safe (after the first call, which compiles: no
allocation, no host read, the same arrays at every call; the contract in :mod:`harness.env`):

- :meth:`MLP.forward_step`: row ``t`` of ``x`` ``(steps, rows, in)`` to row ``t`` of ``y``
  ``(steps, rows, out)``, a policy at every step of one tape: each step writes its own rows,
  so backward has every step's values;
- :meth:`MLP.forward`: ``x`` ``(rows, in)`` to ``y`` ``(rows, out)``, or the gathered rows
  ``x[indices[i]]`` of a stored dataset (a critic trained on minibatches).

Tile width: the rule (tile path)
--------------------------------
A block handles ``P`` rows, the largest power of two with

1. ``P <= MAX_TILE_ROWS`` (32) and ``P <= next_power_of_two(rows)``;
2. :meth:`MLP.shared_bytes` ``(P)`` in backward at most the device's tile memory per block:
   on the CPU the fixed arena of Warp 1.19 (:data:`CPU_TILE_ARENA`, 256 KiB; an overflow
   aborts the process with an assertion, nothing is raised), on CUDA the device's opt-in
   shared memory per block.

:meth:`MLP.shared_bytes` is Warp's own accounting of the kernel, in closed form: per layer
the tiles Warp keeps in shared memory (the ``P x in`` rows moved there for the product, the
``out x in`` weight, the ``P x out`` product, the bias broadcast; with LayerNorm its two
``P x out`` reductions and four broadcasts; the index tile of a gathering kernel), each
rounded up to 16 bytes, and twice that in backward, where every shared tile gets an adjoint
of its size. Every tile stays allocated until the kernel ends, so the weights alone take 8
bytes per weight in backward. ``tests/test_nn.py`` checks the formula against the count Warp
records when it compiles a kernel. At the limit it is exact: in = 52 -> 128 -> 128 -> 2 with
LayerNorm, 8 rows per block (261,792 bytes) ran forward and backward, one input wider
(262,880 bytes) aborted. Examples: 6 -> 64 -> 64 -> 1: P = 32 (102 KiB in backward);
5 -> 64 -> 64 -> 1 with LayerNorm: P = 32 (169 KiB); 8 -> 128 -> 128 -> 2 with LayerNorm:
P = 8 (209 KiB); hidden 128 -> 64 -> 32 with LayerNorm: P = 16. An MLP with more than about
32,000 weights in all (hidden 256 -> 128, or 400 -> 200 -> 100) fits no block on the CPU:
:meth:`MLP.tile_width` raises a ValueError rather than let Warp abort (the CPU path, the
default there, takes such networks up to :data:`harness.nn_cpu.STACK_BUDGET`: SHAC's humanoid
actor, 76 -> 256 -> 128 -> 21, needs 0.4 MiB of it).

Rows that are not a multiple of ``P`` are padded: the last block reads zeros past the end
(a gathering kernel reads index 0 there), computes rows nobody reads and writes nothing past
the end, so the padded rows get a zero adjoint and add nothing to any gradient.
"""

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import warp as wp

from harness import compile as kernel_compile
from harness import nn_cpu, nn_rows
from harness.params import ParamSet, ParamSpec

__all__ = [
    "ACTIVATIONS",
    "CPU_TILE_ARENA",
    "LAYER_NORM_EPS",
    "MAX_TILE_ROWS",
    "MLP",
    "OUTPUTS",
    "PATHS",
    "Layer",
    "Regression",
]


@wp.func
def _tanh(x: float):
    return wp.tanh(x)


@wp.func
def _elu(x: float):
    if x > 0.0:
        return x
    return wp.exp(x) - 1.0


@wp.func
def _relu(x: float):
    return wp.max(x, 0.0)


@wp.func
def _rsqrt(x: float):
    return 1.0 / wp.sqrt(x)


ACTIVATIONS = {"tanh": _tanh, "elu": _elu, "relu": _relu}
"""Hidden-layer activations, by name."""

OUTPUTS = ("identity", "tanh")
"""Output transforms: ``W h + b``, or ``output_scale * tanh(W h + b)``."""

LAYER_NORM_EPS = 1.0e-5
"""LayerNorm's default epsilon: PyTorch's ``nn.LayerNorm`` default, the one SHAC's actor and
critic use (``torch.nn.LayerNorm(width)`` in NVlabs/DiffRL ``models/actor.py`` and
``models/critic.py``)."""

MAX_TILE_ROWS = 32
"""The most rows one block handles. On the CPU 32 rows per block were the fastest of 8, 16 and
32, by at most 11% (scripts/bench_nn.py --sweep; 64 did not fit SHAC's critic); on a GPU fewer,
larger blocks leave multiprocessors idle."""

CPU_TILE_ARENA = 256 * 1024
"""Bytes of tile memory a CPU tile kernel has (``WP_MAX_CPU_SHARED``, Warp 1.19
``native/tile.h``); overflowing it aborts the process."""

_CUDA_BLOCK_DIM = 64
"""Threads per block on CUDA (a CPU block is one thread)."""

PATHS = ("auto", "tile", "cpu", "rows")
"""How a call runs (the module docstring): ``tile``, the fused tile kernel (any device);
``cpu``, the C++ kernel of :mod:`harness.nn_cpu` (CPU only); ``rows``, the C++ kernel of
:mod:`harness.nn_rows`, a thread per row (any device); ``auto``, unless a tile width is given
(then ``tile``): ``cpu`` on the CPU for an MLP whose buffers fit
:data:`harness.nn_cpu.STACK_BUDGET`, ``rows`` on CUDA for one whose fit
:data:`harness.nn_rows.ROW_BUDGET`, else ``tile``."""

_FLOAT_BYTES = 4
_TILE_ALIGN = 16
"""Warp rounds every shared tile up to 16 bytes."""


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer of an :class:`MLP`: ``norm(scale * act(W x + b))``.

    Attributes:
        name: Parameter-name stem, prefix included (``critic.l1``, ``out``).
        fan_in: Input width.
        fan_out: Output width.
        activation: A key of :data:`ACTIVATIONS`, or None (linear).
        norm: LayerNorm after the activation, with its gain and shift.
        scale: Multiplies the activation's output (the output layer's ``output_scale``).
    """

    name: str
    fan_in: int
    fan_out: int
    activation: str | None
    norm: bool
    scale: float = 1.0

    @property
    def key(self) -> tuple:
        """What the kernel depends on (everything but the name)."""
        return (self.fan_in, self.fan_out, self.activation, self.norm, self.scale)

    @property
    def parameter_names(self) -> list[str]:
        """``weight``, ``bias`` and, with LayerNorm, ``norm.weight``, ``norm.bias``, in that order."""
        kinds = ["weight", "bias", *(("norm.weight", "norm.bias") if self.norm else ())]
        return [f"{self.name}.{kind}" for kind in kinds]


class MLP:
    """A multilayer perceptron's shape; its parameters live in a :class:`ParamSet`.

    Args:
        inputs: Input width.
        hidden: Hidden widths, e.g. ``[64, 64]`` (empty: a single linear layer).
        outputs: Output width.
        activation: The hidden layers' activation, a key of :data:`ACTIVATIONS`.
        layer_norm: LayerNorm after every hidden activation (Ba et al. 2016), with a learnable
            gain (``lK.norm.weight``, initially 1) and shift (``lK.norm.bias``, initially 0).
        output: ``identity`` or ``tanh`` (:data:`OUTPUTS`).
        output_scale: Multiplies a ``tanh`` output (an action bound).
        prefix: Put before every parameter name (``critic.``).
        norm_eps: LayerNorm's epsilon, added to the variance.

    Raises:
        ValueError: An unknown activation or output, a width below 1, a non-positive
            ``norm_eps``, or ``output_scale`` with the identity output.
    """

    def __init__(
        self,
        inputs: int,
        hidden: Sequence[int],
        outputs: int,
        *,
        activation: str = "tanh",
        layer_norm: bool = False,
        output: str = "identity",
        output_scale: float = 1.0,
        prefix: str = "",
        norm_eps: float = LAYER_NORM_EPS,
    ):
        if activation not in ACTIVATIONS:
            raise ValueError(f"MLP: activation {activation!r}; accepted: {', '.join(ACTIVATIONS)}")
        if output not in OUTPUTS:
            raise ValueError(f"MLP: output {output!r}; accepted: {', '.join(OUTPUTS)}")
        if output == "identity" and output_scale != 1.0:
            raise ValueError(f"MLP: output_scale={output_scale} scales a tanh output; accepted with output='tanh'")
        if not norm_eps > 0.0:
            raise ValueError(f"MLP: norm_eps={norm_eps}; accepted: a positive number")
        widths = [int(inputs), *(int(h) for h in hidden), int(outputs)]
        if min(widths) < 1:
            raise ValueError(f"MLP: widths {widths}; accepted: every width at least 1")
        self.widths = widths
        self.activation = activation
        self.layer_norm = bool(layer_norm)
        self.output = output
        self.output_scale = float(output_scale)
        self.prefix = prefix
        self.norm_eps = float(norm_eps)
        pairs = list(itertools.pairwise(widths))
        self.layers = [
            Layer(f"{prefix}l{k + 1}", fan_in, fan_out, activation, self.layer_norm)
            for k, (fan_in, fan_out) in enumerate(pairs[:-1])
        ]
        out_activation = None if output == "identity" else "tanh"
        self.layers.append(Layer(f"{prefix}out", *pairs[-1], out_activation, False, self.output_scale))

    @property
    def inputs(self) -> int:
        return self.widths[0]

    @property
    def outputs(self) -> int:
        return self.widths[-1]

    def __repr__(self) -> str:
        norm = " + LayerNorm" if self.layer_norm else ""
        out = f", output {self.output_scale:g} * tanh" if self.output == "tanh" else ""
        prefix = f", prefix {self.prefix!r}" if self.prefix else ""
        return f"MLP({' -> '.join(map(str, self.widths))}, {self.activation}{norm}{out}{prefix})"

    # -- parameters ---------------------------------------------------------------------------

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape, by name, in the order of :meth:`specs`."""
        found: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            weight, *vectors = layer.parameter_names
            found[weight] = (layer.fan_out, layer.fan_in)
            found.update({name: (layer.fan_out,) for name in vectors})
        return found

    def specs(self, *, seed: int, init_scale: float = 1.0, fd_step: float = 1.0e-2) -> list[ParamSpec]:
        """The parameters with their initial values.

        Weights and biases are uniform in ``+-1/sqrt(fan_in)`` (PyTorch's ``nn.Linear``
        default), drawn layer by layer, weight then bias, from
        ``numpy.random.default_rng(seed)`` (the draws the policy task made before this module);
        the output layer's weight and bias are then multiplied by ``init_scale``. LayerNorm
        gains start at 1 and shifts at 0.

        Args:
            seed: Seeds the draws.
            init_scale: Multiplies the output layer's initial weight and bias.
            fd_step: Every parameter's finite-difference step (``harness gradcheck``).

        Returns:
            One :class:`ParamSpec` per parameter, in :meth:`shapes` order.
        """
        rng = np.random.default_rng(seed)
        shapes = self.shapes()
        specs = []
        for layer in self.layers:
            bound = 1.0 / np.sqrt(layer.fan_in)
            scale = np.float32(init_scale if layer is self.layers[-1] else 1.0)
            for name in layer.parameter_names:
                if ".norm." in name:
                    value = np.full(shapes[name], 1.0 if name.endswith("weight") else 0.0, np.float32)
                else:
                    value = rng.uniform(-bound, bound, size=shapes[name]).astype(np.float32) * scale
                specs.append(ParamSpec(name, shapes[name], init=value, fd_step=fd_step))
        return specs

    def _offsets(self, params: ParamSet) -> Any:
        """Where each parameter starts in ``params.data``: the kernel's by-value offset vector
        (four entries per layer: weight, bias, gain, shift; 0 where a layer has no LayerNorm)."""
        where = {seg.name: seg.offset for seg in params.segments}
        shapes = self.shapes()
        values = []
        for layer in self.layers:
            names = layer.parameter_names
            for name in names:
                view = params.views.get(name)
                if view is None:
                    raise KeyError(f"{self!r}: parameter {name!r} is not in the ParamSet (it holds {params.names})")
                if view.dtype != wp.float32 or tuple(view.shape) != shapes[name]:
                    raise ValueError(
                        f"{self!r}: parameter {name!r} is {_describe(view)}; accepted: float32{shapes[name]}"
                    )
                values.append(where[name])
            values += [0] * (4 - len(names))
        return _offset_type(len(self.layers))(*values)

    # -- which code runs -------------------------------------------------------------------------

    def path(self, device: wp.DeviceLike = None, path: str = "auto", *, tile_width: int | None = None) -> str:
        """``tile``, ``cpu`` or ``rows``: how a call on ``device`` runs (:data:`PATHS`).

        Raises:
            ValueError: An unknown path, ``cpu`` on another device, ``cpu`` or ``rows`` for an
                MLP too wide for it or with a tile width.
        """
        if path not in PATHS:
            raise ValueError(f"{self!r}: path={path!r}; accepted: {', '.join(map(repr, PATHS))}")
        device = wp.get_device(device)
        keys = self._keys()
        fits_cpu = nn_cpu.stack_bytes(keys) <= nn_cpu.STACK_BUDGET
        fits_rows = nn_rows.row_bytes(keys) <= nn_rows.ROW_BUDGET
        if path == "auto":
            if tile_width is not None:
                return "tile"
            if device.is_cpu and not kernel_compile.cuda_kernels():
                return "cpu" if fits_cpu else "tile"
            return "rows" if fits_rows else "tile"  # CUDA's choice (also while `harness compile` finds CUDA's kernels)
        if path == "cpu":
            if not device.is_cpu:
                raise ValueError(
                    f"{self!r}: path='cpu' runs on the CPU, not on {device}; accepted: 'auto', 'tile' or 'rows'"
                )
            if not fits_cpu:
                raise ValueError(
                    f"{self!r}: path='cpu' needs {nn_cpu.stack_bytes(keys)} bytes of stack, over the "
                    f"{nn_cpu.STACK_BUDGET} allowed; accepted: 'auto' or 'tile'"
                )
        if path == "rows" and not fits_rows:
            raise ValueError(
                f"{self!r}: path='rows' needs {nn_rows.row_bytes(keys)} bytes of local arrays per row, over the "
                f"{nn_rows.ROW_BUDGET} allowed; accepted: 'auto' or 'tile'"
            )
        if path in ("cpu", "rows") and tile_width is not None:
            raise ValueError(f"{self!r}: tile_width={tile_width} with path={path!r}; accepted: tile_width=None")
        return path

    def _keys(self) -> tuple[tuple, ...]:
        return tuple(layer.key for layer in self.layers)

    def _eps(self) -> float:
        return self.norm_eps if self.layer_norm else 0.0  # no LayerNorm: one kernel whatever eps

    # -- tile width ---------------------------------------------------------------------------

    def shared_bytes(self, rows: int, *, gather: bool = False) -> tuple[int, int]:
        """One block's tile memory (bytes) in forward and in backward: the module docstring's
        closed form of Warp's own accounting.

        Args:
            rows: Rows per block (``P``).
            gather: The kernel gathers its rows through an index array.
        """
        total = _tile_bytes(rows) if gather else 0
        for layer in self.layers:
            a, b = layer.fan_in, layer.fan_out
            total += _tile_bytes(rows * a) + _tile_bytes(a * b) + _tile_bytes(rows * b) + _tile_bytes(b)
            if layer.norm:
                total += 2 * _tile_bytes(rows * b) + 2 * _tile_bytes(rows) + 2 * _tile_bytes(b)
        return total, 2 * total

    def tile_width(self, rows: int, device: wp.DeviceLike = None, *, gather: bool = False) -> int:
        """Rows per block for a call over ``rows`` rows on ``device`` (the module docstring's rule).

        Raises:
            ValueError: One row per block already needs more tile memory than the device has
                (layers too wide for a fused kernel).
        """
        device = wp.get_device(device)
        p = min(MAX_TILE_ROWS, _next_power_of_two(rows))
        while p > 1 and self.shared_bytes(p, gather=gather)[1] > _tile_budget(device):
            p //= 2
        self._check_width(p, device, gather)
        return p

    def _check_width(self, p: int, device: wp.Device, gather: bool) -> None:
        if p < 1 or p & (p - 1):
            raise ValueError(f"{self!r}: tile_width={p}; accepted: a power of two")
        need, budget = self.shared_bytes(p, gather=gather)[1], _tile_budget(device)
        if need > budget:
            raise ValueError(
                f"{self!r}: {p} row(s) per block need {need} bytes of tile memory in backward, over the "
                f"{budget} a block has on {device} (the weights alone take 8 bytes per weight); "
                "accepted: fewer rows per block, or narrower layers"
            )

    # -- application --------------------------------------------------------------------------

    def forward(
        self,
        params: ParamSet,
        x: wp.array,
        y: wp.array,
        *,
        indices: wp.array | None = None,
        tile_width: int | None = None,
        path: str = "auto",
    ) -> None:
        """``y[i] = mlp(x[i])``, or ``y[i] = mlp(x[indices[i]])``: one kernel launch.

        Recorded by an enclosing ``wp.Tape``: backward adds into ``x.grad`` (atomically, at the
        gathered rows: a row picked twice gets both contributions) and ``params.grad``, and
        consumes ``y.grad`` (Warp's ``tile_store`` adjoint zeroes the entries it reads).

        Args:
            params: Holds this MLP's parameters (:meth:`specs`), anywhere in its buffer.
            x: float32 ``(rows, inputs)``; with ``indices``, ``(stored, inputs)``.
            y: float32 ``(rows, outputs)``, written.
            indices: Optional int32 ``(rows,)``: the rows of ``x`` to apply the MLP to, each in
                ``[0, stored)``.
            tile_width: Rows per block of the tile path; None: :meth:`tile_width`. A power of
                two whose tile memory fits the device (tests and benchmarks).
            path: :data:`PATHS` (:meth:`path`).

        Raises:
            ValueError: Shapes or dtypes that do not fit, a ``tile_width`` that does not fit
                the device's tile memory, or a path that cannot run here.
            KeyError: ``params`` lacks one of this MLP's parameters.
        """
        rows = y.shape[0]
        if x.ndim != 2 or x.shape[1] != self.inputs or x.dtype != wp.float32:
            raise ValueError(f"{self!r}: x is {_describe(x)}; accepted: float32 (rows, {self.inputs})")
        if y.ndim != 2 or y.shape[1] != self.outputs or y.dtype != wp.float32:
            raise ValueError(f"{self!r}: y is {_describe(y)}; accepted: float32 (rows, {self.outputs})")
        gather = indices is not None
        if not gather and x.shape[0] != rows:
            raise ValueError(f"{self!r}: x has {x.shape[0]} rows and y {rows}; accepted: as many")
        if gather and (indices.ndim != 1 or indices.shape[0] != rows or indices.dtype != wp.int32):
            raise ValueError(f"{self!r}: indices is {_describe(indices)}; accepted: int32 ({rows},)")
        if rows == 0:
            return
        device = params.device
        chosen = self.path(device, path, tile_width=tile_width)
        if chosen in ("cpu", "rows"):
            make = nn_cpu.forward_kernel if chosen == "cpu" else nn_rows.forward_kernel
            kernel = make(self._keys(), self._eps(), gather, _offset_type(len(self.layers)))
            wp.launch(
                kernel,
                dim=1 if chosen == "cpu" else rows,
                inputs=[params.data, self._offsets(params), x, indices],
                outputs=[y],
                device=device,
            )
            return
        if tile_width is None:
            p = self.tile_width(rows, device, gather=gather)
        else:
            p = int(tile_width)
            self._check_width(p, device, gather)
        kernel = self._kernel(p, gather)
        wp.launch_tiled(
            kernel,
            dim=(-(-rows // p),),
            inputs=[params.data, self._offsets(params), x, indices],
            outputs=[y],
            block_dim=1 if device.is_cpu else _CUDA_BLOCK_DIM,
            device=device,
        )

    def _kernel(self, rows: int, gather: bool) -> Any:
        """The fused kernel for blocks of ``rows`` rows (compiled on its first launch)."""
        return _kernel(self._keys(), rows, gather, self._eps())

    def forward_step(
        self, params: ParamSet, x: wp.array, t: int, y: wp.array, *, tile_width: int | None = None, path: str = "auto"
    ) -> None:
        """``y[t] = mlp(x[t])`` for step ``t`` of a rollout: one kernel launch, row ``t`` only.

        Args:
            params: Holds this MLP's parameters (:meth:`specs`).
            x: float32 ``(steps, rows, inputs)``; row ``t`` is read.
            t: The step, a Python int (the same at every replay of a captured graph).
            y: float32 ``(steps', rows, outputs)``; row ``t`` is written, no other (``steps'``
                may differ from ``steps``: states ``horizon + 1``, actions ``horizon``).
            tile_width: As in :meth:`forward`.
            path: As in :meth:`forward`.

        Raises:
            ValueError: Shapes that do not fit (:meth:`forward`).
            IndexError: ``t`` outside ``x`` or ``y``.
        """
        if x.ndim != 3 or y.ndim != 3 or x.shape[1] != y.shape[1]:
            raise ValueError(
                f"{self!r}: x is {_describe(x)} and y {_describe(y)}; accepted: (steps, rows, {self.inputs}) "
                f"and (steps, rows, {self.outputs})"
            )
        if not 0 <= t < min(x.shape[0], y.shape[0]):
            raise IndexError(f"{self!r}: step {t} of x {tuple(x.shape)} and y {tuple(y.shape)}")
        self.forward(params, x[t], y[t], tile_width=tile_width, path=path)


class Regression:
    """Minibatch steps of the mean squared error of an MLP against targets (SHAC's critic).

    ``x`` holds the data set, ``targets`` what the MLP should output for each row; minibatch
    ``m`` is the contiguous rows ``m * batch .. (m + 1) * batch``. One step computes the
    minibatch's loss, ``sum over rows and outputs (mlp(x_i) - t_i)^2 / (batch x outputs)``,
    and writes its gradient into ``params.grad`` (every entry: 0 outside the MLP's
    parameters), so the caller's optimizer can step on it:

    - path ``cpu``: one launch of :func:`harness.nn_cpu.mse_kernel` (forward, loss, backward);
    - path ``rows``: zero the gradients and the loss (two memsets), then one launch of
      :func:`harness.nn_rows.mse_kernel`, a thread per row adding its share of both;
    - path ``tile``: zero the gradients, forward (the tile kernel) and the loss on a
      ``wp.Tape``, backward: four launches, four zeroings and a copy of the loss; the tapes of
      the last :meth:`fit` are kept (a captured graph replays launches that reference them).

    Args:
        mlp: The MLP.
        params: Holds its parameters; their gradient buffer is written by every step.
        x: float32 ``(rows, inputs)``, read (no gradient flows into it).
        targets: float32 ``(rows, outputs)``.
        minibatches: How many minibatches the rows split into (a divisor of ``rows``).
        path: :data:`PATHS`.

    Raises:
        ValueError: Shapes that do not fit, a ``minibatches`` that does not divide the rows,
            or a path that cannot run here.
    """

    def __init__(
        self, mlp: MLP, params: ParamSet, x: wp.array, targets: wp.array, *, minibatches: int, path: str = "auto"
    ):
        rows = x.shape[0]
        if x.ndim != 2 or x.shape[1] != mlp.inputs or x.dtype != wp.float32:
            raise ValueError(f"{mlp!r}: x is {_describe(x)}; accepted: float32 (rows, {mlp.inputs})")
        if targets.ndim != 2 or tuple(targets.shape) != (rows, mlp.outputs) or targets.dtype != wp.float32:
            raise ValueError(f"{mlp!r}: targets is {_describe(targets)}; accepted: float32 ({rows}, {mlp.outputs})")
        if minibatches < 1 or rows % minibatches:
            raise ValueError(f"Regression: minibatches={minibatches}; accepted: a divisor of the {rows} rows")
        self.mlp, self.params, self.x, self.targets = mlp, params, x, targets
        self.minibatches, self.batch = int(minibatches), rows // int(minibatches)
        self.path = mlp.path(params.device, path)
        self._offsets = mlp._offsets(params)
        self._tapes: list[wp.Tape] = []
        if self.path == "tile":
            device = params.device
            self._values = wp.zeros((self.batch, mlp.outputs), dtype=wp.float32, device=device, requires_grad=True)
            self._loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)

    def step(self, m: int, loss: wp.array) -> None:
        """Minibatch ``m``: its loss into ``loss[0]`` (a float32 ``(1,)`` array), its gradient
        into ``params.grad``."""
        first, batch, params = m * self.batch, self.batch, self.params
        device = params.device
        if self.path in ("cpu", "rows"):
            make = nn_cpu.mse_kernel if self.path == "cpu" else nn_rows.mse_kernel
            kernel = make(self.mlp._keys(), self.mlp._eps(), _offset_type(len(self.mlp.layers)))
            if self.path == "rows":  # the threads add their rows' shares: start from zero
                params.zero_grad()
                loss.zero_()
            wp.launch(
                kernel, dim=1 if self.path == "cpu" else batch,
                inputs=[params.data, self._offsets, self.x, self.targets, first, batch],
                outputs=[params.grad, loss], device=device,
            )  # fmt: skip
            return
        params.zero_grad()
        self._values.grad.zero_()
        self._loss.zero_()
        self._loss.grad.zero_()
        tape = wp.Tape()
        with tape:
            self.mlp.forward(params, self.x[first : first + batch], self._values, path="tile")
            wp.launch(
                _squared_error, dim=self._values.shape,
                inputs=[self._values, self.targets, first, float(batch * self.mlp.outputs)],
                outputs=[self._loss], device=device,
            )  # fmt: skip
        tape.backward(self._loss)
        self._tapes.append(tape)
        wp.copy(loss, self._loss)

    def fit(self, epochs: int, losses: wp.array, update: Callable[[], None]) -> None:
        """``epochs`` passes over the minibatches in order, each step followed by ``update()``
        (the optimizer's step on ``params.grad``); ``losses[m]``: minibatch ``m``'s loss in
        the last pass (float32 ``(minibatches,)``)."""
        self._tapes = []
        for _ in range(epochs):
            self._epoch(losses, update)

    def fit_while(
        self, go: wp.array, losses: wp.array, update: Callable[[], None], after_epoch: Callable[[], None]
    ) -> None:
        """Passes as :meth:`fit` makes them while ``go[0]`` (int32, on the device) is nonzero, each
        followed by ``after_epoch()``, which decides ``go`` from the pass's ``losses``: a device
        loop (``wp.capture_while``), so a captured graph runs as many passes as the rule asks at
        every replay. ``go`` must be nonzero to run the first pass."""
        self._tapes = []

        def epoch() -> None:
            self._epoch(losses, update)
            after_epoch()

        wp.capture_while(go, epoch)

    def _epoch(self, losses: wp.array, update: Callable[[], None]) -> None:
        for m in range(self.minibatches):
            self.step(m, losses[m : m + 1])
            update()


@wp.kernel
def _squared_error(
    values: wp.array2d(dtype=wp.float32),
    targets: wp.array2d(dtype=wp.float32),
    first: int,
    norm: float,
    loss: wp.array(dtype=wp.float32),
):
    """``loss += (values[i, j] - targets[first + i, j])^2 / norm`` (the tile path's loss)."""
    i, j = wp.tid()
    diff = values[i, j] - targets[first + i, j]
    wp.atomic_add(loss, 0, diff * diff / norm)


def _describe(a: wp.array) -> str:
    return f"{getattr(a.dtype, '__name__', a.dtype)}{tuple(a.shape)}"


def _tile_bytes(elements: int) -> int:
    return -(-elements * _FLOAT_BYTES // _TILE_ALIGN) * _TILE_ALIGN


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _tile_budget(device: wp.Device) -> int:
    """Bytes of tile memory one block may use on ``device``."""
    if device.is_cpu:
        return CPU_TILE_ARENA
    return device.max_shared_memory_per_block or 48 * 1024


_OFFSET_TYPES: dict[int, Any] = {}
_KERNELS: dict[tuple, Any] = {}


def _offset_type(layers: int) -> Any:
    """The kernel's by-value vector of parameter offsets, four per layer."""
    if layers not in _OFFSET_TYPES:
        _OFFSET_TYPES[layers] = wp.types.vector(length=4 * layers, dtype=wp.int32)
    return _OFFSET_TYPES[layers]


def _kernel(layers: tuple[tuple, ...], rows: int, gather: bool, eps: float) -> Any:
    """The fused kernel of ``layers`` (:attr:`Layer.key` each) for blocks of ``rows`` rows, made
    once per shape. The layer loop is unrolled when Warp generates the code (its bound is a
    ``wp.static``), so every layer's tiles get their own static shapes."""
    key = (layers, rows, gather, eps)
    if key in _KERNELS:
        return _KERNELS[key]
    count = len(layers)
    widths = [layers[0][0], *(layer[1] for layer in layers)]
    acts = [None if layer[2] is None else ACTIVATIONS[layer[2]] for layer in layers]
    norms = [layer[3] for layer in layers]
    scales = [layer[4] for layer in layers]
    offsets_type = _offset_type(count)

    @wp.kernel(module="unique")
    def mlp(
        theta: wp.array(dtype=wp.float32),
        offsets: offsets_type,
        x: wp.array2d(dtype=wp.float32),
        indices: wp.array(dtype=wp.int32),
        y: wp.array2d(dtype=wp.float32),
    ):
        first = wp.tid() * rows
        if wp.static(gather):
            picked = wp.tile_load(indices, shape=rows, offset=first)
            h = wp.tile_load_indexed(x, indices=picked, shape=(rows, wp.static(widths[0])), offset=(0, 0), axis=0)
        else:
            h = wp.tile_load(x, shape=(rows, wp.static(widths[0])), offset=(first, 0))
        for k in range(wp.static(count)):
            # the weight (out, in) from the flat buffer; the product with its transposed view
            flat = wp.tile_load(
                theta, shape=wp.static(widths[k] * widths[k + 1]), offset=offsets[4 * k], storage="shared"
            )
            weight = wp.tile_reshape(flat, shape=(wp.static(widths[k + 1]), wp.static(widths[k])))
            bias = wp.tile_load(theta, shape=wp.static(widths[k + 1]), offset=offsets[4 * k + 1])
            h = wp.tile_matmul(h, wp.tile_transpose(weight))
            h = h + wp.tile_broadcast(bias, shape=(rows, wp.static(widths[k + 1])))
            if wp.static(acts[k] is not None):
                h = wp.tile_map(wp.static(acts[k]), h)
            if wp.static(scales[k] != 1.0):
                h = h * wp.static(scales[k])
            if wp.static(norms[k]):
                # LayerNorm over each row's features (Ba et al. 2016), the biased variance
                mean = wp.tile_reshape(wp.tile_sum(h, axis=1) * wp.static(1.0 / widths[k + 1]), shape=(rows, 1))
                centred = h - wp.tile_broadcast(mean, shape=(rows, wp.static(widths[k + 1])))
                variance = wp.tile_sum(centred * centred, axis=1) * wp.static(1.0 / widths[k + 1])
                inverse = wp.tile_map(_rsqrt, variance + wp.tile_full(shape=rows, value=wp.static(eps), dtype=float))
                gain = wp.tile_load(theta, shape=wp.static(widths[k + 1]), offset=offsets[4 * k + 2])
                shift = wp.tile_load(theta, shape=wp.static(widths[k + 1]), offset=offsets[4 * k + 3])
                h = centred * wp.tile_broadcast(wp.tile_reshape(inverse, shape=(rows, 1)), shape=h.shape)
                h = h * wp.tile_broadcast(gain, shape=h.shape) + wp.tile_broadcast(shift, shape=h.shape)
        wp.tile_store(y, h, offset=(first, 0))

    _KERNELS[key] = mlp
    return mlp
