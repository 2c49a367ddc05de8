"""Measure the harness's MLP (harness/mlp.py: one tile kernel per layer) against per-unit kernels.

Two shapes, forward + backward on one tape, on this machine's CPU:

* a policy applied at every step of a closed loop: ``horizon`` steps of ``worlds`` rows through
  obs(6) -> hidden -> hidden -> 1 (tanh), a stand-in for the simulator closing the loop
  (``x[t+1] = x[t] + 0.01 * y[t]``), the loss the sum of squares of every output;
* a critic over one minibatch: ``rows`` rows through obs(5) -> hidden -> hidden -> 1 with ELU and
  LayerNorm (SHAC's critic), the loss the sum of squares.

The baseline is what task=policy ran before harness/mlp.py: one thread per (row, unit) and
two launches per layer (a dot product, then the activation), each step writing its own rows
(written here, with a LayerNorm launch for the critic). Both sides start from the same weights;
the worst relative difference of their gradients is printed. Run::

    .venv/bin/python scripts/bench_mlp.py [--horizon 240] [--worlds 32] [--hidden 64] [--rows 512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import warp as wp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness.mlp import MLP
from harness.params import ParamSet


@wp.kernel
def _dot(x: wp.array2d(dtype=float), weight: wp.array2d(dtype=float), bias: wp.array(dtype=float),
         z: wp.array2d(dtype=float)):  # fmt: skip
    row, j = wp.tid()
    s = bias[j]
    for i in range(weight.shape[1]):
        s += weight[j, i] * x[row, i]
    z[row, j] = s


@wp.kernel
def _act(z: wp.array2d(dtype=float), kind: int, y: wp.array2d(dtype=float)):
    row, j = wp.tid()
    v = z[row, j]
    if kind == 1:
        v = wp.tanh(v)
    elif kind == 2:
        if v < 0.0:
            v = wp.exp(v) - 1.0
    y[row, j] = v


@wp.kernel
def _row_mean(h: wp.array2d(dtype=float), mean: wp.array(dtype=float)):
    row, j = wp.tid()
    wp.atomic_add(mean, row, h[row, j] / float(h.shape[1]))


@wp.kernel
def _row_var(h: wp.array2d(dtype=float), mean: wp.array(dtype=float), var: wp.array(dtype=float)):
    row, j = wp.tid()
    d = h[row, j] - mean[row]
    wp.atomic_add(var, row, d * d / float(h.shape[1]))


@wp.kernel
def _normalize(h: wp.array2d(dtype=float), mean: wp.array(dtype=float), var: wp.array(dtype=float),
               gain: wp.array(dtype=float), shift: wp.array(dtype=float), y: wp.array2d(dtype=float)):  # fmt: skip
    row, j = wp.tid()
    y[row, j] = (h[row, j] - mean[row]) / wp.sqrt(var[row] + 1.0e-5) * gain[j] + shift[j]


@wp.kernel
def _close_loop(x: wp.array3d(dtype=float), t: int, y: wp.array3d(dtype=float)):
    w, i = wp.tid()
    x[t + 1, w, i] = x[t, w, i] + 0.01 * y[t, w, 0]


@wp.kernel
def _squares(y: wp.array2d(dtype=float), loss: wp.array(dtype=float)):
    row, j = wp.tid()
    wp.atomic_add(loss, 0, y[row, j] * y[row, j])


class PerUnit:
    """The per-unit baseline: per layer a dot-product launch and an activation launch (and three
    LayerNorm launches: row means, row variances, the normalisation), every step writing its own rows."""

    def __init__(self, mlp: MLP, params: ParamSet, shape: tuple[int, ...]):
        self.mlp, self.params = mlp, params
        dev = params.device
        self.bufs = [
            [wp.zeros((*shape, layer.fan_out), device=dev, requires_grad=True) for _ in range(3)]
            + [wp.zeros(shape, device=dev, requires_grad=True) for _ in range(2)]
            for layer in mlp.layers
        ]

    def forward(self, x: wp.array, y: wp.array, t: int | None = None) -> None:
        h = x if t is None else x[t]
        for k, layer in enumerate(self.mlp.layers):
            z, a, n, mean, var = (b if t is None else b[t] for b in self.bufs[k])
            p = self.params
            wp.launch(_dot, dim=z.shape, inputs=[h, p[f"{layer.name}.weight"], p[f"{layer.name}.bias"]], outputs=[z])
            last = k == len(self.mlp.layers) - 1
            out = (y if t is None else y[t]) if last and not layer.norm else a
            wp.launch(_act, dim=z.shape, inputs=[z, layer.activation], outputs=[out])
            if layer.norm:
                mean.zero_()
                var.zero_()
                wp.launch(_row_mean, dim=z.shape, inputs=[a], outputs=[mean])
                wp.launch(_row_var, dim=z.shape, inputs=[a, mean], outputs=[var])
                wp.launch(_normalize, dim=z.shape, inputs=[a, mean, var, p[f"{layer.name}.norm.weight"],
                          p[f"{layer.name}.norm.bias"]], outputs=[n])  # fmt: skip
                out = n
            h = out

    def zero_grad(self) -> None:
        for bufs in self.bufs:
            for b in bufs:
                b.grad.zero_()


def measure(run, zero, repeats: int) -> tuple[float, wp.Tape]:
    """One warm-up, then the median of ``repeats`` forward + backward passes [ms]."""
    times = []
    for r in range(repeats + 1):
        zero()
        t0 = time.perf_counter()
        tape = run()
        if r:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), tape


def loop_case(args, kind: str) -> tuple[float, np.ndarray]:
    mlp = MLP(6, [args.hidden, args.hidden], 1, activation="tanh", output="tanh")
    params = ParamSet(mlp.specs(seed=0, init_scale=1.0))
    x0 = np.random.default_rng(0).normal(size=(args.worlds, 6)).astype(np.float32)
    x = wp.zeros((args.horizon + 1, args.worlds, 6), requires_grad=True)
    y = wp.zeros((args.horizon, args.worlds, 1), requires_grad=True)
    loss = wp.zeros(1, requires_grad=True)
    base = PerUnit(mlp, params, (args.horizon, args.worlds)) if kind == "per-unit" else None

    def run() -> wp.Tape:
        x[0].assign(x0)
        tape = wp.Tape()
        with tape:
            for t in range(args.horizon):
                if base is None:
                    mlp.forward_step(params, x, t, y)
                else:
                    base.forward(x, y, t)
                wp.launch(_close_loop, dim=(args.worlds, 6), inputs=[x, t, y])
            wp.launch(_squares, dim=(args.horizon * args.worlds, 1), inputs=[y.reshape((-1, 1))], outputs=[loss])
        tape.backward(loss)
        return tape

    def zero() -> None:
        params.zero_grad()
        mlp.zero_grad()
        if base is not None:
            base.zero_grad()
        for a in (x, y):
            a.grad.zero_()
        loss.zero_()
        loss.grad.zero_()

    ms, _ = measure(run, zero, args.repeats)
    return ms, params.grad.numpy().copy()


def critic_case(args, kind: str) -> tuple[float, np.ndarray]:
    mlp = MLP(5, [args.hidden, args.hidden], 1, activation="elu", layer_norm=True)
    params = ParamSet(mlp.specs(seed=1))
    x = wp.array(np.random.default_rng(2).normal(size=(args.rows, 5)).astype(np.float32), requires_grad=True)
    y = wp.zeros((args.rows, 1), requires_grad=True)
    loss = wp.zeros(1, requires_grad=True)
    base = PerUnit(mlp, params, (args.rows,)) if kind == "per-unit" else None

    def run() -> wp.Tape:
        tape = wp.Tape()
        with tape:
            (mlp.forward(params, x, y) if base is None else base.forward(x, y))
            wp.launch(_squares, dim=(args.rows, 1), inputs=[y], outputs=[loss])
        tape.backward(loss)
        return tape

    def zero() -> None:
        params.zero_grad()
        mlp.zero_grad()
        if base is not None:
            base.zero_grad()
        for a in (x, y):
            a.grad.zero_()
        loss.zero_()
        loss.grad.zero_()

    ms, _ = measure(run, zero, args.repeats)
    return ms, params.grad.numpy().copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, default=240)
    parser.add_argument("--worlds", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    wp.config.quiet = True
    wp.init()
    wp.set_device("cpu")
    for name, case in (
        (f"policy loop, {args.horizon} steps x {args.worlds} worlds", loop_case),
        (f"critic minibatch, {args.rows} rows, LayerNorm", critic_case),
    ):
        tile_ms, tile_grad = case(args, "tile")
        unit_ms, unit_grad = case(args, "per-unit")
        diff = np.abs(tile_grad - unit_grad).max() / np.abs(unit_grad).max()
        print(
            f"{name}: harness.mlp {tile_ms:.1f} ms, per-unit kernels {unit_ms:.1f} ms, "
            f"ratio {tile_ms / unit_ms:.3f}; gradients differ by {diff:.1e} (relative, worst entry)"
        )


if __name__ == "__main__":
    main()
