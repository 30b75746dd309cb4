// paddock's web console: the sandbox list and a sandbox's page, drawn from
// the daemon's /v1 API (same origin; the session cookie stands in for the
// token, and every change carries the CSRF token of the page's <meta>).
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import uPlot from "uplot";
import "@xterm/xterm/css/xterm.css";
import "uplot/dist/uPlot.min.css";
import "./app.css";

const csrf = document.querySelector('meta[name="csrf"]').content;
const app = document.getElementById("app");

// h builds an element: h("a", {href: "/"}, "text", child...).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c != null && c !== false) el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

async function request(method, path, body, signal) {
  const opts = { method, headers: {}, credentials: "same-origin", signal };
  if (method !== "GET") opts.headers["X-Paddock-CSRF"] = csrf;
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 401) {
    location.href = "/ui/login";
    throw new Error("not logged in");
  }
  if (!r.ok) {
    const e = await r.json().catch(() => ({ message: r.statusText }));
    throw new Error(e.message || r.statusText);
  }
  return r;
}

async function api(method, path, body) {
  const r = await request(method, path, body);
  if (r.status === 204) return null;
  return (r.headers.get("content-type") || "").includes("json") ? r.json() : r.text();
}

const enc = encodeURIComponent;

function fmtBytes(n) {
  if (!n) return "0";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n < 10 && i ? 1 : 0)} ${u[i]}`;
}

function fmtTime(t) {
  return t ? new Date(t).toLocaleTimeString() : "";
}

function labelsText(labels) {
  return Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`);
}

function stateBadge(state) {
  return h("span", { class: `state state-${state}` }, state);
}

function notice(msg, bad) {
  const n = h("div", { class: bad ? "notice bad" : "notice" }, msg);
  document.body.append(n);
  setTimeout(() => n.remove(), 5000);
}

// ---- the sandbox list -------------------------------------------------

