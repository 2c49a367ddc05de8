"""Benchmark one global-norm gradient clip: harness vs a naive Warp loop, torch (foreach) and numpy.

Usage::

    .venv/bin/python scripts/bench_clip.py [--repeats 50] [--device cpu]
    .venv/bin/python scripts/bench_clip.py --adjoint-horizon 800   # adjoint-clip figures instead

Two problems: 1e6 float32 gradient entries split over 16 arrays, and 1e4 over 4. Each
contender computes the total L2 norm and rescales every array by
``min(1, max_norm / (total + 1e-6))`` in place (max_norm is below the norm, so every call
really scales). Timed: the median wall time of one call over ``--repeats`` calls, each
followed by a device synchronisation, after warm-up calls (kernel compilation, plan
caching). Ratios are relative to ``harness.clip.clip_grad_norm_``.

* ``harness``: :func:`harness.clip.clip_grad_norm_` (four launches whatever the number of arrays).
* ``warp loop``: what users write by hand: per array one launch of a sum-of-squares kernel
  into a device scalar, then a coefficient launch, then per array one scale launch.
* ``torch``: ``torch.nn.utils.clip_grad_norm_(..., foreach=True)`` on CPU tensors.
* ``numpy``: ``np.linalg.norm`` per array, then in-place ``*=``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import warp as wp

import harness  # noqa: F401  (quiet Warp start-up)
from harness.clip import clip_grad_norm_


@wp.kernel
def _naive_sumsq(g: wp.array(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
    i = wp.tid()
    wp.atomic_add(out, 0, g[i] * g[i])


@wp.kernel
def _naive_coef(max_norm: float, sumsq: wp.array(dtype=wp.float32), coef: wp.array(dtype=wp.float32)):
    coef[0] = wp.min(1.0, max_norm / (wp.sqrt(sumsq[0]) + 1.0e-6))


@wp.kernel
def _naive_scale(coef: wp.array(dtype=wp.float32), g: wp.array(dtype=wp.float32)):
    i = wp.tid()
    g[i] = g[i] * coef[0]


def naive_warp_clip(arrays: list[wp.array], max_norm: float, sumsq: wp.array, coef: wp.array) -> None:
    sumsq.zero_()
    for a in arrays:
        wp.launch(_naive_sumsq, dim=a.size, inputs=[a, sumsq], device=a.device)
    wp.launch(_naive_coef, dim=1, inputs=[max_norm, sumsq, coef], device=sumsq.device)
    for a in arrays:
        wp.launch(_naive_scale, dim=a.size, inputs=[coef, a], device=a.device)


def numpy_clip(arrays: list[np.ndarray], max_norm: float) -> None:
    total = np.sqrt(sum(float(np.dot(a, a)) for a in arrays))
    coef = min(1.0, max_norm / (total + 1e-6))
    for a in arrays:
        a *= np.float32(coef)


def median_ms(fn, repeats: int, device: wp.context.Device) -> float:
    for _ in range(3):
        fn()
    wp.synchronize_device(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        wp.synchronize_device(device)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def bench(total: int, count: int, repeats: int, device: wp.context.Device) -> dict[str, float]:
    rng = np.random.default_rng(0)
    sizes = np.full(count, total // count)
    sizes[: total - sizes.sum()] += 1
    host = [rng.normal(size=int(n)).astype(np.float32) for n in sizes]
    # The values shrink every call (max_norm below the norm); refresh scale is irrelevant to timing.
    max_norm = 1e-3
    ours = [wp.array(h, dtype=wp.float32, device=device) for h in host]
    naive = [wp.array(h, dtype=wp.float32, device=device) for h in host]
    sumsq = wp.zeros(1, dtype=wp.float32, device=device)
    coef = wp.zeros(1, dtype=wp.float32, device=device)
    params = [torch.nn.Parameter(torch.zeros(int(n))) for n in sizes]
    for p, h in zip(params, host, strict=True):
        p.grad = torch.from_numpy(h.copy())
    arrays_np = [h.copy() for h in host]
    return {
        "harness": median_ms(lambda: clip_grad_norm_(ours, max_norm), repeats, device),
        "warp loop": median_ms(lambda: naive_warp_clip(naive, max_norm, sumsq, coef), repeats, device),
        "torch foreach": median_ms(
            lambda: torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True), repeats, device
        ),
        "numpy": median_ms(lambda: numpy_clip(arrays_np, max_norm), repeats, device),
    }


def adjoint_figures(horizon: int, device: wp.context.Device) -> None:
    """Cartpole, 1 world, controls 0, terminal loss |q_T|^2 + 0.1 |qd_T|^2: |g| without and
    with in-backward adjoint clipping, and the pre-clip adjoint profile."""
    from envs.cartpole import CartpoleEnv
    from harness.adjoint import AdjointClipper, profile_summary
    from harness.losses import WeightedLoss
    from harness.tasks import OpenLoop, prepare
    from harness.training.step import taped_rollout

    env = CartpoleEnv(horizon=horizon, world_count=1, device=device)
    task = OpenLoop()
    loss = WeightedLoss(
        {
            "pose": {"source": "joint_q", "steps": "last"},
            "velocity": {"source": "joint_qd", "steps": "last", "weight": 0.1},
        }
    )
    params = prepare(env, task, loss, device=device)
    for max_norm in (None, float("inf"), 10.0, 1.0):
        clipper = AdjointClipper(horizon=horizon, world_count=1, max_norm=max_norm, device=device)
        tape, _, total = taped_rollout(env, task, loss, params, adjoint=clipper if max_norm else None)
        tape.backward(total)
        grad = params.grad.numpy().astype(np.float64)
        line = f"horizon {horizon}, adjoint max_norm {max_norm}: |g| = {np.linalg.norm(grad):.4g}"
        if max_norm == float("inf"):
            profile = clipper.profile()
            line += f", profile {profile_summary(profile)}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--adjoint-horizon", type=int, default=0, help="print adjoint-clip figures at this horizon")
    args = parser.parse_args()
    device = wp.get_device(args.device)
    if args.adjoint_horizon:
        adjoint_figures(args.adjoint_horizon, device)
        return
    threads = torch.get_num_threads()
    print(f"device {device.alias}, torch {torch.__version__} ({threads} threads), warp {wp.__version__}")
    for total, count in ((1_000_000, 16), (10_000, 4)):
        result = bench(total, count, args.repeats, device)
        base = result["harness"]
        print(f"\n{total:.0e} entries in {count} arrays: median ms per clip (ratio to harness)")
        for name, ms in result.items():
            print(f"  {name:<14} {ms:9.3f} ms   {ms / base:6.2f}x")


if __name__ == "__main__":
    main()
