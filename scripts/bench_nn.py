"""Time the MLP of :mod:`harness.nn` (its CPU path and its tile path) against torch and the
policy's old per-unit kernels, and SHAC's iteration part by part.

Four sections (``--sections``, all by default), on the CPU:

* ``torch``: the harness's layers against ``torch.nn.Sequential`` on one thread
  (``torch.set_num_threads(1)``; Warp's CPU kernels run on one thread) at SHAC's shapes: the
  actor (5 -> 64 -> 64 -> 1, ELU and LayerNorm) on one step's 64 rows and the critic (the
  same layers) on one minibatch's 512 rows: forward, backward and one Adam step, each on its
  own, and for the critic the whole minibatch step (forward, squared error, backward;
  :class:`harness.nn.Regression`, one launch on the CPU path). Warp's figures are graph
  replays (as ``harness train`` runs them), torch's eager calls; every figure is the median,
  over ``--repeats`` rounds in which every variant runs in turn, of the calling thread's CPU
  time (``time.thread_time``: what another process on the core does not add) per call.
* ``shac``: one iteration of ``train +env=cartpole_swingup task=shac`` (``--shac-env`` for
  another env) captured whole and in parts: the taped rollout (the simulation, the actor per
  step, the actor's objective with the target critic), its backward, the actor's update, the
  critic's 16 x 4 minibatch updates, and the rest (the TD targets, the target critic, the
  observation statistics, the episode bookkeeping, the history row): whole minus the parts.

and the two comparisons this script began with, forward + backward on one ``wp.Tape``:

* **per step** (a policy inside a rollout): an MLP 6 -> 64 -> 64 -> 1 (tanh, tanh output)
  applied at every step of a 240-step, 32-world horizon, the next input depending on the last
  output (``x[t+1] = x[t] + 0.01 * y[t]``, a stand-in for the simulator), loss ``sum y^2``.
  Variants:

  - ``policy kernels``: ``_linear`` and ``_activation`` of ``harness/tasks/policy.py`` as of
    commit 5d6a191 (reproduced here), two launches per layer and step, every step's rows in
    per-step buffers;
  - ``nn fused``: :meth:`harness.nn.MLP.forward_step` on the tile path, one tile kernel per step;
  - ``nn cpu``: the same on the CPU path (one C++ kernel per step, :mod:`harness.nn_cpu`);
  - ``nn split``: the same tile code launched once per layer (one kernel per layer, the hidden
    rows kept in per-step buffers): does splitting the fused kernel help?

* **batched** (a critic on a minibatch): 2048 rows, 5 -> 64 -> 64 -> 1, ELU and LayerNorm, loss
  ``sum (y - target)^2``. Variants: ``nn fused`` (:meth:`~harness.nn.MLP.forward`), ``nn fused,
  gathered`` (the rows through an index array, a shuffled minibatch), ``nn cpu`` (the CPU
  path), ``nn split`` and, when torch is importable, the same ``torch.nn.Sequential`` on the
  CPU (its default threads here).

Each variant is timed eagerly (forward and backward separately) and as one captured graph
(``wp.ScopedCapture``; on the CPU Warp replays it in C++, as ``harness train`` runs every
iteration), medians of ``--repeats`` after a warm-up that compiles. Gradients are compared
with the first variant's (max |g - g_ref| / max |g_ref| over the parameters). ``--sweep`` also
times the fused kernels at 8, 16, 32 and 64 rows per block (the choice of ``MAX_TILE_ROWS``).

Run::

    .venv/bin/python scripts/bench_nn.py [--sections torch shac per_step batched] [--repeats 5] [--sweep]
"""

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import warp as wp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness.nn import CPU_TILE_ARENA, MLP, Regression, _kernel, _offset_type
from harness.optim import adam
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
        self.name = {"policy": "policy kernels", "fused": "nn fused", "cpu": "nn cpu", "split": "nn split"}[kind]
        if rows_per_block:
            self.name += f" ({rows_per_block} rows/block)"
        self.kind, self.mlp, self.params, self.horizon = kind, mlp, params, horizon
        worlds = x0.shape[0]
        self.rows_per_block = rows_per_block or mlp.tile_width(worlds, params.device)
        self.path = "cpu" if kind == "cpu" else "tile"
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
                    self.mlp.forward_step(self.params, self.x, t, self.y, tile_width=self.rows_per_block, path="tile")
                elif self.kind == "cpu":
                    self.mlp.forward_step(self.params, self.x, t, self.y, path="cpu")
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
        self.name = {"fused": "nn fused", "gathered": "nn fused, gathered", "cpu": "nn cpu", "split": "nn split"}[kind]
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
            elif self.kind == "cpu":
                self.mlp.forward(self.params, self.x, self.y, path="cpu")
            else:
                indices = self.indices if self.kind == "gathered" else None
                self.mlp.forward(
                    self.params, self.x, self.y, indices=indices, tile_width=self.rows_per_block, path="tile"
                )
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


