"""A reference for ``task=policy`` on the cartpole: the linear-quadratic regulator.

Linearises one step of the harness's cartpole (Featherstone, dt 1/240 s) about the upright
rest state by central differences, solves the discrete Riccati equation by iterating it to
a fixed point (Anderson & Moore, *Optimal Control: Linear Quadratic Methods*, 1990), and
rolls the clipped state feedback ``u = clip(-K x, +-limit)`` out from the env's own drawn
starts, reporting the cartpole's ``upright_fraction`` (both poles within +-0.2 rad over the
last quarter) and the default policy loss. The same starts as
``python -m harness evaluate RUN env.seed=7 env.world_count=64 env.horizon=480 env.tilt=0.1``.

    .venv/bin/python scripts/lqr_cartpole.py --tilt 0.1 --limit 50
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def linearise(eps: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """One step's ``x' = A x + B u`` at rest upright, x = (cart, pole 1, pole 2, their rates)."""
    import warp as wp

    from envs.cartpole import CartpoleEnv

    worlds = 7  # one world per state entry and one for the force
    env = CartpoleEnv(horizon=1, world_count=worlds, tilt=0.0, device="cpu")
    push = np.zeros((worlds, 6))
    push[np.arange(6), np.arange(6)] = eps
    force = np.zeros(worlds)
    force[6] = eps

    def step(x: np.ndarray, u: np.ndarray) -> np.ndarray:
        env.initial["joint_q"].assign(x[:, :3].ravel().astype(np.float32))
        env.initial["joint_qd"].assign(x[:, 3:].ravel().astype(np.float32))
        env.reset()
        env.act(0, wp.array(u.reshape(1, worlds, 1).astype(np.float32), device="cpu"))
        env.step(0)
        state = env.state(1)
        return np.concatenate([state.joint_q.numpy().reshape(worlds, 3), state.joint_qd.numpy().reshape(worlds, 3)], 1)

    delta = (step(push, force) - step(-push, -force)) / (2 * eps)
    return delta[:6].T, delta[6:7].T


def riccati_gain(a: np.ndarray, b: np.ndarray, q: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The stationary gain ``K`` of ``u = -K x`` for cost ``x'Qx + u'Ru`` per step."""
    p = q.copy()
    for _ in range(200_000):
        gain = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
        following = q + a.T @ p @ (a - b @ gain)
        if np.abs(following - p).max() <= 1e-9 * np.abs(p).max():
            return gain
        p = following
    raise RuntimeError("the Riccati iteration did not converge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tilt", type=float, default=0.1, help="starts within +-tilt rad (env.tilt)")
    parser.add_argument("--limit", type=float, default=50.0, help="force limit [N] (task.action_scale)")
    parser.add_argument("--horizon", type=int, default=480)
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cart-weight", type=float, default=1.0, help="Q weight of the cart position")
    parser.add_argument("--force-weight", type=float, default=0.01, help="R, the weight of the force")
    args = parser.parse_args()

    import warp as wp

    from envs.cartpole import CartpoleEnv, upright_fraction

    a, b = linearise()
    gain = riccati_gain(a, b, np.diag([args.cart_weight, 10, 10, 0.1, 1, 1]), np.array([[args.force_weight]]))
    env = CartpoleEnv(horizon=args.horizon, world_count=args.worlds, seed=args.seed, tilt=args.tilt, device="cpu")
    env.request({"joint_q": "all", "joint_qd": "all"})
    actions = np.zeros((args.horizon, args.worlds, 1), np.float32)
    device_actions = wp.zeros(actions.shape, dtype=wp.float32, device="cpu")
    env.reset()
    for t in range(args.horizon):
        state = env.state(t)
        x = np.concatenate([state.joint_q.numpy().reshape(-1, 3), state.joint_qd.numpy().reshape(-1, 3)], 1)
        actions[t, :, 0] = np.clip(-(x @ gain.T)[:, 0], -args.limit, args.limit)
        device_actions.assign(actions)
        env.act(t, device_actions)
        env.step(t)
        env.write_observables(t)
    q, qd = env.observed["joint_q"].numpy(), env.observed["joint_qd"].numpy()
    loss = (
        np.mean(0.1 * q[..., 0] ** 2 + q[..., 1] ** 2 + q[..., 2] ** 2)
        + np.mean(0.1 * qd[..., 0] ** 2 + 0.1 * qd[..., 1] ** 2 + 0.1 * qd[..., 2] ** 2)
        + 1e-3 * np.mean(actions**2)
    )
    print(f"K = {np.array2string(gain.ravel(), precision=1)}")
    print(
        f"tilt {args.tilt}, limit {args.limit:g} N, {args.worlds} worlds x {args.horizon} steps, seed {args.seed}: "
        f"upright_fraction {upright_fraction(q):.3f}, policy loss {loss:.4f}, "
        f"largest |cart position| {np.abs(q[..., 0]).max():.2f} m"
    )


if __name__ == "__main__":
    main()
