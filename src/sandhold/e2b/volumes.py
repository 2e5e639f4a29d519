"""Volumes: named host directories (``data_dir/volumes/<name>``) that outlive sandboxes and are
mounted read-write into them at create (``volumeMounts``).

A volume's record (owner team, token) lives apart from its content, under
``data_dir/e2b/volumes/<volumeID>.json``, so that a sandbox mounting the directory never sees it.
Names are unique on this server (they name the host directory).
"""

from __future__ import annotations

import json
import os
import secrets
import string
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sandhold.config import Settings
from sandhold.errors import Conflict, InvalidRequest, VolumeNotFound
from sandhold.runtime import safefs
from sandhold.runtime.spec import NAME_RE, NAME_RULE, clipped
from sandhold.runtime.templates.store import SANDBOX_USER_UID

ID_ALPHABET = string.ascii_lowercase + string.digits


@dataclass
class Volume:
    volumeID: str
    name: str
    team: str
    token: str
    createdAt: float

    def public(self, with_token: bool = True) -> dict[str, str]:
        out = {"volumeID": self.volumeID, "name": self.name}
        if with_token:
            out["token"] = self.token
        return out


class VolumeStore:
    def __init__(self, settings: Settings) -> None:
        self.content_dir = settings.data_dir / "volumes"
        self.records_dir = settings.data_dir / "e2b" / "volumes"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.content_dir.mkdir(parents=True, exist_ok=True)
        self.owner = settings.uid_base + SANDBOX_USER_UID  # the sandbox's default user

    def path(self, volume: Volume) -> Path:
        return self.content_dir / volume.name

    def _all(self) -> list[Volume]:
        out = []
        for f in sorted(self.records_dir.glob("*.json")):
            try:
                out.append(Volume(**json.loads(f.read_text())))
            except (OSError, ValueError, TypeError):
                continue
        return out

    def list(self, team: str) -> list[Volume]:
        return sorted((v for v in self._all() if v.team == team), key=lambda v: v.createdAt)

    def get(self, team: str, volume_id: str) -> Volume:
        for v in self._all():
            if v.volumeID == volume_id and v.team == team:
                return v
        raise VolumeNotFound(f"volume {clipped(volume_id)} not found")

    def by_name(self, team: str, name: str) -> Volume:
        for v in self._all():
            if v.name == name and v.team == team:
                return v
        raise InvalidRequest(f"volume {clipped(name)} does not exist")

    def create(self, team: str, name: str) -> Volume:
        if not NAME_RE.match(name):
            raise InvalidRequest(f"volume name {clipped(name)} is not valid: {NAME_RULE}")
        if any(v.name == name for v in self._all()):
            raise Conflict(f"a volume named {name!r} already exists")
        vol = Volume(
            volumeID="".join(secrets.choice(ID_ALPHABET) for _ in range(20)),
            name=name,
            team=team,
            token=secrets.token_urlsafe(32),
            createdAt=time.time(),
        )
        directory = self.path(vol)
        try:
            directory.mkdir(mode=0o755)
        except FileExistsError:  # a concurrent create of the same name won
            raise Conflict(f"a volume named {name!r} already exists") from None
        os.chown(directory, self.owner, self.owner)
        record = self.records_dir / f"{vol.volumeID}.json"
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(vol)))
        os.replace(tmp, record)
        return vol

    def delete(self, volume: Volume) -> None:
        (self.records_dir / f"{volume.volumeID}.json").unlink(missing_ok=True)
        safefs.remove_quietly(self.path(volume))  # a volume's tree may be deep
