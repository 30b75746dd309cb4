// Scenarios that drive paddock's E2B facade through the unchanged npm e2b
// SDK. test/e2b_test.go runs one per subtest: `node scenarios.mjs NAME`,
// with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointing at the
// daemon. Each prints "ok NAME" on success; any failed check throws (exit
// code 1). Lines "info KEY VALUE" report values the Go test checks too.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox, CommandExitError } from 'e2b'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function until(what, cond, ms = 10000) {
  const end = Date.now() + ms
  for (;;) {
    if (await cond()) return
    if (Date.now() > end) throw new Error('timed out waiting for ' + what)
    await sleep(50)
  }
}

function info(key, value) {
  console.log(`info ${key} ${value}`)
}

async function withSandbox(opts, fn) {
  const sbx = await Sandbox.create(opts)
  info('sandbox', sbx.sandboxId)
  try {
    await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

const scenarios = {
  // commands.run with onStdout, exit codes, users, env, cwd, background
  // commands with kill, stdin, connecting to a running command.
  async commands() {
    await withSandbox({}, async (sbx) => {
      const chunks = []
      const r = await sbx.commands.run('echo hi; echo oops >&2; whoami; pwd', { onStdout: (d) => chunks.push(d) })
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'hi\nuser\n/home/user\n')
      assert.equal(r.stderr, 'oops\n')
      assert.equal(chunks.join(''), r.stdout)

      await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
      assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
      assert.equal((await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar baz' } })).stdout, 'bar baz\n')
      assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
      assert.equal((await sbx.commands.run('python --version && git --version >/dev/null && echo ok')).stdout.trim().split('\n').pop(), 'ok')
      // Passwordless sudo to the sandbox's root, bounded like root's calls:
      // Docker's capabilities less CAP_NET_RAW (no CAP_SYS_ADMIN: no mounts) and seccomp.
      assert.equal((await sbx.commands.run('sudo -n whoami')).stdout, 'root\n')
      assert.match((await sbx.commands.run('sudo -n grep -E "^(CapEff|Seccomp):" /proc/self/status')).stdout, /CapEff:\s+00000000a80405fb\nSeccomp:\s+2/)
      await assert.rejects(sbx.commands.run('sudo -n mount -t tmpfs t /mnt'), CommandExitError)

      // A background command, listed, then killed.
      const bg = await sbx.commands.run('sleep 600', { background: true })
      assert.ok(bg.pid > 0)
      const listed = await sbx.commands.list()
      assert.ok(listed.some((p) => p.pid === bg.pid), 'background command is listed')
      assert.equal(await sbx.commands.kill(bg.pid), true)
      await assert.rejects(bg.wait(), (e) => e instanceof CommandExitError)
      assert.equal(await sbx.commands.kill(bg.pid), false, 'a second kill finds no process')

      // stdin: sendStdin, then closeStdin ends cat.
      const cat = await sbx.commands.run('cat', { background: true, stdin: true })
      await sbx.commands.sendStdin(cat.pid, 'line one\n')
      await sbx.commands.sendStdin(cat.pid, 'line two\n')
      await sbx.commands.closeStdin(cat.pid)
      const catRes = await cat.wait()
      assert.equal(catRes.stdout, 'line one\nline two\n')

      // Connect to a running command: new output arrives on the new handle.
      const ticker = await sbx.commands.run('for i in $(seq 1 1000); do echo tick $i; sleep 0.05; done', { background: true })
      await sleep(200)
      await ticker.disconnect()
      const got = []
      const again = await sbx.commands.connect(ticker.pid, { onStdout: (d) => got.push(d) })
      await until('output after connect', () => got.join('').includes('tick'))
      assert.equal(again.pid, ticker.pid)
      await again.kill()
      info('connected_output_bytes', got.join('').length)
    })
    console.log('ok commands')
  },

  // A PTY: input, output, resize.
  async pty() {
    await withSandbox({}, async (sbx) => {
      let out = ''
      const dec = new TextDecoder()
      const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
      await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo marker-$((6*7))\n'))
      await until('first stty size', () => out.includes('marker-42'))
      assert.match(out, /24 80/)
      await sbx.pty.resize(term.pid, { cols: 120, rows: 40 })
      out = ''
      await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo marker-$((6*8))\n'))
      await until('stty size after resize', () => out.includes('marker-48'))
      assert.match(out, /40 120/)
      await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit 0\n'))
      const res = await term.wait()
      assert.equal(res.exitCode, 0)
    })
    console.log('ok pty')
  },

  // Files: write/read/list/exists/remove/rename/makeDir, several files at
  // once, gzip both ways, signed URLs, and watchDir.
  async files() {
    await withSandbox({}, async (sbx) => {
      const w = await sbx.files.write('notes/a.txt', 'alpha')
      assert.equal(w.path, '/home/user/notes/a.txt')
      assert.equal(await sbx.files.read('notes/a.txt'), 'alpha')
      assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'alpha')
      assert.equal((await sbx.commands.run('stat -c %U:%G /home/user/notes/a.txt /home/user/notes')).stdout, 'user:user\nuser:user\n')

      const many = await sbx.files.write([{ path: 'm/1.txt', data: 'one' }, { path: 'm/2.txt', data: 'two' }])
      assert.equal(many.length, 2)
      assert.deepEqual((await sbx.files.list('m')).map((e) => e.name).sort(), ['1.txt', '2.txt'])

      assert.equal(await sbx.files.exists('notes/a.txt'), true)
      assert.equal(await sbx.files.exists('notes/missing.txt'), false)
      assert.equal(await sbx.files.makeDir('d1/d2'), true)
      assert.equal(await sbx.files.makeDir('d1/d2'), false, 'makeDir of an existing directory')
      const moved = await sbx.files.rename('notes/a.txt', 'd1/d2/b.txt')
      assert.equal(moved.path, '/home/user/d1/d2/b.txt')
      assert.equal(await sbx.files.exists('notes/a.txt'), false)
      const deep = await sbx.files.list('d1', { depth: 2 })
      assert.deepEqual(deep.map((e) => e.path).sort(), ['/home/user/d1/d2', '/home/user/d1/d2/b.txt'])
      assert.equal(deep.find((e) => e.name === 'd2').type, 'dir')
      const st = await sbx.files.getInfo('d1/d2/b.txt')
      assert.equal(st.size, 5)
      assert.equal(st.owner, 'user')
      await sbx.files.remove('d1')
      assert.equal(await sbx.files.exists('d1'), false)
      await assert.rejects(sbx.files.read('nope.txt'), (e) => e.name === 'FileNotFoundError' || e.name === 'NotFoundError')

      // gzip both ways.
      const text = 'zip '.repeat(10000)
      await sbx.files.write('z.txt', text, { gzip: true })
      assert.equal(await sbx.files.read('z.txt', { gzip: true }), text)
      assert.equal((await sbx.commands.run('wc -c < z.txt')).stdout.trim(), String(text.length))

      // Root's files through Basic auth.
      await sbx.files.write('/root/secret.txt', 'r', { user: 'root' })
      assert.equal((await sbx.commands.run('stat -c %U /root/secret.txt', { user: 'root' })).stdout, 'root\n')

      // Signed URLs: no access token, a signature instead.
      const up = await sbx.uploadUrl('signed.txt', { useSignatureExpiration: 60 })
      const form = new FormData()
      form.append('file', new Blob(['signed body']), 'signed.txt')
      let res = await fetch(up, { method: 'POST', body: form, headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
      assert.equal(res.status, 200)
      const down = await sbx.downloadUrl('signed.txt')
      res = await fetch(down, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
      assert.equal(res.status, 200)
      assert.equal(await res.text(), 'signed body')
      const forged = new URL(down)
      forged.searchParams.set('path', '/root/secret.txt')
      res = await fetch(forged, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
      assert.equal(res.status, 401, 'a signature is bound to its path')
      res = await fetch(new URL(down).origin + '/files?path=signed.txt', { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
      assert.equal(res.status, 401, 'no token, no signature')

      // watchDir: create, write, remove.
      await sbx.files.makeDir('w')
      const events = []
      const handle = await sbx.files.watchDir('w', (e) => events.push(e))
      await sbx.files.write('w/x.txt', 'x')
      await sbx.files.remove('w/x.txt')
      await until('watch events', () => events.some((e) => e.type === 'remove'))
      await handle.stop()
      assert.ok(events.some((e) => e.name === 'x.txt' && (e.type === 'create' || e.type === 'write')), JSON.stringify(events))
      info('watch_events', events.map((e) => `${e.type}:${e.name}`).join(','))
    })
    console.log('ok files')
  },

  // 100 MB up and down, as bytes and as a stream.
  async bigfile() {
    await withSandbox({}, async (sbx) => {
      const data = randomBytes(100 << 20)
      const sum = createHash('sha256').update(data).digest('hex')
      let t = Date.now()
      await sbx.files.write('big.bin', data.buffer.slice(data.byteOffset, data.byteOffset + data.length))
      info('upload_ms', Date.now() - t)
      const inside = (await sbx.commands.run('sha256sum big.bin')).stdout.split(' ')[0]
      assert.equal(inside, sum)
      t = Date.now()
      const back = await sbx.files.read('big.bin', { format: 'bytes' })
      info('download_ms', Date.now() - t)
      assert.equal(back.length, data.length)
      assert.equal(createHash('sha256').update(back).digest('hex'), sum)
      // Streamed upload (octet-stream) and streamed download.
      const stream = new Blob([data]).stream()
      await sbx.files.write('big2.bin', stream)
      const rs = await sbx.files.read('big2.bin', { format: 'stream' })
      const h = createHash('sha256')
      let n = 0
      for await (const chunk of rs) {
        h.update(chunk)
        n += chunk.length
      }
      assert.equal(n, data.length)
      assert.equal(h.digest('hex'), sum)
    })
    console.log('ok bigfile')
  },

  // Control plane: metadata, list filters and pages, getInfo, metrics,
  // setTimeout, pause and connect-to-resume, kill.
  async lifecycle() {
    const tag = randomBytes(4).toString('hex')
    const a = await Sandbox.create({ metadata: { suite: tag, role: 'a' }, timeoutMs: 120_000 })
    const b = await Sandbox.create({ metadata: { suite: tag, role: 'b' } })
    info('sandbox', a.sandboxId)
    info('sandbox', b.sandboxId)
    try {
      const found = []
      const pager = Sandbox.list({ query: { metadata: { suite: tag } }, limit: 1 })
      while (pager.hasNext) found.push(...(await pager.nextItems()))
      assert.deepEqual(found.map((s) => s.sandboxId).sort(), [a.sandboxId, b.sandboxId].sort())
      const onlyA = await Sandbox.list({ query: { metadata: { suite: tag, role: 'a' } } }).nextItems()
      assert.deepEqual(onlyA.map((s) => s.sandboxId), [a.sandboxId])

      const infoA = await a.getInfo()
      assert.equal(infoA.templateId, 'base')
      assert.equal(infoA.state, 'running')
      assert.deepEqual(infoA.metadata, { suite: tag, role: 'a' })
      const left = infoA.endAt.getTime() - Date.now()
      assert.ok(left > 100_000 && left <= 121_000, `endAt is the timeout away (${left} ms)`)

      await a.commands.run('head -c 20000000 /dev/zero | md5sum >/dev/null')
      // [] until the first sample (the telemetry's interval, 1 s).
      let metrics = []
      await until('a metrics sample', async () => (metrics = await a.getMetrics()).length >= 1, 5000)
      const m = metrics[metrics.length - 1]
      assert.ok(m.memTotal > 0 && m.memUsed > 0 && m.diskTotal > 0 && m.cpuCount >= 1, JSON.stringify(m))
      info('metrics', JSON.stringify(m))

      // Pause: files stay, processes end, envd answers 502; connect resumes.
      await a.files.write('kept.txt', 'still here')
      assert.equal(await a.pause(), true)
      assert.equal(await a.isRunning(), false)
      assert.equal(await Sandbox.pause(a.sandboxId), false, 'pausing a paused sandbox')
      const paused = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['paused'] } }).nextItems()
      assert.deepEqual(paused.map((s) => s.sandboxId), [a.sandboxId])
      const resumed = await Sandbox.connect(a.sandboxId)
      assert.equal(await resumed.isRunning(), true)
      assert.equal(await resumed.files.read('kept.txt'), 'still here')
      assert.equal((await resumed.commands.run('echo back')).stdout, 'back\n')
      assert.equal((await resumed.getInfo()).state, 'running')

      // setTimeout: the sandbox ends when it is up.
      await b.setTimeout(2000)
      await until('sandbox b to time out', async () => !(await b.isRunning()), 15000)
      await assert.rejects(b.getInfo(), (e) => e.name === 'SandboxNotFoundError' || e.name === 'NotFoundError')

      // autoPause + autoResume: the timeout pauses, the next envd call
      // resumes.
      const c = await Sandbox.create({ timeoutMs: 1500, lifecycle: { onTimeout: 'pause', autoResume: true } })
      info('sandbox', c.sandboxId)
      await c.files.write('auto.txt', 'kept')
      await until('sandbox c to pause on its timeout', async () => (await c.getInfo()).state === 'paused', 15000)
      assert.equal((await c.commands.run('cat auto.txt')).stdout, 'kept')
      assert.equal((await c.getInfo()).state, 'running')
      await c.kill()

      assert.equal(await resumed.kill(), true)
      assert.equal(await Sandbox.kill(a.sandboxId), false, 'a second kill finds nothing')
      const none = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
      assert.equal(none.length, 0)
    } finally {
      await Sandbox.kill(a.sandboxId).catch(() => {})
      await Sandbox.kill(b.sandboxId).catch(() => {})
    }
    console.log('ok lifecycle')
  },

  // A stream open when its sandbox is killed: the connection drops, the
  // SDK probes /health (502) and reports the sandbox gone.
  async killed() {
    const sbx = await Sandbox.create()
    info('sandbox', sbx.sandboxId)
    const handle = await sbx.commands.run('while true; do echo alive; sleep 0.1; done', { background: true, onStdout: () => {} })
    const term = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
    await sleep(300)
    await Sandbox.kill(sbx.sandboxId)
    const err = await handle.wait().then(() => null, (e) => e)
    assert.ok(err, 'the stream ends with an error')
    info('stream_error', `${err.name}: ${err.message}`.replace(/\s+/g, ' '))
    assert.equal(err.name, 'TimeoutError', `${err.name}: ${err.message}`)
    const perr = await term.wait().then(() => null, (e) => e)
    assert.equal(perr?.name, 'TimeoutError')
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(sbx.commands.run('true'))
    console.log('ok killed')
  },

  // The benchmark's flow (bench/e2b.go drives it): for each line read, a
  // template name, time Sandbox.create() + commands.run('echo hi') +
  // kill() and print "ms MILLISECONDS ID".
  async bench() {
    const rl = (await import('node:readline')).createInterface({ input: process.stdin })
    console.log('ready')
    for await (const line of rl) {
      const template = line.trim()
      let step = 'create'
      const watchdog = setTimeout(() => {
        console.error(`bench flow stuck in ${step} for 60 s`)
        process.exit(1)
      }, 60000)
      const t = process.hrtime.bigint()
      const sbx = await Sandbox.create(template)
      step = 'run ' + sbx.sandboxId
      const r = await sbx.commands.run('echo hi')
      step = 'kill ' + sbx.sandboxId
      await sbx.kill()
      clearTimeout(watchdog)
      const ms = Number(process.hrtime.bigint() - t) / 1e6
      assert.equal(r.stdout, 'hi\n')
      console.log(`ms ${ms.toFixed(3)} ${sbx.sandboxId}`)
    }
  },
}

const name = process.argv[2]
if (!scenarios[name]) {
  console.error(`usage: node scenarios.mjs {${Object.keys(scenarios).join('|')}}`)
  process.exit(2)
}
try {
  await scenarios[name]()
} catch (e) {
  console.error(e)
  process.exit(1)
}
