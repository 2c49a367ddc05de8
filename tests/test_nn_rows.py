"""harness.nn's rows path (harness.nn_rows: a thread per row, the path CUDA takes) on the CPU,
which runs the very C++ a GPU runs: against a float64 numpy reference (forward, and central
differences for the gradients) and against the CPU path, per step in a closed loop, gathered
with a repeated row, the regression step, captured graphs; and that the same text compiles for
sm_90 with NVRTC.

Tolerance as in tests/test_nn.py (its module docstring): ``32 L n u`` relative to the scale of
what is compared, ``L`` layers of width at most ``n``, ``u = 2^-24``; the rows path sums each
row's products in order, the CPU path in blocks and lanes, so the two differ by float32
rounding only. ``ROWS`` (37, a prime) is a multiple of no block or lane count. The reference,
the central differences and the runs on a tape are tests/test_nn.py's.
"""

import tempfile
import types

import numpy as np
import pytest
import warp as wp

from harness import nn, nn_rows
from harness.nn import MLP, PATHS, Regression
from tests.test_nn import (
    CONFIGS,
    IN,
    OUT,
    as64,
    assert_close,
    build,
    captured_fit_matches_eager,
    captured_graph_matches_eager,
    central_differences,
    grads_of,
    kink_free,
    reference,
    reference_rollout,
    regression_setup,
    rollout_inputs,
    run_forward,
    run_rollout,
    tolerance,
    values64,
)

ROWS = 37


# -- gradients ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_gathered_rows_against_the_reference_and_the_cpu_path(name):
    """Every activation, with and without LayerNorm, a tanh output with and without a scale:
    ``ROWS`` rows gathered from a stored set (a row picked twice gets both contributions, unused
    rows get none, the last stored row is used): outputs, parameter and input gradients against
    the float64 reference and central differences, and against the CPU path's; both consume
    ``y.grad``."""
    config = CONFIGS[name]
    mlp, params = build(config, seed=5)
    point = values64(params, mlp)
    stored = ROWS + 9

    def draw(rng):
        data = rng.normal(size=(stored, IN)).astype(np.float32).astype(np.float64)
        picked = rng.integers(0, stored - 8, size=ROWS).astype(np.int32)  # rows 38..44 unused
        picked[:3] = [7, 7, stored - 1]
        return data, picked, rng.normal(size=(ROWS, OUT))

    data, picked, c = kink_free(config, draw, lambda d: reference(point, d[0][d[1]], config, "net.")[1], seed=6)
    found = {}
    for path in ("rows", "cpu"):
        params.zero_grad()
        x, y = run_forward(mlp, params, data, c, picked, path=path)
        assert not y.grad.numpy().any()  # consumed
        found[path] = {"y": y.numpy(), "x": x.grad.numpy(), **grads_of(params, mlp)}

    tol = tolerance(mlp)
    rows = found["rows"]
    assert not rows["x"][stored - 8 : stored - 1].any()
    assert_close({"y": rows["y"]}, {"y": reference(point, data[picked], config, "net.")[0]}, tol)
    point["x"] = data
    expected = central_differences(
        lambda: float(np.sum(c * reference(point, point["x"][picked], config, "net.")[0])), point
    )
    assert_close(rows, expected, tol)
    assert_close(rows, as64(found["cpu"]), tol)


@pytest.mark.parametrize("name", ["tanh", "elu+norm"])
def test_per_step_rollout_gradients(name):
    """``forward_step`` (ungathered rows of a ``(steps, rows, in)`` array) in a closed loop over
    ``STEPS`` steps on one tape: forward and the gradients w.r.t. the initial state and every
    parameter against the reference, and the CPU path's."""
    config = CONFIGS[name]
    mlp, params = build(config, seed=1)
    point = values64(params, mlp)
    x0, mix, c = rollout_inputs(np.random.default_rng(2), ROWS)
    found = {}
    for path in ("rows", "cpu"):
        params.zero_grad()
        x, y = run_rollout(mlp, params, x0, mix, c, path=path)
        found[path] = {"y": y.numpy(), "x0": x.grad.numpy()[0], **grads_of(params, mlp)}

    tol = tolerance(mlp)
    assert_close({"y": found["rows"]["y"]}, {"y": reference_rollout(point, config, x0, mix)[0]}, tol)
    point["x0"] = x0
    expected = central_differences(
        lambda: float(np.sum(c * reference_rollout(point, config, point["x0"], mix)[0])), point
    )
    assert_close(found["rows"], expected, tol)
    assert_close(found["rows"], as64(found["cpu"]), tol)


# -- regression -----------------------------------------------------------------------------------


def test_a_regression_step_equals_the_cpu_paths():
    """Every minibatch (of ``ROWS`` rows) on both paths: the loss is the float64 reference's
    mean squared error, the gradients agree, and the gradient and the loss are written, not
    added: entries outside the MLP come out 0 whatever the buffers held."""
    mlp, params, x, targets = regression_setup(3 * ROWS)
    config = {"activation": "elu", "layer_norm": True, "output": "identity"}
    point = values64(params, mlp)
    data, wanted = x.numpy().astype(np.float64), targets.numpy().astype(np.float64)
    losses = wp.zeros(2, dtype=float)
    for m in range(3):
        part = slice(m * ROWS, (m + 1) * ROWS)
        expected = float(np.mean((reference(point, data[part], config, "net.")[0] - wanted[part]) ** 2))
        grads = {}
        for path in ("rows", "cpu"):
            fit = Regression(mlp, params, x, targets, minibatches=3, path=path)
            assert fit.path == path
            params.grad.fill_(7.0)
            losses.fill_(7.0)
            fit.step(m, losses[1:2])
            assert losses.numpy()[0] == 7.0
            np.testing.assert_allclose(losses.numpy()[1], expected, rtol=tolerance(mlp))
            grads[path] = grads_of(params, mlp)
        assert_close(grads["rows"], as64(grads["cpu"]), tolerance(mlp))


