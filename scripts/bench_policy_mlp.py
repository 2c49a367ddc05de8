"""Measure the policy MLP's layers on one tape: the project's kernels against warp-nn and tile_matmul.

The policy (:mod:`harness.tasks.policy`) applies one MLP at every step of a rollout recorded on a
single ``wp.Tape``, so backward needs every step's activations. This script builds the same
closed loop in three ways and times forward + backward of the whole horizon on the CPU:

* ``project``: ``_linear`` and ``_activation`` from ``harness.tasks.policy``, two launches per
  layer, each step writing its own row ``t`` of per-step buffers ``(horizon, worlds, width)``;
* ``warp-nn shared``: NVIDIA's ``warp-nn`` ``Linear`` and ``Tanh`` modules called once per step,
  as their API intends. A module keeps one output array per (shape, dtype) (``self._cache`` in
  ``Linear.__call__``, ``warp_nn/modules/layers/linear.py``, and ``Tanh.__call__``,
  ``warp_nn/modules/operators/tanh.py``), so every step overwrites the previous step's output;
* ``warp-nn per-step``: a shallow copy of every module per step (``copy.copy``, shares the
  ``Parameter`` objects and the compiled kernels, with an empty output cache), the only way to get
  per-step outputs: warp-nn has no ``out=`` argument;
* ``tile_matmul``: one fused tile kernel per step for the whole MLP (``wp.tile_matmul`` as in
  Warp's ``examples/tile/example_tile_mlp.py``), reading ``x[t]`` and writing ``y[t]``; its
  backward recomputes the hidden tiles inside the kernel, so only inputs and outputs are kept.

The MLP is obs(6) -> hidden -> hidden -> 1, tanh after every layer; a stand-in for the
simulator closes the loop (``x[t+1] = x[t] + 0.01 * y[t]``, broadcast over the observation),
and the loss is the sum of the squares of every step's output. Every variant starts from the
same weights and initial observations; the gradients of the weights and biases are compared
with the project's (max |g - g_project| / max |g_project|, worst over the six parameters).

warp-nn is not a project dependency: install it outside the project venv and point
``--warp-nn-path`` at it (default ``/tmp/wnn/lib``)::

    .venv/bin/pip install --target /tmp/wnn/lib --no-deps warp-nn==0.4.1

Run::

    .venv/bin/python scripts/bench_policy_mlp.py [--horizon 240] [--worlds 32] [--hidden 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import warp as wp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness.tasks.policy import ACTIVATIONS, _activation, _linear

OBS = 6
ACT = 1
TANH = ACTIVATIONS["tanh"]
LAYERS = ("l1", "l2", "out")


# -- the closed loop's stand-ins ------------------------------------------------------------


@wp.kernel
def _step3(x: wp.array3d(dtype=wp.float32), t: int, y: wp.array3d(dtype=wp.float32)):
    """``x[t+1, w, i] = x[t, w, i] + 0.01 * y[t, w, 0]``: the simulator step."""
    w, i = wp.tid()
    x[t + 1, w, i] = x[t, w, i] + 0.01 * y[t, w, 0]


@wp.kernel
def _step2(x: wp.array3d(dtype=wp.float32), t: int, y: wp.array2d(dtype=wp.float32)):
    """The same step for an output that is one ``(worlds, 1)`` array (warp-nn)."""
    w, i = wp.tid()
    x[t + 1, w, i] = x[t, w, i] + 0.01 * y[w, 0]


@wp.kernel
def _loss3(y: wp.array3d(dtype=wp.float32), loss: wp.array(dtype=wp.float32)):
    t, w = wp.tid()
    wp.atomic_add(loss, 0, y[t, w, 0] * y[t, w, 0])


@wp.kernel
def _loss2(y: wp.array2d(dtype=wp.float32), loss: wp.array(dtype=wp.float32)):
    w = wp.tid()
    wp.atomic_add(loss, 0, y[w, 0] * y[w, 0])


# -- variants ------------------------------------------------------------------------------
# Each variant: ``params()`` -> {name: array whose .grad is the gradient}, ``run(tape)`` records
# the horizon on the tape and returns the loss array.


class Project:
    name = "project kernels"

    def __init__(self, weights, x0, horizon, hidden):
        self.horizon, self.worlds = horizon, x0.shape[0]
        self.p = {k: wp.array(v, dtype=wp.float32, requires_grad=True) for k, v in weights.items()}
        self.x = wp.zeros((horizon + 1, self.worlds, OBS), dtype=wp.float32, requires_grad=True)
        self.x0 = x0
        widths = [hidden, hidden, ACT]
        self.pre = [wp.zeros((horizon, self.worlds, w), dtype=wp.float32, requires_grad=True) for w in widths]
        self.post = [wp.zeros((horizon, self.worlds, w), dtype=wp.float32, requires_grad=True) for w in widths]
        self.loss = wp.zeros(1, dtype=wp.float32, requires_grad=True)

    def params(self):
        return self.p

    def _zero(self):
        for a in (self.x, *self.pre, *self.post, self.loss):
            a.grad.zero_()
        self.loss.zero_()
        self.x[0].assign(self.x0)

    def run(self, tape):
        self._zero()
        with tape:
            for t in range(self.horizon):
                inputs = [self.x, *self.post[:-1]]
                for k, name in enumerate(LAYERS):
                    dim = (self.worlds, self.pre[k].shape[2])
                    wp.launch(_linear, dim=dim, inputs=[inputs[k], t, self.p[f"{name}.weight"], self.p[f"{name}.bias"]],
                              outputs=[self.pre[k]])  # fmt: skip
                    wp.launch(_activation, dim=dim, inputs=[self.pre[k], t, TANH, 1.0], outputs=[self.post[k]])
                wp.launch(_step3, dim=(self.worlds, OBS), inputs=[self.x, t, self.post[-1]])
            wp.launch(_loss3, dim=(self.horizon, self.worlds), inputs=[self.post[-1]], outputs=[self.loss])
        return self.loss


class WarpNN:
    """warp-nn's modules, called once per step; ``per_step`` gives every step its own module copies."""

    def __init__(self, nn, weights, x0, horizon, hidden, per_step):
        self.name = "warp-nn per-step copies" if per_step else "warp-nn shared modules"
        self.horizon, self.worlds = horizon, x0.shape[0]
        self.per_step = per_step
        fan = {"l1": (OBS, hidden), "l2": (hidden, hidden), "out": (hidden, ACT)}
        self.linears = {n: nn.Linear(*fan[n], initialize_parameters=False) for n in LAYERS}
        for n, m in self.linears.items():
            m.weight.data.assign(weights[f"{n}.weight"])
            m.bias.data.assign(weights[f"{n}.bias"].reshape(-1, 1))  # warp-nn's bias is (out, 1)
        self.tanh = nn.Tanh()
        self.x = wp.zeros((horizon + 1, self.worlds, OBS), dtype=wp.float32, requires_grad=True)
        self.x0 = x0
        self.loss = wp.zeros(1, dtype=wp.float32, requires_grad=True)
        self._outputs = []  # every output array of the last run (their grads are zeroed per run)

    def params(self):
        out = {}
        for n, m in self.linears.items():
            out[f"{n}.weight"] = m.weight.data
            out[f"{n}.bias"] = m.bias.data
        return out

    def _module(self, m):
        if not self.per_step:
            return m
        c = copy.copy(m)  # same Parameter objects and kernels, fresh output cache
        c._cache = {}
        return c

    def run(self, tape):
        for a in (self.x, self.loss, *self._outputs):
            a.grad.zero_()
        self.loss.zero_()
        self.x[0].assign(self.x0)
        outputs = {}  # every array a module handed back (the shared modules hand back the same ones)
        with tape:
            for t in range(self.horizon):
                h = self.x[t]
                for n in LAYERS:
                    z = self._module(self.linears[n])(h)
                    h = self._module(self.tanh)(z)
                    outputs[id(z)], outputs[id(h)] = z, h
                wp.launch(_step2, dim=(self.worlds, OBS), inputs=[self.x, t, h])
                wp.launch(_loss2, dim=self.worlds, inputs=[h], outputs=[self.loss])
        self._outputs = list(outputs.values())
        return self.loss


