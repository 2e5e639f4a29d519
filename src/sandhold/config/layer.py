"""What every layer of the settings shares: its TOML section and how the section's keys map to
the layer's (flat) field names."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Layer(BaseModel):
    """The fields of one layer. ``Settings`` inherits every layer, so the field names are flat
    (``gateway_port``) and so are the environment variables (``SANDHOLD_GATEWAY_PORT``)."""

    model_config = ConfigDict(extra="forbid")

    toml_section: ClassVar[str]
    """The layer's section in the TOML file (``[gateway]``)."""
    toml_prefix: ClassVar[str] = ""
    """Dropped from the field names that carry it to make the section's keys (``gateway_``)."""

    @classmethod
    def toml_keys(cls) -> dict[str, str]:
        """The keys of the layer's TOML section -> the field names they set: a field's name
        without the layer's prefix, or its whole name if it does not carry the prefix."""
        return {name.removeprefix(cls.toml_prefix): name for name in cls.model_fields}


def env_name(field: str) -> str:
    return "SANDHOLD_" + field.upper()
