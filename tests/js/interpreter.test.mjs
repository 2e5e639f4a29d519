// The official `@e2b/code-interpreter` JavaScript SDK against a live Sandhold server: every
// language the server offers, contexts, errors, charts' data, envs.
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'

let sbx
before(async () => { sbx = await Sandbox.create({ timeoutMs: 600_000 }) })
after(async () => { await sbx?.kill() })

test('python: state kept, results, stdout, errors, envs', async () => {
  await sbx.runCode('x = 41')
  const r = await sbx.runCode('print("out"); x + 1')
  assert.equal(r.text, '42')
  assert.deepEqual(r.logs.stdout, ['out\n'])
  const bad = await sbx.runCode('1 / 0')
  assert.equal(bad.error.name, 'ZeroDivisionError')
  assert.equal((await sbx.runCode('import os; os.environ["K"]', { envs: { K: 'v' } })).text, 'v')  // a str as its content, as E2B's server shows it
})

test('javascript and typescript', async () => {
  assert.equal((await sbx.runCode('const a = 20; a * 2 + 2', { language: 'javascript' })).text, '42')
  assert.equal((await sbx.runCode('const f = (n: number): number => n + 1; f(41)', { language: 'typescript' })).text, '42')
})

test('r, java and bash', async () => {
  assert.match((await sbx.runCode('x <- c(1, 2, 3); sum(x)', { language: 'r' })).text, /6/)
  const j = await sbx.runCode('String s = System.getProperty("FROM_CALL"); s', { language: 'java', envs: { FROM_CALL: 'c' } })
  assert.equal(j.text, 'c')
  const b = await sbx.runCode('echo "$((6 * 7))"', { language: 'bash' })
  assert.deepEqual(b.logs.stdout, ['42\n'])
})

test('contexts keep their own state', async () => {
  const one = await sbx.createCodeContext({ language: 'python' })
  const two = await sbx.createCodeContext({ language: 'python' })
  await sbx.runCode('v = "one"', { context: one })
  await sbx.runCode('v = "two"', { context: two })
  assert.equal((await sbx.runCode('v', { context: one })).text, 'one')
  assert.equal((await sbx.runCode('v', { context: two })).text, 'two')
  const listed = await sbx.listCodeContexts()
  assert.ok(listed.some((c) => c.id === one.id))
  await sbx.removeCodeContext(one)
})

test('a chart comes back as an image with its data', async () => {
  const code = 'import matplotlib.pyplot as plt\nplt.bar(["a", "b"], [1, 2])\nplt.title("t")\nplt.show()'
  const r = await sbx.runCode(code)
  assert.equal(r.error, undefined)
  assert.ok(r.results[0].png.length > 100)
  assert.equal(r.results[0].chart.title, 't')
})
