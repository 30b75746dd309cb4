// Scenarios that drive paddock's E2B facade through the unchanged npm e2b
// SDK. test/e2b_test.go runs one per subtest: `node scenarios.mjs NAME`,
// with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointing at the
// daemon. Each prints "ok NAME" on success; any failed check throws (exit
// code 1). Lines "info KEY VALUE" report values the Go test checks too.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import http from 'node:http'
import { readFileSync } from 'node:fs'
import { Sandbox, CommandExitError } from 'e2b'

const WS_ECHO = `import socket, hashlib, base64
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 8001))
s.listen()
while True:
    c, _ = s.accept()
    d = b''
    while b'\\r\\n\\r\\n' not in d:
        d += c.recv(4096)
    k = [l.split(b':', 1)[1].strip() for l in d.split(b'\\r\\n') if l.lower().startswith(b'sec-websocket-key')][0]
    a = base64.b64encode(hashlib.sha1(k + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ' + a + b'\\r\\n\\r\\n')
    f = c.recv(4096)
    n = f[1] & 127
    m = f[2:6]
    p = bytes(b ^ m[i % 4] for i, b in enumerate(f[6:6 + n]))
    c.sendall(bytes([0x81, len(p)]) + p)
    c.close()
`

// wsEcho opens a WebSocket to host through the facade at api, sends text
// in one masked frame and returns the text of the first frame back.
function wsEcho(api, host, text) {
  return new Promise((resolve, reject) => {
    // Its own connection (agent: false): a refused upgrade's answer
    // would otherwise leave a kept-alive connection in the global agent,
    // which holds node's exit until the facade's idle timeout closes it
    // (the ingress scenario once took 120 s for it).
    const req = http.request({
      hostname: api.hostname, port: api.port, path: '/', agent: false,
      headers: { host, connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': randomBytes(16).toString('base64') },
    })
    req.on('upgrade', (res, socket) => {
      const payload = Buffer.from(text)
      const mask = randomBytes(4)
      const frame = Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, payload.map((b, i) => b ^ mask[i % 4])])
      socket.write(frame)
      let buf = Buffer.alloc(0)
      socket.on('data', (d) => {
        buf = Buffer.concat([buf, d])
        if (buf.length >= 2 && buf.length >= 2 + (buf[1] & 127)) {
          socket.destroy()
          resolve(buf.subarray(2, 2 + (buf[1] & 127)).toString())
        }
      })
      socket.on('error', reject)
    })
    req.on('response', (res) => { res.resume(); reject(new Error('no upgrade: ' + res.statusCode)) })
    req.on('error', reject)
    req.end()
  })
}

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

// signedPlainly fetches sbx's signed file URLs with no sandbox header, as
// a plain client does: download, upload, an expired one, a bad one.
async function signedPlainly(sbx) {
  await sbx.files.write('plain.txt', 'plain client')
  const url = await sbx.downloadUrl('plain.txt')
  let res = await fetch(url)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'plain client')
  // Again (a gateway remembers which sandbox signed it).
  res = await fetch(url)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'plain client')
  const form = new FormData()
  form.append('file', new Blob(['uploaded plainly']), 'up.txt')
  res = await fetch(await sbx.uploadUrl('up.txt'), { method: 'POST', body: form })
  assert.equal(res.status, 200)
  assert.equal(await sbx.files.read('up.txt'), 'uploaded plainly')
  const soon = await sbx.downloadUrl('plain.txt', { useSignatureExpiration: 1 })
  await sleep(2100)
  res = await fetch(soon)
  assert.equal(res.status, 401)
  assert.equal((await res.json()).message, 'signature is already expired')
  const bad = new URL(await sbx.downloadUrl('plain.txt'))
  bad.searchParams.set('signature', 'v1_AAAA')
  res = await fetch(bad)
  assert.equal(res.status, 401)
  assert.equal((await res.json()).message, 'invalid signature')
}

