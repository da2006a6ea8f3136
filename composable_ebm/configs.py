"""Typed dataclass configs <-> plain JSON-able dicts.

Configs are frozen dataclasses. ``config_to_dict`` / ``config_from_dict`` round-trip them
through JSON (tuples become lists and back, nested dataclasses become dicts and back);
unknown keys are an error that names the valid ones, so a typo in a recipe never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from composable_ebm.errors import InvalidInputError

T = TypeVar("T")

MAX_WIDTH = 8192
"""Largest layer width (channels, hidden units) a config may ask for: a config from a stranger
must not make the loader allocate gigabytes before any weight is checked."""
MAX_IMAGE_SIZE = 4096
"""Largest image side a network config may ask for."""
MAX_ACTIVATION_ELEMENTS = 1 << 28
"""Most activation elements one image may need in a network's forward pass (1 GiB in float32):
bounds what a small config file can make the loader allocate when it probes the energy."""
MAX_TOTAL_STEPS = 1 << 20
"""Most Langevin steps one sampler config may ask for (``rounds * steps + final_steps``)."""
MAX_BUFFER_ELEMENTS = 1 << 31
"""Most elements a replay buffer may hold (8 GiB in float32)."""
MAX_PARAMETERS = 1_000_000_000
"""Most weight elements a loaded model may have (4 GB in float32)."""
MAX_CONFIG_BYTES = 1_000_000
"""Largest model ``config.json`` read."""


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects in a JSON file read from outside (a config, a safetensors header): deeper
text would exhaust Python's recursion in the parser."""


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_JSON_BRACKET = re.compile(r"[][{}]")


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON text, brackets inside strings not counted; linear, no
    recursion."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def load_json(text: str | bytes, where: str, error: type[Exception] = InvalidInputError) -> Any:
    """``json.loads`` of text from outside, refusing nesting deeper than `MAX_JSON_DEPTH` with ``error``, one line
    that names ``where`` (the file); other parse errors are ``ValueError`` as ``json.loads`` raises them."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{where}: JSON nested {depth} levels deep; at most {MAX_JSON_DEPTH} are read")
    return json.loads(text)


def check_attributes(owner: str, attributes: dict[str, tuple[str, ...]]) -> None:
    """Attribute tables: at most 64 attributes of 1 to 4096 distinct value names each."""
    if len(attributes) > 64:
        raise InvalidInputError(f"{owner}.attributes has {len(attributes)} attributes; at most 64")
    for name, values in attributes.items():
        if not 1 <= len(values) <= 4096 or len(set(values)) != len(values):
            raise InvalidInputError(f"{owner}.attributes[{name!r}] must list 1 to 4096 distinct value names")


def check_size(owner: str, name: str, value: int, low: int = 1, high: int = MAX_WIDTH) -> None:
    """Raise `InvalidInputError` unless ``low <= value <= high`` (``value`` an integer)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInputError(f"{owner}.{name} must be an integer in [{low}, {high}], got {value!r}")


class JSONConfig:
    """Mixin for config dataclasses: ``to_dict()`` and ``Config.from_dict(data)`` through JSON-able dicts."""

    def to_dict(self) -> dict[str, Any]:
        """This config as a JSON-able dict (nested configs included)."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        return config_from_dict(cls, data)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-able dict of a dataclass config (nested dataclasses included)."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"expected a dataclass instance, got {type(config).__name__}")
    return {f.name: _to_plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def config_defaults(cls: type) -> dict[str, Any]:
    """The JSON-able defaults of a config dataclass's fields that have one: what a config saved before a field was
    added stands for."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = _to_plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = _to_plain(f.default_factory())
    return out


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_plain(v) for k, v in value.items()}
    return value


