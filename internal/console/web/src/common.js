// Helpers shared by the console's pages.
export const csrf = document.querySelector('meta[name="csrf"]').content;
export const app = document.getElementById("app");

// h builds an element: h("a", {href: "/"}, "text", child...).
export function h(tag, attrs, ...children) {
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

export async function request(method, path, body, signal) {
  // Decisions' audit names the console (Paddock-Client).
  const opts = { method, headers: { "Paddock-Client": "console" }, credentials: "same-origin", signal };
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

export async function api(method, path, body) {
  const r = await request(method, path, body);
  if (r.status === 204) return null;
  return (r.headers.get("content-type") || "").includes("json") ? r.json() : r.text();
}

export const enc = encodeURIComponent;

export function fmtBytes(n) {
  if (!n) return "0";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n < 10 && i ? 1 : 0)} ${u[i]}`;
}

export function fmtTime(t) {
  return t ? new Date(t).toLocaleTimeString() : "";
}

export function labelsText(labels) {
  return Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`);
}

export function stateBadge(state) {
  return h("span", { class: `state state-${state}` }, state);
}

export function notice(msg, bad) {
  const n = h("div", { class: bad ? "notice bad" : "notice" }, msg);
  document.body.append(n);
  setTimeout(() => n.remove(), 5000);
}

// loaded marks the page drawn, once: for the tests, and for the bench's
// load time (a performance mark, measured from the navigation's start).
export function loaded() {
  if (app.dataset.loaded) return;
  app.dataset.loaded = "1";
  performance.mark("paddock-loaded");
}

