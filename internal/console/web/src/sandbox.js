// A sandbox's page: loaded only there, with xterm.js and uPlot.
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import uPlot from "uplot";
import { h, api, request, enc, fmtBytes, fmtTime, labelsText, stateBadge, notice, loaded, app } from "./common.js";

// ---- a sandbox's page -------------------------------------------------

function dialog(title, body, okText, onOK) {
  const d = h("dialog", { class: "confirm" });
  const ok = h("button", { class: "danger", id: "confirm-ok" }, okText);
  const form = h("form", { method: "dialog" }, h("h3", {}, title), body,
    h("div", { class: "buttons" }, h("button", { value: "cancel", id: "confirm-cancel" }, "Cancel"), ok));
  ok.addEventListener("click", async (e) => {
    e.preventDefault();
    ok.disabled = true;
    try {
      await onOK(form);
      d.close();
    } catch (err) {
      notice(err.message, true);
      ok.disabled = false;
    }
  });
  d.append(form);
  d.addEventListener("close", () => d.remove());
  document.body.append(d);
  d.showModal();
}

export async function sandboxPage(id) {
  const base = `/v1/sandboxes/${enc(id)}`;
  const head = h("section", { class: "sb-head" });
  const chartBox = h("div", { id: "chart", class: "chart" });
  const procs = h("tbody", { id: "processes" });
  const events = h("ol", { id: "events", class: "events" });
  const policy = h("pre", { id: "policy", class: "policy" });
  const requests = h("tbody", { id: "requests" });
  const logList = h("ul", { id: "logs", class: "logs" });
  const logOut = h("pre", { id: "log-output", class: "log-output" });
  const termBox = h("div", { id: "terminal", class: "terminal" });
  const termBtn = h("button", { id: "open-terminal" }, "Open terminal");
  app.replaceChildren(head,
    h("div", { class: "grid" },
      h("section", { class: "card wide" }, h("h3", {}, "Metrics ", h("small", {}, "CPU % of a core · memory MiB")), chartBox),
      h("section", { class: "card wide" }, h("h3", {}, "Terminal ", termBtn), termBox),
      h("section", { class: "card" }, h("h3", {}, "Exec log"), logList, logOut),
      h("section", { class: "card" }, h("h3", {}, "Processes"),
        h("table", { class: "list" }, h("thead", {}, h("tr", {}, ["pid", "cmd", "state", "started"].map((c) => h("th", {}, c)))), procs)),
      h("section", { class: "card" }, h("h3", {}, "Events"), events),
      h("section", { class: "card" }, h("h3", {}, "Policy"), policy),
      h("section", { class: "card wide" }, h("h3", {}, "Egress requests"),
        h("table", { class: "list" }, h("thead", {}, h("tr", {}, ["host", "reason", "state", "decided by", ""].map((c) => h("th", {}, c)))), requests))));

  let sb;
  async function drawHead() {
    sb = await api("GET", base);
    const r = sb.resources || {};
    const paused = sb.state === "paused";
    head.replaceChildren(
      h("div", { class: "title" }, h("a", { href: "/ui/" }, "Sandboxes"), " / ", h("h2", { id: "sb-id" }, sb.id), stateBadge(sb.state)),
      h("div", { class: "facts" },
        h("span", {}, `image ${sb.image}`),
        h("span", { id: "sb-resources" }, `cpus ${r.cpus || "–"} · memory ${r.memory_bytes ? fmtBytes(r.memory_bytes) : "–"} · pids ${r.pids || "–"} · disk ${r.disk_bytes ? fmtBytes(r.disk_bytes) : "–"}`),
        labelsText(sb.labels).map((l) => h("span", { class: "label" }, l))),
      h("div", { class: "actions" },
        paused
          ? h("button", { id: "act-resume", onclick: () => confirmAction("Resume", `Resume ${id}?`, () => api("POST", `${base}/resume`)) }, "Resume")
          : h("button", { id: "act-pause", onclick: () => confirmAction("Pause", `Pause ${id}? Its processes stop until it is resumed.`, () => api("POST", `${base}/pause`)) }, "Pause"),
        h("button", { id: "act-snapshot", onclick: () => confirmAction("Snapshot", `Take a snapshot of ${id}?`, async () => {
          const s = await api("POST", `${base}/snapshots`, {});
          notice(`snapshot ${s.id} taken`);
        }) }, "Snapshot"),
        h("button", { id: "act-fork", onclick: () => confirmAction("Fork", `Fork ${id} into a new sandbox?`, async () => {
          const f = await api("POST", `${base}/fork`, {});
          const n = f.sandboxes[0].id;
          notice(`forked into ${n}`);
          location.href = `/ui/sandboxes/${enc(n)}`;
        }) }, "Fork"),
        h("button", { id: "act-resize", onclick: resize }, "Resize"),
        h("button", { id: "act-delete", class: "danger", onclick: () => confirmAction("Delete", `Delete ${id} and its disk? This cannot be undone.`, async () => {
          await api("DELETE", `${base}?force=true`);
          location.href = "/ui/";
        }) }, "Delete")));
  }
  function confirmAction(verb, question, run) {
    dialog(verb, h("p", {}, question), verb, async () => {
      await run();
      await drawHead().catch(() => {});
    });
  }
  function resize() {
    const r = sb.resources || {};
    const cpus = h("input", { id: "resize-cpus", type: "number", step: "0.1", min: "0", value: r.cpus || "" });
    const mem = h("input", { id: "resize-memory", type: "number", min: "0", value: r.memory_bytes ? Math.round(r.memory_bytes / 1048576) : "" });
    dialog("Resize", h("div", { class: "fields" }, h("label", {}, "CPUs ", cpus), h("label", {}, "Memory (MiB) ", mem)), "Resize", async () => {
      const res = {};
      if (cpus.value) res.cpus = Number(cpus.value);
      if (mem.value) res.memory_bytes = Math.round(Number(mem.value) * 1048576);
      await api("POST", `${base}/update`, { resources: res });
      await drawHead();
    });
  }
  await drawHead();
  loaded();

  startChart(base, chartBox);
  termBtn.addEventListener("click", () => { termBtn.disabled = true; openTerminal(id, termBox); });
  pollProcesses(base, procs);
  followEvents(base, events);
  api("GET", `${base}/policy`).then((p) => { policy.textContent = JSON.stringify(p, null, 2); })
    .catch((e) => { policy.textContent = e.message; });
  execLogs(base, logList, logOut);
  setInterval(() => drawHead().catch(() => {}), 5000);

  // Egress requests: the sandbox asks for a host, a person decides. An
  // approval lasts an hour; the reason is the sandbox's own (untrusted)
  // text, shown as text.
  async function pollRequests() {
    const list = await api("GET", `${base}/requests`);
    requests.replaceChildren(...list.map((r) => {
      const path = `${base}/requests/${enc(r.id)}`;
      const buttons = r.state !== "pending" ? [] : [
        h("button", { class: "approve", onclick: () => confirmAction("Approve", `Let ${id} reach ${r.host} for an hour?`,
          () => api("POST", `${path}/approve`, { duration_seconds: 3600 }).then(pollRequests)) }, "Approve 1h"),
        h("button", { class: "deny danger", onclick: () => confirmAction("Deny", `Refuse ${r.host} to ${id}?`,
          () => api("POST", `${path}/deny`, {}).then(pollRequests)) }, "Deny")];
      return h("tr", { "data-id": r.id, "data-state": r.state },
        h("td", {}, r.host), h("td", { class: "cmd" }, r.reason || ""), h("td", {}, r.state),
        h("td", {}, r.decided_by || ""), h("td", {}, ...buttons));
    }));
  }
  pollRequests().catch(() => {});
  setInterval(() => pollRequests().catch(() => {}), 1000);
}

