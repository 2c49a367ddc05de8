"""Device code of SHAC (:mod:`harness.tasks.shac`): episodes, the actor's objective, TD(lambda)
targets, observation statistics, Polyak averaging (the critic's loss and its minibatch steps:
:class:`harness.nn.Regression`).

Every quantity that changes between iterations is read from a device array (the iteration
counter, the episode counters, the statistics), so one SHAC iteration is one captured graph.
"""

from __future__ import annotations

import warp as wp

__all__ = [
    "actor_objective",
    "cut_every",
    "episode_marks",
    "episode_stats",
    "mark_terminations",
    "next_episode",
    "normalize",
    "polyak",
    "sample_actions",
    "summarize",
    "td_lambda",
    "update_moments",
    "window_keys",
    "zero_cut_adjoint",
]


@wp.kernel
def window_keys(counter: wp.array(dtype=wp.int32), steps: int, keys: wp.array(dtype=wp.int32)):
    """``keys[t]``: the random stream of step ``t`` of this iteration's window (``t = 0``: the
    window's start draw; ``t >= 1``: the draw a restart at step ``t`` takes), distinct for every
    iteration and step."""
    t = wp.tid()
    keys[t] = counter[0] * (steps + 1) + t


@wp.kernel
def cut_every(window: wp.array(dtype=wp.int32), steps: int, cut: wp.array2d(dtype=wp.int32)):
    """``cut[t] = 1`` after every ``window[0]`` steps of the rollout but its last (``task.window=auto``:
    the gradient's window inside a rollout of the ceiling's steps)."""
    t, w = wp.tid()
    n = window[0]
    cut[t, w] = wp.where((t + 1) % n == 0 and t < steps - 1, 1, 0)


@wp.kernel
def zero_cut_adjoint(cut: wp.array2d(dtype=wp.int32), t: int, grad: wp.array2d(dtype=wp.float32)):
    """The adjoint of the state after step ``t`` of every world cut there (``grad`` a per-world view
    of one state array's gradient): nothing later in the rollout reaches the steps before the cut."""
    w, j = wp.tid()
    if cut[t, w] != 0:
        grad[w, j] = 0.0


@wp.kernel
def episode_marks(
    episode_step: wp.array(dtype=wp.int32),
    episode_length: int,
    steps: int,
    cut: wp.array2d(dtype=wp.int32),
    done: wp.array2d(dtype=wp.int32),
    ends: wp.array2d(dtype=wp.int32),
    cost_weight: wp.array2d(dtype=wp.float32),
    value_weight: wp.array2d(dtype=wp.float32),
    gamma: float,
):
    """For one world over the window: ``done[t]`` (its episode ends after step ``t``), ``ends[t]``
    (a sub-trajectory ends there: done, or the window's last step), and the actor objective's
    weights: ``cost_weight[t] = gamma^k`` with ``k`` the steps since the sub-trajectory began, and
    ``value_weight[t] = gamma^(k + 1)`` where it ends (0 elsewhere). A gradient cut (``cut[t]``,
    ``task.window=auto``) ends the actor's sub-trajectory too, without ending the episode: the
    critic's TD(lambda) returns run on through it (``ends`` is theirs). Non-differentiable: they
    depend on the episode counters and the cuts only."""
    w = wp.tid()
    discount = wp.float32(1.0)
    for t in range(steps):
        ended = (episode_step[w] + t + 1) % episode_length == 0
        done[t, w] = wp.where(ended, 1, 0)
        last = ended or t == steps - 1
        ends[t, w] = wp.where(last, 1, 0)
        cost_weight[t, w] = discount
        value_weight[t, w] = wp.where(last or cut[t, w] != 0, gamma * discount, 0.0)
        discount = wp.where(ended or cut[t, w] != 0, 1.0, discount * gamma)


