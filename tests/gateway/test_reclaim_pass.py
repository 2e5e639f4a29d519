"""A reclaim pass reads the provider once and kills in parallel, bounded: a gateway in this
process, its ``e2b`` provider talking HTTP to a real `sandhold serve` (tests/support/e2b_server.py),
every request it sends counted on its own httpx client, every store transaction on its engine."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import event

from sandhold.config import Settings
from sandhold.gateway.app import Gateway
from sandhold.gateway.providers.e2b import E2bProvider
from tests.support.e2b_server import KEY_A, Server
from tests.support.gateway_server import destroy_runtime_dir, kill_tagged, scratch_dir

SESSIONS = 6
CONCURRENCY = 2


class Requests:
    """What the provider's client sent, and how many of its DELETEs were in flight at most."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.deletes_in_flight = 0
        self.max_deletes_in_flight = 0

    async def request(self, r: httpx.Request) -> None:
        path = "/sandboxes/{id}" if r.url.path.startswith("/sandboxes/") else r.url.path
        self.sent[f"{r.method} {path}"] += 1
        if r.method == "DELETE":
            self.deletes_in_flight += 1
            self.max_deletes_in_flight = max(self.max_deletes_in_flight, self.deletes_in_flight)

    async def response(self, r: httpx.Response) -> None:
        if r.request.method == "DELETE":
            self.deletes_in_flight -= 1


async def until_paused(gw: Gateway, n: int) -> None:
    while [s.state for s in await gw.provider.list(gw.manager.gateway_tags())].count("paused") < n:
        await asyncio.sleep(0.2)


def test_one_pass_reads_the_provider_once_and_kills_in_parallel_bounded(
    e2b_server: Server, workspace_root: Path
) -> None:
    data_dir = scratch_dir("sandhold-gw-reclaim-")
    name = f"t{uuid.uuid4().hex[:10]}"
    policy = {"keep_alive_s": 1, "retention_s": 0}
    settings = Settings(
        data_dir=data_dir, gateway_provider="e2b", gateway_name=name,
        gateway_e2b_api_url=e2b_server.url, gateway_e2b_sandbox_url=e2b_server.url,
        gateway_e2b_api_key=KEY_A, gateway_workspace_root=workspace_root / name,
        gateway_tenants={"acme": {"api_key": "k" * 20, "policy": policy}},
        gateway_reclaim_concurrency=CONCURRENCY, prebuild_templates=[],
    )  # fmt: skip

    async def scenario() -> dict[str, Any]:
        gw = Gateway(settings)
        async with gw.running(reclaim=False):
            for i in range(SESSIONS):
                async with gw.manager.use("acme", f"s{i}", "test", 10):
                    pass
            await until_paused(gw, SESSIONS)
            # One session is being changed by someone else: its sandbox must survive the pass.
            busy = await gw.manager.session("acme", "s0")
            assert gw.store.try_lock(busy.pk, 60) is not None
            assert isinstance(gw.provider, E2bProvider)
            seen = Requests()
            gw.provider.api.event_hooks = {"request": [seen.request], "response": [seen.response]}
            transactions = Counter[str]()
            event.listen(gw.store.engine, "begin", lambda _c: transactions.update(["begin"]))
            report = await gw.reclaimer.run_pass()
            gw.provider.api.event_hooks = {"request": [], "response": []}
            in_pass = transactions["begin"]
            left = await gw.provider.list(gw.manager.gateway_tags())
            events = gw.store.events("sandbox_reclaimed")
            return {"report": report, "sent": seen.sent, "max": seen.max_deletes_in_flight,
                    "transactions": in_pass, "left": left,
                    "events": events, "busy_sandbox": busy.sandbox_id,
                    "sessions": gw.store.sessions("acme")}  # fmt: skip

    try:
        out = asyncio.run(scenario())
    finally:
        kill_tagged(e2b_server, name)
        assert not destroy_runtime_dir(data_dir)
    report = out["report"]
    assert report.listed == SESSIONS and report.paused == SESSIONS, report
    assert report.reclaimed == SESSIONS - 1 and report.skipped_locked == 1, report
    assert report.pauses_recorded == SESSIONS and report.errors == 0, report
    # The provider's state was read once (one page), never per sandbox; one kill per reclaim.
    assert out["sent"] == {"GET /v2/sandboxes": 1, "DELETE /sandboxes/{id}": SESSIONS - 1}
    # The kills overlapped, never more than the setting allows.
    assert 1 < out["max"] <= CONCURRENCY, out["max"]
    # The store: sessions, tenants, the pauses, the batch's locks and its results.
    assert out["transactions"] <= 5, out["transactions"]
    assert [s.id for s in out["left"]] == [out["busy_sandbox"]]
    assert len(out["events"]) == SESSIONS - 1
    assert {e.reason.split(" for ")[0] for e in out["events"]} == {"paused"}
    for row in out["sessions"]:
        assert row.lock_owner is None or row.session_id == "s0", row
        assert (row.sandbox_id is None) == (row.session_id != "s0"), row