# -- the harness's layers against torch -------------------------------------------------------------


def replayed(fn, calls: int) -> Any:
    """A graph of ``calls`` calls of ``fn`` (one eager call first, which compiles)."""
    fn()
    with wp.ScopedCapture() as capture:
        for _ in range(calls):
            fn()
    return capture.graph


def cpu_ms(run, calls: int) -> float:
    """The calling thread's CPU time of ``run()`` per call, in ms."""
    start = time.thread_time()
    run()
    return (time.thread_time() - start) * 1e3 / calls


class HarnessLayers:
    """One shape on one path: forward, backward and an Adam step, each a graph of ``calls`` calls."""

    def __init__(self, mlp: MLP, rows: int, path: str, calls: int, seed: int, regression: bool):
        self.name = f"harness {path} path"
        rng = np.random.default_rng(seed)
        self.params = params = ParamSet(mlp.specs(seed=seed))
        x = wp.array(rng.normal(size=(rows, mlp.inputs)).astype(np.float32))
        y = wp.zeros((rows, mlp.outputs), requires_grad=True)
        loss = wp.zeros(1, requires_grad=True)
        target = wp.array(rng.normal(size=(rows, mlp.outputs)).astype(np.float32))
        weights = wp.array(rng.normal(size=(rows, mlp.outputs)).astype(np.float32))
        optimizer = adam(lr=1e-3, betas=(0.7, 0.95))
        state = optimizer.init(params)
        tape = wp.Tape()
        with tape:
            mlp.forward(params, x, y, path=path)
            wp.launch(_weighted, dim=y.shape, inputs=[y, weights], outputs=[loss])
        self._keep = (tape, x, y, loss)
        self.graphs = {
            "forward": replayed(lambda: mlp.forward(params, x, y, path=path), calls),
            "backward": replayed(lambda: tape.backward(loss), calls),
            "adam": replayed(lambda: optimizer.step(params, params.grad, state), calls),
        }
        if regression:
            fit = Regression(mlp, params, x, target, minibatches=1, path=path)
            losses = wp.zeros(1)
            self.graphs["minibatch step"] = replayed(lambda: fit.step(0, losses), calls)
        self.calls = calls

    def times(self) -> dict[str, float]:
        return {key: cpu_ms(lambda g=graph: wp.capture_launch(g), self.calls) for key, graph in self.graphs.items()}


@wp.kernel
def _weighted(y: wp.array2d(dtype=wp.float32), c: wp.array2d(dtype=wp.float32), loss: wp.array(dtype=wp.float32)):
    i, j = wp.tid()
    wp.atomic_add(loss, 0, c[i, j] * y[i, j])