def config_from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build dataclass ``cls`` from a plain dict.

    Unknown keys and values of the wrong type raise `InvalidInputError` naming the setting
    and what it expects; range checks run in the config's ``__post_init__``.
    """
    if not isinstance(data, dict):
        raise InvalidInputError(f"{cls.__name__} expects a table of settings, got {kind_of(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise InvalidInputError(f"unknown {cls.__name__} setting(s) {unknown}; valid settings: {sorted(fields)}")
    hints = get_type_hints(cls)
    kwargs = {name: _from_plain(hints[name], value, f"{cls.__name__}.{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except InvalidInputError:
        raise
    except (ValueError, TypeError) as err:
        raise InvalidInputError(f"{cls.__name__}: {err}") from err


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def kind_of(value: Any) -> str:
    """How a value reads in an error: its JSON/TOML kind and, when short, the value itself."""
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             tuple: "a list", dict: "a table", type(None): "nothing (null)"}
    kind = kinds.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text}" if len(text) <= 40 and not isinstance(value, (dict, list, tuple, type(None))) else kind


def _expected(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(a) for a in get_args(tp))
    if origin is typing.Literal:
        return f"one of {list(get_args(tp))}"
    if tp is type(None):
        return "nothing"
    if dataclasses.is_dataclass(tp):
        return f"a table of {tp.__name__} settings"
    if origin in (tuple, list):
        return "a list"
    if origin is dict:
        return "a table"
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _bad(tp: Any, value: Any, where: str) -> InvalidInputError:
    return InvalidInputError(f"{where} must be {_expected(tp)}, got {kind_of(value)}")


def _from_plain(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            if len(args) == len(get_args(tp)):
                raise _bad(tp, value, where)
            return None
        if value is False and len(args) == 1 and dataclasses.is_dataclass(args[0]):
            return None  # TOML has no null: `table = false` switches an optional table off
        for arg in args:
            try:
                return _from_plain(arg, value, where)
            except InvalidInputError:
                if len(args) == 1:
                    raise
        raise _bad(tp, value, where)
    if origin is typing.Literal:
        if value not in get_args(tp) or isinstance(value, bool) != any(isinstance(a, bool) for a in get_args(tp)):
            raise InvalidInputError(f"{where} must be one of {list(get_args(tp))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _bad(tp, value, where)
        return config_from_dict(tp, value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _bad(tp, value, where)
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_plain(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise InvalidInputError(f"{where} must be a list of {len(args)} values, got {len(value)}")
        return tuple(_from_plain(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise _bad(tp, value, where)
        kt, vt = get_args(tp)
        return {_from_plain(kt, k, f"{where} key"): _from_plain(vt, v, f"{where}[{k!r}]") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _bad(tp, value, where)
        (et,) = get_args(tp)
        return [_from_plain(et, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(tp, value, where)
        return float(value)
    if tp is int or tp is bool or tp is str:
        if type(value) is not tp:
            raise _bad(tp, value, where)
        return value
    if tp is Any:
        return value
    raise TypeError(f"{where}: configs cannot hold values of type {tp!r}")  # a library bug, not bad input


def check_autoencoder(owner: str, value: Any) -> None:
    """One line unless ``value`` (a config's ``autoencoder``) is None or names one: a non-empty string."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidInputError(f"{owner}.autoencoder must name an autoencoder (a bundled name, a Hub id or a folder),"
                                f" got {value!r}")


def check_range(owner: str, name: str, value: float, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False) -> None:
    """Raise `InvalidInputError` unless ``value`` is finite and within ``[low, high]`` (ends
    open as asked)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        lo = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
        raise InvalidInputError(f"{owner}.{name} must be a finite number in {lo}, {hi}, got {value!r}")


def check_interval(interval: Any) -> tuple[float, float] | None:
    """A guidance interval as ``(lo, hi)`` floats with ``0 <= lo < hi`` (None stays None); anything else is one line
    naming what is valid."""
    if interval is None:
        return None
    ok = (isinstance(interval, (list, tuple)) and len(interval) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in interval))
    if not ok or not 0 <= interval[0] < interval[1]:
        raise InvalidInputError(f"a guidance interval must be two noise levels [lo, hi] with 0 <= lo < hi, got"
                                f" {interval!r}")
    return float(interval[0]), float(interval[1])
