"""Every TensorBoard tag the harness writes, named once.

Tags are grouped by prefix, as CleanRL groups them: ``episode/`` (a policy's whole episodes
from the env's own starts, ``task=policy`` and ``task=shac``), ``loss/`` (what is minimised),
``optim/`` (gradients, clipping, the optimizer), ``perf/`` (speed), ``rollout/`` (pictures of
the rollout), ``through_time/`` (the state adjoint inside backward), ``diagnose/`` (can the
gradient be trusted, ``diagnose.every``) and one prefix per task
(``policy/``, ``sysid/``, ``shac/``). TensorBoard sorts the groups by name and opens the
first two, so a policy run opens on its episodes (is it learning?), then its loss curves, and
any other run on its loss curves, then its gradient curves.

A task that trains several parameter groups (SHAC's actor and critic) has each group's
optimizer tags under the group's name: :func:`optim` gives ``optim/<stat>`` for a run with one
group and ``optim/<group>/<stat>`` otherwise. Nothing else in the package spells a tag.
"""

from __future__ import annotations

__all__ = [
    "ADJOINT_CLIPPED",
    "ADJOINT_CLIPPED_FRACTION",
    "ADJOINT_GROWTH",
    "ADJOINT_HISTOGRAM",
    "ADJOINT_NORM_FIRST",
    "ADJOINT_NORM_MAX",
    "ADJOINT_PROFILE",
    "DIAGNOSE_BATCH_GRAD_NORM_P90",
    "DIAGNOSE_FD_REL_ERROR",
    "DIAGNOSE_GRAD_NORM_MEDIAN",
    "DIAGNOSE_SNR",
    "DIAGNOSE_SNR_BATCH",
    "DIAGNOSE_TRUSTED",
    "DIAGNOSE_ZO_COSINE",
    "EPISODE_LOSS",
    "EPISODE_RETURN",
    "EPISODE_UPRIGHT",
    "LOSS_BEST",
    "LOSS_FINAL",
    "LOSS_TOTAL",
    "PERF_ENV_STEPS_PER_S",
    "PERF_EPISODES_MS",
    "PERF_ITER_MS",
    "POLICY_ACTIONS",
    "POLICY_ACTION_ABS_MEAN",
    "POLICY_SATURATED_FRACTION",
    "POLICY_WINDOW_COST",
    "ROLLOUT_PLOT",
    "loss_term",
    "optim",
    "sysid",
    "task",
]

EPISODE_RETURN = "episode/return"
"""A policy's mean return over whole episodes from the env's own starts (its evaluation
parameters, no exploration noise): before training (step 0), every few log steps and at
the end; the figure of the done line, ``summary.json``'s ``episodes`` and the sweep report."""
EPISODE_UPRIGHT = "episode/upright_fraction"
"""The same episodes' share of steps with the pole upright (an env that defines it)."""
EPISODE_LOSS = "episode/loss"
"""The same episodes' loss (the configured loss over the whole horizon)."""

LOSS_TOTAL = "loss/total"
"""The loss of the iteration (what backward started from)."""
LOSS_BEST = "loss/best"
"""The lowest ``loss/total`` so far."""
LOSS_FINAL = "loss/final"
"""The final loss: the loss of the parameters a finished run ends with (after its last update),
from one more rollout; one point, at the last iteration's step. The same number as
``summary.json``'s ``final_loss``, the done line and the sweep report."""


def loss_term(name: str) -> str:
    """``loss/<term>``: one weighted term of the loss."""
    return f"loss/{name}"


# -- optim/: per parameter group ------------------------------------------------------------