@wp.kernel
def mark_terminations(
    ended: wp.array(dtype=wp.int32),
    t: int,
    steps: int,
    episode_length: int,
    gamma: float,
    cut: wp.array2d(dtype=wp.int32),
    done: wp.array2d(dtype=wp.int32),
    ends: wp.array2d(dtype=wp.int32),
    terminal: wp.array2d(dtype=wp.int32),
    cost_weight: wp.array2d(dtype=wp.float32),
    value_weight: wp.array2d(dtype=wp.float32),
):
    """A world whose state after step ``t`` ended its episode early (``ended[w]``, the env's
    :class:`~harness.env.Terminates`): its episode is done after step ``t``, its last state is
    valued 0 (``terminal``: no bootstrap, as SHAC's code does for an early termination), and a new
    episode starts at step ``t + 1``, whose marks and weights replace :func:`episode_marks`' for
    the rest of the window (its gradient cuts kept). An episode that reaches its time limit at ``t`` is not an early end
    (its last state is valued by the critic)."""
    w = wp.tid()
    if ended[w] == 0 or done[t, w] != 0:
        return
    done[t, w] = 1
    ends[t, w] = 1
    terminal[t, w] = 1
    value_weight[t, w] = 0.0
    discount = wp.float32(1.0)
    for s in range(t + 1, steps):
        limit = (s - t) % episode_length == 0
        done[s, w] = wp.where(limit, 1, 0)
        last = limit or s == steps - 1
        ends[s, w] = wp.where(last, 1, 0)
        terminal[s, w] = 0
        cost_weight[s, w] = discount
        value_weight[s, w] = wp.where(last or cut[s, w] != 0, gamma * discount, 0.0)
        discount = wp.where(limit or cut[s, w] != 0, 1.0, discount * gamma)


@wp.kernel
def next_episode(
    episode_step: wp.array(dtype=wp.int32), done: wp.array2d(dtype=wp.int32), episode_length: int, steps: int
):
    """Every world's step in its episode after the window: the steps since its last episode ended
    in the window, or its step before plus the window's steps."""
    w = wp.tid()
    following = episode_step[w] + steps
    for t in range(steps):
        if done[t, w] != 0:
            following = steps - 1 - t
    episode_step[w] = following % episode_length


@wp.kernel
def normalize(
    x: wp.array2d(dtype=wp.float32),
    mean: wp.array(dtype=wp.float64),
    var: wp.array(dtype=wp.float64),
    out: wp.array2d(dtype=wp.float32),
):
    """``out = (x - mean) / sqrt(var + 1e-5)`` per feature (the statistics are constants here:
    the gradient flows into ``x`` only)."""
    i, d = wp.tid()
    scale = wp.float32(wp.float64(1.0) / wp.sqrt(var[d] + wp.float64(1.0e-5)))
    out[i, d] = (x[i, d] - wp.float32(mean[d])) * scale


@wp.kernel
def update_moments(
    x: wp.array2d(dtype=wp.float32),
    mean: wp.array(dtype=wp.float64),
    var: wp.array(dtype=wp.float64),
    count: wp.array(dtype=wp.float64),
    feature_count: int,
):
    """Merge the rows of ``x`` into the running mean and (biased) variance of every feature:
    Chan, Golub and LeVeque's pairwise update (1979), as RunningMeanStd in SHAC's code. One
    thread: the features in turn, then the count."""
    rows = x.shape[0]
    n = wp.float64(rows)
    total = count[0] + n
    for d in range(feature_count):
        s = wp.float64(0.0)
        for i in range(rows):
            s += wp.float64(x[i, d])
        batch_mean = s / n
        m2 = wp.float64(0.0)
        for i in range(rows):
            diff = wp.float64(x[i, d]) - batch_mean
            m2 += diff * diff
        delta = batch_mean - mean[d]
        mean[d] = mean[d] + delta * n / total
        var[d] = (var[d] * count[0] + m2 + delta * delta * count[0] * n / total) / total
    count[0] = total


@wp.kernel
def sample_actions(
    mean: wp.array3d(dtype=wp.float32),
    log_std: wp.array(dtype=wp.float32),
    t: int,
    counter: wp.array(dtype=wp.int32),
    seed: int,
    steps: int,
    stochastic: int,
    scale: float,
    actions: wp.array3d(dtype=wp.float32),
):
    """``actions[t] = scale * tanh(mean[t] + exp(log_std) * eps)``, ``eps`` standard normal from
    the iteration counter, the step and the world (the reparameterised sample of SHAC's
    stochastic actor, differentiable in ``mean`` and ``log_std``); ``stochastic`` 0: ``eps = 0``."""
    w, d = wp.tid()
    noise = wp.float32(0.0)
    if stochastic != 0:
        state = wp.rand_init(seed, ((counter[0] * steps + t) * mean.shape[1] + w) * mean.shape[2] + d)
        noise = wp.randn(state)
    actions[t, w, d] = scale * wp.tanh(mean[t, w, d] + wp.exp(log_std[d]) * noise)


