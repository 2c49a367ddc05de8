"""Registries of factories a config's ``_target_`` may name: the optimizers
(:data:`harness.optim.OPTIMIZERS`), clip policies (:data:`harness.clip.CLIP_POLICIES`) and
schedules (:data:`harness.schedules.SCHEDULES`), which :mod:`harness.targets` checks a
``_target_`` against. This module imports nothing of the harness, so each of them can use it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register_factory"]


def register_factory(registry: dict[str, Any], factory: Any, register: str, returns: str) -> Any:
    """Add ``factory`` to ``registry`` under its ``__name__`` (what ``register_optimizer``,
    ``register_clip_policy`` and ``register_schedule`` do); returns it, so they can decorate.
    Registering the same dotted path again (its module was reloaded) replaces the entry.

    Raises:
        ValueError: ``factory`` is not callable, or a factory of another path holds its name.
    """
    name = getattr(factory, "__name__", None)
    if not callable(factory) or not isinstance(name, str):
        raise ValueError(f"{register}: expected a function that returns {returns}, got {factory!r}")
    held = registry.get(name)
    if held is not None and _dotted(held) != _dotted(factory):
        raise ValueError(
            f"{register}: the name '{name}' is taken by {_dotted(held)}; accepted: a factory with another name"
        )
    registry[name] = factory
    return factory


def _dotted(factory: Any) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', '?')}"
