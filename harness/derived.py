"""Errors in a derived value name the key the user typed.

Some config values are interpolations of others: ``env.horizon:
${harness.mul:${env.frames},${env.substeps}}`` (configs/env/bear.yaml), ``iterations:
${env.frames}`` under ``task=mpc``, ``task.window: ${harness.div:${env.horizon},2}`` under
``task=policy``, a decay schedule's ``decay_steps: ${iterations}``. When such a value is
refused, the one-line error would name a key the command line never set (``+env=bear
env.frames=-3`` said ``env.horizon: must be an integer >= 1, got -240``). :func:`blame`
rewrites it to name the key that was typed, the value typed, and what is accepted:

- the typed key's own rule, where its schema refuses the value
  (``env.frames: must be an integer >= 1, got -3 (env.horizon = env.frames x env.substeps)``);
- otherwise the derivation and the refused value's rule
  (``env.horizon: 1 makes task.window = env.horizon / 2 = 0, which is refused (task.window:
  must be an integer >= 1, got 0); accepted: ...``).

A message about a value that is not an interpolation, or whose sources the command line did
not set, is returned as it is. The rewrite is applied where a command line is checked
(:func:`harness.build.precheck`) and where a sweep's job checks its own config
(:func:`harness.build.validate`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["blame", "expression", "sources", "typed_keys"]

_REFERENCE = re.compile(r"\$\{\s*(\.*[A-Za-z_][\w.\-]*)\s*\}")
"""A plain reference (``${env.frames}``); a resolver call (``${harness.mul:...}``) has a colon."""

_OPERATORS = {"harness.mul": " x ", "harness.div": " / "}
"""How :func:`expression` writes the harness's arithmetic resolvers (harness/config.py)."""

_ABSENT = object()


def _raw(tree: Any, key: str) -> Any:
    """The unresolved value of dotted ``key`` in the plain container ``tree``, or ``_ABSENT``."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _references(key: str, value: str) -> list[str]:
    """The keys ``value`` (the interpolation stored at ``key``) refers to, relative ones made absolute."""
    found = []
    for name in _REFERENCE.findall(value):
        if name.startswith("."):  # ${.x} is a sibling, ${..x} the parent's sibling
            dots = len(name) - len(name.lstrip("."))
            parent = key.split(".")[:-dots] if dots else key.split(".")
            name = ".".join([*parent, name.lstrip(".")])
        found.append(name)
    return list(dict.fromkeys(found))


def _is_derived(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def sources(tree: Any, key: str) -> tuple[list[str], list[str]]:
    """(the keys ``key``'s value is derived from, that are not derived themselves; the derived
    keys met on the way, ``key`` first), following references through other interpolations."""
    leaves: list[str] = []
    chain: list[str] = []
    pending = [key]
    while pending:
        current = pending.pop(0)
        if current in chain:
            continue
        value = _raw(tree, current)
        if _is_derived(value):
            chain.append(current)
            pending.extend(_references(current, value))
        elif value is not _ABSENT and current not in leaves:
            leaves.append(current)
    return leaves, chain


def expression(value: str) -> str:
    """An interpolation as arithmetic: ``${harness.mul:${env.frames},${env.substeps}}`` ->
    ``env.frames x env.substeps``; other resolvers are left as written."""
    text = _REFERENCE.sub(lambda m: m.group(1), value)
    for name, operator in _OPERATORS.items():
        call = re.compile(r"\$\{\s*" + re.escape(name) + r":([^${}]*)\}")
        while call.search(text):
            text = call.sub(lambda m, op=operator: op.join(a.strip() for a in m.group(1).split(",")), text)
    return text


def typed_keys(overrides: Iterable[str]) -> list[str]:
    """The keys a list of override strings (``env.frames=0``, ``+env=bear``) sets."""
    return [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]


def blame(
    cfg: DictConfig,
    message: str,
    typed: Iterable[str],
    own_check: Callable[[str, Any], str | None] = lambda key, value: None,
) -> str:
    """``message`` (one line, ``<key>: ...``) rewritten to name the typed key ``<key>``'s value
    came from, when ``<key>`` is an interpolation of keys in ``typed``.

    Args:
        cfg: The composed config the message is about.
        message: The refusal.
        typed: The keys the command line set.
        own_check: ``(key, value) -> message or None``: the typed key's own rule, where it has one.
    """
    key, sep, rest = message.partition(": ")
    if not sep or " " in key:
        return message
    try:
        tree = OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # a config that does not convert: keep the message as it was
        return message
    if not _is_derived(_raw(tree, key)):
        return message
    leaves, chain = sources(tree, key)
    given = set(typed)
    chosen = [s for s in leaves if s in given]
    if not chosen:
        return message
    how = ", ".join(f"{k} = {expression(_raw(tree, k))}" for k in chain)
    values = {s: OmegaConf.select(cfg, s, default=None, throw_on_resolution_failure=False) for s in chosen}
    for source, value in values.items():
        own = own_check(source, value)
        if own:
            return f"{own} ({how})"
    if len(values) == 1:
        what = f"{_text(values[chosen[0]])} makes"
    else:
        what = " and ".join(f"{s}={_text(v)}" for s, v in values.items()) + " make"
    return (
        f"{chosen[0]}: {what} {how}, which is refused ({key}: {rest}); "
        f"accepted: {' and '.join(chosen)} such that {key} is accepted, or {key} set on the command line"
    )


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)
