"""The settings file (``SANDHOLD_CONFIG``): TOML sections, one per layer, read into the flat
field names ``Settings`` takes. The rule is in the package's docstring (``sandhold.config``)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

from sandhold.config.layer import Layer
from sandhold.errors import ConfigError


def read_file(path: str, layers: Iterable[type[Layer]]) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        msg = f"cannot read the settings file {path} (SANDHOLD_CONFIG): {e.strerror}"
        raise ConfigError(msg) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"the settings file {path} (SANDHOLD_CONFIG) is not TOML: {e}") from None
    return flatten(data, path, layers)


def flatten(data: Mapping[str, Any], source: str, layers: Iterable[type[Layer]]) -> dict[str, Any]:
    """The file's values by field name; refuses unknown sections and keys, and a field that is
    set twice (in two places of the file)."""
    sections = {layer.toml_section: layer for layer in layers}
    fields = {name for layer in sections.values() for name in layer.model_fields}
    out: dict[str, Any] = {}
    where: dict[str, str] = {}

    def put(field: str, value: Any, place: str) -> None:
        if field in out:
            raise ConfigError(f"{source}: {field} is set twice ({where[field]} and {place})")
        out[field] = value
        where[field] = place

    for key, value in data.items():
        if key in fields:  # the flat form: a setting's whole name outside any section
            put(key, value, key)
            continue
        layer = sections.get(key)
        if layer is None:
            raise ConfigError(
                f"{source}: unknown key or section {key!r}. The sections are "
                f"{', '.join(f'[{s}]' for s in sections)}; outside them a key is a setting's "
                "whole name (e.g. gateway_port)"
            )
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key} must be a section ([{key}]), not a value")
        keys = layer.toml_keys()
        for k, v in value.items():
            if k in keys:
                put(keys[k], v, f"{k} in [{key}]")
            elif key == "runtime" and k in fields:  # the old form: one [runtime] table for all
                put(k, v, f"{k} in [runtime]")
            else:
                raise ConfigError(f"{source}: {_unknown(key, k, sections)}")
    return out


def _unknown(section: str, key: str, sections: Mapping[str, type[Layer]]) -> str:
    msg = f"unknown key {key!r} in [{section}]"
    layer = sections[section]
    if key in layer.model_fields:
        short = key.removeprefix(layer.toml_prefix)
        return f"{msg}: write it as {short!r} (keys in [{section}] drop {layer.toml_prefix!r})"
    for other, o in sections.items():
        if key in o.toml_keys():
            return f"{msg}: it is a key of [{other}]"
        if key in o.model_fields:
            return f"{msg}: it is {key.removeprefix(o.toml_prefix)!r} in [{other}]"
    return f"{msg}; the keys of [{section}] are {', '.join(sorted(layer.toml_keys()))}"