@wp.func
def _tanh(x: float):
    return wp.tanh(x)


def _tile_kernel(hidden: int, tile_worlds: int):
    tw = tile_worlds

    @wp.kernel(module="unique")
    def mlp(
        x: wp.array3d(dtype=wp.float32),
        t: int,
        w0: wp.array2d(dtype=wp.float32),
        b0: wp.array2d(dtype=wp.float32),
        w1: wp.array2d(dtype=wp.float32),
        b1: wp.array2d(dtype=wp.float32),
        w2: wp.array2d(dtype=wp.float32),
        b2: wp.array2d(dtype=wp.float32),
        y: wp.array3d(dtype=wp.float32),
    ):
        i = wp.tid()
        xt = x[t]
        yt = y[t]
        f = wp.tile_transpose(wp.tile_load(xt, shape=(tw, OBS), offset=(i * tw, 0)))  # (OBS, tw)
        a = wp.tile_load(w0, shape=(wp.static(hidden), OBS))
        c = wp.tile_load(b0, shape=(wp.static(hidden), 1))
        z = wp.tile_map(_tanh, wp.tile_matmul(a, f) + wp.tile_broadcast(c, shape=(wp.static(hidden), tw)))
        a1 = wp.tile_load(w1, shape=(wp.static(hidden), wp.static(hidden)))
        c1 = wp.tile_load(b1, shape=(wp.static(hidden), 1))
        z1 = wp.tile_map(_tanh, wp.tile_matmul(a1, z) + wp.tile_broadcast(c1, shape=(wp.static(hidden), tw)))
        a2 = wp.tile_load(w2, shape=(ACT, wp.static(hidden)))
        c2 = wp.tile_load(b2, shape=(ACT, 1))
        o = wp.tile_map(_tanh, wp.tile_matmul(a2, z1) + wp.tile_broadcast(c2, shape=(ACT, tw)))
        wp.tile_store(yt, wp.tile_transpose(o), offset=(i * tw, 0))

    return mlp


