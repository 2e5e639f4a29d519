"""Snapshots: persistent objects that outlive their source; ``full`` starts new sandboxes with
the saved memory, ``filesystem`` boots them afresh over the saved files."""

from __future__ import annotations

import time

import pytest

from sandhold.errors import TemplateNotFound
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.runtime.checkpoint.snapshots import SnapshotStore
from sandhold.runtime.runtime import Runtime
from tests.runtime.helpers import sh
from tests.runtime.test_suspend import COUNTER, _state


async def test_a_full_snapshot_outlives_its_source_and_restores_memory(
    make_sandbox, runtime, settings
):
    if not criu_status(runtime.settings.criu_path)[0]:
        pytest.skip("CRIU unusable here")
    source = await make_sandbox()
    await sh(source, COUNTER + "; echo saved > /home/user/file; sleep 0.2")
    n0, secret = await _state(source)
    snap = SnapshotStore(runtime).take(source.id, "team-a", "mine", "full")
    runtime.kill(source.id)
    store = SnapshotStore(Runtime(settings))  # a restarted server reads it back
    again = store.get(snap.id)
    assert (again.owner, again.names, again.mode, again.source) == ("team-a", ["mine"], "full",
                                                                    source.id)  # fmt: skip
    restored = store.start(again, {"k": "v"})
    make_sandbox.created.append(restored.id)
    time.sleep(0.1)
    n1, secret1 = await _state(restored)
    assert secret1 == secret and n1 > n0
    assert (await sh(restored, "cat /home/user/file")).text.strip() == "saved"
    assert restored.id != source.id and restored.host_uid is not None


async def test_a_filesystem_snapshot_boots_afresh_over_the_files(make_sandbox, runtime):
    source = await make_sandbox()
    await sh(source, COUNTER + "; echo saved > /home/user/file; sleep 0.2")
    store = SnapshotStore(runtime)
    snap = store.take(source.id, "team-a", None, "filesystem")
    assert not (snap.dir / "checkpoint").exists()
    assert (await sh(source, "cat /home/user/file")).text.strip() == "saved"  # source runs on
    booted = store.start(snap, {})
    make_sandbox.created.append(booted.id)
    r = await sh(booted, "cat /home/user/file; ps -eo args | grep -c '[t]oken_hex' || true")
    assert r.text.split() == ["saved", "0"], r.text  # files kept, processes not
    store.delete(snap.id)
    with pytest.raises(TemplateNotFound):
        store.get(snap.id)
    assert snap.id not in {s.id for s in store.list()}
