// The overseer page's own script: live updates over server-sent events, search, compose and
// the flow picture. Every piece of text from a message is set with textContent, never as
// markup, so nothing an agent writes can run here.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]').content;
const boot = JSON.parse(document.getElementById("boot").dataset.boot);
const MARK_START = "\u00ab", MARK_END = "\u00bb";
const feed = new Map();  // message id -> message object
let roster = boot.roster;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k.startsWith("data-")) node.setAttribute(k, v); else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

function who(p) { return `${p.name || p.id}@${p.host}`; }

function messageItem(m) {
  const thread = m.thread_id || m.id;
  const link = el("a", { href: "#", class: "thread", "data-thread": thread }, "thread");
  link.addEventListener("click", (e) => { e.preventDefault(); showThread(thread); });
  const head = el("div", { class: "head" },
    el("span", { class: "when" }, m.sent_at), " ",
    el("span", { class: "from" }, who(m.from)), " → ", el("span", { class: "to" }, m.to), " ");
  if (m.subject) head.append(el("span", { class: "subject" }, m.subject), " ");
  head.append(link);
  const receipts = el("div", { class: "receipts" });
  for (const r of m.recipients || []) {
    receipts.append(el("span", { class: `receipt ${r.outcome}` }, `${r.name || r.session_id}@${r.host}: ${r.outcome}`));
  }
  return el("li", { class: "msg", "data-id": m.id }, head, el("div", { class: "text" }, m.message), receipts);
}

function addMessage(m, animate) {
  const list = document.getElementById("feed");
  const item = messageItem(m);
  const old = list.querySelector(`li[data-id="${CSS.escape(m.id)}"]`);
  const known = feed.has(m.id);
  feed.set(m.id, m);
  if (old) old.replaceWith(item); else list.prepend(item);
  drawFlow();  // a later copy may name more recipients (hosts)
  if (!known && animate) pulse(m);
}

function renderRoster(r) {
  roster = r;
  const hosts = document.getElementById("hosts");
  hosts.replaceChildren(...r.hosts.map((h) => el("tr", { "data-host": h.host },
    el("td", {}, h.host), el("td", { class: `lease ${h.lease}` }, h.lease),
    el("td", {}, h.generation ?? ""), el("td", {}, r.sessions.filter((s) => s.host === h.host).length))));
  const sessions = document.getElementById("sessions");
  sessions.replaceChildren(...r.sessions.map((s) => el("tr", { class: "session", "data-name": s.alias, "data-host": s.host },
    el("td", {}, s.alias), el("td", {}, s.host), el("td", { class: s.online ? "online" : "offline" }, s.online ? "online" : "offline"),
    el("td", {}, s.status || ""), el("td", {}, (s.groups || []).join(", ")), el("td", {}, s.cwd || ""), el("td", {}, s.model || ""))));
  // The host's degraded states (a full disk, a failing inbox): shown until they clear.
  const warnings = document.getElementById("warnings");
  warnings.replaceChildren(...(r.warnings || []).map((w) => el("p", {}, w)));
  warnings.hidden = !(r.warnings || []).length;
  const badge = document.getElementById("archive-state");
  badge.className = `badge ${r.archive ? "on" : "off"}`;
  badge.textContent = r.archive ? "archive on" : "archive off (this host only)";
  drawFlow();
  loadPending();
}

// --- the flow picture: hosts on a circle, an edge per direction with its message count ---------

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function positions() {
  const names = roster.hosts.map((h) => h.host);
  const pos = new Map();
  names.forEach((n, i) => {
    const a = (2 * Math.PI * i) / Math.max(names.length, 1) - Math.PI / 2;
    pos.set(n, [180 + 110 * Math.cos(a), 130 + 75 * Math.sin(a)]);
  });
  return pos;
}

function edges() {
  const counts = new Map();
  for (const m of feed.values()) {
    const targets = new Set((m.recipients || []).map((r) => r.host));
    if (targets.size === 0) targets.add(m.from.host);
    for (const t of targets) {
      const key = `${m.from.host}\u0000${t}`;
      counts.set(key, (counts.get(key) || 0) + 1);
    }
  }
  return counts;
}

function drawFlow() {
  const box = document.getElementById("flow");
  const pos = positions();
  const defs = svg("defs");
  const arrow = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
  arrow.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#64748b" }));
  defs.append(arrow);
  box.replaceChildren(defs);
  for (const [key, n] of edges()) {
    const [from, to] = key.split("\u0000");
    const a = pos.get(from), b = pos.get(to);
    if (!a || !b) continue;
    if (from === to) {
      // Same-host messages: a loop on the outer side of the host.
      const ux = a[0] - 180, uy = a[1] - 130, ul = Math.hypot(ux, uy) || 1;
      const lx = a[0] + (ux / ul) * 34, ly = a[1] + (uy / ul) * 34;
      box.append(svg("circle", { cx: lx, cy: ly, r: 12, fill: "none", stroke: "#94a3b8", "data-edge": `${from}->${to}` }));
      box.append(svg("text", { class: "count", x: lx + 14, y: ly + 4 }, String(n)));
      continue;
    }
    // Two directions side by side: each line a little to its own left, arrow at its end.
    const dx = b[0] - a[0], dy = b[1] - a[1], len = Math.hypot(dx, dy) || 1;
    const ox = (-dy / len) * 7, oy = (dx / len) * 7;
    const ux = dx / len, uy = dy / len, r = 28;
    box.append(svg("line", {
      x1: a[0] + ox + ux * r, y1: a[1] + oy + uy * r, x2: b[0] + ox - ux * r, y2: b[1] + oy - uy * r,
      "stroke-width": Math.min(1 + Math.log2(n + 1), 6), "marker-end": "url(#arrow)", "data-edge": `${from}->${to}`,
    }));
    box.append(svg("text", { class: "count", x: (a[0] + b[0]) / 2 + ox * 2.2 - 4, y: (a[1] + b[1]) / 2 + oy * 2.2 + 4 }, String(n)));
  }
  for (const [name, [x, y]] of pos) {
    const g = svg("g", { class: "node", "data-host": name });
    g.append(svg("circle", { cx: x, cy: y, r: 26 }), svg("text", { x, y: y + 3 }, name.length > 12 ? name.slice(0, 11) + "…" : name));
    g.append(svg("title", {}, name));
    box.append(g);
  }
}

