// The official `e2b` JavaScript SDK's tour against a live Sandhold server (E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY from tests/js/test_js_sdk.py): sandboxes, commands with
// streaming and stdin, PTY, files and watch, pause and resume, snapshots, fork, listing, metrics.
import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import { CommandExitError, Sandbox } from 'e2b'

const made = []
async function create(...args) {
  const sbx = await Sandbox.create(...args)
  made.push(sbx)
  return sbx
}
after(async () => { for (const s of made) await s.kill().catch(() => {}) })

const until = async (check, what, ms = 10_000) => {
  const end = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

test('create, info, list by metadata, timeout, connect, kill', async () => {
  const sbx = await create({ metadata: { suite: 'js-tour' }, timeoutMs: 120_000 })
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.metadata.suite, 'js-tour')
  assert.equal(info.state, 'running')
  const pages = Sandbox.list({ query: { metadata: { suite: 'js-tour' } } })
  const listed = await pages.nextItems()
  assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId))
  await sbx.setTimeout(300_000)
  assert.ok((await sbx.getInfo()).endAt > info.endAt)
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.commands.run('echo same')).stdout, 'same\n')
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
})

test('commands: output streamed, exit codes, env, cwd, root, background and stdin', async () => {
  const sbx = await create()
  const seen = []
  const r = await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.05; done', {
    onStdout: (d) => seen.push(d),
  })
  assert.equal(r.stdout, '1\n2\n3\n')
  assert.equal(seen.join(''), '1\n2\n3\n')
  await assert.rejects(sbx.commands.run('echo bad >&2; exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError)
    assert.equal(e.exitCode, 3)
    assert.equal(e.stderr, 'bad\n')
    return true
  })
  const env = await sbx.commands.run('echo $GREETING; pwd; whoami', { envs: { GREETING: 'hi' }, cwd: '/tmp' })
  assert.equal(env.stdout, 'hi\n/tmp\nuser\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')

  const h = await sbx.commands.run('read line; echo got:$line', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'hello\n')
  const done = await h.wait()
  assert.equal(done.stdout, 'got:hello\n')
  const listed = await sbx.commands.list()
  assert.ok(!listed.some((p) => p.pid === h.pid))
})

test('pty: input in, output out, resize, kill', async () => {
  const sbx = await create()
  let out = ''
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += new TextDecoder().decode(d) } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo from-the-pty $((6*7))\n'))
  await until(() => out.includes('from-the-pty 42'), 'the PTY to answer')
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  assert.equal(await sbx.pty.kill(term.pid), true)
})

test('files: text and bytes, list, exists, info, rename, remove, make_dir, watch', async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/a.txt', 'alpha')
  assert.equal(await sbx.files.read('/home/user/a.txt'), 'alpha')
  const bytes = new Uint8Array([0, 1, 2, 255])
  await sbx.files.write('/home/user/b.bin', bytes.buffer)
  assert.deepEqual(await sbx.files.read('/home/user/b.bin', { format: 'bytes' }), bytes)
  await sbx.files.write([{ path: '/home/user/m/1.txt', data: 'one' }, { path: '/home/user/m/2.txt', data: 'two' }])
  const names = (await sbx.files.list('/home/user/m')).map((e) => e.name).sort()
  assert.deepEqual(names, ['1.txt', '2.txt'])
  assert.equal(await sbx.files.exists('/home/user/m/1.txt'), true)
  const info = await sbx.files.getInfo('/home/user/a.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.size, 5)
  await sbx.files.rename('/home/user/a.txt', '/home/user/c.txt')
  assert.equal(await sbx.files.exists('/home/user/a.txt'), false)
  await sbx.files.remove('/home/user/c.txt')
  assert.equal(await sbx.files.makeDir('/home/user/newdir'), true)
  assert.equal(await sbx.files.makeDir('/home/user/newdir'), false)

  const events = []
  const watch = await sbx.files.watchDir('/home/user/newdir', (e) => events.push(e))
  await sbx.files.write('/home/user/newdir/w.txt', 'w')
  await until(() => events.some((e) => e.name === 'w.txt'), 'the watch event')
  await watch.stop()
})

test('pause and resume keep memory and files', async () => {
  const sbx = await create({ timeoutMs: 300_000 })
  const h = await sbx.commands.run('sleep 600', { background: true })
  await sbx.files.write('/home/user/kept.txt', 'kept')
  assert.equal(await sbx.betaPause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  const back = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await back.commands.run(`kill -0 ${h.pid} && cat /home/user/kept.txt`)).stdout, 'kept')
})

test('snapshots and fork', async () => {
  const sbx = await create({ timeoutMs: 300_000 })
  await sbx.files.write('/home/user/state.json', '{"step": 1}')
  const snap = await sbx.createSnapshot()
  const fromSnap = await create(snap.snapshotId)
  assert.equal(await fromSnap.files.read('/home/user/state.json'), '{"step": 1}')
  const forks = await sbx.fork({ count: 1 })
  assert.equal(forks.length, 1)
  assert.ok(forks[0] instanceof Sandbox, String(forks[0]))
  made.push(forks[0])
  assert.equal(await forks[0].files.read('/home/user/state.json'), '{"step": 1}')
  assert.notEqual(forks[0].sandboxId, sbx.sandboxId)
  await Sandbox.deleteSnapshot(snap.snapshotId)
})

test('metrics', async () => {
  const sbx = await create()
  await sbx.commands.run('true')
  await until(async () => (await sbx.getMetrics()).length > 0, 'a metrics sample', 20_000)
  const [m] = await sbx.getMetrics()
  assert.ok(m.memTotal > 0 && m.cpuCount > 0, JSON.stringify(m))
})
