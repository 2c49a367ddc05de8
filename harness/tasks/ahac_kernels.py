"""Device code of AHAC (:mod:`harness.tasks.ahac`): the contact cut, the twin critic's minimum,
the critic's stopping rule and the horizon's dual step. Each reads what changes between
iterations from device arrays, so one AHAC iteration stays one captured graph.
"""

from __future__ import annotations

import warp as wp

__all__ = [
    "contact_cut", "critic_stop", "duplicate_targets", "horizon_from_window", "horizon_step", "stop_start", "twin_min",
]  # fmt: skip


@wp.func
def window_length(t: int, w: int, cut: wp.array2d(dtype=wp.int32), done: wp.array2d(dtype=wp.int32)) -> int:
    """Steps of world ``w``'s current gradient window up to step ``t`` included: back to the
    rollout's start, the last cut or the last episode end before ``t``."""
    length = wp.int32(1)
    s = t - 1
    while s >= 0:
        if cut[s, w] != 0 or done[s, w] != 0:
            break
        length += 1
        s -= 1
    return length


@wp.func
def horizon_steps(horizon: float, steps_min: int, steps_max: int) -> int:
    """The learned horizon as a whole number of steps, ``round(H)`` within ``[steps_min, steps_max]``."""
    return wp.clamp(int(wp.floor(horizon + 0.5)), steps_min, steps_max)


@wp.kernel
def contact_cut(
    load: wp.array2d(dtype=wp.float32),
    t: int,
    steps: int,
    steps_min: int,
    steps_max: int,
    horizon: wp.array(dtype=wp.float32),
    threshold: float,
    gamma: float,
    done: wp.array2d(dtype=wp.int32),
    cut: wp.array2d(dtype=wp.int32),
    cost_weight: wp.array2d(dtype=wp.float32),
    value_weight: wp.array2d(dtype=wp.float32),
):
    """After step ``t`` (its terminations marked): world ``w``'s gradient window ends there when it
    has more than ``steps_min`` steps and the contact load after the step passes ``threshold`` (as
    DiffRL's ``ahac1.py`` counts: its ``rollout_len >= steps_min`` before the step is counted), or
    when it has reached the learned horizon ``round(H)``. Not after the rollout's last step nor
    where the episode ends (the window ends there anyway). A cut ends the actor's sub-trajectory
    as a window's end does: the state after ``t`` is valued (``gamma^(k + 1)``), and the discount
    starts again at ``t + 1``, the later weights rebased as :func:`harness.tasks.shac_kernels.mark_terminations`
    rebases them (episode ends kept, later cuts still to come)."""
    w = wp.tid()
    if t >= steps - 1 or done[t, w] != 0:
        return
    length = window_length(t, w, cut, done)
    contact = length > steps_min and load[t, w] > threshold
    if not contact and length < horizon_steps(horizon[0], steps_min, steps_max):
        return
    cut[t, w] = 1
    value_weight[t, w] = gamma * cost_weight[t, w]
    discount = wp.float32(1.0)
    for s in range(t + 1, steps):
        last = done[s, w] != 0 or s == steps - 1
        cost_weight[s, w] = discount
        value_weight[s, w] = wp.where(last, gamma * discount, 0.0)
        discount = wp.where(done[s, w] != 0, 1.0, discount * gamma)


@wp.kernel
def horizon_from_window(window: wp.array(dtype=wp.int32), horizon: wp.array(dtype=wp.float32)):
    """``task.window=auto``: the windows' cap is the measured window ``n``."""
    horizon[0] = float(window[0])


@wp.kernel
def twin_min(heads: wp.array2d(dtype=wp.float32), out: wp.array2d(dtype=wp.float32)):
    """``out[i, 0]``: the smallest of row ``i``'s critic heads (the twin critic's value; its
    adjoint goes to the smaller head)."""
    i = wp.tid()
    v = heads[i, 0]
    for j in range(1, heads.shape[1]):
        v = wp.min(v, heads[i, j])
    out[i, 0] = v


