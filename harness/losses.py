"""Loss terms over rollout observables, and their weighted sum.

A term reads one observable of shape (steps, worlds, dim) and reduces it to a scalar;
the loss is ``sum_k weight_k * term_k``. Every term is normalised by the number of steps
and worlds it covers, so weights do not need retuning when the horizon or the world
count changes. Each term's weighted value is kept in its own entry of a device array
(``term_values``) for logging; the total is a one-element device array that
``Tape.backward`` starts from.

A kind of term is a :class:`TermKind`: a ``wp.func`` giving the weighted penalty of one
entry's difference from its target, from which the harness makes the kernels (the loss's
term, and per step and world for tasks that need a cost per step, SHAC's rewards). The
built-in kinds are ``quadratic``, ``reference``, ``linear`` (an observable that is a cost
already: the drone's, the bear's) and ``reward`` (minus the entry: a reward an env records,
maximised); a kind of your own lives in your own
module and is named in a loss config by its dotted path (``kind: my_terms.huber``), as an
env is named by its ``_target_``, or registered by name with :func:`register_term_kind`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import warp as wp

from harness import schema
from harness.schema import field


@wp.kernel
def _sum_terms(term_values: wp.array(dtype=wp.float32), term_count: int, total: wp.array(dtype=wp.float32)):
    acc = float(0.0)  # noqa: UP018  (a dynamic Warp variable, mutated in the loop)
    for k in range(term_count):
        acc += term_values[k]
    total[0] = acc


def _term_kernel(penalty: Any) -> Any:
    """The kernel adding ``sum penalty(scale * dim_weights[d], x - target)`` over the covered
    steps, worlds and dimensions into ``term_values[term]``; the target is one row ``(1, 1,
    dim)`` (``per_step`` 0) or a whole recorded trajectory ``(steps, worlds, dim)`` (``per_step`` 1)."""

    @wp.kernel(module="unique")
    def term_kernel(
        x: wp.array3d(dtype=wp.float32),
        first_step: int,
        dim_weights: wp.array(dtype=wp.float32),
        target: wp.array3d(dtype=wp.float32),
        per_step: int,
        scale: float,
        term: int,
        term_values: wp.array(dtype=wp.float32),
    ):
        t, w, d = wp.tid()
        step = first_step + t
        diff = x[step, w, d] - target[step * per_step, w * per_step, d]
        wp.atomic_add(term_values, term, penalty(scale * dim_weights[d], diff))

    return term_kernel


def _step_cost_kernel(penalty: Any) -> Any:
    """The kernel adding ``penalty(weight * dim_weights[d], x - target)`` of every step and
    world into ``cost[t, w]`` (no average over steps and worlds)."""

    @wp.kernel(module="unique")
    def step_cost_kernel(
        x: wp.array3d(dtype=wp.float32),
        dim_weights: wp.array(dtype=wp.float32),
        target: wp.array3d(dtype=wp.float32),
        per_step: int,
        weight: float,
        cost: wp.array2d(dtype=wp.float32),
    ):
        t, w, d = wp.tid()
        diff = x[t, w, d] - target[t * per_step, w * per_step, d]
        wp.atomic_add(cost, t, w, penalty(weight * dim_weights[d], diff))

    return step_cost_kernel


class TermKind:
    """A kind of loss term (module docstring).

    Args:
        name: How configs name it when registered (``quadratic``); a kind of your own is named
            by its dotted path instead (``my_terms.huber``).
        penalty: A ``wp.func`` ``(weight: float, diff: float) -> float``: the weighted penalty of
            one entry whose difference from its target is ``diff`` (quadratic: ``weight * diff * diff``).
            Differentiable in ``diff``; the harness sums it over steps, worlds and dimensions.
        reference: The target is a recorded trajectory (``task=sysid`` supplies it) instead of
            the term's fixed ``target``.
        doc: One line: what it computes.
    """

    def __init__(self, name: str, penalty: Any, *, reference: bool = False, doc: str = ""):
        if not isinstance(penalty, wp.Function):
            raise TypeError(f"TermKind '{name}': penalty must be a wp.func (weight: float, diff: float) -> float")
        self.name, self.penalty, self.reference, self.doc = name, penalty, reference, doc
        self._kernels: dict[str, Any] = {}

    def kernel(self, which: str) -> Any:
        """The kernel of the loss's term (``term``) or of the cost per step (``step_cost``), made once."""
        if which not in self._kernels:
            self._kernels[which] = (_term_kernel if which == "term" else _step_cost_kernel)(self.penalty)
        return self._kernels[which]

    def __repr__(self) -> str:
        return f"TermKind({self.name!r})"


@wp.func
def _quadratic(weight: float, diff: float) -> float:
    return weight * diff * diff


@wp.func
def _linear(weight: float, diff: float) -> float:
    return weight * diff


TERM_KINDS: dict[str, TermKind] = {}
"""Kinds by the name a config may use without a dotted path."""


