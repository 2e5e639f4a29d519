"""The default build allow-list (runtime/templates/registries.py): the hosts of the pip, npm and apt
registries this machine's own configuration names (here files a test writes, naming test
hosts), and the environment that points a build's tools at them; the environment's variables
win over the files, as they do for the tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandhold.runtime.templates import registries


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "NPM_CONFIG_REGISTRY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = https://pip.mirror.test/simple\n"
        "extra-index-url = https://extra.mirror.test/simple file:///opt/wheels\n"
    )
    (tmp_path / "npmrc").write_text("; comment\nregistry = https://npm.mirror.test/\n")
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.mirror.test/debian\nSuites: bookworm\n"
    )
    (apt / "sources.list").write_text(
        "# old style\ndeb [signed-by=/k.gpg] http://sec.mirror.test/debian-security bookworm main\n"
    )
    monkeypatch.setattr(registries, "PIP_FILES", (str(tmp_path / "pip.conf"),))
    monkeypatch.setattr(registries, "NPM_FILES", (str(tmp_path / "npmrc"),))
    monkeypatch.setattr(registries, "APT_DIR", apt)
    registries.machine.cache_clear()
    yield registries.machine
    registries.machine.cache_clear()


def test_the_hosts_and_tools_of_this_machines_configuration(machine) -> None:
    reg = machine()
    assert reg.hosts() == ["deb.mirror.test", "extra.mirror.test", "npm.mirror.test",
                           "pip.mirror.test", "sec.mirror.test"]  # fmt: skip
    assert reg.env() == {
        "PIP_INDEX_URL": "https://pip.mirror.test/simple",
        "PIP_EXTRA_INDEX_URL": "https://extra.mirror.test/simple",  # (a file:// one is the host's)
        "NPM_CONFIG_REGISTRY": "https://npm.mirror.test/",
    }


def test_the_environment_wins(machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://env-pip.mirror.test/simple")
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", "https://env-npm.mirror.test/")
    reg = machine()
    assert "env-pip.mirror.test" in reg.hosts() and "pip.mirror.test" not in reg.hosts()
    assert reg.env()["NPM_CONFIG_REGISTRY"] == "https://env-npm.mirror.test/"