class Tile:
    name = "tile_matmul fused"
    # On the CPU a tile kernel's tiles (and, in backward, their adjoints) live in a 256 KiB
    # arena, and overflowing it aborts the process (an assertion in warp/native/tile.h, not an
    # exception): main() probes each tile width in a child process first (see _tile_width).

    def __init__(self, weights, x0, horizon, hidden, tile_worlds):
        self.horizon, self.worlds = horizon, x0.shape[0]
        self.tw = tile_worlds
        self.kernel = _tile_kernel(hidden, self.tw)
        self.p = {}
        for k, v in weights.items():
            self.p[k] = wp.array(v.reshape(-1, 1) if k.endswith(".bias") else v, dtype=wp.float32, requires_grad=True)
        self.x = wp.zeros((horizon + 1, self.worlds, OBS), dtype=wp.float32, requires_grad=True)
        self.x0 = x0
        self.y = wp.zeros((horizon, self.worlds, ACT), dtype=wp.float32, requires_grad=True)
        self.loss = wp.zeros(1, dtype=wp.float32, requires_grad=True)

    def params(self):
        return self.p

    def run(self, tape):
        for a in (self.x, self.y, self.loss):
            a.grad.zero_()
        self.loss.zero_()
        self.x[0].assign(self.x0)
        blocks = (self.worlds + self.tw - 1) // self.tw
        args = [self.p[f"{n}.{k}"] for n in LAYERS for k in ("weight", "bias")]
        with tape:
            for t in range(self.horizon):
                wp.launch_tiled(self.kernel, dim=(blocks,), inputs=[self.x, t, *args], outputs=[self.y], block_dim=64)
                wp.launch(_step3, dim=(self.worlds, OBS), inputs=[self.x, t, self.y])
            wp.launch(_loss3, dim=(self.horizon, self.worlds), inputs=[self.y], outputs=[self.loss])
        return self.loss


# -- measurement ---------------------------------------------------------------------------


def measure(variant, repeats):
    """One warm-up (compiles), then ``repeats`` timed forward + backward passes; returns the
    median forward and backward times (ms), the loss and the gradients of the last pass."""
    fwd, bwd = [], []
    for r in range(repeats + 1):
        for a in variant.params().values():
            a.grad.zero_()
        tape = wp.Tape()
        wp.synchronize()
        t0 = time.perf_counter()
        loss = variant.run(tape)
        wp.synchronize()
        t1 = time.perf_counter()
        tape.backward(loss)
        wp.synchronize()
        t2 = time.perf_counter()
        if r:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
        grads = {k: a.grad.numpy().reshape(-1).copy() for k, a in variant.params().items()}
        value = float(loss.numpy()[0])
        tape.reset()
    return statistics.median(fwd), statistics.median(bwd), value, grads