@wp.kernel
def actor_objective(
    cost: wp.array2d(dtype=wp.float32),
    values: wp.array2d(dtype=wp.float32),
    cost_weight: wp.array2d(dtype=wp.float32),
    value_weight: wp.array2d(dtype=wp.float32),
    reward_scale: float,
    norm: float,
    total: wp.array(dtype=wp.float32),
):
    """SHAC's actor loss (Xu et al. 2022, eq. 5), linear in the costs and the critic's values:
    ``sum_t,w (cost_weight * reward_scale * cost - value_weight * V) / norm`` with ``norm = steps
    x worlds`` (the reward is minus the cost)."""
    t, w = wp.tid()
    term = cost_weight[t, w] * reward_scale * cost[t, w] - value_weight[t, w] * values[t, w]
    wp.atomic_add(total, 0, term / norm)


@wp.kernel
def td_lambda(
    cost: wp.array2d(dtype=wp.float32),
    values: wp.array2d(dtype=wp.float32),
    ends: wp.array2d(dtype=wp.int32),
    terminal: wp.array2d(dtype=wp.int32),
    reward_scale: float,
    gamma: float,
    lam: float,
    steps: int,
    targets: wp.array2d(dtype=wp.float32),
):
    """The critic's targets, TD(lambda) returns (Sutton and Barto, 2018, section 12.1):
    ``G_t = r_t + gamma V_t`` where a sub-trajectory ends at ``t``, else
    ``G_t = r_t + gamma ((1 - lambda) V_t + lambda G_{t+1})``, with ``V_t`` the target critic's
    value of the state after step ``t`` (0 where that state ended its episode early, ``terminal``)
    and ``r_t`` minus the scaled cost (the recursion SHAC's code computes in another form)."""
    w = wp.tid()
    following = wp.float32(0.0)
    for k in range(steps):
        t = steps - 1 - k
        r = -reward_scale * cost[t, w]
        value = wp.where(terminal[t, w] != 0, 0.0, values[t, w])
        g = r + gamma * value
        if ends[t, w] == 0:
            g = r + gamma * ((1.0 - lam) * value + lam * following)
        targets[t, w] = g
        following = g


@wp.kernel
def polyak(target: wp.array(dtype=wp.float32), source: wp.array(dtype=wp.float32), keep: float):
    """``target = keep * target + (1 - keep) * source`` (the target critic, SHAC's alpha = keep)."""
    i = wp.tid()
    target[i] = keep * target[i] + (1.0 - keep) * source[i]


@wp.kernel
def episode_stats(
    cost: wp.array2d(dtype=wp.float32),
    done: wp.array2d(dtype=wp.int32),
    reward_scale: float,
    steps: int,
    running: wp.array(dtype=wp.float32),
    finished: wp.array(dtype=wp.float32),
    length: wp.array(dtype=wp.int32),
):
    """Undiscounted returns of every world's episode so far (``running``); an episode that ends in
    this window adds its return to ``finished[0]``, one to ``finished[1]`` and its length to
    ``finished[2]`` (for the episode-return curve). ``length``: steps into the current episode."""
    w = wp.tid()
    for t in range(steps):
        running[w] = running[w] - reward_scale * cost[t, w]
        length[w] = length[w] + 1
        if done[t, w] != 0:
            wp.atomic_add(finished, 0, running[w])
            wp.atomic_add(finished, 1, 1.0)
            wp.atomic_add(finished, 2, float(length[w]))
            running[w] = 0.0
            length[w] = 0


@wp.kernel
def summarize(
    finished: wp.array(dtype=wp.float32),
    losses: wp.array(dtype=wp.float32),
    values: wp.array2d(dtype=wp.float32),
    targets: wp.array(dtype=wp.float32),
    log_std: wp.array(dtype=wp.float32),
    last_return: wp.array(dtype=wp.float32),
    last_length: wp.array(dtype=wp.float32),
    scalars: wp.array(dtype=wp.float32),
):
    """The iteration's logged scalars: the episodes that ended (their mean return and length,
    kept until others end), the critic's mean minibatch loss, the mean target value and TD
    target, the mean action standard deviation."""
    if finished[1] > 0.0:
        last_return[0] = finished[0] / finished[1]
        last_length[0] = finished[2] / finished[1]
    acc = wp.float32(0.0)
    for i in range(losses.shape[0]):
        acc += losses[i]
    scalars[0] = acc / float(losses.shape[0])
    v = wp.float32(0.0)
    g = wp.float32(0.0)
    for i in range(targets.shape[0]):
        v += values[i, 0]
        g += targets[i]
    scalars[1] = v / float(targets.shape[0])
    scalars[2] = g / float(targets.shape[0])
    s = wp.float32(0.0)
    for d in range(log_std.shape[0]):
        s += wp.exp(log_std[d])
    scalars[3] = s / float(log_std.shape[0])