def test_regression_fit_is_bit_identical_captured():
    """Two epochs of three minibatches, each step followed by an update, recorded once and
    replayed: the parameters and the losses bit for bit those of the eager run (the replay
    writes every loss)."""
    captured_fit_matches_eager(regression_setup(3 * ROWS), "rows")


# -- capture --------------------------------------------------------------------------------------


def test_captured_graph_is_bit_identical():
    """An actor applied per step in a closed loop and a critic gathering rows of the rollout's
    states, two MLPs in one ParamSet, recorded with ``wp.ScopedCapture`` and replayed at two
    parameter points: outputs and gradients bit for bit those of eager runs."""
    captured_graph_matches_eager(ROWS, path="rows")


# -- choices, limits, the CUDA build --------------------------------------------------------------


def test_path_choices_and_refusals():
    """``rows`` is a path; ``auto`` still takes the CPU path on the CPU; ``rows`` refuses a tile
    width and an MLP whose row needs more than ``ROW_BUDGET``, each in one line."""
    mlp, _ = build(CONFIGS["elu+norm"])
    assert "rows" in PATHS
    assert mlp.path("cpu") == "cpu" and mlp.path("cpu", "rows") == "rows" and mlp.path("cpu", "tile") == "tile"
    humanoid = MLP(76, [256, 128], 21, activation="elu", layer_norm=True)  # SHAC's humanoid actor
    assert nn_rows.row_bytes(humanoid._keys()) <= nn_rows.ROW_BUDGET
    with pytest.raises(ValueError, match="tile_width=8 with path='rows'") as error:
        mlp.path("cpu", "rows", tile_width=8)
    assert "\n" not in str(error.value)
    wide = MLP(76, [2048], 21)
    assert nn_rows.row_bytes(wide._keys()) > nn_rows.ROW_BUDGET
    with pytest.raises(ValueError, match=r"path='rows' needs \d+ bytes of local arrays per row") as error:
        wide.path("cpu", "rows")
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="accepted: 'auto', 'tile', 'cpu', 'rows'") as error:
        mlp.path("cpu", "gpu")
    assert "\n" not in str(error.value)


def test_auto_takes_the_rows_path_on_cuda(monkeypatch):
    """On a CUDA device (stood in for: this machine has none) ``auto`` takes ``rows``, the tile
    path with a tile width or for an MLP too wide for a row's arrays; ``cpu`` is refused."""
    cuda = types.SimpleNamespace(is_cpu=False)
    monkeypatch.setattr(nn.wp, "get_device", lambda device=None: cuda)
    mlp, wide = MLP(37, [64, 64], 1, activation="elu", layer_norm=True), MLP(76, [2048], 21)
    assert mlp.path("cuda:0") == "rows" and mlp.path("cuda:0", "rows") == "rows"
    assert mlp.path("cuda:0", tile_width=8) == "tile" and wide.path("cuda:0") == "tile"
    with pytest.raises(ValueError, match="accepted: 'auto', 'tile' or 'rows'"):
        mlp.path("cuda:0", "cpu")


def _sources(mlp: MLP) -> list[str]:
    keys, eps = mlp._keys(), mlp._eps()
    return [*nn_rows._forward_source(keys, eps, True), *nn_rows._forward_source(keys, eps, False),
            nn_rows._mse_source(keys, eps)]  # fmt: skip


@pytest.mark.skipif(90 not in wp.get_cuda_supported_archs(), reason="NVRTC cannot build for sm_90 here")
def test_the_same_text_builds_for_sm_90():
    """The C++ has no device branch of its own, and NVRTC builds it for sm_90 (an H100, an H200):
    the gathered forward kernel with its adjoint, and the regression step."""
    mlp, _ = build(CONFIGS["elu+norm"])
    for source in _sources(mlp):
        assert "#if" not in source and "__CUDA_ARCH__" not in source
    offsets = nn._offset_type(len(mlp.layers))
    for kernel in (
        nn_rows.forward_kernel(mlp._keys(), mlp._eps(), True, offsets),
        nn_rows.mse_kernel(mlp._keys(), mlp._eps(), offsets),
    ):
        with tempfile.TemporaryDirectory() as folder:
            (artifact,) = wp.compile_aot_module(kernel.module, arch=90, module_dir=folder)
            assert artifact.stat().st_size > 0


def test_row_bytes_counts_the_arrays():
    """``row_bytes``: the input and its gradient, per layer the outputs, derivatives and gradient,
    with LayerNorm the normalised values and the inverse deviation."""
    mlp = MLP(37, [128, 64, 32], 8, activation="elu", layer_norm=True, output="tanh")  # SHAC's Ant actor
    assert nn_rows.row_bytes(mlp._keys()) == 4 * (2 * 37 + (128 + 64 + 32) * 4 + 3 + 8 * 3)