function startChart(base, box) {
  const data = [[], [], []];
  let last = "";
  const opts = {
    width: Math.max(box.clientWidth, 300), height: 220,
    scales: { x: { time: true }, mem: { auto: true }, cpu: { auto: true } },
    series: [{}, { label: "CPU %", scale: "cpu", stroke: "#39bae6", width: 1.5 },
      { label: "memory MiB", scale: "mem", stroke: "#c2d94c", width: 1.5 }],
    axes: [{ stroke: "#a0a8b8", grid: { stroke: "#2a303c" } },
      { scale: "cpu", stroke: "#39bae6", grid: { stroke: "#2a303c" } },
      { scale: "mem", side: 1, stroke: "#c2d94c", grid: { show: false } }],
  };
  const plot = new uPlot(opts, data, box);
  new ResizeObserver(() => plot.setSize({ width: Math.max(box.clientWidth, 300), height: 220 })).observe(box);
  async function poll(since) {
    const m = await api("GET", `${base}/metrics?since=${since}`);
    for (const s of m.history || []) {
      if (s.time <= last) continue;
      last = s.time;
      data[0].push(Date.parse(s.time) / 1000);
      data[1].push(s.cpu_percent);
      data[2].push(s.memory_bytes / 1048576);
    }
    if (data[0].length > 900) data.forEach((a) => a.splice(0, a.length - 900));
    plot.setData(data);
    box.dataset.points = data[0].length;
  }
  poll("5m").catch(() => {});
  setInterval(() => poll("10s").catch(() => {}), 1000);
}

function openTerminal(id, box) {
  const term = new Terminal({ fontSize: 13, cursorBlink: true, convertEol: false, theme: { background: "#0b0e14" } });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${proto}://${location.host}/ui/ws/terminal/${enc(id)}?cols=${term.cols}&rows=${term.rows}`);
  ws.binaryType = "arraybuffer";
  const te = new TextEncoder();
  ws.onmessage = (e) => {
    if (typeof e.data === "string") {
      const st = JSON.parse(e.data);
      term.write(`\r\n[exited ${st.exit_code}${st.signal ? " on " + st.signal : ""}]\r\n`);
    } else {
      term.write(new Uint8Array(e.data));
    }
  };
  ws.onclose = (e) => {
    if (e.code !== 1000) term.write(`\r\n[closed${e.reason ? ": " + e.reason : ""}]\r\n`);
    box.dataset.state = "closed";
  };
  ws.onopen = () => { box.dataset.state = "open"; term.focus(); };
  term.onData((d) => ws.readyState === 1 && ws.send(te.encode(d)));
  term.onResize(({ cols, rows }) => ws.readyState === 1 && ws.send(JSON.stringify({ cols, rows })));
  new ResizeObserver(() => fit.fit()).observe(box);
  window.paddockTerminal = term;
}

