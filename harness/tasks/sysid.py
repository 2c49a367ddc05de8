"""System identification: fit an env's physical quantities to a recorded trajectory.

``task=sysid task.reference=traj.npz`` replays the recording's inputs (``controls``) from its
initial states, and fits the chosen quantities (cartpole: ``pole_masses``) so that the
simulated observables match the recorded ones: the loss is the mean squared difference per
observable, weighted by ``task.weights`` (kind ``reference`` terms of
:class:`harness.losses.WeightedLoss`); the env's own loss is not used. The run simulates the
recording's steps and worlds (its env.horizon and env.world_count are taken from the file)
and must have its dt. The file format is in :mod:`harness.trajectory`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import warp as wp

from harness import schema, tags
from harness.env import Env, EnvConfig
from harness.losses import LossTerm, WeightedLoss
from harness.params import ParamSet, ParamSpec, _inner_shape
from harness.tasks.quantities import TrainQuantities
from harness.trajectory import Reference, TrajectoryFileError, load_reference

__all__ = ["SystemId"]


@wp.kernel
def _broadcast(value: wp.array(dtype=wp.float32), count: int, out: wp.array(dtype=wp.float32)):
    i = wp.tid()
    out[i] = value[i % count]


MAX_LOGGED_ENTRIES = 32
"""Quantities with at most this many entries get one ``sysid/<name>/<index>`` curve per entry."""


class SystemId(TrainQuantities):
    """Fit named physical quantities to a recorded trajectory (see the module docstring).

    Args:
        reference: The trajectory file (``python -m harness record`` writes one).
        quantities: Names from the env's quantities; None: the env's default physical ones.
        lower: A further lower bound for every fitted quantity (None: the env's own).
        upper: A further upper bound (None: the env's own).
        weights: Observable name -> weight of its term in the fit; every observable in the
            file that is named here is fitted (e.g. ``{joint_q: 1.0, joint_qd: 0.01}``).
        shared: Fit one value of a per-world quantity for all worlds (the worlds are
            repeated experiments on one system, as the recording's are), rather than one
            per world.
    """

    window_key = "the recording's steps (harness record env.horizon=...)"

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class SysidArgs:
        """The fields besides the quantities' (``configs/task/sysid.yaml``), checked by :mod:`harness.schema`."""

        reference: str | None = schema.field()
        weights: dict[str, float] | None = schema.field(minimum=0.0)  # noqa: RUF009 (a dataclasses.field)
        shared: bool = schema.field()

        def check(self) -> None:
            if not self.reference:
                raise ValueError(
                    "reference: required; accepted: the path of a trajectory file written by python -m harness record"
                )

    def __init__(
        self,
        *,
        reference: str | None = None,
        quantities: Sequence[str] | None = None,
        lower: float | None = None,
        upper: float | None = None,
        weights: Mapping[str, float] | None = None,
        shared: bool = True,
    ):
        super().__init__(quantities=quantities, lower=lower, upper=upper, kind="physical")
        self.name = "sysid"
        args = schema.check(self.SysidArgs, "task", reference=reference, weights=weights, shared=shared)
        self.reference_path = str(args.reference)
        self.weights = dict(args.weights or {"joint_q": 1.0})
        self.shared = args.shared
        self.reference: Reference | None = None
        self._device_reference: dict[str, Any] = {}
        self._broadcast: dict[tuple[int, str], wp.array] = {}
        self._shared_names: set[str] = set()

    # -- checks, before anything is built -------------------------------------------------

    def check_env(self, env_name: str, config: EnvConfig) -> None:
        try:
            self.reference = load_reference(
                self.reference_path,
                env=env_name,
                dt=float(getattr(config, "dt", float("nan"))),
                observables=config.observable_dims(),
                action_dim=config.action_dim(),
            )
        except TrajectoryFileError as exc:
            raise ValueError(str(exc)) from None
        fitted = [name for name, w in self.weights.items() if name in self.reference.observed and w > 0]
        if not fitted:
            raise ValueError(
                f"task.weights: names none of the observables in '{self.reference_path}'; "
                f"accepted: {sorted(self.reference.observed)}"
            )

    def training_config(self, config: EnvConfig) -> EnvConfig:
        """The recording's steps and worlds."""
        if self.reference is None:
            return config
        return dataclasses.replace(config, horizon=self.reference.steps, world_count=self.reference.worlds)

    def evaluation_config(self, config: EnvConfig) -> EnvConfig:
        return self.training_config(config)

    def check(self, config: EnvConfig) -> None:
        if self.reference is not None:
            config = self.training_config(config)
        super().check(config)

    def _shared(self, config: EnvConfig) -> set[str]:
        """The quantities fitted as one value for every world."""
        if not self.shared:
            return set()
        return {name for name, q in self.chosen(config).items() if q.per_world and q.dtype is wp.float32}

    def parameter_shapes(self, config: EnvConfig) -> dict[str, tuple[int, ...]]:
        config = self.training_config(config)
        shapes = super().parameter_shapes(config)
        return {name: shape[1:] if name in self._shared(config) else shape for name, shape in shapes.items()}

    def parameter_specs(self, env: Env) -> list[ParamSpec]:
        shared = self._shared(env.config)
        self._shared_names = set(shared)
        specs = []
        for spec in super().parameter_specs(env):
            if spec.name in shared:  # the worlds' mean as the start (they start equal: the env as built)
                init = np.asarray(spec.init, dtype=np.float32).mean(axis=0)
                spec = dataclasses.replace(spec, shape=spec.shape[1:], init=init, world_axis=None)
            specs.append(spec)
        return specs

    def summary(self, values: dict[str, np.ndarray]) -> dict[str, Any]:
        found = super().summary(values)
        found["parameters_shared"] = sorted(self._shared_names)
        return found

    def replace_loss(self, configured: WeightedLoss) -> WeightedLoss:
        """The fit: one ``reference`` term per weighted observable of the recording."""
        assert self.reference is not None, "check_env() comes first"
        terms = [
            LossTerm(name=name, source=name, weight=weight, kind="reference")
            for name, weight in self.weights.items()
            if name in self.reference.observed and weight > 0
        ]
        return WeightedLoss(terms)

    # -- the rollout -----------------------------------------------------------------------

    def attach(self, env: Env, loss: WeightedLoss) -> None:
        ref = self.reference
        assert ref is not None
        if env.world_count != ref.worlds or env.horizon > ref.steps:  # a shorter env compares the first steps
            raise ValueError(
                f"task.reference: '{ref.path}' holds {ref.steps} step{'s' * (ref.steps != 1)} x "
                f"{ref.worlds} world{'s' * (ref.worlds != 1)}; "
                f"the env has {env.horizon} x {env.world_count}"
            )
        device = env.device
        initial = env.initial_state()
        steps = env.horizon  # the recording's first steps (harness diagnose measures shorter horizons)
        arrays: dict[str, Any] = {"controls": wp.array(ref.controls[:steps], dtype=wp.float32, device=device)}
        for name, value in ref.initial.items():
            if (
                name not in initial
                or initial[name].size * int(np.prod(_inner_shape(initial[name].dtype))) != value.size
            ):
                raise ValueError(
                    f"task.reference: '{ref.path}': initial/{name} has {value.shape[1]} entries per world; "
                    f"the env's initial state is {sorted(initial)}"
                )
            flat = np.ascontiguousarray(value).reshape(initial[name].shape + _inner_shape(initial[name].dtype))
            arrays[f"initial/{name}"] = wp.array(flat, dtype=initial[name].dtype, device=device)
        for term in loss.reference_terms:
            reference = wp.array(ref.observed[term.source][:steps], dtype=wp.float32, device=device)
            arrays[f"obs/{term.source}"] = reference
            loss.set_reference(term.name, reference)
        self._device_reference[id(env)] = arrays

    def begin(self, env: Env, params: ParamSet) -> None:
        arrays = self._device_reference[id(env)]
        initial = env.initial_state()
        for key, value in arrays.items():
            if key.startswith("initial/"):
                wp.copy(initial[key[8:]], value)
        shared = self._shared(env.config)
        for name in self.chosen(env.config):
            value = params[name]
            if name in shared:  # one value for every world: broadcast (a recorded launch)
                full = self._broadcast.get((id(env), name))
                if full is None:
                    shape = self.chosen(env.config)[name].shape
                    full = wp.zeros(shape, dtype=wp.float32, device=env.device, requires_grad=True)
                    self._broadcast[(id(env), name)] = full
                wp.launch(
                    _broadcast, dim=full.size, inputs=[value.flatten(), value.size], outputs=[full.flatten()],
                    device=env.device,
                )  # fmt: skip
                value = full
            env.set_quantity(name, value)
        env.reset()

    def zero_grad(self, env: Env) -> None:
        for (env_id, _), full in self._broadcast.items():
            if env_id == id(env):
                full.grad.zero_()

    def act(self, env: Env, params: ParamSet, t: int) -> None:
        env.act(t, self._device_reference[id(env)]["controls"])

    def columns(self, params: ParamSet, loss: WeightedLoss) -> list[tuple[str, wp.array, int]]:
        """``sysid/<quantity>/<index>``: every fitted entry's value after each iteration's
        step (quantities of at most :data:`MAX_LOGGED_ENTRIES` entries)."""
        found = []
        for spec, segment in zip(params.specs, params.segments, strict=True):
            if segment.length > MAX_LOGGED_ENTRIES:
                continue
            shape = spec.shape + _inner_shape(spec.dtype)
            for flat, index in enumerate(np.ndindex(*shape)):
                suffix = "/" + ".".join(str(i) for i in index) if index else ""
                found.append((tags.sysid(spec.name, suffix), params.data, segment.offset + flat))
        return found
