// Templates through the official `e2b` JavaScript SDK's builder against a live Sandhold server.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { Sandbox, Template, waitForPort } from 'e2b'

test('build a template, start it with its start command serving, delete it', async () => {
  const template = Template()
    .fromBaseImage()
    .setEnvs({ GREETING: 'hello' })
    .runCmd('mkdir -p /home/user/site && echo built > /home/user/site/index.txt')
    .setWorkdir('/home/user/site')
    .setStartCmd('python3 -m http.server 8000', waitForPort(8000))
  const logs = []
  const info = await Template.build(template, 'js-built:v1', { onBuildLogs: (e) => logs.push(e.message) })
  assert.ok(logs.length > 0)
  assert.ok(await Template.exists('js-built'))
  const sbx = await Sandbox.create('js-built:v1')
  try {
    const r = await sbx.commands.run('echo $GREETING; pwd; curl -sf localhost:8000/index.txt')
    assert.equal(r.stdout, 'hello\n/home/user/site\nbuilt\n')
  } finally {
    await sbx.kill()
  }
  assert.ok(info.templateId)
})
