// The overseer page's own script: live updates over server-sent events, the feed and its
// history, threads, search, compose and the roster. Every piece of text from a message is set
// as text, never as markup, so nothing an agent writes can run here (docs/web.md).

import { el, getJSON, postJSON, when, who } from "./util.js";
import { addMessage, addOlder, hooks, known, liveMark, liveSince, messageItem, resetFeed, view } from "./feed.js";
import { drawFlow, pulse } from "./flow.js";
import { attentionHooks, renderAttention } from "./attention.js";

const boot = JSON.parse(document.getElementById("boot").dataset.boot);
const MARK_START = "\u00ab", MARK_END = "\u00bb";
let roster = boot.roster;
let older = boot.before;  // the cursor of the next older page, or null

function renderSessions(r) {
  // What the page holds of each session: mail queued for it, and when it last sent.
  const queued = new Map(), last = new Map();
  for (const m of known.values()) {
    if (!last.has(m.from.id) || last.get(m.from.id) < m.sent_at) last.set(m.from.id, m.sent_at);
    for (const x of m.recipients || []) if (x.outcome === "queued") queued.set(x.session_id, (queued.get(x.session_id) || 0) + 1);
  }
  const sessions = document.getElementById("sessions");
  sessions.replaceChildren(...r.sessions.map((s) => el("tr", { class: "session", "data-name": s.alias, "data-host": s.host },
    el("td", {}, s.alias), el("td", {}, s.host), el("td", { class: s.online ? "online" : "offline" }, s.online ? "online" : "offline"),
    el("td", { class: "queued" }, queued.get(s.id) || ""), el("td", {}, last.has(s.id) ? when(last.get(s.id)) : ""),
    el("td", {}, s.status || ""), el("td", {}, (s.groups || []).join(", ")), el("td", {}, s.cwd || ""), el("td", {}, s.model || ""))));
}

// Sessions' queued counts move with the feed: redrawn at most once a second.
let sessionsPending = null;
function sessionsLater() {
  if (!sessionsPending) sessionsPending = setTimeout(() => { sessionsPending = null; renderSessions(roster); }, 1000);
}

function renderRoster(r) {
  roster = r;
  const hosts = document.getElementById("hosts");
  hosts.replaceChildren(...r.hosts.map((h) => el("tr", { "data-host": h.host },
    el("td", {}, h.host), el("td", { class: `lease ${h.lease}` }, h.lease),
    el("td", { class: "beat" }, h.beat_at ? when(h.beat_at) : ""),
    el("td", {}, h.generation ?? ""), el("td", {}, r.sessions.filter((s) => s.host === h.host).length))));
  renderSessions(r);
  // The recipient picker: every session the roster knows, by name@host.
  document.getElementById("recipients").replaceChildren(
    ...r.sessions.map((s) => el("option", { value: `${s.alias}@${s.host}` })));
  // The host's degraded states (a full disk, a failing inbox): shown until they clear.
  const warnings = document.getElementById("warnings");
  warnings.replaceChildren(...(r.warnings || []).map((w) => el("p", {}, w)));
  warnings.hidden = !(r.warnings || []).length;
  const badge = document.getElementById("archive-state");
  badge.className = `badge ${r.archive ? "on" : "off"}`;
  badge.textContent = r.archive ? "archive on" : "archive off (this host only)";
  drawFlow(roster, known);
  loadPending();
}

// --- threads open in place, under the message they were opened from ---------------------------

async function showThread(id, from) {
  const items = await getJSON(`/api/thread/${encodeURIComponent(id)}`);
  const box = document.getElementById("thread-section");
  document.getElementById("thread-id").textContent = id;
  document.getElementById("thread").replaceChildren(...(Array.isArray(items) ? items : []).map(messageItem));
  // A newer copy of the row may have replaced it while the thread was read: open under that.
  if (from && !from.isConnected) from = document.querySelector(`#feed > li[data-id="${CSS.escape(from.dataset.id || "")}"]`);
  if (from && !box.contains(from)) from.after(box);
  else if (!from) document.getElementById("feed").before(box);
  box.hidden = false;
  box.focus();
}
hooks.thread = showThread;
attentionHooks.thread = showThread;