function pulse(m) {
  const pos = positions();
  const a = pos.get(m.from.host);
  const targets = (m.recipients || []).map((r) => r.host);
  for (const t of targets.length ? targets : [m.from.host]) {
    const b = pos.get(t);
    if (!a || !b) continue;
    const dot = svg("circle", { class: "pulse", r: 5, cx: a[0], cy: a[1] });
    document.getElementById("flow").append(dot);
    const start = performance.now();
    const step = (now) => {
      const f = Math.min((now - start) / 800, 1);
      dot.setAttribute("cx", a[0] + (b[0] - a[0]) * f);
      dot.setAttribute("cy", a[1] + (b[1] - a[1]) * f);
      if (f < 1) requestAnimationFrame(step); else dot.remove();
    };
    requestAnimationFrame(step);
  }
}

// --- requests ---------------------------------------------------------------------------------

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin" });
  return r.json();
}

async function postJSON(url, body) {
  const r = await fetch(url, {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify(body),
  });
  return r.json();
}

async function showThread(id) {
  const section = document.getElementById("thread-section");
  document.getElementById("thread-id").textContent = id;
  const items = await getJSON(`/api/thread/${encodeURIComponent(id)}`);
  document.getElementById("thread").replaceChildren(...(Array.isArray(items) ? items : []).map(messageItem));
  section.hidden = false;
}

function highlighted(snippet) {
  // Split on the marks and wrap matches in <mark> as elements: the text stays text.
  const out = el("div", { class: "text" });
  let rest = snippet;
  while (rest.length) {
    const s = rest.indexOf(MARK_START);
    if (s < 0) { out.append(rest); break; }
    const e = rest.indexOf(MARK_END, s + 1);
    if (e < 0) { out.append(rest); break; }
    out.append(rest.slice(0, s), el("mark", {}, rest.slice(s + 1, e)));
    rest = rest.slice(e + 1);
  }
  return out;
}

async function search(form) {
  const params = new URLSearchParams();
  for (const [k, v] of new FormData(form)) if (v) params.set(k, v);
  const answer = await getJSON(`/api/search?${params}`);
  const list = document.getElementById("results");
  if (answer.error) {
    document.getElementById("search-source").textContent = answer.error.message;
    list.replaceChildren();
    return;
  }
  document.getElementById("search-source").textContent =
    `${answer.hits.length} match(es) in ${answer.source === "archive" ? "the archive" : "this host's inboxes"}`;
  list.replaceChildren(...answer.hits.map((h) => {
    const item = messageItem(h);
    item.className = "msg hit";
    item.querySelector(".text").replaceWith(highlighted(h.snippet));
    return item;
  }));
}

async function loadPending() {
  const asks = await getJSON("/api/pending");
  const list = document.getElementById("pending");
  list.replaceChildren(...(Array.isArray(asks) ? asks : []).map((m) => {
    const answer = el("button", { type: "button" }, "reply");
    answer.addEventListener("click", () => {
      const f = document.getElementById("compose-form");
      f.mode.value = "reply"; f.reply_to.value = m.id; f.message.focus();
    });
    return el("li", { "data-id": m.id }, `${who(m.from)}: `, el("span", { class: "text" }, m.message), " ", answer);
  }));
}

async function compose(form) {
  const body = Object.fromEntries(new FormData(form));
  const out = document.getElementById("compose-result");
  out.textContent = `${body.mode}…`;
  const answer = await postJSON("/api/compose", body);
  out.textContent = JSON.stringify(answer, null, 2);
  if (!answer.error) form.message.value = "";
  loadPending();
}

function connect() {
  const live = document.getElementById("live");
  const source = new EventSource("/events");
  source.addEventListener("open", () => { live.textContent = "live"; live.className = "badge on"; });
  source.addEventListener("error", () => { live.textContent = "reconnecting…"; live.className = "badge off"; });
  source.addEventListener("message", (e) => addMessage(JSON.parse(e.data), true));
  source.addEventListener("roster", (e) => renderRoster(JSON.parse(e.data)));
}

document.getElementById("search-form").addEventListener("submit", (e) => { e.preventDefault(); search(e.target); });
document.getElementById("compose-form").addEventListener("submit", (e) => { e.preventDefault(); compose(e.target); });
document.getElementById("thread-close").addEventListener("click", () => { document.getElementById("thread-section").hidden = true; });
for (const m of boot.feed) feed.set(m.id, m);
document.getElementById("feed").replaceChildren(...[...feed.values()].reverse().map(messageItem));
renderRoster(roster);
connect();
