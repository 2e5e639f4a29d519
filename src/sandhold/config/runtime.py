"""The runtime's settings (``sandhold.runtime``): where state lives, the uid range, the default
limits and cgroup of sandboxes, how long a create waits. Section ``[runtime]``; the fields carry
no prefix, so the keys are the field names."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from sandhold.config.layer import Layer
from sandhold.config.limits import CreateLimits
from sandhold.errors import ConfigError

# host[:port] as an image reference writes it (oci.py's grammar), and a path prefix after it
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_REGISTRY = re.compile(rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?")
_PREFIX = re.compile(rf"{_REGISTRY.pattern}(?:/[a-z0-9._/-]+)?")


class RuntimeSettings(CreateLimits, Layer):
    toml_section: ClassVar[str] = "runtime"

    data_dir: Path = Field(
        Path("/var/lib/sandhold"),
        description="Templates, sandbox state, writable layers and workspaces live here.",
    )
    uid_base: int = Field(
        100000,
        ge=65536,
        description="First host uid/gid of Sandhold's ids. The first 65,536 (the canonical range) "
        "own templates and workspaces on disk: sandbox uid N is host uid_base+N there. Each "
        "sandbox runs in a range of its own after it (runtime/uids.py).",
    )
    uid_isolation: bool = Field(
        True,
        description="Run each sandbox in its own host uid/gid range; off: every sandbox runs "
        "in the canonical range (one shared host identity).",
    )
    uid_registry: Path = Field(
        Path("/var/lib/sandhold-uid-ranges"),
        description="Which host uid ranges are taken, shared by every Sandhold runtime on the "
        "host whatever its data_dir (ranges are a host resource).",
    )
    uid_ranges: int = Field(
        16384,
        ge=1,
        description="How many per-sandbox uid ranges (of 65,536 ids) exist: the most sandboxes "
        "that can exist at once on this host.",
    )
    default_memory_mb: int = Field(512, ge=16)
    default_cpu: float = Field(1.0, gt=0)
    default_pids: int = Field(512, ge=16)
    cgroup_parent: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Parent cgroup of all sandboxes; unset: sandhold-<the data dir's instance id> "
        "(runtime/cgroup_parent.py). Claimed: two data dirs never share one.",
    )
    ready_timeout_s: float = Field(10.0, gt=0, description="How long create waits for the agent.")
    snapshot_store_max_mb: int = Field(
        51200,
        ge=0,
        description="Most disk the snapshots under data_dir/snapshots may use together (MiB); "
        "a snapshot past it is refused. With snapshot_s3_bucket the local copies are a cache: "
        "the least recently used ones (kept in S3) are dropped first.",
    )
    snapshot_s3_bucket: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$",
        description="Keep every snapshot in this S3 (or S3-compatible) bucket too, sealed with "
        "the secrets key ring, so that every server given the same bucket and keys lists and "
        "starts it; unset: snapshots stay on this server. Credentials come from boto3's own "
        "chain (AWS_* variables, its config files, an instance role), never from Sandhold.",
    )
    snapshot_s3_prefix: str = Field(
        "sandhold/snapshots/",
        pattern=r"^([A-Za-z0-9._-]+/)*$",
        description="Key prefix of the snapshot store in the bucket (empty, or ending in /).",
    )
    snapshot_s3_endpoint_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="Endpoint of an S3-compatible store (MinIO, Ceph, ...); AWS when unset.",
    )
    snapshot_s3_region: str | None = Field(None, description="Region of the snapshot bucket.")
    criu_path: Path = Field(
        Path("/opt/sandhold/criu/4.1.1/sbin/criu"),
        description="The CRIU binary (>= 4.1) for checkpoints; scripts/install.sh builds it "
        "there. Missing or failing `criu check`: checkpoints are unavailable, pause still works.",
    )
    template_build_allow_out: list[str] | None = Field(
        None,
        description="Hosts a template build's steps may reach (egress allow-list entries); "
        "unset: this machine's pip, npm and apt registries, its tools pointed at them; []: none.",
    )
    template_build_memory_mb: int = Field(2048, ge=64, description="Memory of a build step.")
    template_image_registry: str | None = Field(
        None,
        description="Registry (host[:port][/prefix]) that image references naming none are "
        "pulled from (a mirror); unset: skopeo's default.",
    )
    template_image_insecure: list[str] = Field(
        default_factory=list,
        description="Registries (host[:port]) reached without TLS verification, or over HTTP.",
    )
    template_image_ca_file: Path | None = Field(
        None, description="A PEM CA trusted for image registries (beside the system's)."
    )
    template_image_registries: list[str] = Field(
        default_factory=list,
        description="Registries (host[:port], as references write them) that images may be "
        "pulled from besides the default one (template_image_registry, or skopeo's default when "
        "unset); a reference naming any other registry is refused before any traffic. A "
        "registry written as an IP address is dialled as written (the operator named the "
        "address); one written as a host name must resolve only to addresses the egress guard "
        "passes: no loopback, link-local, private (RFC 1918, CGNAT, unique-local), multicast or "
        "this host's own addresses, outside template_image_open_cidrs.",
    )
    template_image_open_cidrs: list[str] = Field(
        default_factory=list,
        description="Internal ranges (e.g. 10.1.2.0/24) that registries named by host name may "
        "resolve to after all (an internal registry); empty: none.",
    )
    template_image_public: list[str] | None = Field(
        None,
        description="Registries (host[:port]) or reference prefixes (host[:port]/path) whose "
        "images, pulled anonymously, every team shares without proving access again; any other "
        "image is usable only by the teams whose own pull or manifest fetch of it succeeded. "
        "Unset: template_image_registry when set, else none.",
    )
    template_image_privileged: Literal["drop", "refuse"] = Field(
        "drop",
        description="What an image's setuid/setgid bits, file capabilities and device nodes get: "
        "dropped at import (the build log names device nodes), or the image refused.",
    )
    template_unpack_max_depth: int = Field(
        256,
        ge=8,
        le=4096,
        description="Deepest path (in directories) an image's layers or a COPY archive may "
        "unpack to; deeper is refused (the entries a build may unpack are "
        "template_build_disk_mb / 16 KiB, its bytes template_build_disk_mb).",
    )
    template_build_disk_mb: int = Field(
        10240, ge=64, description="Disk budget of a build step's writable layer."
    )
    warm_templates: bool = Field(
        True,
        description="Start sandboxes of templates that start warm (code-interpreter-v1) from a "
        "checkpoint of a started one (checkpoint/warm.py, needs CRIU); off: they always boot.",
    )
    memory_merge: bool = Field(
        False,
        description="Kernel samepage merging of sandbox memory (runtime/ksm.py): sandboxes "
        "started from one checkpoint share their identical pages; off by default, since "
        "merging opens a timing side channel between sandboxes and costs ksmd's CPU.",
    )
    memory_merge_pages_to_scan: int = Field(
        1000, ge=10, le=100000, description="ksmd's pages per 20 ms with memory_merge."
    )
    pool_sizes: dict[str, Annotated[int, Field(ge=0, le=1000)]] = Field(
        default_factory=dict,
        description="Sandboxes booted ahead per template, handed out to creates they can serve "
        '(runtime/pool.py), e.g. {"base": 8}; refilled in the background by `sandhold serve`.',
    )
    pool_refill_quiet_ms: int = Field(
        100,
        ge=0,
        le=10000,
        description="How long creates must pause before a pool refills (0: at once): a burst "
        "is served from the pool without boots competing for the CPU. A refill waits at most "
        "1 s, whatever the load.",
    )
    suspend_compress: bool = Field(
        True,
        description="Keep the memory image of a sandbox suspended to disk lz4-compressed (about "
        "3x smaller for Python processes; a suspend takes ~2.5 ms and a resume ~0.7 ms more per "
        "MiB of memory). Snapshots and forks are never compressed.",
    )
    criu_timeout_s: float = Field(
        300.0,
        gt=0,
        description="How long one `criu dump` or `criu restore` may take before it is killed "
        "and the checkpoint fails (the sandbox is left as a failed dump or restore leaves it).",
    )

    # -- the disk budget of a sandbox's writable layer (runtime/disk.py) --
    disk_enforced: bool = Field(
        True,
        description="Give each sandbox's writable layer a filesystem of its budget (a sparse "
        "ext4 image on a loop device); off: the layer lives on data_dir's filesystem, uncapped.",
    )
    default_disk_mb: int = Field(
        2048, ge=8, description="Disk budget of a sandbox when neither create nor template says."
    )
    max_disk_mb: int = Field(
        20480,
        ge=8,
        description="The largest disk budget a create or a template may ask for, for a "
        "sandbox's writable layer or for a workspace (workspace_disk_mb).",
    )

    @model_validator(mode="after")
    def _check_uids(self) -> RuntimeSettings:
        last = self.uid_base + 65536 * (self.uid_ranges + 1) - 1
        if last > 0xFFFFFFFE:  # uid_t is 32 bits; -1 means "no id"
            raise ConfigError(
                f"uid_base={self.uid_base} with uid_ranges={self.uid_ranges} reaches host id "
                f"{last}, past 4294967294: lower uid_ranges"
            )
        return self

    @model_validator(mode="after")
    def _check_disk(self) -> RuntimeSettings:
        if self.default_disk_mb > self.max_disk_mb:
            raise ConfigError(
                f"default_disk_mb={self.default_disk_mb} is above max_disk_mb={self.max_disk_mb}: "
                "raise max_disk_mb or lower default_disk_mb"
            )
        return self

    @model_validator(mode="after")
    def _check_registries(self) -> RuntimeSettings:
        """Refuse entries no reference could match (a scheme, a path where none belongs)."""
        for key, pattern, form in (
            ("template_image_registries", _REGISTRY, "host[:port]"),
            ("template_image_public", _PREFIX, "host[:port][/path]"),
        ):
            for entry in getattr(self, key) or []:
                if not pattern.fullmatch(entry):
                    raise ConfigError(f"{key}: {entry!r} is not a registry ({form})")
        for cidr in self.template_image_open_cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ConfigError(
                    f"template_image_open_cidrs: {cidr!r} is not an IP network (e.g. 10.0.0.0/8)"
                ) from None
        return self