class TorchLayers:
    """The same shape as ``torch.nn.Sequential`` (Linear, ELU, LayerNorm per hidden layer) on one thread."""

    def __init__(self, torch, mlp: MLP, rows: int, calls: int, seed: int, regression: bool):
        self.name = f"torch {torch.__version__}, 1 thread"
        self.torch, self.calls, self.regression = torch, calls, regression
        rng = np.random.default_rng(seed)
        modules = []
        for layer in mlp.layers:
            modules.append(torch.nn.Linear(layer.fan_in, layer.fan_out))
            if layer.activation == "elu":
                modules.append(torch.nn.ELU())
            if layer.norm:
                modules.append(torch.nn.LayerNorm(layer.fan_out, eps=mlp.norm_eps))
        self.net = torch.nn.Sequential(*modules)
        self.x = torch.tensor(rng.normal(size=(rows, mlp.inputs)).astype(np.float32))
        self.target = torch.tensor(rng.normal(size=(rows, mlp.outputs)).astype(np.float32))
        self.weights = torch.tensor(rng.normal(size=(rows, mlp.outputs)).astype(np.float32))
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=1e-3, betas=(0.7, 0.95))
        self._backward_once()
        self.optimizer.step()  # allocates the moments

    def _backward_once(self) -> None:
        self.net.zero_grad()
        (self.net(self.x) * self.weights).sum().backward()

    def times(self) -> dict[str, float]:
        torch, calls = self.torch, self.calls
        found = {"forward": cpu_ms(lambda: [self.net(self.x) for _ in range(calls)], calls)}
        outs = [(self.net(self.x) * self.weights).sum() for _ in range(calls)]
        found["backward"] = cpu_ms(lambda: [out.backward() for out in outs], calls)
        found["adam"] = cpu_ms(lambda: [self.optimizer.step() for _ in range(calls)], calls)
        if self.regression:

            def steps() -> None:
                for _ in range(calls):
                    self.net.zero_grad()
                    torch.nn.functional.mse_loss(self.net(self.x), self.target).backward()

            found["minibatch step"] = cpu_ms(steps, calls)
        return found


def versus_torch(repeats: int) -> None:
    """The ``torch`` section (module docstring)."""
    try:
        import torch
    except ImportError:
        print("\ntorch not importable: no torch section")
        return
    torch.set_num_threads(1)
    shapes = [("actor, one step", 64, 20, False), ("critic, one minibatch", 512, 5, True)]
    print(f"\nthe harness's layers against torch: CPU ms per call (thread time), medians of {repeats} rounds")
    for title, rows, calls, regression in shapes:
        mlp = MLP(5, [64, 64], 1, activation="elu", layer_norm=True)
        variants = [HarnessLayers(mlp, rows, path, calls, 3, regression) for path in ("cpu", "tile")]
        variants.append(TorchLayers(torch, mlp, rows, calls, 3, regression))
        rounds = [[v.times() for v in variants] for _ in range(repeats)]
        keys = list(rounds[0][0])
        median = [{k: statistics.median(r[i][k] for r in rounds) for k in keys} for i in range(len(variants))]
        print(f"\n{title}: {rows} rows, {' -> '.join(map(str, mlp.widths))} ELU + LayerNorm")
        print(f"{'variant':<30}" + "".join(f"{k:>16}" for k in keys))
        for v, m in zip(variants, median, strict=True):
            print(f"{v.name:<30}" + "".join(f"{m[k]:>16.4f}" for k in keys))
        ratios = "".join(f"{median[0][k] / median[-1][k]:>16.2f}" for k in keys)
        print(f"{'harness cpu / torch':<30}{ratios}")


# -- SHAC's iteration in parts ------------------------------------------------------------------------


