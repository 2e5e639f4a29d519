"""The logs' settings (``sandhold.logs``), shared by every serving process (``sandhold serve``,
``sandhold gateway serve``): where the JSON-lines files go, how large they grow and how many old
ones are kept, the level, and what stderr shows. Section ``[logs]``; the keys drop ``log_``
(``max_bytes`` sets ``log_max_bytes``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from sandhold.config.layer import Layer


class LogSettings(Layer):
    toml_section: ClassVar[str] = "logs"
    toml_prefix: ClassVar[str] = "log_"

    log_dir: Path | None = Field(
        None,
        description="Directory of the JSON-lines log files (<component>.jsonl, rotated to "
        ".jsonl.1, .2, ...); default data_dir/logs.",
    )
    log_max_bytes: int = Field(
        20 * 1024 * 1024,
        ge=1024,
        description="Size at which a log file is rotated (bytes).",
    )
    log_backup_count: int = Field(
        5, ge=1, le=1000, description="How many rotated log files are kept per component."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Least severe level written, to the files and to stderr."
    )
    log_stderr_format: Literal["text", "json", "off"] = Field(
        "text",
        description="What stderr shows: one readable line per record, the files' JSON lines, "
        "or nothing.",
    )
    log_fsync_interval_s: float = Field(
        1.0,
        ge=0,
        description="Every record reaches the file (the kernel) as it is logged, so a killed "
        "process loses nothing; this bounds what a host crash can lose: written lines are "
        "fsynced at least this often (0: after every record).",
    )
