"""Typed config sections as dataclasses, checked field by field with one-line errors.

The one module that checks values: this module owns the rule for turning a mapping of
values (a YAML section after Hydra's composition, or a factory's keyword arguments) into a
dataclass instance: unknown fields, wrong types and values out of range are refused with
one line naming the field (``env.horizon: must be an integer >= 1, got 0``). A field states
its range in its metadata with :func:`field`; the type comes from its annotation (``int``,
``float``, ``bool``, ``str``, ``tuple[float, ...]``, ``dict[str, float]`` or ``X | None``).

The schemas: an env's ``Config`` (:class:`harness.env.EnvConfig`), the loop's
:class:`~harness.config.TrainSettings` (the top level of ``configs/train.yaml``),
a loss term (:class:`~harness.losses.LossTerm`), the tasks' ``Args``, and the arguments of
every optimizer (:mod:`harness.optim`), schedule (:mod:`harness.schedules`) and clip
policy (:mod:`harness.clip.policies`), which their factories check whether Hydra or Python
code calls them (:func:`checked`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["SchemaError", "build", "check", "check_field", "checked", "field"]


class SchemaError(ValueError):
    """A value that does not fit its schema; the message is one line naming the field."""


def field(
    default: Any = dataclasses.MISSING,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
    strict_maximum: bool = False,
    finite: bool = True,
    choices: Sequence[Any] | None = None,
    length: int | None = None,
    key: str | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with its accepted range.

    Args:
        default: Default value (a list or tuple default is stored as a tuple).
        minimum: Smallest accepted value (each entry, for a tuple).
        maximum: Largest accepted value.
        strict: ``minimum`` itself is refused (``> minimum``).
        strict_maximum: ``maximum`` itself is refused (``< maximum``).
        finite: A float must be finite; False accepts ``inf`` (``.inf`` in YAML).
        choices: The only accepted values (compared with their type: ``1`` is not ``true``).
        length: Required number of entries of a tuple.
        key: Where the value sits in the section, when not at the field's name
            (``checkpoint.every`` for ``TrainSettings.checkpoint_every``).
        doc: One line for the docs and ``--help``.
    """
    if isinstance(default, list):
        default = tuple(default)
    meta = {
        "minimum": minimum,
        "maximum": maximum,
        "strict": strict,
        "strict_maximum": strict_maximum,
        "finite": finite,
        "choices": choices,
        "length": length,
        "key": key,
        "doc": doc,
    }
    return dataclasses.field(default=default, metadata=meta)


