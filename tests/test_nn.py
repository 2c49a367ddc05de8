"""harness.nn: both code paths of the MLP (the fused tile kernel and the CPU's C++ kernel)
against a float64 numpy reference, central differences, torch, each other, and a captured
graph; nn.Regression's minibatch steps on both paths.

Tolerance. Warp computes in float32 (unit roundoff ``u = 2^-24``); the reference and the
central differences run in float64. A dot product of length ``n`` carries a relative error of
at most ``gamma_n ~ n u`` of the sum of its terms' magnitudes (Higham, "Accuracy and Stability
of Numerical Algorithms", 2nd ed., section 3.1); activations and LayerNorm add a few ``u``
each, and the errors of ``L`` layers add up (each layer's map is O(1)-Lipschitz at these
weights). Backward is the same kind of computation (the transposed products, same lengths).
So outputs and gradients carry about ``L n u`` relative to their scale; :func:`tolerance`
allows 32 times that (9.2e-5 for the 5 -> 16 -> 12 -> 3 network here) for the constants of
the bound (the sum of magnitudes over the magnitude of the sum). Central differences on the
float64 reference with step ``h = 1e-6`` err by ``h^2 |f'''| / 6 ~ 1e-13`` (truncation) and
``eps_64 |f| / h ~ 1e-10`` (rounding), negligible beside it. ReLU's kink is kept more than
``100 h`` from every pre-activation (asserted): a perturbation moves a pre-activation by at
most about ``10 h`` here (inputs and weights of order 1) and float32 puts it within ``1e-6``
of the float64 value, so neither side of a comparison crosses the kink. Measured errors:
median 2e-7, worst 2.3e-6 (40 times below the tolerance); a wrong gradient term is off by
O(1), four orders above it.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import warp as wp

from harness import nn_cpu
from harness.nn import CPU_TILE_ARENA, MLP, Regression
from harness.params import ParamSet, ParamSpec

U = 2.0**-24
FD_STEP = 1.0e-6
IN, HIDDEN, OUT = 5, (16, 12), 3
ROWS = 21  # not a multiple of WIDTH: three blocks, the last with 5 rows
WIDTH = 8  # rows per block in the gradient tests (all share one kernel per configuration)
STEPS = 3

CONFIGS = {
    "tanh": dict(activation="tanh", layer_norm=False, output="tanh", output_scale=2.0),
    "tanh+norm": dict(activation="tanh", layer_norm=True, output="identity"),
    "elu": dict(activation="elu", layer_norm=False, output="identity"),
    "elu+norm": dict(activation="elu", layer_norm=True, output="tanh", output_scale=1.5),
    "relu": dict(activation="relu", layer_norm=False, output="tanh"),
    "relu+norm": dict(activation="relu", layer_norm=True, output="identity"),
}
GATHERED = ("tanh", "elu+norm", "relu+norm")
PATHS = ("tile", "cpu")


def path_args(path: str) -> dict:
    """How a test calls a path: the tile kernel in blocks of WIDTH rows (several blocks, the last
    one padded), or a C++ kernel: the CPU's (its blocks are BLOCK_ROWS = 32 rows) or the rows
    path's (tests/test_nn_rows.py)."""
    return {"tile_width": WIDTH, "path": "tile"} if path == "tile" else {"path": path}


def tolerance(mlp: MLP) -> float:
    """Relative to the scale of what is compared (module docstring)."""
    return 32 * len(mlp.layers) * max(mlp.widths) * U


# -- the float64 reference ------------------------------------------------------------------------

ACTIVATIONS = {
    "tanh": np.tanh,
    "elu": lambda z: np.where(z > 0.0, z, np.expm1(np.minimum(z, 0.0))),
    "relu": lambda z: np.maximum(z, 0.0),
}


def reference(values: dict, x: np.ndarray, config: dict, prefix: str = "", eps: float = 1.0e-5) -> tuple:
    """The MLP of ``config`` in float64: (output, the hidden layers' pre-activations)."""
    h, pre = x, []
    names = [f"l{k + 1}" for k in range(len(HIDDEN))] + ["out"]
    for name in names:
        z = h @ values[f"{prefix}{name}.weight"].T + values[f"{prefix}{name}.bias"]
        if name == "out":
            h = config.get("output_scale", 1.0) * np.tanh(z) if config["output"] == "tanh" else z
            continue
        pre.append(z)
        h = ACTIVATIONS[config["activation"]](z)
        if config["layer_norm"]:
            centred = h - h.mean(axis=-1, keepdims=True)
            h = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps)
            h = h * values[f"{prefix}{name}.norm.weight"] + values[f"{prefix}{name}.norm.bias"]
    return h, pre


