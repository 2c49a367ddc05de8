"""Multilayer perceptrons on the device, one tile kernel per layer: the harness's one MLP.

A layer is ``y = norm(act(W x + b))``: a ``wp.tile_matmul`` of a block of rows, the bias, the
activation (tanh, ELU, ReLU or none) and optionally LayerNorm over the layer's features (Ba,
Kiros and Hinton 2016, "Layer Normalization": ``(h - mean) / sqrt(var + eps) * gain + bias``,
the mean and variance taken with tile products against a row of ones), all in one kernel
launched per block of rows. The output layer is linear, or ``scale * tanh``.

Two ways to apply an :class:`MLP`, both recorded by a ``wp.Tape`` with gradients for the
inputs and every parameter, and both capture-safe (same arrays every call, nothing
allocated or read back once the buffers exist):

- :meth:`MLP.forward_step`: row ``t`` of ``(steps, rows, in)`` to row ``t`` of ``(steps, rows,
  out)``, each step keeping its own hidden rows (a policy applied at every step of one tape:
  backward needs every step's activations);
- :meth:`MLP.forward`: ``(rows, in)`` to ``(rows, out)`` (a critic over a minibatch).

Parameters live in a :class:`harness.params.ParamSet` under ``l1.weight`` ``(out, in)``,
``l1.bias``, ``l1.norm.weight``, ``l1.norm.bias``, ..., ``out.weight``, ``out.bias``, so the
gradient statistics, clipping and the optimizers treat them as any other parameter.

Tile width: a block handles ``TW`` rows, the largest power of two up to 32 that divides the
row count (rows that are not a multiple of 32 still work, in narrower blocks). On the CPU a
tile kernel's tiles live in a fixed arena (256 KiB in Warp 1.19) whose overflow aborts the
process; a layer's largest tiles are ``width x TW`` floats (8 KiB at 64 x 32), a handful of
them with their adjoints, well inside it for widths up to 256 (:data:`MAX_WIDTH`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import warp as wp

from harness.params import ParamSet, ParamSpec

__all__ = ["ACTIVATIONS", "MAX_WIDTH", "MLP", "tile_width"]

ACTIVATIONS = {"identity": 0, "tanh": 1, "elu": 2, "relu": 3}
"""Hidden-layer activations, by name (the kernel's code)."""

MAX_WIDTH = 256
"""The widest layer (inputs or outputs) the tile kernels accept."""

LAYER_NORM_EPS = 1.0e-5
"""LayerNorm's epsilon (PyTorch's default, which SHAC's networks use)."""

BLOCK_DIM = 64
"""Threads per tile block (on the CPU a block runs on one thread whatever this is)."""


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


_FUNCS = {ACTIVATIONS["tanh"]: _tanh, ACTIVATIONS["elu"]: _elu, ACTIVATIONS["relu"]: _relu}


@wp.func
def _mul(a: float, b: float):
    return a * b


@wp.func
def _inverse_std(variance: float):
    return 1.0 / wp.sqrt(variance + wp.static(LAYER_NORM_EPS))


def tile_width(rows: int) -> int:
    """Rows per block: the largest power of two up to 32 dividing ``rows``."""
    width = 32
    while rows % width:
        width //= 2
    return width


_KERNELS: dict[tuple, Any] = {}


def _layer_kernel(fan_in: int, fan_out: int, rows: int, activation: int, norm: bool, scale: float) -> Any:
    """One layer's tile kernel for blocks of ``rows`` rows (module docstring), made once per shape."""
    key = (fan_in, fan_out, rows, activation, norm, scale)
    if key in _KERNELS:
        return _KERNELS[key]
    tw = rows

    @wp.kernel(module="unique")
    def layer(
        x: wp.array2d(dtype=wp.float32),
        weight: wp.array2d(dtype=wp.float32),
        bias: wp.array2d(dtype=wp.float32),
        gain: wp.array2d(dtype=wp.float32),
        shift: wp.array2d(dtype=wp.float32),
        y: wp.array2d(dtype=wp.float32),
    ):
        i = wp.tid()
        features = wp.tile_transpose(wp.tile_load(x, shape=(tw, wp.static(fan_in)), offset=(i * tw, 0)))
        w = wp.tile_load(weight, shape=(wp.static(fan_out), wp.static(fan_in)))
        b = wp.tile_load(bias, shape=(wp.static(fan_out), 1))
        h = wp.tile_matmul(w, features) + wp.tile_broadcast(b, shape=(wp.static(fan_out), tw))
        if wp.static(activation != 0):
            h = wp.tile_map(wp.static(_FUNCS.get(activation)), h)
        if wp.static(scale != 1.0):
            h = h * wp.static(scale)
        if wp.static(norm):
            ones = wp.tile_ones(shape=(1, wp.static(fan_out)), dtype=wp.float32)
            inv = wp.static(1.0 / fan_out)
            mean = wp.tile_matmul(ones, h) * inv
            centred = h - wp.tile_broadcast(mean, shape=(wp.static(fan_out), tw))
            variance = wp.tile_matmul(ones, wp.tile_map(_mul, centred, centred)) * inv
            spread = wp.tile_broadcast(wp.tile_map(_inverse_std, variance), shape=(wp.static(fan_out), tw))
            g = wp.tile_broadcast(wp.tile_load(gain, shape=(wp.static(fan_out), 1)), shape=(wp.static(fan_out), tw))
            s = wp.tile_broadcast(wp.tile_load(shift, shape=(wp.static(fan_out), 1)), shape=(wp.static(fan_out), tw))
            h = wp.tile_map(_mul, wp.tile_map(_mul, centred, spread), g) + s
        wp.tile_store(y, wp.tile_transpose(h), offset=(i * tw, 0))

    _KERNELS[key] = layer
    return layer


@dataclasses.dataclass
class _Layer:
    name: str
    fan_in: int
    fan_out: int
    activation: int
    norm: bool
    scale: float


class MLP:
    """A multilayer perceptron's shape; its parameters live in a :class:`ParamSet`.

    Args:
        inputs: Width of the input.
        hidden: Widths of the hidden layers.
        outputs: Width of the output.
        activation: The hidden layers' activation (:data:`ACTIVATIONS`).
        layer_norm: LayerNorm after every hidden activation (SHAC's networks: Linear, ELU, LayerNorm).
        output: ``identity`` (a linear output layer) or ``tanh`` (``output_scale * tanh``).
        output_scale: Multiplies a ``tanh`` output.
        prefix: Put before every parameter name (``critic.``), so several MLPs share a ParamSet.
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
    ):
        if activation not in ACTIVATIONS or output not in ("identity", "tanh"):
            raise ValueError(f"MLP: activation {activation!r} / output {output!r}; accepted: {list(ACTIVATIONS)}")
        widths = [int(inputs), *(int(h) for h in hidden), int(outputs)]
        if max(widths) > MAX_WIDTH or min(widths) < 1:
            raise ValueError(f"MLP: widths {widths} must lie in [1, {MAX_WIDTH}]")
        self.widths = widths
        self.prefix = prefix
        names = [*(f"l{k + 1}" for k in range(len(widths) - 2)), "out"]
        self.layers = [
            _Layer(
                f"{prefix}{name}",
                fan_in,
                fan_out,
                ACTIVATIONS[activation] if name != "out" else ACTIVATIONS[output],
                layer_norm and name != "out",
                float(output_scale) if name == "out" and output == "tanh" else 1.0,
            )
            for name, (fan_in, fan_out) in zip(names, itertools.pairwise(widths), strict=True)
        ]
        self._hidden: dict[tuple[int, ...], list[wp.array]] = {}
        self._unit: dict[str, wp.array] = {}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape, by name, in the order of :meth:`specs`."""
        found: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            found[f"{layer.name}.weight"] = (layer.fan_out, layer.fan_in)
            found[f"{layer.name}.bias"] = (layer.fan_out,)
            if layer.norm:
                found[f"{layer.name}.norm.weight"] = (layer.fan_out,)
                found[f"{layer.name}.norm.bias"] = (layer.fan_out,)
        return found

    def specs(self, *, seed: int, init_scale: float = 1.0) -> list[ParamSpec]:
        """The parameters with their initial values: weights and biases uniform in
        ``+-1/sqrt(fan_in)`` (PyTorch's ``nn.Linear`` default), the output layer's times
        ``init_scale``; LayerNorm gains 1 and shifts 0."""
        rng = np.random.default_rng(seed)
        specs = []
        for name, shape in self.shapes().items():
            if ".norm." in name:
                value = np.full(shape, 1.0 if name.endswith("weight") else 0.0, np.float32)
            else:
                fan_in = self.shapes()[name.replace(".bias", ".weight")][1]
                bound = 1.0 / np.sqrt(fan_in)
                value = rng.uniform(-bound, bound, size=shape).astype(np.float32)
                if name.startswith(f"{self.prefix}out."):
                    value *= init_scale
            specs.append(ParamSpec(name, shape, init=value, fd_step=1.0e-2))
        return specs

    # -- application --------------------------------------------------------------------------

    def _args(self, params: ParamSet, layer: _Layer) -> list[wp.array]:
        weight = params[f"{layer.name}.weight"]
        bias = params[f"{layer.name}.bias"].reshape((layer.fan_out, 1))
        if layer.norm:
            gain = params[f"{layer.name}.norm.weight"].reshape((layer.fan_out, 1))
            shift = params[f"{layer.name}.norm.bias"].reshape((layer.fan_out, 1))
        else:  # unused by the kernel; any (fan_out, 1) arrays
            gain = shift = bias
        return [weight, bias, gain, shift]

    def hidden_buffers(self, shape: tuple[int, ...], device: Any) -> list[wp.array]:
        """The hidden layers' outputs for inputs of leading shape ``shape`` (made once per shape)."""
        found = self._hidden.get(shape)
        if found is None:
            found = [
                wp.zeros((*shape, layer.fan_out), dtype=wp.float32, device=device, requires_grad=True)
                for layer in self.layers[:-1]
            ]
            self._hidden[shape] = found
        return found

    def zero_grad(self) -> None:
        """Zero the gradients of the hidden buffers (the caller zeroes the inputs' and outputs')."""
        for buffers in self._hidden.values():
            for array in buffers:
                array.grad.zero_()

    def _launch(self, params: ParamSet, xs: list[wp.array], y: wp.array) -> None:
        rows = xs[0].shape[0]
        tw = tile_width(rows)
        outputs = [*xs[1:], y]
        for layer, x, out in zip(self.layers, xs, outputs, strict=True):
            kernel = _layer_kernel(layer.fan_in, layer.fan_out, tw, layer.activation, layer.norm, layer.scale)
            wp.launch_tiled(
                kernel, dim=(rows // tw,), inputs=[x, *self._args(params, layer)], outputs=[out],
                block_dim=BLOCK_DIM, device=params.device,
            )  # fmt: skip

    def forward(self, params: ParamSet, x: wp.array, y: wp.array) -> None:
        """``y = mlp(x)`` for ``x`` float32 ``(rows, inputs)`` and ``y`` ``(rows, outputs)``."""
        hidden = self.hidden_buffers((x.shape[0],), params.device)
        self._launch(params, [x, *hidden], y)

    def forward_step(self, params: ParamSet, x: wp.array, t: int, y: wp.array) -> None:
        """``y[t] = mlp(x[t])`` for ``x`` float32 ``(steps, rows, inputs)`` and ``y`` ``(steps, rows,
        outputs)``; step ``t``'s hidden rows are its own."""
        hidden = self.hidden_buffers(tuple(x.shape[:2]), params.device)
        self._launch(params, [x[t], *(h[t] for h in hidden)], y[t])
