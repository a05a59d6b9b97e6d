// Messages as list items, and the live feed: newest first, in time order whatever order they
// arrive in, bounded (older ones are paged in on request, never kept growing).

import { el, when, who } from "./util.js";
import { escalationView } from "./attention.js";

export const LIVE_KEEP = 300;
const LONG = 600;  // characters shown before a message is collapsed
export const known = new Map();  // message id -> the newest copy the page got
export const hooks = { thread: () => {}, reply: () => {}, changed: () => {}, trimmed: () => {}, me: null };

function receiptText(r) {
  const code = r.code ? ` (${r.code})` : "";
  if (!r.session_id) return `${r.outcome}${code}`;  // went nowhere: no recipient was tried
  return `${r.name || r.session_id}@${r.host || "?"}: ${r.outcome}${code}`;
}

export function messageItem(m) {
  const thread = m.thread_id || m.id;
  const link = el("a", { href: `#thread=${encodeURIComponent(thread)}`, class: "thread", "data-thread": thread }, "thread");
  link.addEventListener("click", (e) => { e.preventDefault(); hooks.thread(thread, e.target.closest("li")); });
  const perma = el("a", { href: `/message/${encodeURIComponent(m.id)}`, class: "perma", title: "this message on its own page" }, "open");
  const head = el("div", { class: "head" },
    when(m.sent_at), " ",
    el("span", { class: "from" }, who(m.from)), " → ", el("span", { class: "to" }, m.to), " ");
  if (m.kind && m.kind !== "message") head.append(el("span", { class: `kind ${m.kind}` }, m.kind), " ");
  if (m.priority && m.priority !== "normal") head.append(el("span", { class: `priority ${m.priority}` }, m.priority), " ");
  if (m.ack_required) head.append(el("span", { class: "ack" }, "ack asked"), " ");
  if (m.subject) head.append(el("span", { class: "subject" }, m.subject), " ");
  head.append(link, " ", perma);
  const text = el("div", { class: "text" }, m.message);
  const body = [head, text];
  if ((m.message || "").length > LONG) {
    text.classList.add("collapsed");
    const more = el("button", { type: "button", class: "expand", "aria-expanded": "false" }, "show all");
    more.addEventListener("click", () => {
      const open = text.classList.toggle("collapsed") === false;
      more.textContent = open ? "show less" : "show all";
      more.setAttribute("aria-expanded", String(open));
    });
    body.push(more);
  }
  if (m.escalation) {
    const mine = (m.recipients || []).some((r) => r.session_id === hooks.me);
    body.push(escalationView(m.escalation, m.id, mine));
  }
  if ((m.attachments || []).length) {
    body.push(el("div", { class: "attachments" }, ...m.attachments.map((a) => el("span", { class: "attachment" }, `${a.kind}: ${a.name}`))));
  }
  const receipts = el("div", { class: "receipts" });
  for (const r of m.recipients || []) receipts.append(el("span", { class: `receipt ${r.outcome}` }, receiptText(r)));
  body.push(receipts);
  if (m.expects_reply && !m.escalation) {
    const answer = el("button", { type: "button", class: "answer" }, "reply");
    answer.addEventListener("click", () => hooks.reply(m));
    body.push(answer);
  }
  return el("li", { class: `msg ${m.kind || "message"}`, "data-id": m.id, "data-key": m.cursor || "" }, ...body);
}

// Insert keeping newest first by the server's sort key (sent time, then id).
function place(list, item) {
  const key = item.dataset.key;
  for (const other of list.children) {
    if (other.tagName === "LI" && (other.dataset.key || "") < key) { list.insertBefore(item, other); return; }
  }
  list.append(item);
}

// A newer copy of a message (its receipts moved on) replaces its item, but not what the person
// did to it: a text shown in full stays so, an escalation form half filled in keeps its input.
function keepWhatWasDone(old, item) {
  const text = old.querySelector(":scope > .text");
  const more = item.querySelector(":scope > button.expand");
  if (more && text && !text.classList.contains("collapsed")) more.click();
  const form = old.querySelector(":scope > .escalation");
  const fresh = item.querySelector(":scope > .escalation");
  if (form && fresh) fresh.replaceWith(form);
}

// Live messages as they came, so that a feed load's answer (a page read before some of them
// came) does not drop those that came while it was under way (docs/web.md).
const liveLog = [];
let liveCount = 0;
export function liveMark() { return liveCount; }
export function liveSince(mark) { return liveLog.slice(Math.max(0, liveLog.length - (liveCount - mark))); }

export function addMessage(m) {
  liveCount += 1;
  liveLog.push(m);
  if (liveLog.length > LIVE_KEEP) liveLog.shift();
  const list = document.getElementById("feed");
  const item = messageItem(m);
  const old = list.querySelector(`:scope > li[data-id="${CSS.escape(m.id)}"]`);
  const isNew = !known.has(m.id);
  known.set(m.id, m);
  if (old) { keepWhatWasDone(old, item); old.replaceWith(item); } else if (matchesView(m)) place(list, item);
  // The live tab stays bounded: the oldest items go (paged back in on request).
  let trimmed = false;
  while (list.querySelectorAll(":scope > li").length > LIVE_KEEP + extra.count) {
    const last = list.lastElementChild;
    if (last.tagName !== "LI") { parkThread(); continue; }  // an open thread under the last one
    last.remove(); trimmed = true;
  }
  if (trimmed) hooks.trimmed(list.querySelector(":scope > li:last-of-type").dataset.key);
  hooks.changed(m, isNew);
}

// Messages the user paged in on purpose stay, on top of the live bound.
const extra = { count: 0 };
export function addOlder(items) {
  const list = document.getElementById("feed");
  for (const m of items) {
    if (list.querySelector(`:scope > li[data-id="${CSS.escape(m.id)}"]`)) continue;
    known.set(m.id, m);
    list.append(messageItem(m));
    extra.count += 1;
  }
}
// A thread opens inside the feed, under its message; before the feed's items are replaced or
// dropped it goes back above the feed, closed.
export function parkThread() {
  const box = document.getElementById("thread-section");
  const list = document.getElementById("feed");
  if (list.contains(box)) { box.hidden = true; list.before(box); }
}

export function resetFeed(items) {
  extra.count = 0;
  parkThread();
  const list = document.getElementById("feed");
  list.replaceChildren(...items.map(messageItem));
  for (const m of items) known.set(m.id, m);
}

// The filters in force (set by the page): a live message shows only if it passes them.
export const view = { filters: {} };
function matchesView(m) {
  const f = view.filters;
  const rs = m.recipients || [];
  if (f.thread && (m.thread_id || m.id) !== f.thread) return false;
  if (f.kind && m.kind !== f.kind) return false;
  if (f.state && !rs.some((r) => r.outcome === f.state)) return false;
  if (f.host && m.from.host !== f.host && !rs.some((r) => r.host === f.host)) return false;
  if (f.session) {
    const names = [m.from.id, m.from.name, m.to, ...rs.map((r) => r.name), ...rs.map((r) => r.session_id)];
    if (!names.includes(f.session)) return false;
  }
  return true;
}
