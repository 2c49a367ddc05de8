"""Time the fused tile-kernel MLP of :mod:`harness.nn` against the policy's per-unit kernels.

Two shapes, forward + backward on one ``wp.Tape``, on the CPU by default:

* **per step** (a policy inside a rollout): an MLP 6 -> 64 -> 64 -> 1 (tanh, tanh output)
  applied at every step of a 240-step, 32-world horizon, the next input depending on the last
  output (``x[t+1] = x[t] + 0.01 * y[t]``, a stand-in for the simulator), loss ``sum y^2``.
  Variants:

  - ``policy kernels``: ``_linear`` and ``_activation`` of ``harness/tasks/policy.py`` as of
    commit 5d6a191 (reproduced here), two launches per layer and step, every step's rows in
    per-step buffers;
  - ``nn fused``: :meth:`harness.nn.MLP.forward_step`, one tile kernel per step;
  - ``nn split``: the same tile code launched once per layer (one kernel per layer, the hidden
    rows kept in per-step buffers): does splitting the fused kernel help?

* **batched** (a critic on a minibatch): 2048 rows, 5 -> 64 -> 64 -> 1, ELU and LayerNorm, loss
  ``sum (y - target)^2``. Variants: ``nn fused`` (:meth:`~harness.nn.MLP.forward`), ``nn fused,
  gathered`` (the rows through an index array, a shuffled minibatch), ``nn split`` and, when
  torch is importable, the same ``torch.nn.Sequential`` on the CPU.

Each variant is timed eagerly (forward and backward separately) and as one captured graph
(``wp.ScopedCapture``; on the CPU Warp replays it in C++, as ``harness train`` runs every
iteration), medians of ``--repeats`` after a warm-up that compiles. Gradients are compared
with the first variant's (max |g - g_ref| / max |g_ref| over the parameters). ``--sweep`` also
times the fused kernels at 8, 16, 32 and 64 rows per block (the choice of ``MAX_TILE_ROWS``).

Run::

    .venv/bin/python scripts/bench_nn.py [--horizon 240] [--worlds 32] [--rows 2048] [--repeats 5] [--sweep]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import warp as wp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness.nn import CPU_TILE_ARENA, MLP, _kernel, _offset_type
from harness.params import ParamSet

# -- the baseline: the per-unit kernels of harness/tasks/policy.py (commit 5d6a191) -------------
# Reproduced here because that module is moving to a tile MLP: the baseline stays measurable.


@wp.kernel
def _linear(
    x: wp.array3d(dtype=wp.float32),
    t: int,
    weight: wp.array2d(dtype=wp.float32),
    bias: wp.array(dtype=wp.float32),
    z: wp.array3d(dtype=wp.float32),
):
    """``z[t, w, j] = bias[j] + sum_i weight[j, i] x[t, w, i]``."""
    world, j = wp.tid()
    s = bias[j]
    for i in range(weight.shape[1]):
        s += weight[j, i] * x[t, world, i]
    z[t, world, j] = s


@wp.kernel
def _activation(z: wp.array3d(dtype=wp.float32), t: int, scale: float, y: wp.array3d(dtype=wp.float32)):
    """``y[t, w, j] = scale * tanh(z[t, w, j])`` (the policy's tanh case)."""
    world, j = wp.tid()
    y[t, world, j] = scale * wp.tanh(z[t, world, j])


# -- device code of the stand-ins --------------------------------------------------------------


@wp.kernel
def _sim_step(x: wp.array3d(dtype=wp.float32), t: int, y: wp.array3d(dtype=wp.float32)):
    """``x[t+1, w, i] = x[t, w, i] + 0.01 * y[t, w, 0]``."""
    w, i = wp.tid()
    x[t + 1, w, i] = x[t, w, i] + 0.01 * y[t, w, 0]


@wp.kernel
def _square_sum(y: wp.array3d(dtype=wp.float32), loss: wp.array(dtype=wp.float32)):
    t, w = wp.tid()
    wp.atomic_add(loss, 0, y[t, w, 0] * y[t, w, 0])


@wp.kernel
def _squared_error(
    y: wp.array2d(dtype=wp.float32), target: wp.array(dtype=wp.float32), loss: wp.array(dtype=wp.float32)
):
    i = wp.tid()
    d = y[i, 0] - target[i]
    wp.atomic_add(loss, 0, d * d)


# -- per-layer launches of the fused code (the "split" variants) -------------------------------


def split_layers(mlp: MLP, params: ParamSet) -> list[tuple]:
    """One (kernel code, offsets) pair per layer: each layer is its own one-layer tile kernel."""
    where = {seg.name: seg.offset for seg in params.segments}
    found = []
    for layer in mlp.layers:
        names = [f"{layer.name}.{k}" for k in ("weight", "bias", "norm.weight", "norm.bias")]
        offsets = _offset_type(1)(*[where.get(n, 0) for n in names])
        found.append((layer.key, offsets))
    return found


def launch_split(mlp: MLP, params: ParamSet, layers: list[tuple], xs: list[wp.array], rows_per_block: int) -> None:
    """``xs[k + 1] = layer_k(xs[k])`` for every layer, one launch each."""
    rows = xs[0].shape[0]
    for (code, offsets), x, y in zip(layers, xs[:-1], xs[1:], strict=True):
        kernel = _kernel((code,), rows_per_block, False, mlp.norm_eps)
        wp.launch_tiled(kernel, dim=(-(-rows // rows_per_block),), inputs=[params.data, offsets, x, None],
                        outputs=[y], block_dim=1 if params.device.is_cpu else 64, device=params.device)  # fmt: skip


# -- the per-step shape -------------------------------------------------------------------------

OBS = 6


class PerStep:
    """The closed loop over ``horizon`` steps; ``kind``: ``policy``, ``fused`` or ``split``."""

    def __init__(self, kind: str, mlp: MLP, params: ParamSet, x0: np.ndarray, horizon: int, rows_per_block=None):
        self.name = {"policy": "policy kernels", "fused": "nn fused", "split": "nn split"}[kind]
        if rows_per_block:
            self.name += f" ({rows_per_block} rows/block)"
        self.kind, self.mlp, self.params, self.horizon = kind, mlp, params, horizon
        worlds = x0.shape[0]
        self.rows_per_block = rows_per_block or mlp.tile_width(worlds, params.device)
        self.x0 = x0
        zeros = lambda *shape: wp.zeros(shape, dtype=wp.float32, requires_grad=True)  # noqa: E731
        self.x = zeros(horizon + 1, worlds, OBS)
        self.y = zeros(horizon, worlds, 1)
        self.loss = zeros(1)
        self.hidden = [zeros(horizon, worlds, w) for w in mlp.widths[1:-1]]
        self.pre = [zeros(horizon, worlds, w) for w in mlp.widths[1:]]  # policy kernels only
        self.layers = split_layers(mlp, params)
        self.scratch = [self.x, self.y, self.loss, *self.hidden, *self.pre]

    def zero(self) -> None:
        self.params.zero_grad()
        for a in self.scratch:
            a.grad.zero_()
        self.loss.zero_()
        wp.copy(self.x, self.x0_device, count=self.x0_device.size)

    def prepare(self) -> None:
        self.x0_device = wp.array(self.x0.reshape(-1), dtype=wp.float32)

    def record(self, tape: wp.Tape) -> None:
        worlds = self.x.shape[1]
        with tape:
            for t in range(self.horizon):
                if self.kind == "fused":
                    self.mlp.forward_step(self.params, self.x, t, self.y, tile_width=self.rows_per_block)
                elif self.kind == "split":
                    xs = [self.x[t], *(h[t] for h in self.hidden), self.y[t]]
                    launch_split(self.mlp, self.params, self.layers, xs, self.rows_per_block)
                else:
                    layers = [self.x, *self.hidden, self.y]
                    for k, layer in enumerate(self.mlp.layers):
                        dim = (worlds, layer.fan_out)
                        wp.launch(_linear, dim=dim, inputs=[layers[k], t, self.params[f"{layer.name}.weight"],
                                  self.params[f"{layer.name}.bias"]], outputs=[self.pre[k]])  # fmt: skip
                        wp.launch(_activation, dim=dim, inputs=[self.pre[k], t, 1.0],
                                  outputs=[layers[k + 1]])  # fmt: skip
                wp.launch(_sim_step, dim=(worlds, OBS), inputs=[self.x, t, self.y])
            wp.launch(_square_sum, dim=(self.horizon, worlds), inputs=[self.y], outputs=[self.loss])


# -- the batched shape --------------------------------------------------------------------------


class Batched:
    """The critic's minibatch; ``kind``: ``fused``, ``gathered`` or ``split``."""

    def __init__(self, kind: str, mlp: MLP, params: ParamSet, x: np.ndarray, target: np.ndarray, rows_per_block=None):
        self.name = {"fused": "nn fused", "gathered": "nn fused, gathered", "split": "nn split"}[kind]
        if rows_per_block:
            self.name += f" ({rows_per_block} rows/block)"
        rows = x.shape[0]
        self.kind, self.mlp, self.params = kind, mlp, params
        self.rows_per_block = rows_per_block or mlp.tile_width(rows, params.device, gather=kind == "gathered")
        zeros = lambda *shape: wp.zeros(shape, dtype=wp.float32, requires_grad=True)  # noqa: E731
        # gathered: the same rows stored shuffled, read back in order through the permutation
        order = np.random.default_rng(1).permutation(rows)
        stored = np.empty_like(x)
        stored[order] = x
        self.x = wp.array(stored if kind == "gathered" else x, dtype=wp.float32, requires_grad=True)
        self.indices = wp.array(order.astype(np.int32), dtype=wp.int32)
        self.target = wp.array(target, dtype=wp.float32)
        self.y = zeros(rows, 1)
        self.hidden = [zeros(rows, w) for w in mlp.widths[1:-1]]
        self.loss = zeros(1)
        self.layers = split_layers(mlp, params)

    def prepare(self) -> None:
        pass

    def zero(self) -> None:
        self.params.zero_grad()
        for a in (self.x, self.y, self.loss, *self.hidden):
            a.grad.zero_()
        self.loss.zero_()

    def record(self, tape: wp.Tape) -> None:
        with tape:
            if self.kind == "split":
                launch_split(self.mlp, self.params, self.layers, [self.x, *self.hidden, self.y], self.rows_per_block)
            else:
                indices = self.indices if self.kind == "gathered" else None
                self.mlp.forward(self.params, self.x, self.y, indices=indices, tile_width=self.rows_per_block)
            wp.launch(_squared_error, dim=self.y.shape[0], inputs=[self.y, self.target], outputs=[self.loss])


class Torch:
    """The same network as a ``torch.nn.Sequential`` on the CPU (its default threads)."""

    def __init__(self, torch, mlp: MLP, params: ParamSet, x: np.ndarray, target: np.ndarray):
        self.name = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
        self.torch = torch
        values = params.numpy()
        modules = []
        for layer in mlp.layers:
            linear = torch.nn.Linear(layer.fan_in, layer.fan_out)
            linear.weight.data = torch.tensor(values[f"{layer.name}.weight"])
            linear.bias.data = torch.tensor(values[f"{layer.name}.bias"])
            modules.append(linear)
            if layer.activation == "elu":
                modules.append(torch.nn.ELU())
            if layer.norm:
                norm = torch.nn.LayerNorm(layer.fan_out, eps=mlp.norm_eps)
                norm.weight.data = torch.tensor(values[f"{layer.name}.norm.weight"])
                norm.bias.data = torch.tensor(values[f"{layer.name}.norm.bias"])
                modules.append(norm)
        self.net = torch.nn.Sequential(*modules)
        self.names = [n for n in mlp.shapes()]
        self.x = torch.tensor(x, requires_grad=True)
        self.target = torch.tensor(target)

    def step(self) -> tuple[float, float, dict]:
        torch = self.torch
        self.net.zero_grad()
        self.x.grad = None
        t0 = time.perf_counter()
        loss = ((self.net(self.x)[:, 0] - self.target) ** 2).sum()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        with torch.no_grad():
            grads = [p.grad.numpy().reshape(-1).copy() for p in self.net.parameters()]
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, dict(zip(self.names, grads, strict=True))


# -- measurement --------------------------------------------------------------------------------


def measure(variant, repeats: int) -> tuple[float, float, float, dict]:
    """Median eager forward and backward ms, median captured-graph ms (forward + backward), and
    the parameter gradients of the last eager pass."""
    variant.prepare()
    tape = wp.Tape()
    fwd, bwd = [], []
    for r in range(repeats + 1):
        variant.zero()
        wp.synchronize()
        t0 = time.perf_counter()
        variant.record(tape)
        wp.synchronize()
        t1 = time.perf_counter()
        tape.backward(variant.loss)
        wp.synchronize()
        t2 = time.perf_counter()
        if r:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
        grads = {k: v.reshape(-1).copy() for k, v in variant.params.grad_numpy().items()}
        tape.reset()
    graph_ms = float("nan")
    if wp.get_device().is_cpu or wp.get_device().is_capturable:
        with wp.ScopedCapture() as capture:
            variant.zero()
            variant.record(tape)
            tape.backward(variant.loss)
        replay = []
        for r in range(repeats + 1):
            wp.synchronize()
            t0 = time.perf_counter()
            wp.capture_launch(capture.graph)
            wp.synchronize()
            if r:
                replay.append((time.perf_counter() - t0) * 1e3)
        graph_ms = statistics.median(replay)
        tape.reset()
    return statistics.median(fwd), statistics.median(bwd), graph_ms, grads


def fitting(mlp: MLP, rows: int) -> list[int]:
    """The sweep's rows per block other than the rule's choice, those that fit the tile memory."""
    budget = CPU_TILE_ARENA if wp.get_device().is_cpu else wp.get_device().max_shared_memory_per_block
    chosen = mlp.tile_width(rows)
    return [p for p in (8, 16, 32, 64) if p != chosen and p <= rows and mlp.shared_bytes(p)[1] <= budget]


def speedups(label: str, rows: list[tuple], base: int, other: int) -> None:
    """One line: how many times faster row ``other`` is than row ``base``, eager and captured."""
    eager = (rows[base][1] + rows[base][2]) / (rows[other][1] + rows[other][2])
    graph = rows[base][3] / rows[other][3]
    print(f"{label}: {rows[other][0]} vs {rows[base][0]}: {eager:.2f}x eager, {graph:.2f}x captured")


def rel_diff(grads: dict, ref: dict) -> float:
    return max(float(np.max(np.abs(grads[k] - ref[k])) / max(np.max(np.abs(ref[k])), 1e-30)) for k in ref)


def table(title: str, rows: list[tuple]) -> None:
    base = rows[0]
    header = (
        f"{'variant':<36}{'fwd ms':>9}{'bwd ms':>9}{'total ms':>10}{'vs first':>10}"
        f"{'graph ms':>10}{'vs first':>10}{'grad rel':>10}"
    )
    print(f"\n{title}\n{header}\n{'-' * len(header)}")
    for name, fwd, bwd, graph, drel in rows:
        total = fwd + bwd
        ratio = total / (base[1] + base[2])
        gratio = graph / base[3] if base[3] == base[3] else float("nan")
        print(f"{name:<36}{fwd:>9.1f}{bwd:>9.1f}{total:>10.1f}{ratio:>10.3f}{graph:>10.1f}{gratio:>10.3f}{drel:>10.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horizon", type=int, default=240)
    parser.add_argument("--worlds", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rows", type=int, default=2048, help="rows of the batched (critic) shape")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sweep", action="store_true", help="also time 8, 16, 32, 64 rows per block")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    wp.config.quiet = True
    wp.init()
    wp.set_device(args.device)
    print(f"warp {wp.config.version}, device {args.device}, repeats {args.repeats} (medians)")
    rng = np.random.default_rng(0)

    # per step
    actor = MLP(OBS, [args.hidden, args.hidden], 1, activation="tanh", output="tanh")
    params = ParamSet(actor.specs(seed=0))
    x0 = rng.uniform(-1.0, 1.0, (args.worlds, OBS)).astype(np.float32)
    kinds = [("policy", None), ("fused", None), ("split", None)]
    if args.sweep:
        kinds += [("fused", p) for p in fitting(actor, args.worlds)]
    rows, ref = [], None
    for kind, p in kinds:
        v = PerStep(kind, actor, params, x0, args.horizon, p)
        fwd, bwd, graph, grads = measure(v, args.repeats)
        ref = ref or grads
        rows.append((v.name, fwd, bwd, graph, rel_diff(grads, ref)))
    per_step = rows
    table(
        f"per step: {args.horizon} steps x {args.worlds} worlds, {' -> '.join(map(str, actor.widths))} tanh, "
        f"{actor.tile_width(args.worlds)} rows/block",
        rows,
    )

    # batched
    critic = MLP(5, [args.hidden, args.hidden], 1, activation="elu", layer_norm=True, prefix="critic.")
    cparams = ParamSet(critic.specs(seed=1))
    data = rng.normal(size=(args.rows, 5)).astype(np.float32)
    target = rng.normal(size=args.rows).astype(np.float32)
    kinds = [("fused", None), ("gathered", None), ("split", None)]
    if args.sweep:
        kinds += [("fused", p) for p in fitting(critic, args.rows)]
    rows, ref = [], None
    for kind, p in kinds:
        v = Batched(kind, critic, cparams, data, target, p)
        fwd, bwd, graph, grads = measure(v, args.repeats)
        ref = ref or grads
        rows.append((v.name, fwd, bwd, graph, rel_diff(grads, ref)))
    try:
        import torch

        t = Torch(torch, critic, cparams, data, target)
        runs = [t.step() for _ in range(args.repeats + 1)][1:]
        fwd, bwd = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        rows.append((t.name, fwd, bwd, float("nan"), rel_diff(runs[-1][2], ref)))
    except ImportError:
        print("torch not importable: no torch row")
    table(
        f"batched: {args.rows} rows, {' -> '.join(map(str, critic.widths))} ELU + LayerNorm, "
        f"{critic.tile_width(args.rows)} rows/block",
        rows,
    )
    print()
    speedups("per step", per_step, 0, 1)
    speedups("per step", per_step, 2, 1)
    speedups("batched", rows, 2, 0)
    print("\nvs first: time / the first row's; graph: forward + backward replayed as one captured graph")
    print("grad rel: max |g - g_first| / max |g_first| over the parameters")


if __name__ == "__main__":
    main()