def register_term_kind(kind: TermKind) -> TermKind:
    """Make ``kind`` available by its name (``kind: <name>`` in a loss config); returns it."""
    if not isinstance(kind, TermKind):
        raise TypeError(f"register_term_kind: expected a harness.losses.TermKind, got {type(kind).__name__}")
    TERM_KINDS[kind.name] = kind
    return kind


@wp.func
def _reward(weight: float, diff: float) -> float:
    return -weight * diff


register_term_kind(TermKind("quadratic", _quadratic, doc="weight * (x - target)^2"))
register_term_kind(TermKind("reward", _reward, doc="-weight * (x - target): a reward to maximise, as a cost"))
register_term_kind(TermKind("reference", _quadratic, reference=True, doc="weight * (x - recorded x)^2"))
register_term_kind(TermKind("linear", _linear, doc="weight * (x - target): a cost the env computes itself"))

STEP_MODES = ("all", "last")


def term_kind(name: str, field: str) -> TermKind:
    """The kind a config names: a registered name, or the dotted path of a :class:`TermKind`
    object in an importable module (checked to be one before it is used).

    Raises:
        ValueError: One line naming ``field`` and what is accepted.
    """
    if name in TERM_KINDS:
        return TERM_KINDS[name]
    accepted = f"accepted: {', '.join(TERM_KINDS)}, or module.name of a harness.losses.TermKind"
    module_name, _, attribute = str(name).rpartition(".")
    if not module_name:
        raise ValueError(f"{field}: '{name}' is not a term kind; {accepted}")
    import importlib

    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:
        raise ValueError(f"{field}: cannot import '{name}' ({type(exc).__name__}: {exc}); {accepted}") from None
    if not isinstance(found, TermKind):
        raise ValueError(f"{field}: '{name}' is a {type(found).__name__}, not a harness.losses.TermKind; {accepted}")
    return found


@dataclasses.dataclass(frozen=True)
class LossTerm:
    """One weighted term of the loss.

    Attributes:
        name: Tag suffix in logs (``loss/<name>``).
        source: Observable it reads (``joint_q``, ``controls``, ...).
        weight: Multiplier of the term in the total.
        kind: ``quadratic``: mean over the covered steps and worlds of
            ``sum_d dim_weights[d] * (x[t, w, d] - target[d])**2``; ``reference``: the same
            with a recorded trajectory ``reference[t, w, d]`` in place of ``target[d]``
            (``task=sysid`` supplies it, :meth:`WeightedLoss.set_reference`); or another
            :class:`TermKind`'s penalty in place of the square (:func:`term_kind`).
        dim_weights: Per-dimension weights; all ones if empty.
        target: Per-dimension target values; zeros if empty.
        steps: ``all`` (running cost over the whole horizon) or ``last`` (final step only).
    """

    name: str = field()
    source: str = field()
    weight: float = field(1.0, minimum=0.0)
    kind: str = field("quadratic")
    dim_weights: tuple[float, ...] | None = field(())
    target: tuple[float, ...] | None = field(())
    steps: str = field("all", choices=STEP_MODES)