async function pollProcesses(base, tbody) {
  async function poll() {
    const ps = await api("GET", `${base}/processes`);
    tbody.replaceChildren(...ps.map((p) => h("tr", {},
      h("td", {}, p.pid), h("td", { class: "cmd" }, (p.cmd || []).join(" ")),
      h("td", {}, p.state + (p.exit ? ` (${p.exit.exit_code})` : "")), h("td", {}, fmtTime(p.started_at)))));
  }
  poll().catch(() => {});
  setInterval(() => poll().catch(() => {}), 2000);
}

// lines reads a fetch body as text lines (NDJSON).
async function* lines(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      yield buf.slice(0, i);
      buf = buf.slice(i + 1);
    }
  }
}

async function followEvents(base, list) {
  let after = 0;
  for (;;) {
    try {
      const r = await request("GET", `${base}/events?follow=true&after=${after}`);
      for await (const line of lines(r.body)) {
        if (!line) continue;
        const e = JSON.parse(line);
        after = e.seq;
        list.prepend(h("li", { class: `ev ev-${e.type}` },
          h("time", {}, fmtTime(e.time)), h("span", { class: "ev-type" }, e.type), " ", e.message || "",
          e.data ? h("code", {}, JSON.stringify(e.data)) : null));
        while (list.children.length > 300) list.lastChild.remove();
      }
    } catch (e) {
      if (String(e.message).includes("not logged in")) return;
    }
    await new Promise((res) => setTimeout(res, 2000));
  }
}

// frames reads paddock's stream framing: an 8-byte header (type, three
// zero bytes, big-endian length) and a payload.
async function* frames(body) {
  const reader = body.getReader();
  let buf = new Uint8Array(0);
  for (;;) {
    while (buf.length >= 8) {
      const n = new DataView(buf.buffer, buf.byteOffset).getUint32(4);
      if (buf.length < 8 + n) break;
      yield { type: buf[0], payload: buf.slice(8, 8 + n) };
      buf = buf.slice(8 + n);
    }
    const { value, done } = await reader.read();
    if (done) return;
    const b = new Uint8Array(buf.length + value.length);
    b.set(buf);
    b.set(value, buf.length);
    buf = b;
  }
}

// execLogs lists the processes with kept output and shows one's: an
// ended process's from the exec log, a running one's live from its stream
// (the exec log writes in batches a second apart; the stream is the
// guest's ring as the output comes).
function execLogs(base, list, out) {
  let tailing = null; // {pid, ctl, auto}
  const known = new Map();
  const running = new Set();
  const td = new TextDecoder();
  async function tail(pid) {
    if (tailing) tailing.ctl.abort();
    const ctl = new AbortController();
    tailing = { pid, ctl };
    for (const li of list.children) li.classList.toggle("on", li.dataset.pid === String(pid));
    out.textContent = "";
    const path = running.has(pid) ? `${base}/processes/${pid}/stream?offset=0` : `${base}/logs?exec=${pid}`;
    try {
      const r = await request("GET", path, undefined, ctl.signal);
      for await (const f of frames(r.body)) {
        if (f.type === 1 || f.type === 2) out.append(td.decode(f.payload, { stream: true }));
        else if (f.type === 6) out.append(`[… ${JSON.parse(td.decode(f.payload)).bytes} bytes dropped …]\n`);
        else if (f.type === 3) out.append(`[exit ${JSON.parse(td.decode(f.payload)).exit_code}]\n`);
        out.scrollTop = out.scrollHeight;
      }
    } catch (e) {
      if (e.name !== "AbortError") out.append(`[${e.message}]\n`);
    }
  }
  async function poll() {
    const logs = await api("GET", `${base}/logs`);
    let newest = null;
    for (const l of logs) {
      newest = l;
      if (l.exit) running.delete(l.pid);
      else running.add(l.pid);
      let li = known.get(l.pid);
      if (!li) {
        li = h("li", { "data-pid": l.pid, onclick: () => tail(l.pid) });
        known.set(l.pid, li);
        list.prepend(li);
      }
      li.replaceChildren(h("span", { class: "pid" }, l.pid), " ", h("span", { class: "cmd" }, (l.cmd || []).join(" ")),
        l.exit ? h("span", { class: "exit" }, ` exit ${l.exit.exit_code}`) : h("span", { class: "live" }, " running"));
    }
    // Follow the newest process until one is picked.
    if (newest && (!tailing || (tailing.auto && tailing.pid !== newest.pid))) {
      tail(newest.pid);
      tailing.auto = true;
    }
  }
  list.addEventListener("click", () => { if (tailing) tailing.auto = false; });
  poll().catch(() => {});
  setInterval(() => poll().catch(() => {}), 1000);
}