def central_differences(loss, point: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """d loss / d every entry of ``point`` (float64 arrays, perturbed in place and restored)."""
    grads = {}
    for name, value in point.items():
        grad = np.zeros_like(value)
        for j in np.ndindex(value.shape):
            saved = value[j]
            value[j] = saved + FD_STEP
            up = loss()
            value[j] = saved - FD_STEP
            down = loss()
            value[j] = saved
            grad[j] = (up - down) / (2.0 * FD_STEP)
        grads[name] = grad
    return grads


def assert_close(actual: dict, expected: dict, tol: float) -> None:
    for name, want in expected.items():
        scale = np.max(np.abs(want))
        assert scale > 0.0, name
        err = np.max(np.abs(actual[name] - want)) / scale
        assert err <= tol, f"{name}: max |warp - reference| / max |reference| = {err:.2e} > {tol:.2e}"


def kink_free(config: dict, draw, pre_activations, seed: int) -> tuple:
    """``draw(rng)`` for the first of 50 seeds from ``seed`` whose hidden pre-activations
    (``pre_activations(drawn)``) all lie more than ``100 h`` from ReLU's kink (module docstring);
    the first draw for the other activations."""
    for k in range(50):
        drawn = draw(np.random.default_rng(seed + k))
        if config["activation"] != "relu" or min(np.abs(z).min() for z in pre_activations(drawn)) > 100 * FD_STEP:
            return drawn
    raise AssertionError("no draw keeps ReLU's kink clear of the finite differences")


# -- setup ------------------------------------------------------------------------------------------


def build(config: dict, seed: int = 0, prefix: str = "net.") -> tuple[MLP, ParamSet]:
    """The MLP between two unrelated parameters (its offsets are not 0), every entry perturbed
    (LayerNorm's gains and shifts away from 1 and 0)."""
    mlp = MLP(IN, HIDDEN, OUT, prefix=prefix, **config)
    specs = [ParamSpec("before", (2,)), *mlp.specs(seed=seed), ParamSpec("after", (3,))]
    params = ParamSet(specs, device="cpu")
    rng = np.random.default_rng(seed + 100)
    data = params.data.numpy()
    params.data.assign(data + rng.normal(scale=0.2, size=data.shape).astype(np.float32))
    return mlp, params


def values64(params: ParamSet, mlp: MLP) -> dict[str, np.ndarray]:
    found = params.numpy()
    return {name: found[name].astype(np.float64) for name in mlp.shapes()}


@wp.kernel
def _feedback(x: wp.array3d(dtype=float), t: int, y: wp.array3d(dtype=float), mix: wp.array2d(dtype=float)):
    """The closed loop's stand-in simulator: ``x[t+1] = x[t] + y[t] @ mix``."""
    w, i = wp.tid()
    s = x[t, w, i]
    for j in range(OUT):
        s += y[t, w, j] * mix[j, i]
    x[t + 1, w, i] = s


@wp.kernel
def _weighted_sum3(y: wp.array3d(dtype=float), c: wp.array3d(dtype=float), loss: wp.array(dtype=float)):
    t, w, j = wp.tid()
    wp.atomic_add(loss, 0, c[t, w, j] * y[t, w, j])


@wp.kernel
def _weighted_sum2(y: wp.array2d(dtype=float), c: wp.array2d(dtype=float), loss: wp.array(dtype=float)):
    i, j = wp.tid()
    wp.atomic_add(loss, 0, c[i, j] * y[i, j])


def grads_of(params: ParamSet, mlp: MLP) -> dict[str, np.ndarray]:
    found = params.grad_numpy()
    assert not found["before"].any() and not found["after"].any()  # nothing outside the MLP's own entries
    return {name: found[name] for name in mlp.shapes()}


def warp_shared_bytes(mlp: MLP, width: int, gather: bool) -> tuple[int, int]:
    """The tile memory Warp recorded for the compiled kernel (what it sizes CUDA launches with)."""
    (meta,) = [e.meta for e in mlp._kernel(width, gather).module.execs.values()]  # Warp's internals
    forward = next(v for k, v in meta.items() if k.endswith("forward_smem_bytes"))
    backward = next(v for k, v in meta.items() if k.endswith("backward_smem_bytes"))
    return forward, backward


def as64(found: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One path's results as the expected values of another's (float64)."""
    return {key: value.astype(np.float64) for key, value in found.items()}


def rollout_inputs(rng: np.random.Generator, rows: int = ROWS) -> tuple:
    """A closed loop's initial states (float32 values), its mixing matrix and the loss's weights."""
    x0 = rng.normal(size=(rows, IN)).astype(np.float32).astype(np.float64)
    return x0, rng.normal(scale=0.3, size=(OUT, IN)), rng.normal(size=(STEPS, rows, OUT))


def reference_rollout(point: dict, config: dict, x0: np.ndarray, mix: np.ndarray) -> tuple:
    """The closed loop of :func:`run_rollout` in float64: (the outputs of every step, the hidden
    pre-activations of every step)."""
    state, ys, pre = x0, [], []
    for _ in range(STEPS):
        out, z = reference(point, state, config, prefix="net.")
        ys.append(out)
        pre += z
        state = state + out @ mix
    return np.stack(ys), pre


def run_rollout(mlp: MLP, params: ParamSet, x0: np.ndarray, mix: np.ndarray, c: np.ndarray, **call) -> tuple:
    """``forward_step`` (with the keywords ``call``) in a closed loop over STEPS steps on one tape
    (each step's input depends on the last output), then backward from ``sum(c * y)``: the
    states ``x`` and outputs ``y``."""
    x = wp.zeros((STEPS + 1, *x0.shape), dtype=float, requires_grad=True)
    x[0].assign(x0)
    y = wp.zeros(c.shape, dtype=float, requires_grad=True)
    loss = wp.zeros(1, dtype=float, requires_grad=True)
    mix_w, c_w = wp.array(mix, dtype=float), wp.array(c, dtype=float)
    tape = wp.Tape()
    with tape:
        for t in range(STEPS):
            mlp.forward_step(params, x, t, y, **call)
            wp.launch(_feedback, dim=x0.shape, inputs=[x, t, y, mix_w])
        wp.launch(_weighted_sum3, dim=y.shape, inputs=[y, c_w], outputs=[loss])
    tape.backward(loss)
    return x, y


def run_forward(mlp: MLP, params: ParamSet, data: np.ndarray, c: np.ndarray, picked=None, **call) -> tuple:
    """``mlp.forward`` (with the keywords ``call``) of the rows of ``data`` (gathered by
    ``picked``) on one tape, then backward from ``sum(c * y)``: the inputs ``x`` and outputs
    ``y``."""
    x = wp.array(data, dtype=float, requires_grad=True)
    y = wp.zeros(c.shape, dtype=float, requires_grad=True)
    loss = wp.zeros(1, dtype=float, requires_grad=True)
    indices = None if picked is None else wp.array(picked, dtype=wp.int32)
    tape = wp.Tape()
    with tape:
        mlp.forward(params, x, y, indices=indices, **call)
        wp.launch(_weighted_sum2, dim=y.shape, inputs=[y, wp.array(c, dtype=float)], outputs=[loss])
    tape.backward(loss)
    return x, y


# -- gradients ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CONFIGS)
def test_per_step_rollout_gradients(name, path):
    """A closed loop over STEPS steps on one tape (each step's input depends on the last output):
    forward and the gradients w.r.t. the initial state and every parameter."""
    config = CONFIGS[name]
    mlp, params = build(config, seed=1)
    point = values64(params, mlp)
    x0, mix, c = kink_free(config, rollout_inputs, lambda d: reference_rollout(point, config, d[0], d[1])[1], seed=2)
    x, y = run_rollout(mlp, params, x0, mix, c, **path_args(path))
    if path == "tile":
        assert warp_shared_bytes(mlp, WIDTH, False) == mlp.shared_bytes(WIDTH)

    tol = tolerance(mlp)
    assert_close({"y": y.numpy()}, {"y": reference_rollout(point, config, x0, mix)[0]}, tol)
    point["x0"] = x0
    expected = central_differences(
        lambda: float(np.sum(c * reference_rollout(point, config, point["x0"], mix)[0])), point
    )
    assert_close({**grads_of(params, mlp), "x0": x.grad.numpy()[0]}, expected, tol)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CONFIGS)
def test_batched_gradients(name, path):
    config = CONFIGS[name]
    mlp, params = build(config, seed=3)
    point = values64(params, mlp)

    def draw(rng):
        return rng.normal(size=(ROWS, IN)).astype(np.float32).astype(np.float64), rng.normal(size=(ROWS, OUT))

    xs, c = kink_free(config, draw, lambda d: reference(point, d[0], config, "net.")[1], seed=4)
    x, y = run_forward(mlp, params, xs, c, **path_args(path))

    tol = tolerance(mlp)
    assert_close({"y": y.numpy()}, {"y": reference(point, xs, config, "net.")[0]}, tol)
    point["x"] = xs
    expected = central_differences(lambda: float(np.sum(c * reference(point, point["x"], config, "net.")[0])), point)
    assert_close({**grads_of(params, mlp), "x": x.grad.numpy()}, expected, tol)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", GATHERED)
def test_gathered_gradients(name, path):
    """Rows gathered from a stored dataset: repeated rows (their gradients add up), unused
    rows (zero gradient), the last stored row."""
    config = CONFIGS[name]
    mlp, params = build(config, seed=5)
    point = values64(params, mlp)
    stored = 30

    def draw(rng):
        data = rng.normal(size=(stored, IN)).astype(np.float32).astype(np.float64)
        picked = rng.integers(0, stored - 10, size=ROWS).astype(np.int32)  # rows 20..28 unused
        picked[:3] = [7, 7, stored - 1]
        return data, picked, rng.normal(size=(ROWS, OUT))

    data, picked, c = kink_free(config, draw, lambda d: reference(point, d[0][d[1]], config, "net.")[1], seed=6)
    x, y = run_forward(mlp, params, data, c, picked, **path_args(path))
    if path == "tile":
        assert warp_shared_bytes(mlp, WIDTH, True) == mlp.shared_bytes(WIDTH, gather=True)

    tol = tolerance(mlp)
    assert_close({"y": y.numpy()}, {"y": reference(point, data[picked], config, "net.")[0]}, tol)
    point["x"] = data
    expected = central_differences(
        lambda: float(np.sum(c * reference(point, point["x"][picked], config, "net.")[0])), point
    )
    grads = {**grads_of(params, mlp), "x": x.grad.numpy()}
    assert not grads["x"][20 : stored - 1].any()
    assert_close(grads, expected, tol)


# -- torch ----------------------------------------------------------------------------------------


def torch_sequential(torch, mlp: MLP, params: ParamSet, config: dict):
    """``torch.nn.Sequential`` of the same layers and weights, float64."""
    values = params.numpy()
    modules = []
    for layer in mlp.layers:
        linear = torch.nn.Linear(layer.fan_in, layer.fan_out, dtype=torch.float64)
        linear.weight.data = torch.tensor(values[f"{layer.name}.weight"], dtype=torch.float64)
        linear.bias.data = torch.tensor(values[f"{layer.name}.bias"], dtype=torch.float64)
        modules.append(linear)
        if layer.name.endswith(".out"):
            if config["output"] == "tanh":
                assert config.get("output_scale", 1.0) == 1.0  # Sequential has no scale module
                modules.append(torch.nn.Tanh())
            continue
        modules.append({"tanh": torch.nn.Tanh, "elu": torch.nn.ELU, "relu": torch.nn.ReLU}[config["activation"]]())
        if config["layer_norm"]:
            norm = torch.nn.LayerNorm(layer.fan_out, eps=mlp.norm_eps, dtype=torch.float64)
            norm.weight.data = torch.tensor(values[f"{layer.name}.norm.weight"], dtype=torch.float64)
            norm.bias.data = torch.tensor(values[f"{layer.name}.norm.bias"], dtype=torch.float64)
            modules.append(norm)
    return torch.nn.Sequential(*modules), [name for layer in mlp.layers for name in layer.parameter_names]


@pytest.mark.parametrize(
    ("name", "rows", "width", "path"),
    [("elu+norm", 37, None, "tile"), ("elu+norm", 37, None, "cpu"), ("relu", ROWS, WIDTH, "tile")],
)
def test_matches_torch(name, rows, width, path):
    """Forward and gradients against ``torch.nn.Sequential`` (float64) with the same weights.
    SHAC's critic shape (ELU, LayerNorm) over 37 rows at the default tile width (32: two
    blocks, the second with 5 rows) and on the CPU path (blocks of 32 too); ReLU without
    LayerNorm in blocks of 8."""
    torch = pytest.importorskip("torch")
    config = {key: value for key, value in CONFIGS[name].items() if key != "output_scale"}
    if name == "elu+norm":
        config["output"] = "identity"  # SHAC's critic
    mlp, params = build(config, seed=7)
    if width is None:
        assert mlp.tile_width(rows) == 32 == nn_cpu.BLOCK_ROWS
    rng = np.random.default_rng(8)
    xs = rng.normal(size=(rows, IN)).astype(np.float32)
    c = rng.normal(size=(rows, OUT))
    x = wp.array(xs, dtype=float, requires_grad=True)
    y = wp.zeros((rows, OUT), dtype=float, requires_grad=True)
    loss = wp.zeros(1, dtype=float, requires_grad=True)
    tape = wp.Tape()
    with tape:
        mlp.forward(params, x, y, tile_width=width, path=path)
        wp.launch(_weighted_sum2, dim=y.shape, inputs=[y, wp.array(c, dtype=float)], outputs=[loss])
    tape.backward(loss)

    net, names = torch_sequential(torch, mlp, params, config)
    tx = torch.tensor(xs, dtype=torch.float64, requires_grad=True)
    ty = net(tx)
    (ty * torch.tensor(c)).sum().backward()
    # the numpy reference means what torch means
    out, _ = reference(values64(params, mlp), xs.astype(np.float64), config, prefix="net.", eps=mlp.norm_eps)
    np.testing.assert_allclose(ty.detach().numpy(), out, rtol=1e-12, atol=1e-12)
    tol = tolerance(mlp)
    assert_close({"y": y.numpy()}, {"y": ty.detach().numpy()}, tol)
    expected = {n: p.grad.numpy() for n, p in zip(names, net.parameters(), strict=True)}
    assert_close({**grads_of(params, mlp), "x": x.grad.numpy()}, {**expected, "x": tx.grad.numpy()}, tol)


# -- capture --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_captured_graph_is_bit_identical(path):
    """An actor applied per step inside a closed loop and a critic gathering rows of the
    rollout's states, two MLPs in one ParamSet, recorded with ``wp.ScopedCapture`` and replayed
    at two parameter points: outputs and gradients bit for bit those of eager runs."""
    captured_graph_matches_eager(ROWS, **path_args(path))


def captured_graph_matches_eager(rows: int, **call) -> None:
    """:func:`test_captured_graph_is_bit_identical` over ``rows`` rows, the MLPs called with the
    keywords ``call``."""
    actor = MLP(IN, HIDDEN, OUT, prefix="actor.", **CONFIGS["elu+norm"])
    critic = MLP(IN, HIDDEN, OUT, prefix="critic.", **CONFIGS["relu+norm"])
    params = ParamSet([*actor.specs(seed=0), ParamSpec("log_std", (OUT,)), *critic.specs(seed=1)], device="cpu")
    rng = np.random.default_rng(9)
    p0 = params.data.numpy() + rng.normal(scale=0.2, size=params.size).astype(np.float32)
    p1 = p0 + rng.normal(scale=0.1, size=params.size).astype(np.float32)
    x0 = wp.array(rng.normal(size=(rows, IN)).astype(np.float32), dtype=float)
    mix = wp.array(rng.normal(scale=0.3, size=(OUT, IN)), dtype=float)
    c = wp.array(rng.normal(size=(STEPS, rows, OUT)), dtype=float)
    stored = (STEPS + 1) * rows
    picked = wp.array(rng.integers(0, stored, size=rows).astype(np.int32), dtype=wp.int32)
    cv = wp.array(rng.normal(size=(rows, OUT)), dtype=float)
    x = wp.zeros((STEPS + 1, rows, IN), dtype=float, requires_grad=True)
    y = wp.zeros((STEPS, rows, OUT), dtype=float, requires_grad=True)
    values = wp.zeros((rows, OUT), dtype=float, requires_grad=True)
    loss = wp.zeros(1, dtype=float, requires_grad=True)
    tapes = []

    def iteration():
        params.zero_grad()
        for array in (x, y, values, loss):
            array.grad.zero_()
        loss.zero_()
        wp.copy(x, x0, count=x0.size)
        tape = wp.Tape()
        with tape:
            for t in range(STEPS):
                actor.forward_step(params, x, t, y, **call)
                wp.launch(_feedback, dim=(rows, IN), inputs=[x, t, y, mix])
            wp.launch(_weighted_sum3, dim=y.shape, inputs=[y, c], outputs=[loss])
            critic.forward(params, x.reshape((stored, IN)), values, indices=picked, **call)
            wp.launch(_weighted_sum2, dim=values.shape, inputs=[values, cv], outputs=[loss])
        tape.backward(loss)
        tapes.append(tape)  # a replayed graph reads what its tape holds

    def snapshot():
        arrays = {"x": x, "y": y, "values": values, "loss": loss, "grad": params.grad, "x.grad": x.grad}
        return {key: array.numpy().copy() for key, array in arrays.items()}  # on the CPU .numpy() aliases

    eager = []
    for point in (p0, p1):
        params.data.assign(point)
        iteration()
        eager.append(snapshot())
    with wp.ScopedCapture(device="cpu") as capture:
        iteration()
    for point, expected in ((p1, eager[1]), (p0, eager[0])):
        params.data.assign(point)
        wp.capture_launch(capture.graph)
        for key, value in snapshot().items():
            assert np.array_equal(value, expected[key]), key
    assert not np.array_equal(eager[0]["grad"], eager[1]["grad"])


# -- the two paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_the_cpu_path_agrees_with_the_tile_path(name):
    """The same call on both paths (the CPU runs both): outputs, parameter and input gradients
    to float32 rounding (the paths sum in different orders; module docstring's tolerance), over
    rows that fill one and a half of the CPU path's blocks, gathered with a repeated row."""
    config = CONFIGS[name]
    mlp, params = build(config, seed=12)
    rng = np.random.default_rng(13)
    rows = nn_cpu.BLOCK_ROWS + nn_cpu.BLOCK_ROWS // 2
    data = rng.normal(size=(rows + 4, IN)).astype(np.float32)
    picked = rng.integers(0, rows + 4, size=rows).astype(np.int32)
    picked[:2] = 3
    c = rng.normal(size=(rows, OUT))
    found = {}
    for path in PATHS:
        params.zero_grad()
        x, y = run_forward(mlp, params, data, c, picked, path=path)
        found[path] = {"y": y.numpy(), "x": x.grad.numpy(), **grads_of(params, mlp)}
        assert not y.grad.numpy().any()  # both consume the output's gradient
    assert_close(found["cpu"], as64(found["tile"]), tolerance(mlp))


def regression_setup(rows: int = 3 * nn_cpu.BLOCK_ROWS + 6, seed: int = 14):
    """SHAC's critic shape (ELU, LayerNorm, one output) between two other parameters, a data set
    of ``rows`` rows and targets."""
    config = {**CONFIGS["elu+norm"], "output": "identity", "output_scale": 1.0}
    mlp = MLP(IN, HIDDEN, 1, prefix="net.", **{k: v for k, v in config.items() if k != "output_scale"})
    specs = [ParamSpec("before", (2,)), *mlp.specs(seed=seed), ParamSpec("after", (3,))]
    params = ParamSet(specs, device="cpu")
    rng = np.random.default_rng(seed)
    params.data.assign(params.data.numpy() + rng.normal(scale=0.2, size=params.size).astype(np.float32))
    x = wp.array(rng.normal(size=(rows, IN)).astype(np.float32), dtype=float)
    targets = wp.array(rng.normal(size=(rows, 1)).astype(np.float32), dtype=float)
    return mlp, params, x, targets


def test_a_regression_step_is_the_mean_squared_error_and_its_gradient_on_both_paths():
    """Every minibatch on both paths: the loss is the float64 reference's mean squared error,
    the paths' gradients agree, and the gradient is written, not added: entries outside the
    MLP come out 0 whatever the buffer held."""
    mlp, params, x, targets = regression_setup()
    rows, minibatches = x.shape[0], 3
    batch = rows // minibatches
    point = values64(params, mlp)
    data, wanted = x.numpy().astype(np.float64), targets.numpy().astype(np.float64)
    losses = wp.zeros(1, dtype=float)
    for m in range(minibatches):
        part = slice(m * batch, (m + 1) * batch)
        expected = float(np.mean((reference(point, data[part], CONFIGS["elu+norm"] | {"output": "identity"}, "net.")[0]
                                  - wanted[part]) ** 2))  # fmt: skip
        grads = {}
        for path in PATHS:
            fit = Regression(mlp, params, x, targets, minibatches=minibatches, path=path)
            params.grad.fill_(7.0)
            fit.step(m, losses)
            np.testing.assert_allclose(losses.numpy()[0], expected, rtol=tolerance(mlp))
            full = params.grad_numpy()
            assert not full["before"].any() and not full["after"].any()
            grads[path] = {name: full[name] for name in mlp.shapes()}
        assert_close(grads["cpu"], {k: v.astype(np.float64) for k, v in grads["tile"].items()}, tolerance(mlp))


@wp.kernel
def _sgd(data: wp.array(dtype=float), grad: wp.array(dtype=float)):
    i = wp.tid()
    data[i] = data[i] - 0.05 * grad[i]


@pytest.mark.parametrize("path", PATHS)
def test_regression_fit_is_bit_identical_captured(path):
    """Two epochs of three minibatches, each step followed by an update, recorded once and
    replayed: the parameters and the losses bit for bit those of the eager run (the replay
    writes every loss), and the fit did move the parameters."""
    captured_fit_matches_eager(regression_setup(), path)


def captured_fit_matches_eager(setup: tuple, path: str) -> None:
    """:func:`test_regression_fit_is_bit_identical_captured` on ``setup`` (:func:`regression_setup`'s)."""
    mlp, params, x, targets = setup
    start = params.data.numpy().copy()
    losses = wp.zeros(3, dtype=float)
    fit = Regression(mlp, params, x, targets, minibatches=3, path=path)

    def run():
        fit.fit(2, losses, lambda: wp.launch(_sgd, dim=params.size, inputs=[params.data, params.grad]))

    run()
    eager = (params.data.numpy().copy(), losses.numpy().copy())
    params.data.assign(start)
    with wp.ScopedCapture(device="cpu") as capture:
        run()
    params.data.assign(start)
    losses.fill_(123.0)
    wp.capture_launch(capture.graph)
    assert np.array_equal(params.data.numpy(), eager[0]) and np.array_equal(losses.numpy(), eager[1])
    assert not np.array_equal(eager[0], start)


def test_the_cpu_paths_exp_is_within_two_ulp():
    """``exp_low`` (harness.nn_cpu), the ELU's exponential on the CPU path, against the float64
    exp over [-87, 0] (every 1e-4, and the ends), in units of the float32 spacing at the result."""

    @wp.func_native(nn_cpu._EXP + "\nfor (int i = 0; i < z.shape.dims[0]; ++i) out.data[i] = exp_low(z.data[i]);")
    def exp_all(z: wp.array(dtype=float), out: wp.array(dtype=float)): ...

    @wp.kernel(enable_backward=False)
    def run(z: wp.array(dtype=float), out: wp.array(dtype=float)):
        exp_all(z, out)

    zs = np.concatenate([np.arange(-87.0, 0.0, 1e-4), [-87.0, -1e-30, 0.0]]).astype(np.float32)
    out = wp.zeros(zs.size, dtype=float, device="cpu")
    wp.launch(run, dim=1, inputs=[wp.array(zs, dtype=float, device="cpu"), out], device="cpu")
    got = out.numpy().astype(np.float64)
    exact = np.exp(zs.astype(np.float64))
    ulps = np.abs(got - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 2.0, (ulps.max(), zs[np.argmax(ulps)])
    assert got[-1] == 1.0


def test_path_choices_and_refusals():
    """``auto`` takes the CPU path on the CPU, the tile path with a tile width or for an MLP
    whose buffers exceed the CPU path's stack budget; ``cpu`` refuses what it cannot run."""
    mlp, params = build(CONFIGS["elu+norm"])
    assert mlp.path("cpu") == "cpu" and mlp.path("cpu", tile_width=8) == "tile" and mlp.path("cpu", "tile") == "tile"
    wide = MLP(76, [1024, 512], 21)  # over 3 MiB of transposed weights alone
    assert nn_cpu.stack_bytes(wide._keys()) > nn_cpu.STACK_BUDGET and wide.path("cpu") == "tile"
    with pytest.raises(ValueError, match="stack"):
        wide.path("cpu", "cpu")
    with pytest.raises(ValueError, match="tile_width"):
        mlp.path("cpu", "cpu", tile_width=8)
    with pytest.raises(ValueError, match="path='gpu'"):
        mlp.forward(params, wp.zeros((ROWS, IN), dtype=float), wp.zeros((ROWS, OUT), dtype=float), path="gpu")
    x, targets = wp.zeros((ROWS, IN), dtype=float), wp.zeros((ROWS, OUT), dtype=float)
    with pytest.raises(ValueError, match="minibatches=2"):
        Regression(mlp, params, x, targets, minibatches=2)  # 21 rows
    with pytest.raises(ValueError, match="targets"):
        Regression(mlp, params, x, wp.zeros((ROWS, 1), dtype=float), minibatches=3)


# -- smaller contracts ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_forward_step_writes_its_rows_only(path):
    mlp, params = build(CONFIGS["tanh"])
    xs = np.random.default_rng(10).normal(size=(STEPS, ROWS, IN)).astype(np.float32)
    y = wp.full((STEPS, ROWS, OUT), 7.0, dtype=float)
    mlp.forward_step(params, wp.array(xs, dtype=float), 1, y, **path_args(path))
    got = y.numpy()
    assert (got[0] == 7.0).all() and (got[2] == 7.0).all()
    out, _ = reference(values64(params, mlp), xs[1].astype(np.float64), CONFIGS["tanh"], prefix="net.")
    assert_close({"y": got[1]}, {"y": out}, tolerance(mlp))


@pytest.mark.parametrize("path", PATHS)
def test_inputs_without_gradient(path):
    """A critic on stored data that needs no input gradient: the parameters' gradients are
    those of the same call with one."""
    mlp, params = build(CONFIGS["elu"])
    xs = np.random.default_rng(11).normal(size=(ROWS, IN)).astype(np.float32)
    grads = []
    for requires_grad in (True, False):
        params.zero_grad()
        y = wp.zeros((ROWS, OUT), dtype=float, requires_grad=True)
        tape = wp.Tape()
        with tape:
            mlp.forward(params, wp.array(xs, dtype=float, requires_grad=requires_grad), y, **path_args(path))
        tape.backward(grads={y: wp.ones_like(y)})
        grads.append(params.grad.numpy())
    assert np.array_equal(grads[0], grads[1]) and grads[0].any()


def test_specs():
    mlp = MLP(4, [8, 6], 2, activation="elu", layer_norm=True, prefix="critic.")
    specs = mlp.specs(seed=3, init_scale=0.1)
    assert [s.name for s in specs] == [
        "critic.l1.weight", "critic.l1.bias", "critic.l1.norm.weight", "critic.l1.norm.bias",
        "critic.l2.weight", "critic.l2.bias", "critic.l2.norm.weight", "critic.l2.norm.bias",
        "critic.out.weight", "critic.out.bias",
    ]  # fmt: skip
    assert {s.name: s.shape for s in specs} == mlp.shapes()
    assert mlp.shapes()["critic.l2.weight"] == (6, 8)
    # PyTorch nn.Linear's default, drawn weight then bias, layer by layer; the output layer scaled
    rng = np.random.default_rng(3)
    for spec in specs:
        if ".norm." in spec.name:
            assert (spec.init == (1.0 if spec.name.endswith("weight") else 0.0)).all()
            continue
        fan_in = mlp.shapes()[spec.name.replace(".bias", ".weight")][1]
        drawn = rng.uniform(-(fan_in**-0.5), fan_in**-0.5, size=spec.shape).astype(np.float32)
        scale = np.float32(0.1) if ".out." in spec.name else np.float32(1.0)
        np.testing.assert_array_equal(spec.init, drawn * scale)
    assert [s.name for s in MLP(4, [], 2).specs(seed=0)] == ["out.weight", "out.bias"]


def test_tile_width_rule():
    policy = MLP(6, [64, 64], 1, activation="tanh", output="tanh")
    assert [policy.tile_width(n) for n in (1, 2, 5, 13, 32, 33, 2048)] == [1, 2, 8, 16, 32, 32, 32]
    critic = MLP(5, [64, 64], 1, activation="elu", layer_norm=True)
    assert critic.tile_width(2048) == 32 and critic.shared_bytes(32)[1] <= CPU_TILE_ARENA
    wide = MLP(8, [128, 128], 2, activation="elu", layer_norm=True)
    p = wide.tile_width(1000)
    assert p == 8 and wide.shared_bytes(p)[1] <= CPU_TILE_ARENA < wide.shared_bytes(2 * p)[1]
    with pytest.raises(ValueError, match="tile memory"):
        MLP(76, [256, 128], 21).tile_width(64)  # SHAC's humanoid actor: its weights alone overflow
    mlp, params = build(CONFIGS["tanh"])
    x, y = wp.zeros((ROWS, IN), dtype=float), wp.zeros((ROWS, OUT), dtype=float)
    with pytest.raises(ValueError, match="power of two"):
        mlp.forward(params, x, y, tile_width=12)


def test_refusals():
    with pytest.raises(ValueError, match="activation"):
        MLP(3, [4], 1, activation="gelu")
    with pytest.raises(ValueError, match="output_scale"):
        MLP(3, [4], 1, output_scale=2.0)
    mlp, params = build(CONFIGS["tanh"])
    with pytest.raises(ValueError, match="x is"):
        mlp.forward(params, wp.zeros((ROWS, IN + 1), dtype=float), wp.zeros((ROWS, OUT), dtype=float))
    with pytest.raises(ValueError, match="indices"):
        mlp.forward(params, wp.zeros((4, IN), dtype=float), wp.zeros((ROWS, OUT), dtype=float),
                    indices=wp.zeros(ROWS + 1, dtype=wp.int32))  # fmt: skip
    with pytest.raises(IndexError):
        mlp.forward_step(params, wp.zeros((2, ROWS, IN), dtype=float), 2, wp.zeros((2, ROWS, OUT), dtype=float))
    other = ParamSet(MLP(IN, HIDDEN, OUT, prefix="other.").specs(seed=0))
    with pytest.raises(KeyError, match=r"net\.l1\.weight"):
        mlp.forward(other, wp.zeros((ROWS, IN), dtype=float), wp.zeros((ROWS, OUT), dtype=float))


@pytest.mark.slow
def test_arena_limit_runs():
    """The widest MLP the rule lets through (backward 261,792 of 262,144 bytes) runs forward and
    backward on the CPU; an overflow would abort the child process, not raise."""
    code = textwrap.dedent("""
        import numpy as np, warp as wp
        import harness
        from harness.nn import MLP, CPU_TILE_ARENA
        from harness.params import ParamSet
        mlp = MLP(52, [128, 128], 2, activation="elu", layer_norm=True)
        p = mlp.tile_width(64)
        assert p == 8 and CPU_TILE_ARENA - 1024 < mlp.shared_bytes(p)[1] <= CPU_TILE_ARENA, mlp.shared_bytes(p)
        params = ParamSet(mlp.specs(seed=0), device="cpu")
        x = wp.array(np.ones((64, 52), np.float32), requires_grad=True)
        y = wp.zeros((64, 2), requires_grad=True)
        tape = wp.Tape()
        with tape:
            mlp.forward(params, x, y, path="tile")
        tape.backward(grads={y: wp.ones_like(y)})
        assert np.isfinite(params.grad.numpy()).all() and params.grad.numpy().any()
        print("ran")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-2000:]