def shac_parts(env: str, repeats: int) -> None:
    """The ``shac`` section (module docstring)."""
    from harness import build, config
    from harness.training.loop import TrainSettings
    from harness.training.step import taped_rollout

    overrides = [f"+env={env}", "task=shac", "device=cpu"]
    run = build.build_run(*config.compose_config("train", overrides))
    trainer = run.trainer(TrainSettings(iterations=10, log_every=10, device="cpu"))
    step, task, env_ = trainer.step, trainer.task, trainer.env
    step.run()  # compiles, allocates
    step.run()
    b = task.buffers(env_)
    held: dict[str, Any] = {}

    def rollout() -> None:
        with task.training(step.counter):
            objective = lambda trajectory: task.objective(env_, step.loss, trajectory)  # noqa: E731
            held["tape"], _, held["total"] = taped_rollout(env_, task, step.loss, step.params, objective=objective)

    def rest() -> None:
        """The iteration with the parts above taken out: what SHAC.iterate and the step do besides."""
        step.forward_backward = lambda objective=None: None
        step.apply = lambda name: None
        b.critic_fit.fit = lambda *args: None
        try:
            step.iteration()
        finally:
            for name in ("forward_backward", "apply"):
                delattr(step, name)
            del b.critic_fit.fit

    parts = {
        "whole iteration": step.iteration,
        "rollout (taped) + objective": rollout,
        "its backward": lambda: held["tape"].backward(held["total"]),
        "actor update": lambda: step.apply("actor"),
        "critic updates": lambda: b.critic_fit.fit(task.args.critic_epochs, b.losses, lambda: step.apply("critic")),
        "the rest: TD targets, target critic, statistics, history": rest,
    }
    graphs = {}
    for name, fn in parts.items():
        with wp.ScopedCapture() as capture:
            fn()
        graphs[name] = capture.graph
    rounds = [{name: cpu_ms(lambda g=g: wp.capture_launch(g), 1) for name, g in graphs.items()} for _ in range(repeats)]
    found = {name: statistics.median(r[name] for r in rounds) for name in graphs}
    whole = found.pop("whole iteration")
    a = task.args
    print(
        f"\nSHAC's iteration, +env={env}: {env_.horizon} steps x {env_.world_count} worlds, critic "
        f"{a.critic_epochs} x {a.critic_minibatches} minibatches; CPU ms (thread time), medians of {repeats}"
    )
    for name, ms in found.items():
        print(f"{name:<58}{ms:>10.2f} ms {100 * ms / whole:>6.1f}%")
    print(f"{'sum of the parts, each its own graph':<58}{sum(found.values()):>10.2f} ms")
    print(f"{'whole iteration (one graph)':<58}{whole:>10.2f} ms   ({1e3 / whole:.2f} it/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", default=["torch", "shac", "per_step", "batched"],
                        choices=["torch", "shac", "per_step", "batched"])  # fmt: skip
    parser.add_argument("--shac-env", default="cartpole_swingup", help="the env of the shac section")
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
    print(f"warp {wp.config.version}, device {args.device}, repeats {args.repeats} (medians), load {os.getloadavg()}")
    rng = np.random.default_rng(0)
    if "torch" in args.sections:
        versus_torch(args.repeats)
    if "shac" in args.sections:
        shac_parts(args.shac_env, args.repeats)

    per_step = rows = None
    if "per_step" in args.sections:
        actor = MLP(OBS, [args.hidden, args.hidden], 1, activation="tanh", output="tanh")
        params = ParamSet(actor.specs(seed=0))
        x0 = rng.uniform(-1.0, 1.0, (args.worlds, OBS)).astype(np.float32)
        kinds = [("policy", None), ("fused", None), ("split", None), ("cpu", None)]
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

    if "batched" in args.sections:
        critic = MLP(5, [args.hidden, args.hidden], 1, activation="elu", layer_norm=True, prefix="critic.")
        cparams = ParamSet(critic.specs(seed=1))
        data = rng.normal(size=(args.rows, 5)).astype(np.float32)
        target = rng.normal(size=args.rows).astype(np.float32)
        kinds = [("fused", None), ("gathered", None), ("split", None), ("cpu", None)]
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
    if per_step is not None:
        speedups("per step", per_step, 0, 1)
        speedups("per step", per_step, 2, 1)
        speedups("per step", per_step, 1, 3)
    if rows is not None and "batched" in args.sections:
        speedups("batched", rows, 2, 0)
        speedups("batched", rows, 0, 3)
    if per_step is not None or "batched" in args.sections:
        print("\nvs first: time / the first row's; graph: forward + backward replayed as one captured graph")
        print("grad rel: max |g - g_first| / max |g_first| over the parameters")
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
