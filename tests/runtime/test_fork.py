"""Fork with CRIU: one checkpoint of a running sandbox, N new sandboxes restored from it, each
with the source's processes and memory, its own files, id, uid range and cgroups; the source
runs on untouched."""

from __future__ import annotations

import time

import pytest

from sandhold.errors import InvalidRequest, Unsupported
from tests.runtime.helpers import sh
from tests.runtime.test_suspend import (  # noqa: F401 (_criu: autouse)
    COUNTER,
    THREADS,
    _criu,
    _state,
    assert_ticking,
)


async def test_forks_carry_the_memory_and_share_nothing(make_sandbox, runtime):
    source = await make_sandbox()
    await sh(source, COUNTER + "; echo before > /home/user/file; sleep 0.2")
    n0, secret = await _state(source)
    forks = runtime.fork(source.id, [{"n": 1}, {"n": 2}])
    make_sandbox.created += [f.id for f in forks if not isinstance(f, Exception)]
    assert all(not isinstance(f, Exception) for f in forks), forks
    time.sleep(0.1)
    ids = {source.id} | {f.id for f in forks}
    ranges = {runtime.get(i).host_uid for i in ids}
    assert len(ids) == 3 and len(ranges) == 3  # own ids, own host uid ranges
    for f in forks:
        n, s = await _state(f)
        assert s == secret and n > n0  # the source's process, carrying on in the fork
        assert f.extra in ({"n": 1}, {"n": 2})
    n, s = await _state(source)
    assert s == secret and n > n0  # the source runs on
    # Files: each its own copy of the layer.
    await sh(forks[0], "echo fork0 > /home/user/file")
    for info, want in ((source, "before"), (forks[0], "fork0"), (forks[1], "before")):
        assert (await sh(info, "cat /home/user/file")).text.strip() == want
    r = await sh(forks[1], "id -u; stat -c %u /home/user/file; ps -o user= -p $$")
    assert r.text.split()[:2] == ["1000", "1000"], r.text
    # Killing the source leaves the forks alone.
    runtime.kill(source.id)
    assert (await _state(forks[1]))[1] == secret


async def test_a_multi_threaded_process_forks(make_sandbox, runtime):
    """The interpreter's kernel has threads: each fork's land in the fork's own cgroups."""
    source = await make_sandbox()
    await sh(source, THREADS)
    forks = runtime.fork(source.id, [{}, {}])
    make_sandbox.created += [f.id for f in forks if not isinstance(f, Exception)]
    assert all(not isinstance(f, Exception) for f in forks), forks
    for info in (source, *forks):
        await assert_ticking(runtime, info)


async def test_what_cannot_be_forked_is_refused_and_nothing_made(make_sandbox, runtime):
    before = set(p.name for p in runtime.sandboxes_dir.iterdir())
    ws = await make_sandbox(workspace_id="fork-ws")
    with pytest.raises(Unsupported, match="host directories"):
        runtime.fork(ws.id, [{}])
    plain = await make_sandbox()
    with pytest.raises(InvalidRequest, match="between 1 and 20"):
        runtime.fork(plain.id, [{}] * 21)
    runtime.pause(plain.id)
    with pytest.raises(Exception, match="only a running sandbox"):
        runtime.fork(plain.id, [{}])
    assert set(p.name for p in runtime.sandboxes_dir.iterdir()) == before | {ws.id, plain.id}
    assert (await sh(ws, "echo ok")).text.strip() == "ok"  # the refused source is unharmed