const scenarios = {
  // Signed file URLs fetched plainly on E2B_SANDBOX_URL (a gateway's own
  // name, where only the signature says which sandbox they are for).
  async signed() {
    await withSandbox({}, signedPlainly)
    console.log('ok signed')
  },

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
      // The resume is a new boot, with a boot_id of its own (never the
      // host's).
      const bootId = async (s) => (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
      const hostBoot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim()
      const boot1 = await bootId(a)
      assert.match(boot1, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
      assert.notEqual(boot1, hostBoot)
      assert.notEqual(boot1, await bootId(b), 'each sandbox its own')
      await assert.rejects(a.commands.run('echo x > /proc/sys/kernel/random/boot_id', { user: 'root' }))
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
      const boot2 = await bootId(resumed)
      assert.notEqual(boot2, boot1, 'a resume is a new boot')
      assert.notEqual(boot2, hostBoot)
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

  // List: order, startedAfter, the template filter, pages in either
  // order; metrics over a range.
  async listing() {
    const tag = randomBytes(4).toString('hex')
    const made = []
    try {
      for (let i = 0; i < 3; i++) {
        made.push(await Sandbox.create({ metadata: { suite: tag, n: String(i) } }))
        info('sandbox', made[i].sandboxId)
        await sleep(20)
      }
      const ids = made.map((s) => s.sandboxId)
      const all = async (opts) => {
        const out = []
        const pager = Sandbox.list({ ...opts, query: { metadata: { suite: tag }, ...opts.query } })
        while (pager.hasNext) out.push(...(await pager.nextItems()))
        return out.map((s) => s.sandboxId)
      }
      assert.deepEqual(await all({ query: {} }), [...ids].reverse(), 'newest first by default')
      assert.deepEqual(await all({ query: {}, order: 'desc', limit: 1 }), [...ids].reverse())
      assert.deepEqual(await all({ query: {}, order: 'asc', limit: 2 }), ids, 'oldest first, two pages')
      const second = (await made[1].getInfo()).startedAt
      assert.deepEqual(await all({ query: { startedAfter: second }, order: 'asc' }), ids.slice(1), 'startedAfter is inclusive')
      assert.deepEqual(await all({ query: { template: 'base' }, order: 'asc' }), ids)
      assert.deepEqual(await all({ query: { template: 'no-such-template' } }), [])
      await assert.rejects(Sandbox.list({ order: 'sideways' }).nextItems(), (e) => /order/.test(e.message))

      // Metrics over a range: nothing before the sandbox existed; the
      // samples of its life after.
      const born = (await made[0].getInfo()).startedAt
      const before = await made[0].getMetrics({ start: new Date(born.getTime() - 3600_000), end: new Date(born.getTime() - 60_000) })
      assert.deepEqual(before, [])
      let ranged = []
      await until('two samples in range', async () => (ranged = await made[0].getMetrics({ start: born, end: new Date() })).length >= 2, 10000)
      for (const m of ranged) assert.ok(m.timestamp.getTime() >= born.getTime() - 1000 && m.memTotal > 0, JSON.stringify(m))
      assert.ok(ranged[0].timestamp <= ranged[ranged.length - 1].timestamp)
      info('ranged_samples', ranged.length)
    } finally {
      for (const s of made) await s.kill().catch(() => {})
    }
    console.log('ok listing')
  },

  // Snapshots (named and not), listed all, per sandbox and by name,
  // sandboxes made from them, deleted; forks.
  async snapshots() {
    await withSandbox({}, async (sbx) => {
      await sbx.files.write('state.txt', 'one')
      const anon = await sbx.createSnapshot()
      assert.match(anon.snapshotId, /^snap-/)
      assert.deepEqual(anon.names, [])
      const name = 'snap-test-' + randomBytes(3).toString('hex')
      await sbx.files.write('state.txt', 'two')
      const named = await sbx.createSnapshot({ name })
      assert.deepEqual(named.names, [name + ':default'])
      await assert.rejects(sbx.createSnapshot({ name: 'Bad Name!' }), (e) => /name/.test(e.message))

      const mine = []
      const pager = sbx.listSnapshots({ limit: 1 })
      while (pager.hasNext) mine.push(...(await pager.nextItems()))
      assert.deepEqual(mine.map((s) => s.snapshotId), [named.snapshotId, anon.snapshotId], 'per sandbox, newest first')
      const byName = await Sandbox.listSnapshots({ name }).nextItems()
      assert.deepEqual(byName.map((s) => s.snapshotId), [named.snapshotId])
      const everything = await Sandbox.listSnapshots().nextItems()
      assert.ok(everything.some((s) => s.snapshotId === anon.snapshotId))

      // Sandboxes from a snapshot id and from a name.
      const fromId = await Sandbox.create(anon.snapshotId)
      info('sandbox', fromId.sandboxId)
      assert.equal(await fromId.files.read('state.txt'), 'one')
      await fromId.kill()
      const fromName = await Sandbox.create(name)
      info('sandbox', fromName.sandboxId)
      assert.equal(await fromName.files.read('state.txt'), 'two')
      await fromName.kill()

      assert.equal(await Sandbox.deleteSnapshot(anon.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(anon.snapshotId), false, 'a second delete finds nothing')
      assert.equal(await Sandbox.deleteSnapshot(name), true, 'delete by name')
      assert.deepEqual(await Sandbox.listSnapshots({ name }).nextItems(), [])

      // Fork: two sandboxes with the source's files; the source runs on.
      await sbx.files.write('state.txt', 'three')
      const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
      assert.equal(forks.length, 2)
      for (const f of forks) {
        assert.ok(f instanceof Sandbox, String(f))
        info('sandbox', f.sandboxId)
        assert.equal(await f.files.read('state.txt'), 'three')
        const left = (await f.getInfo()).endAt.getTime() - Date.now()
        assert.ok(left > 50_000 && left <= 61_000, `fork's timeout (${left} ms)`)
      }
      await forks[0].files.write('state.txt', 'fork')
      assert.equal(await sbx.files.read('state.txt'), 'three', 'forks are copies')
      assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
      for (const f of forks) await f.kill()
      await assert.rejects(Sandbox.fork(sbx.sandboxId, { count: 1000 }), (e) => /count/.test(e.message))
      await assert.rejects(Sandbox.fork('nosuchsandbox0000000', {}), (e) => e.name === 'SandboxNotFoundError')
    })
    console.log('ok snapshots')
  },

  // Entry info as envd gives it: permission bits only; a symlink by its
  // target; removing a missing path succeeds.
  async entries() {
    await withSandbox({}, async (sbx) => {
      await sbx.commands.run('mkdir -p d && chmod 750 d && echo hi > d/f && chmod 640 d/f && ln -s d/f link && ln -s d dlink && ln -s nowhere broken')
      const f = await sbx.files.getInfo('d/f')
      assert.equal(f.type, 'file')
      assert.equal(f.mode, 0o640)
      assert.equal(f.permissions, '-rw-r-----')
      const d = await sbx.files.getInfo('d')
      assert.equal(d.type, 'dir')
      assert.equal(d.mode, 0o750)
      assert.equal(d.permissions, 'drwxr-x---')
      const l = await sbx.files.getInfo('link')
      assert.equal(l.type, 'file', 'a symlink has its target type')
      assert.equal(l.mode, 0o640)
      assert.equal(l.symlinkTarget, '/home/user/d/f')
      assert.match(l.permissions, /^L/)
      const dl = (await sbx.files.list('.')).find((e) => e.name === 'dlink')
      assert.equal(dl.type, 'dir')
      assert.equal(dl.symlinkTarget, '/home/user/d')
      const b = await sbx.files.getInfo('broken')
      assert.equal(b.type, undefined)
      assert.equal(b.symlinkTarget, '/home/user/broken')
      await sbx.files.remove('no/such/path')
      await sbx.files.remove('link')
      assert.equal(await sbx.files.exists('d/f'), true, 'removing a link keeps its target')
    })
    console.log('ok entries')
  },

  // File metadata (envd 0.6.2): user.e2b.* xattrs written with a file,
  // read back by getInfo, list, rename and from inside, replaced on
  // overwrite; watch events with entry info (envd 0.6.3), allowNetworkMounts
  // (0.6.4).
  async metadata() {
    await withSandbox({}, async (sbx) => {
      const w = await sbx.files.write('m/a.txt', 'alpha', { metadata: { Owner: 'me', 'x-tag': 'v1' } })
      assert.deepEqual(w.metadata, { owner: 'me', 'x-tag': 'v1' }, 'keys are lowercased, as envd does')
      assert.deepEqual((await sbx.files.getInfo('m/a.txt')).metadata, { owner: 'me', 'x-tag': 'v1' })
      const listed = (await sbx.files.list('m')).find((e) => e.name === 'a.txt')
      assert.deepEqual(listed.metadata, { owner: 'me', 'x-tag': 'v1' })
      const inside = await sbx.commands.run(`python3 -c "import os; print(os.getxattr('m/a.txt', 'user.e2b.owner').decode())"`)
      assert.equal(inside.stdout, 'me\n', 'the metadata is the file\'s xattrs')
      await sbx.commands.run(`python3 -c "import os; os.setxattr('m/a.txt', 'user.e2b.set-inside', b'yes'); os.setxattr('m/a.txt', 'user.other', b'no')"`)
      const moved = await sbx.files.rename('m/a.txt', 'm/b.txt')
      assert.deepEqual(moved.metadata, { owner: 'me', 'x-tag': 'v1', 'set-inside': 'yes' }, 'set from inside shows; other user.* does not')
      const many = await sbx.files.write([{ path: 'm/1.txt', data: '1' }, { path: 'm/2.txt', data: '2' }], { metadata: { batch: 'yes' } })
      assert.deepEqual(many.map((f) => f.metadata), [{ batch: 'yes' }, { batch: 'yes' }])
      await sbx.files.write('m/b.txt', 'beta', { metadata: { fresh: '1' } })
      assert.deepEqual((await sbx.files.getInfo('m/b.txt')).metadata, { fresh: '1' }, 'an overwrite replaces the set')
      const plain = await sbx.files.write('m/b.txt', 'gamma')
      assert.equal(plain.metadata, undefined)
      assert.equal((await sbx.files.getInfo('m/b.txt')).metadata, undefined, 'an overwrite without metadata clears it')
      await sbx.files.write('m/s.txt', 'stream', { metadata: { via: 'octet' }, useOctetStream: true })
      assert.deepEqual((await sbx.files.getInfo('m/s.txt')).metadata, { via: 'octet' })
      assert.equal((await sbx.files.getInfo('m')).metadata, undefined)

      // Watch events with entry info: the file as it is when the event is sent.
      await sbx.files.makeDir('w')
      const events = []
      const handle = await sbx.files.watchDir('w', (e) => events.push(e), { includeEntry: true })
      await sbx.files.write('w/x.txt', 'xyz', { metadata: { k: 'v' } })
      await until('a write event', () => events.some((e) => e.name === 'x.txt' && e.entry && e.entry.size === 3))
      await sbx.files.remove('w/x.txt')
      await until('a remove event', () => events.some((e) => e.type === 'remove'))
      await handle.stop()
      const withEntry = events.find((e) => e.name === 'x.txt' && e.entry && e.entry.size === 3)
      assert.equal(withEntry.entry.path, '/home/user/w/x.txt')
      assert.equal(withEntry.entry.type, 'file')
      assert.equal(withEntry.entry.owner, 'user')
      assert.deepEqual(withEntry.entry.metadata, { k: 'v' })
      assert.equal(events.find((e) => e.type === 'remove').entry, undefined, 'a removed file has no entry')
      const plainEvents = []
      const h2 = await sbx.files.watchDir('w', (e) => plainEvents.push(e))
      await sbx.files.write('w/y.txt', 'y')
      await until('an event', () => plainEvents.length > 0)
      await h2.stop()
      assert.equal(plainEvents[0].entry, undefined, 'no entry unless asked')
      // envd 0.6.4: the SDK sends allowNetworkMounts; a local directory is
      // watched with inotify as before (a network mount would be polled).
      const netEvents = []
      const h3 = await sbx.files.watchDir('w', (e) => netEvents.push(e), { allowNetworkMounts: true, recursive: true })
      await sbx.files.write('w/z.txt', 'z')
      await until('an event with allowNetworkMounts', () => netEvents.some((e) => e.name === 'z.txt'))
      await h3.stop()
      info('watch_entry_events', events.map((e) => `${e.type}:${e.name}:${e.entry ? e.entry.size : '-'}`).join(','))
    })
    console.log('ok metadata')
  },

  // Network settings as paddock policy (read back from inside, in
  // /run/paddock/policy.json), updateNetwork, header transforms as
  // secrets the sandbox never holds, the traffic token; bad input.
  async network() {
    const policyOf = async (sbx) => JSON.parse((await sbx.commands.run('cat /run/paddock/policy.json')).stdout)
    await withSandbox({ allowInternetAccess: false }, async (sbx) => {
      assert.equal((await sbx.getInfo()).allowInternetAccess, false)
      const p = await policyOf(sbx)
      assert.ok(!(p.presets ?? []).includes('internet'), JSON.stringify(p))
      assert.equal(sbx.trafficAccessToken, undefined)
    })
    await withSandbox({ allowInternetAccess: true, network: { denyOut: ['8.8.8.8'], allowOut: ['example.com'] } }, async (sbx) => {
      const p = await policyOf(sbx)
      assert.deepEqual(p.presets, ['internet'])
      assert.deepEqual((p.allow ?? []).map((r) => r.match ?? r), ['example.com'])
      assert.deepEqual((p.deny ?? []).map((r) => r.match ?? r), ['8.8.8.8'])
      // updateNetwork replaces everything: internet off, one allowed domain.
      await sbx.updateNetwork({ allowOut: ['*.example.org'], denyOut: ['0.0.0.0/0'] })
      await until('the new policy inside', async () => !((await policyOf(sbx)).presets ?? []).includes('internet'))
      const q = await policyOf(sbx)
      assert.deepEqual((q.allow ?? []).map((r) => r.match ?? r), ['*.example.org'])
      assert.deepEqual(q.deny ?? [], [])
    })
    const secret = 'sk-' + randomBytes(8).toString('hex')
    await withSandbox({
      network: {
        allowOut: ['api.example.com'],
        allowPublicTraffic: false,
        rules: { 'api.example.com': [{ transform: { headers: { Authorization: 'Bearer ' + secret } } }] },
      },
    }, async (sbx) => {
      assert.match(sbx.trafficAccessToken ?? '', /^[0-9a-f]{32}$/)
      const p = await policyOf(sbx)
      assert.equal(p.secrets.length, 1)
      assert.deepEqual(p.secrets[0].hosts, ['api.example.com'])
      assert.equal(p.secrets[0].inject.header, 'Authorization')
      const inside = (await sbx.commands.run('cat /run/paddock/policy.json; env', { user: 'root' })).stdout
      assert.ok(!inside.includes(secret), 'the header value never enters the sandbox')
      info('traffic_token', sbx.trafficAccessToken)
    })
    await assert.rejects(Sandbox.create({ network: { denyOut: ['example.com'] } }), (e) => /denyOut/.test(e.message))
    await assert.rejects(Sandbox.create({ network: { allowOut: ['not a host!'] } }), (e) => /allowOut/.test(e.message))
    await assert.rejects(Sandbox.create({ network: { rules: { 'x.com': [{ transform: { headers: { 'Bad Header': 'v' } } }] } } }), (e) => /rules/.test(e.message))
    console.log('ok network')
  },

  // E2B's precedence, against a host the Go test made (TestE2BNetworkPrecedence:
  // E2B_UPSTREAM_IP, named allowed.test and other.test, its HTTPS
  // certificate signed by E2B_UPSTREAM_CA): an allowOut entry, an address
  // or a domain matched by Host or SNI, wins over a denyOut entry that
  // covers the same address; anything else in the denied block stays
  // denied; updateNetwork keeps the precedence.
  async precedence() {
    const ip = process.env.E2B_UPSTREAM_IP
    const block = ip.split('.').slice(0, 3).join('.') + '.0/24'
    const ca = readFileSync(process.env.E2B_UPSTREAM_CA, 'utf8')
    const policyOf = async (sbx) => JSON.parse((await sbx.commands.run('cat /run/paddock/policy.json')).stdout)
    // The HTTP status curl got, or 000 when the connection was refused.
    const status = async (sbx, url) => (await sbx.commands.run(
      `curl -s -o /dev/null -w '%{http_code}' --max-time 5 --noproxy '*' --cacert /tmp/ca.pem ${url} || true`)).stdout.trim()
    await withSandbox({ allowInternetAccess: true, network: { denyOut: [block], allowOut: ['allowed.test'] } }, async (sbx) => {
      await sbx.files.write('/tmp/ca.pem', ca)
      const p = await policyOf(sbx)
      assert.equal(p.precedence, 'allow', JSON.stringify(p))
      assert.deepEqual((p.deny ?? []).map((r) => r.match ?? r), [block])
      assert.equal(await status(sbx, 'http://allowed.test/'), '200', 'a domain allowed by Host wins over a denied block')
      assert.equal(await status(sbx, 'https://allowed.test/'), '200', 'a domain allowed by SNI wins over a denied block')
      assert.notEqual(await status(sbx, 'http://other.test/'), '200', 'a name only the internet allows stays denied')
      assert.notEqual(await status(sbx, 'https://other.test/'), '200')
      assert.notEqual(await status(sbx, `http://${ip}/`), '200', 'the address itself stays denied')
      // updateNetwork replaces the policy and keeps E2B's precedence: now
      // the address is allowed inside the denied block.
      await sbx.updateNetwork({ allowInternetAccess: true, denyOut: [block], allowOut: [ip] })
      await until('the new policy inside', async () => ((await policyOf(sbx)).allow ?? []).some((r) => (r.match ?? r) === ip))
      const q = await policyOf(sbx)
      assert.equal(q.precedence, 'allow', JSON.stringify(q))
      assert.deepEqual((q.deny ?? []).map((r) => r.match ?? r), [block])
      // The policy file inside can show the new policy a moment before
      // the address's rules take effect (seen once in a CI rehearsal):
      // allow a few seconds, then it must hold.
      await until('the allowed address to answer inside its denied block', async () => (await status(sbx, `http://${ip}/`)) === '200', 5000)
      assert.equal(await status(sbx, `http://${ip}/`), '200', 'an allowed address wins over its denied block')
      assert.equal(await status(sbx, 'https://other.test/'), '200', 'any name of the allowed address')
    })
    // Internet off (allowInternetAccess false, E2B's denyOut 0.0.0.0/0)
    // with an allowed domain: that domain only.
    await withSandbox({ allowInternetAccess: false, network: { allowOut: ['allowed.test'] } }, async (sbx) => {
      await sbx.files.write('/tmp/ca.pem', ca)
      assert.equal(await status(sbx, 'https://allowed.test/'), '200')
      assert.notEqual(await status(sbx, 'https://other.test/'), '200')
      assert.notEqual(await status(sbx, `http://${ip}/`), '200')
    })
    console.log('ok precedence')
  },

  // Port ingress by host name: PORT-ID.DOMAIN on the facade's listener,
  // HTTP and WebSockets, the traffic token, E2B's 502s; signed URLs
  // without a sandbox header, and expired ones.
  async ingress() {
    const api = new URL(process.env.E2B_API_URL)
    const request = (host, path = '/', headers = {}) => new Promise((resolve, reject) => {
      const req = http.request({ hostname: api.hostname, port: api.port, path, agent: false, headers: { ...headers, host } }, (res) => {
        let body = ''
        res.on('data', (d) => { body += d })
        res.on('end', () => resolve({ status: res.statusCode, body, headers: res.headers }))
      })
      req.on('error', reject)
      req.end()
    })
    await withSandbox({}, async (sbx) => {
      await sbx.files.write('www/index.html', 'hello from the sandbox')
      await sbx.commands.run('cd www && exec python3 -m http.server 8000', { background: true })
      await sbx.files.write('ws.py', WS_ECHO)
      await sbx.commands.run('exec python3 ws.py', { background: true })
      const host = sbx.getHost(8000)
      assert.equal(host, `8000-${sbx.sandboxId}.${process.env.E2B_TEST_DOMAIN}`)
      let r
      await until('the app to listen', async () => (r = await request(host, '/index.html')).status === 200)
      assert.equal(r.body, 'hello from the sandbox')
      // A closed port: E2B's 502.
      r = await request(sbx.getHost(8999))
      assert.equal(r.status, 502)
      assert.deepEqual(JSON.parse(r.body), { sandboxId: sbx.sandboxId, message: 'The sandbox is running but port is not open', port: '8999' })
      // A browser gets the same 502 as an HTML page.
      r = await request(sbx.getHost(8999), '/', { accept: 'text/html,application/xhtml+xml,*/*;q=0.8', 'user-agent': 'Mozilla/5.0' })
      assert.equal(r.status, 502)
      assert.match(r.headers['content-type'], /^text\/html/)
      assert.ok(r.body.includes(sbx.sandboxId) && r.body.includes('8999') && r.body.includes('port is not open'), r.body)
      r = await request(sbx.getHost(8999), '/', { accept: 'application/json', 'user-agent': 'Mozilla/5.0' })
      assert.match(r.headers['content-type'], /^application\/json/)
      // envd by host name.
      r = await request(sbx.getHost(49983), '/health')
      assert.equal(r.status, 502, 'health without the access token')
      // WebSocket through the ingress.
      let echoed = ''
      await until('a websocket echo', async () => { echoed = await wsEcho(api, sbx.getHost(8001), 'ping over ws').catch(() => ''); return echoed !== '' })
      assert.equal(echoed, 'ping over ws')

      await signedPlainly(sbx)
    })
    // allowPublicTraffic false: the ingress asks for the traffic token.
    await withSandbox({ network: { allowPublicTraffic: false } }, async (sbx) => {
      await sbx.commands.run('exec python3 -m http.server 8000', { background: true })
      const host = sbx.getHost(8000)
      let r = await request(host)
      assert.equal(r.status, 403)
      assert.match(JSON.parse(r.body).message, /traffic access token/)
      r = await request(host, '/', { 'e2b-traffic-access-token': 'wrong' })
      assert.equal(r.status, 403)
      await until('the app behind the token', async () => (r = await request(host, '/', { 'e2b-traffic-access-token': sbx.trafficAccessToken })).status === 200)
    })
    // A sandbox that is gone: 502.
    const gone = await Sandbox.create()
    info('sandbox', gone.sandboxId)
    const host = gone.getHost(8000)
    await gone.kill()
    const r = await request(host)
    assert.equal(r.status, 502)
    assert.equal(JSON.parse(r.body).sandboxId, gone.sandboxId)
    const page = await request(host, '/', { accept: 'text/html' })
    assert.equal(page.status, 502)
    assert.match(page.headers['content-type'], /^text\/html/)
    assert.ok(page.body.includes(gone.sandboxId) && page.body.includes('not running'), page.body)
    console.log('ok ingress')
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

  // On a runtime that keeps memory (a daemon whose default is gvisor:
  // TestE2BGvisorMemory), forks and sandboxes made from a snapshot carry
  // the running processes: a server keeps its pid and the count in its
  // memory, as on E2B.
  async memory() {
    const server = `import http.server, os
hits = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global hits
        hits += 1
        b = ("pid %d hits %d" % (os.getpid(), hits)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
`
    const ask = async (s) => (await s.commands.run('curl -s http://127.0.0.1:8000/')).stdout
    await withSandbox({}, async (sbx) => {
      await sbx.files.write('srv.py', server)
      await sbx.commands.run('python3 srv.py', { background: true })
      let first = ''
      await until('the server', async () => (first = await ask(sbx).catch(() => '')) !== '', 30000)
      const pid = first.match(/^pid (\d+) hits 1$/)?.[1]
      assert.ok(pid, first)

      const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
      assert.equal(forks.length, 2)
      for (const f of forks) {
        info('sandbox', f.sandboxId)
        assert.equal(await ask(f), `pid ${pid} hits 2`, 'the fork runs the server, its memory kept')
        assert.equal(await ask(f), `pid ${pid} hits 3`)
        const listed = await f.commands.list()
        assert.ok(listed.some((p) => p.cmd.includes('python3') || p.args.some((a) => a.includes('srv.py'))), JSON.stringify(listed))
      }
      assert.equal(await ask(sbx), `pid ${pid} hits 2`, 'the source runs on, apart from its forks')
      for (const f of forks) await f.kill()

      const snap = await sbx.createSnapshot()
      const fromSnap = await Sandbox.create(snap.snapshotId)
      info('sandbox', fromSnap.sandboxId)
      assert.equal(await ask(fromSnap), `pid ${pid} hits 3`, 'a sandbox from the snapshot runs the server')
      await fromSnap.kill()
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    })
    console.log('ok memory')
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
