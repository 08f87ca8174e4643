"""flowgpu's options in dask.config under ``flowgpu``: the defaults (``flowgpu.yaml``, so
``DASK_FLOWGPU__BACKEND=cpu`` works as in Dask) and :func:`check` against ``flowgpu-schema.yaml``.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Mapping
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

from flowgpu.errors import ConfigError

__all__ = ["DEFAULTS", "SCHEMA", "allowed", "check", "get", "options", "parse_gpus", "parse_seconds", "parse_size",
           "tree"]

_HERE = os.path.dirname(__file__)
DEFAULTS_PATH = os.path.join(_HERE, "flowgpu.yaml")
SCHEMA_PATH = os.path.join(_HERE, "flowgpu-schema.yaml")

_NO_DEFAULT = object()


def _load(path: str) -> dict:
    with open(path) as f:  # libyaml's loader where PyYAML has it: this runs at every import of flowgpu
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader


DEFAULTS = _load(DEFAULTS_PATH)
dask.config.update_defaults(DEFAULTS)
SCHEMA: dict = _load(SCHEMA_PATH)["properties"]["flowgpu"]


def get(key: str, override_with: Any = None, default: Any = _NO_DEFAULT) -> Any:
    """Read ``flowgpu.<key>`` from dask.config, unless ``override_with`` is given (not None)."""
    full = key if key.startswith("flowgpu.") else f"flowgpu.{key}"
    try:
        return dask.config.get(full, override_with=override_with)
    except KeyError:
        if default is not _NO_DEFAULT:
            return default
        # A dask.config.set({"flowgpu.x": ...}) block entered before this module was imported drops
        # the whole namespace when it exits; put the defaults back under whatever is set now.
        dask.config.update(dask.config.config, DEFAULTS, priority="old")
        return dask.config.get(full, override_with=override_with)


def _canonical(values: Mapping, schema: dict) -> dict:
    """``values`` with keys spelt as in the schema: dask.config takes ``n_workers`` for ``n-workers``."""
    known = schema.get("properties", {})
    aliases = {k.replace("-", "_"): k for k in known}
    out = {}
    for key, value in values.items():
        key = key if key in known else aliases.get(key, key)
        out[key] = _canonical(value, known[key]) if isinstance(value, Mapping) and key in known else value
    return out


def tree() -> dict:
    """A copy of the whole ``flowgpu`` section of dask.config, over the defaults, keys as in the schema."""
    return dask.config.merge(DEFAULTS["flowgpu"], _canonical(dask.config.get("flowgpu", default={}), SCHEMA))


def options() -> list[str]:
    """The top-level options that are not sections (the keyword arguments of a Session)."""
    return [k for k, s in SCHEMA["properties"].items() if s.get("type") != "object"]


# -- parsing the strings the schema's formats name -------------------------------------------------
_NUMBER = re.compile(r"\s*\d+(\.\d*)?\s*|\s*\.\d+\s*")


def parse_size(text: str) -> int | float:
    """``"4GiB"`` -> bytes; a plain number such as ``"0.25"`` stays a number (a fraction, or bytes)."""
    t = text.strip().lstrip("-")
    try:
        n = float(t) if _NUMBER.fullmatch(t) else parse_bytes(t)
    except (ValueError, TypeError):
        raise ValueError("is not a memory size") from None
    if text.strip().startswith("-") and n:
        raise ValueError("is negative")
    return n


def parse_seconds(text: str | float) -> float:
    """``"30s"``, ``"1ms"`` or a number of seconds -> seconds."""
    if isinstance(text, str) and text.strip().startswith("-"):
        raise ValueError("is negative")
    try:
        return float(parse_timedelta(text, default="s"))
    except (ValueError, TypeError, KeyError):
        raise ValueError("is not a duration") from None


def parse_gpus(text: str | int | list) -> tuple[int, ...]:
    """``"0,1"`` -> ``(0, 1)``; an ordinal, or a list of them (checked by the schema), as a tuple."""
    if not isinstance(text, str):
        return (text,) if isinstance(text, int) else tuple(text)
    items = [g for g in text.replace(" ", "").split(",") if g]
    if not items or not all(g.isdigit() for g in items):
        raise ValueError("is not a list of GPU ordinals")
    if len(set(map(int, items))) != len(items):
        raise ValueError("names a GPU twice")
    return tuple(map(int, items))


_PHRASES = {"bytes": "a size such as '4GiB'", "duration": "a duration such as '30s'",
            "gpu-list": "a string such as '0,1'"}


def _parses(parse):
    def check(value: Any) -> bool:
        if isinstance(value, str):  # other types are the `type` keyword's to refuse
            parse(value)
        return True

    return check


# -- checking ---------------------------------------------------------------------------------------
def _bounds(s: dict) -> str:
    words = [f"{op} {s[k]}" for k, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="))
             if k in s]
    return (" " + " and ".join(words)) if words else ""


_TYPES = {"null": "None", "boolean": "true or false", "string": "a string", "array": "a list",
          "object": "a section", "integer": "a whole number", "number": "a number"}


def _alternatives(schema: dict) -> list[str]:
    if "title" in schema:
        return [schema["title"]]
    if "anyOf" in schema:
        return [a for s in schema["anyOf"] for a in _alternatives(s)]
    if "enum" in schema or "const" in schema:
        return [repr(v) for v in schema.get("enum", [schema.get("const")])]
    if "format" in schema:
        return [_PHRASES[schema["format"]]]
    types = schema.get("type", [])
    return [_TYPES[t] + (_bounds(schema) if t in ("integer", "number") else "")
            for t in ([types] if isinstance(types, str) else types)]


def allowed(schema: dict) -> str:
    """What ``schema`` allows, in words (a subschema's ``title`` says it for that subschema)."""
    if "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    parts = _alternatives(schema)
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


@functools.lru_cache(maxsize=None)
def _validator(path: str) -> Any:
    """A jsonschema validator of the option or section at ``path``, with the formats of flowgpu-schema.yaml
    (bytes, duration, gpu-list); jsonschema is imported only when options are checked (it and its
    dependencies cost a tenth of a second at import)."""
    import jsonschema  # noqa: PLC0415 - third-party, needed only to check options

    formats = jsonschema.FormatChecker(formats=())
    for name, parse in (("bytes", parse_size), ("duration", parse_seconds), ("gpu-list", parse_gpus)):
        formats.checks(name, raises=ValueError)(_parses(parse))
    return jsonschema.Draft202012Validator(_subschema(path), format_checker=formats)


def _subschema(path: str) -> dict:
    """The schema of the option or section at dotted ``path`` (empty: the whole ``flowgpu`` tree)."""
    schema = SCHEMA
    for key in filter(None, path.split(".")):
        schema = schema["properties"][key]
    return schema


def _reason(error: Any) -> str:
    """Why the value fails, in words, from the error of the branch of an ``anyOf`` that fits it best."""
    if error.validator == "anyOf":
        tried = [e for e in error.context if e.validator != "type"]  # branches of the value's own type
        if not tried:
            return "is not allowed"
        error = min(tried, key=lambda e: e.validator in ("enum", "const"))
    if error.path:
        return f"has {error.instance!r} at position {error.path[0]}"
    if error.validator == "format":
        return str(error.cause)
    if error.validator in ("minimum", "exclusiveMinimum"):
        return "is negative" if error.validator_value == 0 and error.instance < 0 else \
            f"is below {error.validator_value}"
    return {"maximum": f"is above {error.validator_value}", "minItems": "is empty", "minLength": "is empty",
            "uniqueItems": "has repeated items", "enum": "is not allowed"}.get(error.validator, "is not allowed")


def _check_value(path: str, value: Any, name: str) -> None:
    validator = _validator(path)
    error = next(iter(validator.iter_errors(value)), None)
    if error is None:
        return
    schema = validator.schema
    if error.validator == "enum" and not error.path:
        raise ConfigError(f"unknown {name} {value!r}; choose {allowed(schema)}")
    raise ConfigError(f"{name}={value!r} {_reason(error)}; give {allowed(schema)}")


def check(values: Mapping, names: Mapping[str, str] | None = None, *, _prefix: str = "") -> None:
    """Hold a ``flowgpu`` tree (keys as in flowgpu.yaml) to flowgpu-schema.yaml.

    Raises :class:`~flowgpu.errors.ConfigError` naming the first bad option as ``names`` calls it
    (dotted key -> name, e.g. ``{"memory-limit": "memory_limit"}`` for a keyword argument), or as
    ``flowgpu.<key>``, with its value and what is allowed.
    """
    names = names or {}
    known = _subschema(_prefix)["properties"]
    for key, value in values.items():
        path = _prefix + key
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean flowgpu.{_prefix}{near[0]}?" if near else ""
            raise ConfigError(f"unknown option flowgpu.{path}{hint} (known: {', '.join(known)})")
        if known[key].get("type") == "object":
            if not isinstance(value, Mapping):
                raise ConfigError(f"flowgpu.{path}={value!r} is not a section; give a mapping of "
                                  f"{', '.join(known[key]['properties'])}")
            check(value, names, _prefix=path + ".")
        else:
            _check_value(path, value, names.get(path, f"flowgpu.{path}"))