@wp.kernel
def duplicate_targets(targets: wp.array(dtype=wp.float32), out: wp.array2d(dtype=wp.float32)):
    """Every head regresses to the same TD(lambda) target."""
    i, j = wp.tid()
    out[i, j] = targets[i]


@wp.kernel
def stop_start(count: wp.array(dtype=wp.int32), go: wp.array(dtype=wp.int32)):
    """Before the critic's first pass of an iteration: no pass made, the loop runs."""
    count[0] = 0
    go[0] = 1


@wp.kernel
def critic_stop(
    losses: wp.array(dtype=wp.float32),
    ring: wp.array(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    max_epochs: int,
    tolerance: float,
    go: wp.array(dtype=wp.int32),
):
    """After a pass of the critic: its loss ``L_j`` (the mean of the minibatches'), the count of
    passes, and whether another runs. AHAC's rule (DiffRL ``ahac.py``): with the five losses
    before this pass at hand, stop when the mean of their four differences, ``(L_(j-1) -
    L_(j-5)) / 4``, is within ``tolerance`` of 0; never more than ``max_epochs`` passes. One thread."""
    j = count[0]  # passes before this one
    total = wp.float32(0.0)
    for m in range(losses.shape[0]):
        total += losses[m]
    size = ring.shape[0]
    stop = False
    if j >= size:
        newest = ring[(j - 1) % size]
        oldest = ring[j % size]
        stop = wp.abs(newest - oldest) / float(size - 1) < tolerance
    ring[j % size] = total / float(losses.shape[0])
    count[0] = j + 1
    go[0] = wp.where(stop or j + 1 >= max_epochs, 0, 1)


@wp.kernel
def horizon_step(
    load: wp.array2d(dtype=wp.float32),
    cut: wp.array2d(dtype=wp.int32),
    done: wp.array2d(dtype=wp.int32),
    counter: wp.array(dtype=wp.int32),
    decay_iterations: int,
    lr: float,
    lr_min: float,
    threshold: float,
    steps_min: int,
    steps_max: int,
    sums: wp.array(dtype=wp.float32),
    counts: wp.array(dtype=wp.float32),
    horizon: wp.array(dtype=wp.float32),
    scalars: wp.array(dtype=wp.float32),
):
    """The horizon's dual step after an iteration (one thread). ``m_k``: the mean contact load at
    position ``k`` of a gradient window (over every world's windows that reached it); with
    ``n = round(H)``, ``H <- clip(H - lr_i * sum_(k < n) (m_k - threshold), steps_min, steps_max)``,
    ``lr_i`` decayed linearly from ``lr`` to ``lr_min`` over ``decay_iterations``. Also the
    iteration's scalars: the mean window, the cuts per world, the mean load."""
    steps = load.shape[0]
    worlds = load.shape[1]
    for k in range(sums.shape[0]):
        sums[k] = 0.0
        counts[k] = 0.0
    windows = wp.float32(0.0)
    cuts = wp.float32(0.0)
    total = wp.float32(0.0)
    for w in range(worlds):
        k = wp.int32(0)
        for t in range(steps):
            if k < sums.shape[0]:
                sums[k] += load[t, w]
                counts[k] += 1.0
            total += load[t, w]
            ends = cut[t, w] != 0 or done[t, w] != 0 or t == steps - 1
            if cut[t, w] != 0:
                cuts += 1.0
            if ends:
                windows += 1.0
                k = 0
            else:
                k += 1
    n = horizon_steps(horizon[0], steps_min, steps_max)
    excess = wp.float32(0.0)
    for k in range(n):
        if counts[k] > 0.0:
            excess += sums[k] / counts[k] - threshold
    progress = wp.min(float(counter[0]) / float(wp.max(decay_iterations, 1)), 1.0)
    rate = lr + (lr_min - lr) * progress
    horizon[0] = wp.clamp(horizon[0] - rate * excess, float(steps_min), float(steps_max))
    scalars[0] = float(steps * worlds) / windows
    scalars[1] = cuts / float(worlds)
    scalars[2] = total / float(steps * worlds)