def _tile_width(args, worlds) -> tuple[int | None, str]:
    """The widest block of worlds (32, 16, 8) whose tile kernel runs forward + backward here."""
    tried = []
    for tw in (32, 16, 8):
        tw = min(tw, worlds)
        if tw in tried:
            continue
        tried.append(tw)
        if args.device != "cpu":
            return tw, ""
        cmd = [sys.executable, os.path.abspath(__file__), "--probe-tile", str(tw), "--hidden", str(args.hidden),
               "--worlds", str(worlds), "--device", args.device]  # fmt: skip
        probe = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if probe.returncode == 0:
            if tw == tried[0]:
                return tw, ""
            return tw, f"tile_matmul: {tried[0]} worlds per block overflow the CPU tile arena; {tw} used"
        last = probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"]
        reason = next((line for line in last if "Assertion" in line or "Error" in line), last[-1])
    return None, f"tile_matmul fused: skipped, no block of {tried} worlds runs on {args.device} ({reason[:150]})"


def rel_diff(grads, ref):
    """Worst over the parameters of max |g - ref| / max |ref|."""
    return max(float(np.max(np.abs(grads[k] - ref[k])) / max(np.max(np.abs(ref[k])), 1e-30)) for k in ref)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horizon", type=int, default=240)
    parser.add_argument("--worlds", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--probe-tile", type=int, default=0, help=argparse.SUPPRESS)  # child process of _tile_width
    parser.add_argument("--warp-nn-path", default="/tmp/wnn/lib", help="where warp-nn is installed (pip --target)")
    args = parser.parse_args()

    wp.config.quiet = True
    wp.init()
    wp.set_device(args.device)

    rng = np.random.default_rng(0)
    weights = {}
    for name, (fan_in, fan_out) in zip(
        LAYERS, [(OBS, args.hidden), (args.hidden, args.hidden), (args.hidden, ACT)], strict=True
    ):
        bound = 1.0 / np.sqrt(fan_in)
        weights[f"{name}.weight"] = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        weights[f"{name}.bias"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    x0 = rng.uniform(-1.0, 1.0, (args.worlds, OBS)).astype(np.float32)
    if args.probe_tile:
        measure(Tile(weights, x0, 2, args.hidden, args.probe_tile), 1)
        return
    print(f"horizon={args.horizon} worlds={args.worlds} hidden={args.hidden} repeats={args.repeats} "
          f"device={args.device} warp={wp.config.version}")  # fmt: skip

    variants = [Project(weights, x0, args.horizon, args.hidden)]
    notes = []
    if args.warp_nn_path and args.warp_nn_path not in sys.path:
        sys.path.insert(0, args.warp_nn_path)
    try:
        import warp_nn
        from warp_nn import nn  # nn.Linear, nn.Tanh

        notes.append(f"warp-nn {warp_nn.__version__} from {os.path.dirname(os.path.dirname(warp_nn.__file__))}")
        for per_step in (False, True):
            variants.append(WarpNN(nn, weights, x0, args.horizon, args.hidden, per_step))
    except ImportError as error:
        notes.append(
            f"warp-nn not importable ({error}); install it outside the project venv, e.g. "
            "`.venv/bin/pip install --target /tmp/wnn/lib --no-deps warp-nn==0.4.1`, "
            "and pass --warp-nn-path /tmp/wnn/lib"
        )
    tile_worlds, note = _tile_width(args, args.worlds)
    if note:
        notes.append(note)
    if tile_worlds:
        variants.append(Tile(weights, x0, args.horizon, args.hidden, tile_worlds))

    header = f"{'variant':<26}{'fwd ms':>9}{'bwd ms':>9}{'total ms':>10}{'loss rel':>11}{'grad rel':>11}"
    print(f"\n{header}\n{'-' * len(header)}", flush=True)
    ref, ref_loss = None, None
    for v in variants:
        try:
            fwd, bwd, loss, grads = measure(v, args.repeats)
        except Exception as error:  # a variant that does not build or run on this device
            notes.append(f"{v.name}: skipped, {type(error).__name__}: {str(error).splitlines()[0][:160]}")
            continue
        if ref is None:
            ref, ref_loss = grads, loss
        dl, dg = abs(loss - ref_loss) / abs(ref_loss), rel_diff(grads, ref)
        print(f"{v.name:<26}{fwd:>9.1f}{bwd:>9.1f}{fwd + bwd:>10.1f}{dl:>11.1e}{dg:>11.1e}", flush=True)
    print("\nloss rel / grad rel: against the project kernels (grad: worst parameter, max|dg| / max|g|)")
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