GRAD_NORM_PRE = "grad_norm_pre"
"""Global L2 norm of the gradient after backward, before clipping."""
GRAD_NORM_POST = "grad_norm_post"
"""The same after clipping."""
CLIP_COEF = "clip_coef"
"""The factor the clip applied (1: untouched)."""
CLIPPED = "clipped"
"""1 when the step was clipped."""
CLIPPED_FRACTION = "clipped_fraction"
"""The share of the iterations so far that were clipped."""
SKIPPED = "skipped"
"""1 when the step made no update (non-finite gradient under ``clip.nonfinite=skip``)."""
GRAD_MAX_ABS = "grad_max_abs"
"""Largest finite |g| entry, pre-clip."""
NONFINITE = "nonfinite"
"""Number of nan/inf gradient entries, pre-clip."""
CLIP_THRESHOLD = "clip_threshold"
"""The norm limit of the step (global_norm, autoclip, zclip)."""
LR = "lr"
"""The learning rate the step applied."""
LR_SCALE = "lr_scale"
"""The clip-aware schedule's multiplier."""
LR_REDUCTIONS = "lr_reductions"
"""How often the clip-aware schedule lowered the rate."""
AVG_WEIGHT = "avg_weight"
"""ScheduleFree's averaging weight."""
PARAM_NORM = "param_norm"
"""L2 norm of the evaluated parameters (log steps)."""
UPDATE_RATIO = "update_ratio"
"""|delta param| / |param| of the step (log steps)."""


def optim(stat: str, group: str | None = None, param: str | None = None) -> str:
    """``optim/<stat>`` (one parameter group) or ``optim/<group>/<stat>``; with ``param``, the
    statistic of one named parameter: ``optim/grad_norm_pre/<param>``."""
    tag = f"optim/{stat}" if group is None else f"optim/{group}/{stat}"
    return f"{tag}/{param}" if param is not None else tag


def grad_hist(param: str, group: str | None = None) -> str:
    """The histogram of one parameter's pre-clip gradient."""
    return optim("grad_hist", group, param)


# -- perf/, through_time/ ---------------------------------------------------------

PERF_ITER_MS = "perf/iter_ms"
"""Host milliseconds an iteration of the log interval took, on average; time a callback set
aside (:meth:`harness.training.loop.Loop.set_aside`: an episode evaluation) not counted."""
PERF_EPISODES_MS = "perf/episodes_ms"
"""Host milliseconds one evaluation of a policy's whole episodes took (at the steps of
``episode/``)."""
PERF_ENV_STEPS_PER_S = "perf/env_steps_per_s"
"""Simulation steps x worlds per second."""
ROLLOUT_PLOT = "loss/rollout"
"""The image of every per-step observable against time: in the ``loss/`` group, which
TensorBoard opens first, beside the curves of the loss those observables make up."""
ADJOINT_CLIPPED = "through_time/clipped"
"""1 when the in-backward clip rescaled any step's state adjoint."""
ADJOINT_NORM_MAX = "through_time/norm_max"
ADJOINT_NORM_FIRST = "through_time/norm_first"
ADJOINT_GROWTH = "through_time/growth_per_100_steps"
ADJOINT_CLIPPED_FRACTION = "through_time/clipped_fraction"
ADJOINT_HISTOGRAM = "through_time/log10_norm_pre"
ADJOINT_PROFILE = "through_time/profile"

# -- tasks ------------------------------------------------------------------------------------

DIAGNOSE_SNR = "diagnose/snr"
"""``diagnose.every``: the measures of :mod:`harness.diagnose` at the current parameters."""
DIAGNOSE_SNR_BATCH = "diagnose/snr_batch"
"""The snr of a training batch's mean gradient (parameters the worlds share only)."""
DIAGNOSE_ZO_COSINE = "diagnose/zo_cosine"
DIAGNOSE_GRAD_NORM_MEDIAN = "diagnose/grad_norm_median"
DIAGNOSE_FD_REL_ERROR = "diagnose/fd_rel_error"
DIAGNOSE_BATCH_GRAD_NORM_P90 = "diagnose/batch_grad_norm_p90"
DIAGNOSE_TRUSTED = "diagnose/trusted"

POLICY_WINDOW_COST = "policy/window_cost"
"""``task=policy``: the loss of the iteration's training window."""
POLICY_ACTIONS = "policy/actions"
"""Histogram of the latest training rollout's actions."""
POLICY_ACTION_ABS_MEAN = "policy/action_abs_mean"
POLICY_SATURATED_FRACTION = "policy/saturated_fraction"
"""The share of actions within 1% of the policy's largest action."""


def sysid(quantity: str, index: str = "") -> str:
    """``sysid/<quantity>/<index>``: one fitted value after the iteration's step."""
    return f"sysid/{quantity}{index}"


def task(task_name: str, name: str) -> str:
    """``<task>/<name>``: a scalar a task logs (``shac/critic_loss``)."""
    return f"{task_name}/{name}"