// An open thread follows the feed: a message joining it (or a newer copy of one in it, with
// later receipts) shows in place, oldest first as the server lists it (docs/web.md).
function followThread(m) {
  const box = document.getElementById("thread-section");
  if (box.hidden || (m.thread_id || m.id) !== document.getElementById("thread-id").textContent) return;
  const list = document.getElementById("thread");
  const item = messageItem(m);
  const old = list.querySelector(`:scope > li[data-id="${CSS.escape(m.id)}"]`);
  if (old) { old.replaceWith(item); return; }
  const key = item.dataset.key;
  for (const other of list.children) {
    if (key && (other.dataset.key || "") > key) { list.insertBefore(item, other); return; }
  }
  list.append(item);
}

// --- replying: the form is filled from the message answered, and only from it -----------------

function replyTo(m) {
  const f = document.getElementById("compose-form");
  f.mode.value = "reply";
  f.reply_to.value = m.id;
  f.to.value = who(m.from);
  f.subject.value = m.subject || "";
  f.thread_id.value = m.thread_id || m.id;
  document.getElementById("compose-section").scrollIntoView({ block: "nearest" });
  f.message.focus();
}
hooks.reply = replyTo;
attentionHooks.reply = replyTo;
attentionHooks.answered = () => loadPending();
hooks.me = boot.roster.me ? boot.roster.me.id : null;
hooks.changed = (m, isNew) => { followThread(m); drawFlow(roster, known); sessionsLater(); if (isNew) pulse(roster, m); };

// --- history: older pages from the server, filters ----------------------------------------------

// The live tab dropped its oldest items: "older" pages on from the oldest one still shown.
hooks.trimmed = (key) => { older = key; document.getElementById("older").hidden = false; };

function filterParams() {
  const params = new URLSearchParams();
  for (const [k, v] of new FormData(document.getElementById("filter-form"))) if (v) params.set(k, v);
  return params;
}

// Feed loads may answer out of order (a filter, a reset, the reload after a reconnect, an older
// page, the catch-up when the stream opens): ``use`` gets an answer only if no newer filter was
// asked for after ``seq`` and the answer is a page (an error answer leaves the list as it was).
// The list is aria-busy while any load is under way (docs/web.md).
let feedSeq = 0;
let feedLoads = 0;

async function feedLoad(params, seq, use) {
  const list = document.getElementById("feed");
  feedLoads += 1;
  list.setAttribute("aria-busy", "true");
  try {
    const page = await getJSON(`/api/feed?${params}`);
    if (seq === feedSeq && Array.isArray(page.messages)) use(page);
  } finally {
    feedLoads -= 1;
    if (!feedLoads) list.setAttribute("aria-busy", "false");
  }
}

function showOlderButton(page) {
  older = page.before;
  document.getElementById("older").hidden = !older;
}

async function loadOlder() {
  if (!older) return;
  const params = filterParams();
  params.set("before", older);
  await feedLoad(params, feedSeq, (page) => { addOlder(page.messages); showOlderButton(page); });
}

async function applyFilters() {
  const seq = ++feedSeq;
  const params = filterParams();
  view.filters = Object.fromEntries(params);
  const mark = liveMark();
  await feedLoad(params, seq, (page) => {
    const came = liveSince(mark);  // live while the page was read: not all in its answer
    resetFeed(page.messages);
    for (const m of came) addMessage(m);
    showOlderButton(page);
  });
}

// The newest page merged in as live messages are: what an open item holds stays as it is.
async function catchUp() {
  await feedLoad(filterParams(), feedSeq, (page) => {
    for (const m of [...page.messages].reverse()) addMessage(m);
  });
}

// --- search -------------------------------------------------------------------------------------

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
    `${answer.hits.length} match(es) in ${answer.source === "archive" ? "the archive and this host's inboxes" : "this host's inboxes"}`;
  list.replaceChildren(...answer.hits.map((h) => {
    const item = messageItem(h);
    item.className = "msg hit";
    item.querySelector(".text").replaceWith(highlighted(h.snippet));
    return item;
  }));
}

// --- the human session's own asks waiting, and compose --------------------------------------------

async function loadDeadLetters() {
  const rows = await getJSON("/api/dead-letters");
  document.getElementById("dead-letters").replaceChildren(...(Array.isArray(rows) ? rows : []).map((d) =>
    el("li", { "data-id": d.id }, `${d.to}: ${d.outcome} (${d.code || d.outcome})${d.resent_as ? `, resent as ${d.resent_as}` : ""} `,
      el("span", { class: "text" }, d.message))));
}

async function loadInbound() {
  const all = await getJSON("/api/inbound");
  document.getElementById("inbound").replaceChildren(...Object.entries(all && !all.error ? all : {}).map(([name, pol]) =>
    el("li", {}, `${name}: ${Object.entries(pol.rules).map(([p, a]) => `${p} ${a}`).join(", ") || "no rules"}; ${pol.held} held`)));
}

