"""What a config's ``_target_`` may name, checked before anything is called.

Hydra's ``instantiate`` imports whatever a ``_target_`` names and calls it, and so does the
harness when it builds a run: left alone, ``optim._target_=os.remove`` on a command line
would call ``os.remove``. This module resolves every ``_target_`` the harness builds from and
requires the object to be of the kind its config group needs, before it is called:

======================= ==============================================================
group                   accepted ``_target_``
======================= ==============================================================
``env``                 a subclass of :class:`harness.env.Env`
``task``                a subclass of :class:`harness.tasks.Task`
``loss``                :class:`harness.losses.WeightedLoss` or a subclass of it
``optim``               a factory of :data:`harness.optim.OPTIMIZERS`
                        (:func:`harness.optim.register_optimizer` adds one)
``clip``                a factory of :data:`harness.clip.CLIP_POLICIES`
                        (:func:`harness.clip.register_clip_policy` adds one)
``schedule``            a factory of :data:`harness.schedules.SCHEDULES`
                        (:func:`harness.schedules.register_schedule` adds one)
``hydra.callbacks.<n>`` a subclass of ``hydra.experimental.callback.Callback``
======================= ==============================================================

A factory is accepted by identity (the object itself is in the registry), so a path names
it under any module that holds it (``harness.clip.zclip`` and ``harness.clip.policies.zclip``).
A section without a ``_target_`` is refused. Hydra builds a ``_target_`` node nested in a
section's arguments before it calls the section's own, so nested nodes are checked too: in
``clip`` each must be a clip policy (the members of ``harness.clip.chain_clips``'s
``policies``, at any depth), in ``loss`` a :class:`harness.losses.LossTerm` (a term given as
an object); anywhere else one is refused. Below a node with ``_recursive_:
false`` Hydra builds nothing, so nothing there is looked at (SHAC's ``task.critic.optim`` is
built, and checked, as that parameter group's optimizer).

Resolving a path imports its module, as Hydra would, and importing a module runs its
top-level code: config files, the folders of ``HARNESS_CONFIG_PATH`` and the modules on the
Python path are trusted code. Loss term kinds (``loss.terms.<name>.kind``) are dotted paths
too, resolved and checked by :func:`harness.losses.term_kind`.

Every refusal is a :class:`TargetError`, one line naming the field and what is accepted;
:mod:`harness.build` and :mod:`harness.config` raise it as their ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["KINDS", "Kind", "TargetError", "check_callbacks", "check_section", "locate", "resolve"]


class TargetError(ValueError):
    """A ``_target_`` that cannot be resolved, or names an object of the wrong kind."""


@dataclasses.dataclass(frozen=True)
class Kind:
    """What one config group's ``_target_`` must name.

    Attributes:
        noun: What the object is, after "is not" in a refusal (``an optimizer``).
        accepts: Whether an object (already resolved, not called) is of this kind.
        accepted: The text after "accepted:" in a refusal.
        nests: The kind (a key of :data:`KINDS`) a ``_target_`` below the group's own must
            name (``clip``: the members of a chain; ``loss``: its terms), or None: refused.
    """

    noun: str
    accepts: Callable[[Any], bool]
    accepted: Callable[[], str]
    nests: str | None = None


def _subclass(module: str, name: str) -> Callable[[Any], bool]:
    """Whether an object is a subclass of ``module.name``. A class can subclass it only once
    ``module`` is imported, so the base is looked up in ``sys.modules`` and nothing is imported
    here (:mod:`harness.config`, below the tasks in the import graph, uses this module)."""

    def accepts(found: Any) -> bool:
        base = getattr(sys.modules.get(module), name, None)
        return isinstance(found, type) and isinstance(base, type) and issubclass(found, base)

    return accepts


def _member(registry: Callable[[], Mapping[str, Any]]) -> Callable[[Any], bool]:
    return lambda found: any(found is factory for factory in registry().values())


def _public_path(found: Any) -> str:
    """``found``'s dotted path, under the outermost package that holds the same object
    (``harness.clip.zclip``, not ``harness.clip.policies.zclip``); only modules already imported."""
    module, name = found.__module__, found.__qualname__
    while "." in module and "." not in name:
        parent = module.rpartition(".")[0]
        if getattr(sys.modules.get(parent), name, None) is not found:
            break
        module = parent
    return f"{module}.{name}"


def _listed(registry: Callable[[], Mapping[str, Any]], register: str) -> Callable[[], str]:
    return lambda: f"{', '.join(_public_path(f) for f in registry().values())}, or a factory registered with {register}"


def _optimizers() -> Mapping[str, Any]:
    from harness.optim import OPTIMIZERS

    return OPTIMIZERS


def _clip_policies() -> Mapping[str, Any]:
    from harness.clip.policies import CLIP_POLICIES

    return CLIP_POLICIES


def _schedules() -> Mapping[str, Any]:
    from harness.schedules import SCHEDULES

    return SCHEDULES


KINDS: dict[str, Kind] = {
    "env": Kind("an env", _subclass("harness.env", "Env"), lambda: "a harness.env.Env subclass"),
    "task": Kind("a task", _subclass("harness.tasks.base", "Task"), lambda: "a harness.tasks.Task subclass"),
    "loss": Kind(
        "a loss",
        _subclass("harness.losses", "WeightedLoss"),
        lambda: "harness.losses.WeightedLoss or a subclass of it",
        "loss_term",
    ),
    "loss_term": Kind(
        "a loss term", _subclass("harness.losses", "LossTerm"), lambda: "harness.losses.LossTerm or a subclass of it"
    ),
    "optim": Kind("an optimizer", _member(_optimizers), _listed(_optimizers, "harness.optim.register_optimizer")),
    "clip": Kind(
        "a clip policy", _member(_clip_policies), _listed(_clip_policies, "harness.clip.register_clip_policy"), "clip"
    ),
    "schedule": Kind("a schedule", _member(_schedules), _listed(_schedules, "harness.schedules.register_schedule")),
    "callback": Kind(
        "a Hydra callback",
        _subclass("hydra.experimental.callback", "Callback"),
        lambda: "a hydra.experimental.callback.Callback subclass",
    ),
}
"""The kind each group's ``_target_`` must name, by group (``callback``: each of ``hydra.callbacks``;
``loss_term``: a node nested in ``loss``)."""


def locate(path: str) -> Any:
    """The object a dotted path names, found as Hydra finds a ``_target_``: the first name is
    imported, then each next one is an attribute, or a submodule imported when it is not one.
    Nothing found is called; importing a module runs its top-level code.

    Raises:
        ImportError: A module cannot be imported or has no such attribute.
    """
    parts = path.split(".")
    if not path or any(not part for part in parts):
        raise ImportError(f"'{path}' is not a dotted path")
    found = importlib.import_module(parts[0])
    for k, part in enumerate(parts[1:], start=1):
        if hasattr(found, part):
            found = getattr(found, part)
            continue
        prefix = ".".join(parts[: k + 1])
        try:
            found = importlib.import_module(prefix)
        except ModuleNotFoundError as exc:
            if exc.name != prefix:  # the module exists and an import inside it failed
                raise
            raise ImportError(f"'{'.'.join(parts[:k])}' has no attribute '{part}'") from None
    return found


def resolve(group: str, target: Any, field: str) -> Any:
    """The object ``target`` names, checked to be of the kind ``group`` needs (:data:`KINDS`);
    nothing is called.

    Raises:
        TargetError: One line naming ``field`` and what is accepted.
    """
    kind = KINDS[group]
    if not isinstance(target, str):
        raise TargetError(f"{field}: expected a dotted path, got {target!r}; accepted: {kind.accepted()}")
    try:
        found = locate(target)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise TargetError(
            f"{field}: cannot import '{target}' ({type(exc).__name__}: {text[0] if text else ''}); "
            f"accepted: {kind.accepted()}"
        ) from None
    if not kind.accepts(found):
        raise TargetError(f"{field}: '{target}' is not {kind.noun}; accepted: {kind.accepted()}")
    return found


def check_section(group: str, section: Any, field: str | None = None) -> Any:
    """Check the ``_target_`` of a group's section and every ``_target_`` Hydra would build
    below it (module docstring), before anything is called. ``section`` is the section with its
    interpolations resolved, as it will be built.

    Args:
        group: The kind of object (a key of :data:`KINDS`).
        section: The section (a mapping).
        field: Its dotted name in messages (default: ``group``).

    Returns:
        The object the section's ``_target_`` names.

    Raises:
        TargetError: One line naming the field and what is accepted.
    """
    field = field or group
    if not isinstance(section, Mapping) or "_target_" not in section:
        raise TargetError(f"{field}._target_: required; accepted: {KINDS[group].accepted()}")
    found = resolve(group, section["_target_"], f"{field}._target_")
    if section.get("_recursive_", True):
        _check_nested(group, _arguments(section), field)
    return found


def _arguments(node: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    return ((str(key), value) for key, value in node.items() if key != "_target_")


def _check_nested(group: str, items: Iterable[tuple[str, Any]], parent: str) -> None:
    nested = KINDS[group].nests
    for key, value in items:
        field = f"{parent}.{key}"
        if isinstance(value, Mapping):
            if "_target_" in value:
                if nested is None:
                    raise TargetError(
                        f"{field}._target_: {value['_target_']!r} below {group}._target_ is refused; accepted: "
                        "plain values (a _target_ nests only in clip, as a chain's policies, and in loss, as terms)"
                    )
                resolve(nested, value["_target_"], f"{field}._target_")
                if not value.get("_recursive_", True):
                    continue
            _check_nested(group, _arguments(value), field)
        elif isinstance(value, (list, tuple)):
            _check_nested(group, ((str(k), item) for k, item in enumerate(value)), field)


def check_callbacks(callbacks: Mapping[str, Any] | None) -> None:
    """Check every ``hydra.callbacks.<name>`` that Hydra will build when the run starts: a
    ``Callback`` subclass, with no ``_target_`` nested in its arguments. ``callbacks`` is the
    node unresolved: a ``_target_`` that is an interpolation is refused (only Hydra's run resolves it).

    Raises:
        TargetError: One line naming ``hydra.callbacks.<name>._target_`` and what is accepted.
    """
    for name, params in (callbacks or {}).items():
        field = f"hydra.callbacks.{name}"
        target = params.get("_target_") if isinstance(params, Mapping) else None
        if isinstance(target, str) and "${" in target:
            raise TargetError(
                f"{field}._target_: '{target}' is an interpolation, resolved only when Hydra runs; "
                f"accepted: {KINDS['callback'].accepted()}, by its dotted path"
            )
        check_section("callback", params, field)
