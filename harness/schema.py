"""Typed config sections as dataclasses, checked field by field with one-line errors.

This module owns the rule for turning a mapping of values (a YAML section after Hydra's
composition) into a dataclass instance: unknown fields, wrong types and values out of
range are refused with one line naming the field (``env.horizon: must be an integer >= 1,
got 0``). A field states its range in its metadata with :func:`field`; the type comes
from its annotation (``int``, ``float``, ``bool``, ``str``, ``tuple[float, ...]``, or
``X | None``).

An env's schema is its ``Config`` dataclass (:class:`harness.env.EnvConfig`); the same
checks serve every other section that has a schema.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SchemaError", "build", "field"]


class SchemaError(ValueError):
    """A value that does not fit its schema; the message is one line naming the field."""


def field(
    default: Any = dataclasses.MISSING,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
    choices: Sequence[Any] | None = None,
    length: int | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with its accepted range.

    Args:
        default: Default value (a list or tuple default is stored as a tuple).
        minimum: Smallest accepted value (each entry, for a tuple).
        maximum: Largest accepted value.
        strict: ``minimum`` itself is refused (``> minimum``).
        choices: The only accepted values.
        length: Required number of entries of a tuple.
        doc: One line for the docs and ``--help``.
    """
    if isinstance(default, list):
        default = tuple(default)
    meta = {"minimum": minimum, "maximum": maximum, "strict": strict, "choices": choices, "length": length, "doc": doc}
    return dataclasses.field(default=default, metadata=meta)


def _kind(annotation: Any) -> tuple[type, bool]:
    """(base type, whether None is accepted) of a field annotation."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else annotation
        origin = typing.get_origin(annotation)
    if origin in (tuple, list, Sequence):
        return tuple, optional
    return annotation, optional


def _number_text(value: float) -> str:
    return f"{value:g}"


def _check_value(name: str, value: Any, kind: type, meta: Mapping[str, Any]) -> Any:
    lo, hi, strict, choices = meta.get("minimum"), meta.get("maximum"), meta.get("strict"), meta.get("choices")
    if choices is not None:
        if value not in choices:
            raise SchemaError(f"{name}: '{value}' is not accepted; accepted: {', '.join(map(str, choices))}")
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
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise SchemaError(f"{name}: must be a list of numbers, got {value!r}")
        if meta.get("length") is not None and len(value) != meta["length"]:
            raise SchemaError(f"{name}: needs {meta['length']} numbers, got {len(value)}")
        return tuple(_check_value(f"{name}[{i}]", v, float, meta) for i, v in enumerate(value))
    if kind in (int, float):
        is_int = isinstance(value, int) and not isinstance(value, bool)
        is_number = is_int or isinstance(value, float)
        what = "an integer" if kind is int else "a finite number"
        if not (is_int if kind is int else is_number and math.isfinite(value)):
            bound = _bound_text(lo, hi, strict)
            raise SchemaError(f"{name}: must be {what}{bound}, got {value!r}")
        below = lo is not None and (value <= lo if strict else value < lo)
        above = hi is not None and value > hi
        if below or above:
            raise SchemaError(f"{name}: must be {what}{_bound_text(lo, hi, strict)}, got {value!r}")
        return int(value) if kind is int else float(value)
    return value


def _bound_text(lo: float | None, hi: float | None, strict: bool) -> str:
    parts = []
    if lo is not None:
        parts.append(f"{'>' if strict else '>='} {_number_text(lo)}")
    if hi is not None:
        parts.append(f"<= {_number_text(hi)}")
    return (" " + " and ".join(parts)) if parts else ""


def build(schema: type, values: Mapping[str, Any], *, prefix: str) -> Any:
    """Check ``values`` against the dataclass ``schema`` and return the instance.

    Args:
        schema: A dataclass whose fields were declared with :func:`field` (or plain defaults).
        values: The section's values; missing fields take their defaults.
        prefix: The section's name in messages (``env``).

    Raises:
        SchemaError: One line naming ``<prefix>.<field>`` and what is accepted, for an
            unknown field, a missing required one, a wrong type or a value out of range.
    """
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise SchemaError(f"{prefix}: unknown field '{unknown[0]}'; accepted: {', '.join(fields)}")
    hints = typing.get_type_hints(schema)
    checked = {}
    for name, f in fields.items():
        if name not in values:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{prefix}.{name}: is required")
            continue
        value = values[name]
        kind, optional = _kind(hints[name])
        if value is None:
            if not optional:
                raise SchemaError(f"{prefix}.{name}: must not be null")
            checked[name] = None
            continue
        checked[name] = _check_value(f"{prefix}.{name}", value, kind, f.metadata)
    instance = schema(**checked)
    check = getattr(instance, "check", None)
    if check is not None:
        try:
            check()
        except SchemaError:
            raise
        except ValueError as exc:
            raise SchemaError(f"{prefix}.{exc}") from None
    return instance