async function loadReservations() {
  const answer = await getJSON("/api/reservations");
  const rows = answer && Array.isArray(answer.reservations) ? answer.reservations : [];
  const items = rows.map((r) =>
    el("li", { "data-id": r.id, "data-holder": r.holder },
      `${r.project}: ${r.glob} ${r.mode} by ${r.holder}, ${Math.ceil(r.expires_in_s / 60)} min left`,
      r.reason ? el("span", { class: "text" }, `: ${r.reason}`) : ""));
  // Bounded whatever the store holds: the oldest are shown, and that there are more.
  if (answer && answer.more) items.push(el("li", { class: "more" }, "more reservations than one answer carries"));
  document.getElementById("reservations").replaceChildren(...items);
}
// A reservation changes no roster: the list is read again every few seconds too.
setInterval(loadReservations, 5000);

async function loadPending() {
  loadDeadLetters();
  loadInbound();
  loadReservations();
  const asks = await getJSON("/api/pending");
  const list = document.getElementById("pending");
  list.replaceChildren(...(Array.isArray(asks) ? asks : []).map((m) => {
    const answer = el("button", { type: "button" }, "reply");
    answer.addEventListener("click", () => replyTo(m));
    return el("li", { "data-id": m.id }, `${who(m.from)}: `, el("span", { class: "text" }, m.message), " ", answer);
  }));
}

async function compose(form) {
  const body = Object.fromEntries(new FormData(form));
  const out = document.getElementById("compose-result");
  out.textContent = `${body.mode}…`;
  const answer = await postJSON("/api/compose", body);
  out.textContent = JSON.stringify(answer, null, 2);
  if (!answer.error) {
    form.message.value = "";
    if (body.mode === "reply") {
      // A reply answers one message: the next one starts from an empty form.
      form.mode.value = "send";
      for (const name of ["reply_to", "thread_id", "subject", "to"]) form[name].value = "";
    }
  }
  loadPending();
}

// The event stream: EventSource reconnects by itself after a stream ends or the network
// fails, but not after a refusal. A refusal (401) means the server restarted with a new token:
// the page says so at once instead of showing frozen data as live.
let down = false;
function connect() {
  const live = document.getElementById("live");
  const source = new EventSource("/events");
  source.addEventListener("open", () => {
    live.textContent = "live"; live.className = "badge on";
    document.getElementById("reload").hidden = true;
    // What arrived while the stream was down, or between the page's render and the stream's
    // first start (pushed to the streams open then, so not to this one).
    if (down) { down = false; applyFilters(); } else catchUp();
  });
  source.addEventListener("error", () => {
    down = true;
    live.textContent = "reconnecting…"; live.className = "badge off";
    if (source.readyState === EventSource.CLOSED) setTimeout(() => recover(), 1000);
  });
  source.addEventListener("bye", () => { live.textContent = "server stopped: reconnecting…"; live.className = "badge off"; });
  source.addEventListener("message", (e) => addMessage(JSON.parse(e.data)));
  source.addEventListener("roster", (e) => renderRoster(JSON.parse(e.data)));
  source.addEventListener("attention", (e) => renderAttention(JSON.parse(e.data)));
}

async function recover() {
  let status = 0;
  try { status = (await fetch("/api/roster", { credentials: "same-origin" })).status; } catch { status = 0; }
  if (status === 401) {
    document.getElementById("reload").hidden = false;
    document.getElementById("live").textContent = "token changed";
    return;
  }
  if (status === 200) connect(); else setTimeout(() => recover(), 2000);
}

document.getElementById("search-form").addEventListener("submit", (e) => { e.preventDefault(); search(e.target); });
document.getElementById("compose-form").addEventListener("submit", (e) => { e.preventDefault(); compose(e.target); });
document.getElementById("filter-form").addEventListener("submit", (e) => { e.preventDefault(); applyFilters(); });
document.getElementById("filter-form").addEventListener("reset", () => setTimeout(applyFilters, 0));
document.getElementById("older").addEventListener("click", loadOlder);
document.getElementById("thread-close").addEventListener("click", () => { document.getElementById("thread-section").hidden = true; });
resetFeed(boot.feed);
document.getElementById("older").hidden = !older;
renderRoster(roster);
renderAttention(boot.attention || []);
// A thread link from another page (a message's own page) opens the thread here.
if (location.hash.startsWith("#thread=")) showThread(decodeURIComponent(location.hash.slice(8)), null);
connect();
