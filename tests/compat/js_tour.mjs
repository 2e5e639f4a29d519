// The JavaScript SDK tour of the compatibility matrix (test_matrix.py), run from a directory
// holding one released `e2b` against a live server (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY): one line of JSON on stdout, each feature "ok", "n/a" (this SDK has no such
// call) or "fail: <why>".
import { Sandbox, Template } from 'e2b'

const results = {}
const made = []
class Missing extends Error {}

async function feature(name, fn) {
  try {
    await fn()
    results[name] = 'ok'
  } catch (e) {
    results[name] = e instanceof Missing ? 'n/a' : `fail: ${String(e?.message ?? e).slice(0, 300)}`
  }
}
async function create(...args) {
  const sbx = await Sandbox.create(...args)
  made.push(sbx)
  return sbx
}
function call(obj, ...names) {
  for (const n of names) if (typeof obj[n] === 'function') return obj[n].bind(obj)
  throw new Missing(names[0])
}
const check = (ok, what) => { if (!ok) throw new Error(what) }
const until = async (fn, what, ms = 10_000) => {
  const end = Date.now() + ms
  while (!(await fn())) {
    check(Date.now() < end, what)
    await new Promise((r) => setTimeout(r, 100))
  }
}

await feature('sandbox lifecycle', async () => {
  const sbx = await create({ metadata: { matrix: 'js' }, timeoutMs: 120_000 })
  check((await sbx.getInfo()).metadata.matrix === 'js', 'metadata')
  await sbx.setTimeout(300_000)
  const again = await Sandbox.connect(sbx.sandboxId)
  check((await again.commands.run('echo c')).stdout === 'c\n', 'connect')
  check(await sbx.isRunning(), 'running')
  await sbx.kill()
  check(!(await sbx.isRunning()), 'killed')
})

await feature('list and metadata filter', async () => {
  const sbx = await create({ metadata: { matrix: 'list' } })
  const items = await Sandbox.list({ query: { metadata: { matrix: 'list' } } }).nextItems()
  check(items.some((s) => s.sandboxId === sbx.sandboxId), 'listed')
})

await feature('commands and stdin', async () => {
  const sbx = await create()
  let seen = ''
  const r = await sbx.commands.run('echo a; echo b >&2', { onStdout: (d) => { seen += d } })
  check(r.stdout === 'a\n' && r.stderr === 'b\n' && seen === 'a\n', 'run')
  const h = await sbx.commands.run('read x; echo got:$x', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'hi\n')
  check((await h.wait()).stdout === 'got:hi\n', 'stdin')
})

await feature('pty', async () => {
  const sbx = await create()
  let out = ''
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += new TextDecoder().decode(d) } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo p-$((1+1))\n'))
  await until(() => out.includes('p-2'), 'pty output')
  await sbx.pty.kill(term.pid)
})

await feature('files and watch', async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/a.txt', 'alpha')
  check((await sbx.files.read('/home/user/a.txt')) === 'alpha', 'read')
  check((await sbx.files.list('/home/user')).some((e) => e.name === 'a.txt'), 'list')
  const events = []
  const w = await sbx.files.watchDir('/home/user', (e) => events.push(e))
  await sbx.files.write('/home/user/b.txt', 'b')
  await until(() => events.some((e) => e.name === 'b.txt'), 'watch event')
  await w.stop()
})

await feature('pause and resume', async () => {
  const sbx = await create({ timeoutMs: 300_000 })
  await sbx.files.write('/home/user/kept.txt', 'kept')
  await call(sbx, 'pause', 'betaPause')()
  const back = await Sandbox.connect(sbx.sandboxId)
  check((await back.files.read('/home/user/kept.txt')) === 'kept', 'kept')
})

await feature('snapshots', async () => {
  const sbx = await create({ timeoutMs: 300_000 })
  await sbx.files.write('/home/user/s.txt', 'snap')
  const snap = await call(sbx, 'createSnapshot')()
  const again = await create(snap.snapshotId)
  check((await again.files.read('/home/user/s.txt')) === 'snap', 'restored')
  await call(Sandbox, 'deleteSnapshot')(snap.snapshotId)
})

await feature('fork', async () => {
  const sbx = await create({ timeoutMs: 300_000 })
  await sbx.files.write('/home/user/f.txt', 'fork')
  const forks = (await call(sbx, 'fork')({ count: 1 })).filter((f) => f instanceof Sandbox)
  made.push(...forks)
  check(forks.length === 1 && (await forks[0].files.read('/home/user/f.txt')) === 'fork', 'forked')
})

await feature('templates', async () => {
  const tpl = Template().fromBaseImage().runCmd('echo built > /home/user/t.txt')
  const name = process.env.MATRIX_TEMPLATE // one per run: the runs build at once
  await Template.build(tpl, name)
  const sbx = await create(name)
  check((await sbx.files.read('/home/user/t.txt')) === 'built\n', 'built')
})

await feature('metrics', async () => {
  const sbx = await create()
  await sbx.commands.run('true')
  await until(async () => (await sbx.getMetrics()).length > 0, 'metrics', 20_000)
})

for (const s of made) await s.kill().catch(() => {})
console.log(JSON.stringify(results))
