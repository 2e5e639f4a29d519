"""The gateway's rollup job (gateway/app.py over store/rollups.py): trips to a worker thread until
every due hour is rolled up, and the settings that drive it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import insert, select

from sandhold.config import Settings
from sandhold.gateway.app import Gateway
from sandhold.store.models import EventRollupMark, Session
from sandhold.store.tally import HOUR


def test_the_job_catches_up_in_trips(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, gateway_provider="e2b", gateway_e2b_api_url="http://127.0.0.1:9",
        gateway_e2b_api_key="k" * 20, gateway_workspace_root=tmp_path / "ws",
        gateway_allow_ephemeral_workspace=True, prebuild_templates=[],
    )  # fmt: skip
    gw = Gateway(settings)
    try:
        gw.bootstrap()
        gw.store.put_tenant("acme", {}, None)
        start = (time.time() // HOUR - 30) * HOUR  # 30 hours ago, a running sandbox since
        with gw.store.db.begin() as db:
            db.execute(insert(Session).values(tenant_id="acme", session_id="s", state="open",
                                              generation=1, created_at=start))  # fmt: skip
        gw.store.add_events([{"tenant_id": "acme", "session_id": "s", "at": start + 1,
                              "kind": "sandbox_created", "sandbox_id": "x"}])  # fmt: skip
        assert settings.gateway_rollup_lag_s == 300 and settings.gateway_rollup_interval_s == 60
        hours = asyncio.run(gw.roll_up())
        with gw.store.db() as db:
            last = db.scalar(select(EventRollupMark.last_hour))
        due = (time.time() - settings.gateway_rollup_lag_s) // HOUR * HOUR - HOUR
        assert last in (due, due - HOUR)  # (an hour may have ended meanwhile)
        assert hours == (last - start) / HOUR + 1 > 6  # more than one trip's worth
        assert asyncio.run(gw.roll_up()) in (0, 1)
    finally:
        asyncio.run(gw.provider.close())
        gw.store.close()


def test_the_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, gateway_rollup_interval_s=0)
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, gateway_rollup_lag_s=-1)