// sparkline draws values (oldest first) as an SVG polyline.
function sparkline(values, max) {
  const w = 100, ht = 22;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${ht}`);
  svg.setAttribute("class", "spark");
  if (values.length > 1) {
    const top = Math.max(max || 0, ...values, 1e-9);
    const pts = values.map((v, i) => `${(i * w / (values.length - 1)).toFixed(1)},${(ht - 1 - v / top * (ht - 2)).toFixed(1)}`);
    const line = document.createElementNS(svg.namespaceURI, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
  }
  svg.dataset.points = values.length;
  return svg;
}

const sparkPoints = 120;

async function listPage() {
  const q = new URLSearchParams(location.search);
  const stateSel = h("select", { id: "state-filter" },
    ["all", "running", "paused", "frozen", "stopped", "creating", "failed"].map((s) => h("option", { value: s }, s)));
  stateSel.value = q.get("state") || "all";
  const labelIn = h("input", { id: "label-filter", placeholder: "label, e.g. team=web", value: q.get("label") || "" });
  const count = h("span", { class: "count", id: "count" });
  const tbody = h("tbody", { id: "sandboxes" });
  app.replaceChildren(
    h("section", { class: "toolbar" }, h("h2", {}, "Sandboxes"), count, h("label", {}, "state ", stateSel), labelIn),
    h("table", { class: "list" },
      h("thead", {}, h("tr", {}, ["id", "state", "image", "labels", "cpu", "memory", "created"].map((c) => h("th", {}, c)))),
      tbody));

  const rows = new Map(); // id → {tr, sb, cpu: [], mem: [], last, loaded}
  const io = new IntersectionObserver((entries) => {
    for (const e of entries) if (e.isIntersecting) loadHistory(e.target.dataset.id);
  });
  const queue = [];
  let running = 0;
  function loadHistory(id) {
    const row = rows.get(id);
    if (!row || row.loaded) return;
    row.loaded = true;
    queue.push(id);
    pump();
  }
  function pump() {
    while (running < 4 && queue.length) {
      const id = queue.shift();
      running++;
      api("GET", `/v1/sandboxes/${enc(id)}/metrics?since=2m`).then((m) => {
        const row = rows.get(id);
        if (!row) return;
        const hist = (m.history || []).filter((s) => !row.last || s.time < row.last);
        row.cpu = hist.map((s) => s.cpu_percent).concat(row.cpu).slice(-sparkPoints);
        row.mem = hist.map((s) => s.memory_bytes).concat(row.mem).slice(-sparkPoints);
        drawSparks(row);
      }).catch(() => {}).finally(() => { running--; pump(); });
    }
  }
  function drawSparks(row) {
    const s = row.sample;
    row.cpuCell.replaceChildren(sparkline(row.cpu, 100), h("span", { class: "num" }, s ? `${s.cpu_percent.toFixed(0)}%` : ""));
    row.memCell.replaceChildren(sparkline(row.mem, s && s.memory_limit_bytes), h("span", { class: "num" }, s ? fmtBytes(s.memory_bytes) : ""));
  }
  function visible(sb) {
    if (stateSel.value !== "all" && sb.state !== stateSel.value) return false;
    const f = labelIn.value.trim();
    if (!f) return true;
    return f.split(/[,\s]+/).every((want) => {
      const [k, v] = want.split("=");
      const have = (sb.labels || {})[k];
      return have !== undefined && (v === undefined || have === v);
    });
  }
  function filter() {
    let n = 0;
    for (const row of rows.values()) {
      const show = visible(row.sb);
      row.tr.hidden = !show;
      if (show) n++;
    }
    count.textContent = `${n} of ${rows.size}`;
    const p = new URLSearchParams();
    if (stateSel.value !== "all") p.set("state", stateSel.value);
    if (labelIn.value.trim()) p.set("label", labelIn.value.trim());
    history.replaceState(null, "", p.size ? `?${p}` : location.pathname);
  }
  stateSel.addEventListener("change", filter);
  labelIn.addEventListener("input", filter);

  async function refresh() {
    const [list, latest] = await Promise.all([api("GET", "/v1/sandboxes"), api("GET", "/v1/metrics").catch(() => [])]);
    const samples = new Map((latest || []).map((s) => [s.id, s.sample]));
    const seen = new Set();
    const frag = document.createDocumentFragment();
    for (const sb of list) {
      seen.add(sb.id);
      let row = rows.get(sb.id);
      if (!row) {
        const cpuCell = h("td", { class: "spark-cell" }), memCell = h("td", { class: "spark-cell" });
        const tr = h("tr", { "data-id": sb.id },
          h("td", {}, h("a", { href: `/ui/sandboxes/${enc(sb.id)}`, class: "sb-link" }, sb.id)),
          h("td", { class: "state-cell" }), h("td", {}, sb.image),
          h("td", { class: "labels" }, labelsText(sb.labels).map((l) => h("span", { class: "label" }, l))),
          cpuCell, memCell, h("td", {}, fmtTime(sb.created_at)));
        row = { tr, sb, cpu: [], mem: [], cpuCell, memCell };
        rows.set(sb.id, row);
        frag.append(tr);
        io.observe(tr);
      }
      row.sb = sb;
      row.tr.querySelector(".state-cell").replaceChildren(stateBadge(sb.state));
      const s = samples.get(sb.id);
      if (s && s.time !== row.last) {
        row.last = s.time;
        row.cpu = row.cpu.concat(s.cpu_percent).slice(-sparkPoints);
        row.mem = row.mem.concat(s.memory_bytes).slice(-sparkPoints);
      }
      row.sample = s;
      drawSparks(row);
    }
    tbody.append(frag);
    for (const [id, row] of rows) {
      if (!seen.has(id)) { row.tr.remove(); rows.delete(id); }
    }
    filter();
    app.dataset.loaded = "1";
  }
  await refresh().catch((e) => notice(e.message, true));
  setInterval(() => refresh().catch(() => {}), 2000);
}

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

async function sandboxPage(id) {
  const base = `/v1/sandboxes/${enc(id)}`;
  const head = h("section", { class: "sb-head" });
  const chartBox = h("div", { id: "chart", class: "chart" });
  const procs = h("tbody", { id: "processes" });
  const events = h("ol", { id: "events", class: "events" });
  const policy = h("pre", { id: "policy", class: "policy" });
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
      h("section", { class: "card" }, h("h3", {}, "Policy"), policy)));

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
  app.dataset.loaded = "1";

  startChart(base, chartBox);
  termBtn.addEventListener("click", () => { termBtn.disabled = true; openTerminal(id, termBox); });
  pollProcesses(base, procs);
  followEvents(base, events);
  api("GET", `${base}/policy`).then((p) => { policy.textContent = JSON.stringify(p, null, 2); })
    .catch((e) => { policy.textContent = e.message; });
  execLogs(base, logList, logOut);
  setInterval(() => drawHead().catch(() => {}), 5000);
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

const m = location.pathname.match(/^\/ui\/sandboxes\/([^/]+)$/);
(m ? sandboxPage(decodeURIComponent(m[1])) : listPage()).catch((e) => {
  app.replaceChildren(h("p", { class: "notice bad" }, e.message));
});
