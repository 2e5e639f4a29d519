"""The package registries this machine is configured to use (pip, npm, apt), read from its own
configuration, never named here: template builds may reach them (their hosts are the default
build allow-list) and their tools are pointed at them (``PIP_INDEX_URL``, npm's registry)."""

from __future__ import annotations

import configparser
import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

PIP_FILES = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "~/.config/pip/pip.conf", "~/.pip/pip.conf")
NPM_FILES = ("/etc/npmrc", "/usr/etc/npmrc", "~/.npmrc")
APT_DIR = Path("/etc/apt")


@dataclass
class Registries:
    pip_index: str | None = None
    pip_extra: list[str] = field(default_factory=list)
    npm_registry: str | None = None
    apt: list[str] = field(default_factory=list)
    pip_extra_hosts: list[str] = field(default_factory=list)  # where pip's index serves files

    def hosts(self) -> list[str]:
        urls = [self.pip_index, *self.pip_extra, self.npm_registry, *self.apt]
        named = {h for u in urls if u and (h := urlsplit(u).hostname)}
        return sorted(named | set(self.pip_extra_hosts))

    def env(self) -> dict[str, str]:
        """What points a build's tools at them."""
        out = {}
        if self.pip_index:
            out["PIP_INDEX_URL"] = self.pip_index
        if extra := [u for u in self.pip_extra if u.startswith(("http://", "https://"))]:
            out["PIP_EXTRA_INDEX_URL"] = " ".join(extra)  # a file:// index is the host's
        if self.npm_registry:
            out["NPM_CONFIG_REGISTRY"] = self.npm_registry
        return out


@functools.lru_cache(maxsize=1)
def machine() -> Registries:
    reg = Registries()
    cp = configparser.ConfigParser(interpolation=None)
    cp.read([os.path.expanduser(f) for f in PIP_FILES])
    for section in ("install", "global"):
        if cp.has_option(section, "index-url") and not reg.pip_index:
            reg.pip_index = cp.get(section, "index-url").strip()
        if cp.has_option(section, "extra-index-url") and not reg.pip_extra:
            reg.pip_extra = cp.get(section, "extra-index-url").split()
    reg.pip_index = os.environ.get("PIP_INDEX_URL") or reg.pip_index
    reg.pip_extra = os.environ.get("PIP_EXTRA_INDEX_URL", "").split() or reg.pip_extra
    for f in NPM_FILES:
        try:
            text = Path(os.path.expanduser(f)).read_text()
        except OSError:
            continue
        if m := re.search(r"^\s*registry\s*=\s*(\S+)", text, re.M):
            reg.npm_registry = m[1]
    reg.npm_registry = os.environ.get("NPM_CONFIG_REGISTRY") or reg.npm_registry
    reg.apt = _apt_uris(APT_DIR)
    # Nothing configured: the tools' own defaults, as they say them (pip's index and the host
    # its files come from; npm's registry).
    if not reg.pip_index and (pypi := _ask(PIP_DEFAULT)):
        reg.pip_index, *files = pypi.split()
        reg.pip_extra_hosts = files
    if not reg.npm_registry and shutil.which("npm"):
        reg.npm_registry = _ask(["npm", "config", "get", "registry"]) or None
    return reg


PIP_DEFAULT = [
    "python3",
    "-c",
    "from pip._internal.models.index import PyPI as p; print(p.simple_url, p.file_storage_domain)",
]


def _ask(argv: list[str]) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def _apt_uris(apt: Path) -> list[str]:
    uris = []
    for f in sorted((apt / "sources.list.d").glob("*.sources")):
        with_text = f.read_text(errors="replace")
        uris += [u for m in re.finditer(r"^URIs:\s*(.+)$", with_text, re.M) for u in m[1].split()]
    try:
        for line in (apt / "sources.list").read_text(errors="replace").splitlines():
            parts = re.sub(r"\[[^]]*\]", "", line).split()
            if len(parts) >= 2 and parts[0] in ("deb", "deb-src"):
                uris.append(parts[1])
    except OSError:
        pass
    return sorted(set(uris))
