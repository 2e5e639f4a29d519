// Where Sandhold does what E2B does for the JavaScript SDK (issue 31), against a live server.
import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import { Sandbox, TimeoutError } from 'e2b'

const made = []
after(async () => { for (const s of made) await s.kill().catch(() => {}) })
async function create() {
  const sbx = await Sandbox.create()
  made.push(sbx)
  return sbx
}

test('a command running when its sandbox is killed says the sandbox was killed', async () => {
  const sbx = await create()
  const h = await sbx.commands.run('sleep 60', { background: true })
  setTimeout(() => { Sandbox.kill(sbx.sandboxId) }, 500)
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof TimeoutError, `${e.name}: ${e.message}`)
    assert.match(e.message, /killed or reached its end of life/)
    assert.doesNotMatch(e.message, /sandbox timeout/)
    return true
  })
})

test('a write into missing directories makes them for the user', async () => {
  const sbx = await create()
  await sbx.files.write('/0/a.txt', 'hi')
  assert.equal(await sbx.files.read('/0/a.txt'), 'hi')
  assert.equal((await sbx.commands.run('stat -c %U /0 /0/a.txt')).stdout, 'user\nuser\n')
  await sbx.files.makeDir('/top/level')
  await sbx.files.rename('/0/a.txt', '/moved/here/a.txt')
  assert.equal((await sbx.commands.run('stat -c %U /top/level /moved/here/a.txt')).stdout, 'user\nuser\n')
})

test('a symlink reports its target type with its target', async () => {
  const sbx = await create()
  await sbx.commands.run('mkdir -p /home/user/d && ln -s /home/user/d /home/user/ld')
  const info = await sbx.files.getInfo('/home/user/ld')
  assert.equal(info.type, 'dir')
  assert.equal(info.symlinkTarget, '/home/user/d')
})

test('pty.kill answers true once the process is gone', async () => {
  const sbx = await create()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  const big = "exec python3 -c 'b = bytearray(300 << 20); import time; time.sleep(600)'\n"
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode(big))
  for (let i = 0; i < 600; i++) {
    const rss = (await sbx.commands.run(`grep VmRSS /proc/${term.pid}/status || true`)).stdout
    if (Number(rss.split(/\s+/)[1] || 0) > 290 * 1024) break
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(await sbx.pty.kill(term.pid), true)
  const after = await sbx.commands.run(`kill -0 ${term.pid} 2>/dev/null && echo alive || echo gone`)
  assert.equal(after.stdout, 'gone\n')
})
