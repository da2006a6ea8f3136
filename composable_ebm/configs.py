"""Typed dataclass configs <-> plain JSON-able dicts.

Configs are frozen dataclasses. ``config_to_dict`` / ``config_from_dict`` round-trip them
through JSON (tuples become lists and back, nested dataclasses become dicts and back);
unknown keys are an error that names the valid ones, so a typo in a recipe never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


class JSONConfig:
    """Mixin for config dataclasses: ``to_dict()`` and ``Config.from_dict(data)`` through JSON-able dicts."""

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        return config_from_dict(cls, data)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-able dict of a dataclass config (nested dataclasses included)."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"expected a dataclass instance, got {type(config).__name__}")
    return {f.name: _to_plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_plain(v) for k, v in value.items()}
    return value


def config_from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build dataclass ``cls`` from a plain dict; unknown keys raise ``ValueError``."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__} expects a table of settings, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} setting(s) {unknown}; valid settings: {sorted(fields)}")
    hints = get_type_hints(cls)
    kwargs = {name: _from_plain(hints[name], value, f"{cls.__name__}.{name}") for name, value in data.items()}
    return cls(**kwargs)


def _from_plain(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if value is False and len(args) == 1 and dataclasses.is_dataclass(args[0]):
            return None  # TOML has no null: `table = false` switches an optional table off
        return _from_plain(args[0], value, where) if len(args) == 1 else value
    if origin is typing.Literal:
        if value not in get_args(tp):
            raise ValueError(f"{where} must be one of {list(get_args(tp))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return config_from_dict(tp, value)
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_plain(args[0], v, where) for v in value)
        return tuple(_from_plain(a, v, where) for a, v in zip(args, value))
    if origin is dict:
        _, vt = get_args(tp)
        return {k: _from_plain(vt, v, where) for k, v in value.items()}
    if origin is list:
        (et,) = get_args(tp)
        return [_from_plain(et, v, where) for v in value]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