class WeightedLoss:
    """The weighted sum of :class:`LossTerm` s; built from ``configs/loss/*.yaml``.

    Args:
        terms: Mapping from term name to its fields (as in the YAML), or LossTerm objects.
    """

    def __init__(self, terms: Mapping[str, Mapping[str, Any]] | Sequence[LossTerm]):
        if isinstance(terms, Mapping):
            built = [
                schema.build(LossTerm, {"name": str(name), **dict(fields or {})}, prefix=f"loss.terms.{name}")
                for name, fields in terms.items()
            ]
        else:
            built = [schema.build(LossTerm, dataclasses.asdict(t), prefix=f"loss.terms.{t.name}") for t in terms]
        if not built:
            raise ValueError("loss.terms: at least one term is needed")
        self.terms = built
        self.kinds = [term_kind(t.kind, f"loss.terms.{t.name}.kind") for t in built]
        self._bound = False
        self._references: dict[str, wp.array] = {}

    @property
    def term_names(self) -> list[str]:
        return [t.name for t in self.terms]

    def check(self, observables: Mapping[str, int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Check every term against an env's observables (name -> per-world width).

        Returns:
            Per term, its per-dimension weights and target.

        Raises:
            ValueError: one line naming ``loss.terms.<name>.<field>`` and what is accepted.
        """
        resolved = []
        for term in self.terms:
            if term.source not in observables:
                raise ValueError(
                    f"loss.terms.{term.name}.source: '{term.source}' is not an observable of this env; "
                    f"accepted: {sorted(observables)}"
                )
            dim = observables[term.source]
            weights = _per_dim(term.dim_weights, dim, 1.0, f"loss.terms.{term.name}.dim_weights")
            target = _per_dim(term.target, dim, 0.0, f"loss.terms.{term.name}.target")
            resolved.append((weights, target))
        return resolved

    def requested(self) -> dict[str, str]:
        """The observables the terms read: ``all`` when any term covers every step, else ``last``."""
        wanted: dict[str, str] = {}
        for term in self.terms:
            if term.steps == "all" or wanted.get(term.source) == "all":
                wanted[term.source] = "all"
            else:
                wanted[term.source] = "last"
        return wanted

    def bind(self, observables: Mapping[str, int], *, device: wp.context.Devicelike = None) -> None:
        """Check every term against the env's observables and allocate device buffers."""
        resolved = self.check(observables)
        self.device = wp.get_device(device)
        self._dim_weights = [wp.array(w, dtype=wp.float32, device=self.device) for w, _ in resolved]
        self._targets = [wp.array(t.reshape(1, 1, -1), dtype=wp.float32, device=self.device) for _, t in resolved]
        self.term_values = wp.zeros(len(self.terms), dtype=wp.float32, device=self.device, requires_grad=True)
        self.total = wp.zeros(1, dtype=wp.float32, device=self.device, requires_grad=True)
        self._bound = True

    @property
    def reference_terms(self) -> list[LossTerm]:
        """The terms that compare with a recorded trajectory (kind ``reference``)."""
        return [t for t, kind in zip(self.terms, self.kinds, strict=True) if kind.reference]

    def set_reference(self, name: str, reference: wp.array) -> None:
        """The recorded trajectory term ``name`` compares with, float32 ``(steps, worlds, dim)``
        of the shape its observable has in a rollout."""
        self._references[name] = reference

    def zero(self) -> None:
        """Zero the values and gradients of the term and total buffers."""
        for array in (self.term_values, self.total):
            array.zero_()
            array.grad.zero_()

    def __call__(self, trajectory: Mapping[str, wp.array]) -> wp.array:
        """Record the loss of a trajectory; returns the one-element total (call :meth:`zero` first)."""
        if not self._bound:
            raise RuntimeError("WeightedLoss.bind() must be called before evaluating the loss")
        for k, (term, kind) in enumerate(zip(self.terms, self.kinds, strict=True)):
            x = trajectory[term.source]
            steps, worlds, dim = x.shape
            first = steps - 1 if term.steps == "last" else 0
            covered = steps - first
            if kind.reference:
                target = self._references.get(term.name)
                if target is None or tuple(target.shape) != (steps, worlds, dim):
                    raise RuntimeError(
                        f"loss.terms.{term.name}: kind reference needs a recorded trajectory of shape "
                        f"{(steps, worlds, dim)} (task=sysid supplies it)"
                    )
            else:
                target = self._targets[k]
            wp.launch(
                kind.kernel("term"),
                dim=(covered, worlds, dim),
                inputs=[
                    x,
                    first,
                    self._dim_weights[k],
                    target,
                    int(kind.reference),
                    term.weight / (covered * worlds),
                    k,
                ],
                outputs=[self.term_values],
                device=self.device,
            )
        wp.launch(
            _sum_terms, dim=1, inputs=[self.term_values, len(self.terms)], outputs=[self.total], device=self.device
        )
        return self.total

    def step_costs(self, trajectory: Mapping[str, wp.array], out: wp.array) -> wp.array:
        """Record the weighted cost of every row and world, ``out[t, w] = sum_k weight_k * sum_d
        penalty_k(dim_weights_k[d], x_k[t, w, d] - target_k[d])``, float32 ``(rows, worlds)``: the
        loss before its average over steps and worlds (a reward per step is its negative). A term
        that reads the ``last`` step only adds at the last row. ``out`` is zeroed first."""
        if not self._bound:
            raise RuntimeError("WeightedLoss.bind() must be called before evaluating the loss")
        out.zero_()
        rows = out.shape[0]
        for k, (term, kind) in enumerate(zip(self.terms, self.kinds, strict=True)):
            x = trajectory[term.source]
            steps, worlds, dim = x.shape
            if term.steps == "last":
                x, at = x[steps - 1 : steps], out[rows - 1 : rows]
            else:
                at = out
            target = self._references.get(term.name) if kind.reference else self._targets[k]
            if kind.reference and term.steps == "last":
                target = target[steps - 1 : steps]
            wp.launch(
                kind.kernel("step_cost"),
                dim=(x.shape[0], worlds, dim),
                inputs=[x, self._dim_weights[k], target, int(kind.reference), term.weight],
                outputs=[at],
                device=self.device,
            )
        return out


def _per_dim(values: Sequence[float] | None, dim: int, default: float, field: str) -> np.ndarray:
    if values is None or len(values) == 0:  # empty or null in the YAML: the default
        return np.full(dim, default, dtype=np.float32)
    if len(values) != dim:
        raise ValueError(f"{field}: needs {dim} values for this observable, got {len(values)}")
    return np.asarray(values, dtype=np.float32)
