"""What a create may ask for: how many environment variables and how large, how much metadata,
how long a path, how many mounts and file view roots. Part of the runtime layer (section
``[runtime]``, keys = field names): they bound what a sandbox is made of, whichever surface asks
(the E2B server, the gateway's local provider). The sandbox service enforces them before anything
is created (``sandhold.service.limits``); each refusal names its setting.

The environment of a create ends up in every command the sandbox runs, through ``execve(2)``,
which takes at most ``ARG_MAX`` bytes of arguments and environment together (measured on this
host: a quarter of the stack limit, 2 MiB with the usual 8 MiB; ``getconf ARG_MAX``) and at most
``MAX_ARG_STRLEN`` (128 KiB) for any one ``NAME=value`` string. The default total, 256 KiB, is an
eighth of that, so a command keeps most of it for its own arguments and variables (the
template's own environment is a few hundred bytes).
"""

from __future__ import annotations

import os

from pydantic import Field, model_validator

from sandhold.config.layer import Layer
from sandhold.errors import ConfigError

ARG_MAX = os.sysconf("SC_ARG_MAX")
MAX_ARG_STRLEN = 32 * 4096  # the kernel's limit on one argument or "NAME=value" string
PATH_MAX = 4096


class CreateLimits(Layer):
    sandbox_env_max_vars: int = Field(
        512, ge=1, le=100_000, description="Environment variables a create may set."
    )
    sandbox_env_max_name_bytes: int = Field(
        256, ge=1, le=4096, description="Longest environment variable name of a create."
    )
    sandbox_env_max_value_bytes: int = Field(
        32 * 1024,
        ge=1,
        le=MAX_ARG_STRLEN // 2,
        description="Longest environment variable value of a create (the kernel refuses any one "
        '"NAME=value" over 128 KiB).',
    )
    sandbox_env_max_bytes: int = Field(
        default_factory=lambda: min(256 * 1024, ARG_MAX // 8),
        ge=1,
        description='All of a create\'s environment, counted as execve counts it ("NAME=value" '
        "plus a NUL each): every command in the sandbox carries it besides its own arguments "
        "and variables, so it may be at most half of ARG_MAX. Default 256 KiB (an eighth of "
        "the usual 2 MiB ARG_MAX).",
    )
    sandbox_metadata_max_keys: int = Field(
        128, ge=1, le=100_000, description="Metadata keys of a sandbox."
    )
    sandbox_metadata_max_key_bytes: int = Field(
        256, ge=1, le=65536, description="Longest metadata key of a sandbox."
    )
    sandbox_metadata_max_value_bytes: int = Field(
        8 * 1024, ge=1, le=1024 * 1024, description="Longest metadata value of a sandbox."
    )
    sandbox_metadata_max_bytes: int = Field(
        64 * 1024,
        ge=1,
        le=16 * 1024 * 1024,
        description="All of a sandbox's metadata keys and values together.",
    )
    sandbox_max_path_bytes: int = Field(
        PATH_MAX,
        ge=64,
        le=PATH_MAX,
        description="Longest path a create names: mount targets and host sources, the host "
        "directory of /workspace, file view roots (PATH_MAX is 4096).",
    )
    sandbox_max_mounts: int = Field(
        32, ge=0, le=1024, description="Mounts of a sandbox (volumes, host mounts, views)."
    )
    sandbox_file_view_max_roots: int = Field(
        32, ge=1, le=1024, description="Read roots, and write roots, of a sandbox's file view."
    )

    @model_validator(mode="after")
    def _check_limits(self) -> CreateLimits:
        if self.sandbox_env_max_bytes > ARG_MAX // 2:
            raise ConfigError(
                f"sandbox_env_max_bytes ({self.sandbox_env_max_bytes}) must be at most half of "
                f"this host's ARG_MAX ({ARG_MAX}): every command in a sandbox carries the "
                "sandbox's environment and needs the rest for its own arguments"
            )
        return self
