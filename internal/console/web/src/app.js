// paddock's web console: the sandbox list and a sandbox's page, drawn from
// the daemon's /v1 API (same origin; the session cookie stands in for the
// token, and every change carries the CSRF token of the page's <meta>).
// The list's script is small; a sandbox's page loads its own, with
// xterm.js and uPlot, when it is opened.
import "@xterm/xterm/css/xterm.css";
import "uplot/dist/uPlot.min.css";
import "./app.css";
import { h, api, enc, fmtBytes, fmtTime, labelsText, stateBadge, notice, loaded, app } from "./common.js";

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
    row.cpuCell.replaceChildren(sparkline(row.cpu, 1), h("span", { class: "num" }, s ? `${s.cpu_percent.toFixed(0)}%` : ""));
    row.memCell.replaceChildren(sparkline(row.mem, 0), h("span", { class: "num" }, s ? fmtBytes(s.memory_bytes) : ""));
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
    loaded();
  }
  await refresh().catch((e) => notice(e.message, true));
  setInterval(() => refresh().catch(() => {}), 2000);
}

const m = location.pathname.match(/^\/ui\/sandboxes\/([^/]+)$/);
(m ? import("./sandbox.js").then((p) => p.sandboxPage(decodeURIComponent(m[1]))) : listPage()).catch((e) => {
  app.replaceChildren(h("p", { class: "notice bad" }, e.message));
});