def _kind(annotation: Any) -> tuple[type, bool, type]:
    """(base type, whether None is accepted, entry type of a tuple) of a field annotation."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else annotation
        origin = typing.get_origin(annotation)
    if origin in (tuple, list, Sequence):
        entries = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return tuple, optional, entries[0] if entries else float
    if origin in (dict, Mapping):
        args = typing.get_args(annotation)
        return dict, optional, args[1] if len(args) == 2 else float
    return annotation, optional, float


def _number_text(value: float) -> str:
    return f"{value:g}"


def _choice_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _check_value(name: str, value: Any, kind: type, meta: Mapping[str, Any], entry: type = float) -> Any:
    lo, hi, strict, choices = meta.get("minimum"), meta.get("maximum"), meta.get("strict"), meta.get("choices")
    strict_hi = meta.get("strict_maximum", False)
    if choices is not None:
        if not any(value == c and type(value) is type(c) for c in choices):
            names = [_choice_text(c) for c in choices]
            accepted = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
            raise SchemaError(f"{name}: expected {accepted}, got {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise SchemaError(f"{name}: must be true or false, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise SchemaError(f"{name}: must be a string, got {value!r}")
        return value
    if kind is tuple:
        what = "integers" if entry is int else "numbers"
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise SchemaError(f"{name}: must be a list of {what}, got {value!r}")
        if meta.get("length") is not None and len(value) != meta["length"]:
            raise SchemaError(f"{name}: needs {meta['length']} {what}, got {len(value)}")
        return tuple(_check_value(f"{name}[{i}]", v, entry, meta) for i, v in enumerate(value))
    if kind is dict:
        if not isinstance(value, Mapping):
            raise SchemaError(f"{name}: must be a mapping of names to numbers, got {value!r}")
        return {str(k): _check_value(f"{name}.{k}", v, entry, meta) for k, v in value.items()}
    if kind in (int, float):
        is_int = isinstance(value, int) and not isinstance(value, bool)
        is_number = is_int or isinstance(value, float)
        finite = meta.get("finite", True)
        what = "an integer" if kind is int else ("a finite number" if finite else "a number")
        bound = _bound_text(lo, hi, strict, strict_hi)
        if not (
            is_int if kind is int else is_number and (math.isfinite(value) or (not finite and not math.isnan(value)))
        ):
            raise SchemaError(f"{name}: must be {what}{bound}, got {value!r}")
        below = lo is not None and not (value > lo if strict else value >= lo)  # nan is below
        above = hi is not None and (value >= hi if strict_hi else value > hi)
        if below or above:
            raise SchemaError(f"{name}: must be {what}{bound}, got {value!r}")
        return int(value) if kind is int else float(value)
    return value


def _bound_text(lo: float | None, hi: float | None, strict: bool, strict_hi: bool = False) -> str:
    parts = []
    if lo is not None:
        parts.append(f"{'>' if strict else '>='} {_number_text(lo)}")
    if hi is not None:
        parts.append(f"{'<' if strict_hi else '<='} {_number_text(hi)}")
    return (" " + " and ".join(parts)) if parts else ""


def _lookup(values: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of a dotted ``key`` in nested ``values``."""
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def build(schema: type, values: Mapping[str, Any], *, prefix: str, ignore: Sequence[str] = ()) -> Any:
    """Check ``values`` against the dataclass ``schema`` and return the instance.

    Args:
        schema: A dataclass whose fields were declared with :func:`field` (or plain defaults).
        values: The section's values; missing fields take their defaults. A field declared
            with ``key="a.b"`` is read from ``values["a"]["b"]``.
        prefix: The section's name in messages (``env``; empty for the top level).
        ignore: Keys of ``values`` that belong to other schemas (the config groups, at the top level).

    Raises:
        SchemaError: One line naming ``<prefix>.<field>`` and what is accepted, for an
            unknown field, a missing required one, a wrong type or a value out of range.
    """
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    keys = {name: f.metadata.get("key") or name for name, f in fields.items()}
    lead = f"{prefix}." if prefix else ""
    known = {key.split(".")[0] for key in keys.values()} | set(ignore)
    unknown = sorted(set(values) - known)
    if unknown:
        accepted = ", ".join(dict.fromkeys(key.split(".")[0] for key in keys.values()))
        raise SchemaError(f"{prefix or 'config'}: unknown field '{unknown[0]}'; accepted: {accepted}")
    nested: dict[str, set[str]] = {}  # parent -> the leaves declared under it (checkpoint -> every, keep)
    for key in keys.values():
        if "." in key:
            parent, leaf = key.rsplit(".", 1)
            nested.setdefault(parent, set()).add(leaf)
    for parent, leaves in nested.items():
        found, node = _lookup(values, parent)
        if not found:
            continue
        accepted = ", ".join(sorted(leaves))
        if not isinstance(node, Mapping):
            raise SchemaError(f"{lead}{parent}: must be a mapping ({accepted}), got {node!r}")
        extra = sorted(set(node) - leaves)
        if extra:
            raise SchemaError(f"{lead}{parent}: unknown field '{extra[0]}'; accepted: {accepted}")
    hints = typing.get_type_hints(schema)
    checked = {}
    for name, f in fields.items():
        found, value = _lookup(values, keys[name])
        label = f"{lead}{keys[name]}"
        if not found:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{label}: is required")
            continue
        kind, optional, entry = _kind(hints[name])
        if value is None:
            if not optional:
                raise SchemaError(f"{label}: must not be null")
            checked[name] = None
            continue
        checked[name] = _check_value(label, value, kind, f.metadata, entry)
    instance = schema(**checked)
    method = getattr(instance, "check", None)
    if method is not None:
        try:
            method()
        except SchemaError:
            raise
        except ValueError as exc:
            raise SchemaError(f"{lead}{exc}") from None
    return instance


def check_field(schema: type, name: str, value: Any, label: str) -> None:
    """Check one ``value`` against the field ``name`` of ``schema`` alone (its type and range).

    Raises:
        SchemaError: One line naming ``label``; KeyError when ``schema`` has no such field.
    """
    found = {f.name: f for f in dataclasses.fields(schema) if f.init}
    by_key = {f.metadata.get("key") or f.name: f for f in found.values()}
    f = by_key.get(name) or found[name]
    kind, optional, entry = _kind(typing.get_type_hints(schema)[f.name])
    if value is None:
        if not optional:
            raise SchemaError(f"{label}: must not be null")
        return
    _check_value(label, value, kind, f.metadata, entry)


def check(schema: type, prefix: str, **values: Any) -> Any:
    """:func:`build` for a factory's keyword arguments: ``check(AdamArgs, "optim", lr=lr, ...)``."""
    return build(schema, values, prefix=prefix)


def checked(schema: type, prefix: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a factory (or an ``__init__``) whose arguments are the fields of ``schema``:
    every call's arguments (defaults included) are checked by :func:`build` and the factory
    receives the checked values (``1`` for a float field arrives as ``1.0``, a list as a tuple).

    Raises (from the decorated factory):
        SchemaError: One line naming ``<prefix>.<field>`` and what is accepted.
    """

    def decorate(factory: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(factory)

        @functools.wraps(factory)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            owner = (arguments.pop("self"),) if "self" in arguments else ()
            values = build(schema, arguments, prefix=prefix)
            return factory(*owner, **{f.name: getattr(values, f.name) for f in dataclasses.fields(values)})

        return wrapper

    return decorate
