// The attention view at the top of the page, and escalations rendered as what they are
// (decision, interview, progress), answerable from the page when they were sent to the human
// session. Text from messages is set as text only.

import { el, postJSON, when, who } from "./util.js";

export const attentionHooks = { thread: () => {}, reply: () => {}, answered: () => {} };
const baseTitle = document.title;

function answer(id, text, status) {
  status.textContent = "sending…";
  postJSON("/api/compose", { mode: "reply", reply_to: id, message: text }).then((out) => {
    status.textContent = out.error ? `${out.error.code}: ${out.error.message}` : `answered (${out.outcome})`;
    attentionHooks.answered(out);
  });
}

function questionField(q, n) {
  const name = `q-${n}-${q.id}`;
  if (q.type === "single") {
    return el("label", {}, q.question, el("select", { name, "data-qid": q.id },
      ...(q.options || []).map((o) => el("option", { value: o }, o))));
  }
  if (q.type === "multi") {
    return el("fieldset", { "data-qid": q.id, "data-multi": "1" }, el("legend", {}, q.question),
      ...(q.options || []).map((o) => el("label", {}, el("input", { type: "checkbox", value: o }), o)));
  }
  if (q.type === "info") return el("p", { class: "info" }, q.question);
  return el("label", {}, q.question, el("textarea", { name, rows: 2, "data-qid": q.id }));
}

function responsesOf(form) {
  const out = [];
  for (const node of form.querySelectorAll("[data-qid]")) {
    if (node.dataset.multi) {
      out.push({ id: node.dataset.qid, value: [...node.querySelectorAll("input:checked")].map((i) => i.value) });
    } else if (node.tagName !== "FIELDSET") {
      out.push({ id: node.dataset.qid, value: node.value });
    }
  }
  return JSON.stringify({ responses: out });
}

// An escalation's own view; with ``answerable``, the controls that answer it.
export function escalationView(esc, id, answerable) {
  const box = el("div", { class: `escalation ${esc.kind}`, "data-escalation": esc.kind });
  const status = el("span", { class: "answer-status", role: "status" });
  if (esc.kind === "progress_update") {
    box.append(el("span", { class: "kind escalation" }, "progress"), " ", el("span", { class: "title" }, esc.title || ""));
    if (esc.percent !== null && esc.percent !== undefined) {
      box.append(" ", el("progress", { max: 100, value: esc.percent, "aria-label": "progress" }), ` ${esc.percent}%`);
    }
    if (esc.context) box.append(el("div", { class: "context" }, esc.context));
    return box;
  }
  const q0 = (esc.questions || [])[0] || {};
  const label = esc.kind === "need_decision" ? "decision needed" : "interview";
  box.append(el("span", { class: "kind escalation" }, label), " ",
    el("span", { class: "title" }, esc.title || q0.question || ""));
  if (esc.context) box.append(el("div", { class: "context" }, esc.context));
  if (esc.kind === "need_decision" && q0.options && q0.options.length) {
    const choices = el("div", { class: "choices" });
    for (const o of q0.options) {
      const b = el("button", { type: "button", class: "choice", disabled: !answerable }, o);
      b.addEventListener("click", () => answer(id, JSON.stringify({ responses: [{ id: q0.id, value: o }] }), status));
      choices.append(b);
    }
    box.append(choices, status);
    return box;
  }
  const form = el("form", { class: "answer-form", "aria-label": "answer" },
    ...(esc.kind === "need_decision" ? [questionField({ ...q0, question: "answer" }, 0)] : (esc.questions || []).map(questionField)));
  form.append(el("button", { type: "submit", disabled: !answerable }, "answer"));
  form.addEventListener("submit", (e) => { e.preventDefault(); answer(id, responsesOf(form), status); });
  box.append(form, status);
  return box;
}

function seconds(s) {
  if (s === null || s === undefined) return "";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

function links(e) {
  const perma = el("a", { href: `/message/${encodeURIComponent(e.id)}`, class: "perma" }, "message");
  const thread = el("a", { href: `#thread=${encodeURIComponent(e.thread_id)}`, class: "thread" }, "thread");
  thread.addEventListener("click", (ev) => { ev.preventDefault(); attentionHooks.thread(e.thread_id, null); });
  return [" ", perma, " ", thread];
}

function entry(e) {
  const li = el("li", { class: `attention ${e.kind}`, "data-kind": e.kind, "data-id": e.id || e.host || (e.session && e.session.id) });
  if (e.kind === "lapsed") {
    li.append(el("span", { class: "kind refusal" }, "host lapsed"), ` ${e.host}: its relay stopped renewing its lease`);
    return li;
  }
  if (e.kind === "offline") {
    li.append(el("span", { class: "kind" }, "offline"), ` ${e.session.name}@${e.session.host} has ${e.waiting} message(s) waiting`);
    return li;
  }
  const head = [when(e.sent_at), " ", el("span", { class: "from" }, who(e.from)), " → ", el("span", { class: "to" }, e.to || ""), " "];
  if (e.kind === "escalation") {
    li.append(...head, ...links(e), escalationView(e.escalation, e.id, e.answerable));
    return li;
  }
  if (e.kind === "ask") {
    const late = e.overdue;
    li.append(el("span", { class: "kind ask" }, "ask waiting"), " ", ...head,
      el("span", { class: "waited" }, `waiting ${seconds(e.age_s)}`),
      e.timeout_s ? el("span", { class: late ? "timeout late" : "timeout" }, ` · timeout ${seconds(e.timeout_s)}${late ? " (passed)" : ""}`) : "",
      " ", el("span", { class: "text" }, e.message || ""), ...links(e));
    if (e.answerable) {
      const b = el("button", { type: "button", class: "answer" }, "answer");
      b.addEventListener("click", () => attentionHooks.reply(e));
      li.append(" ", b);
    }
    return li;
  }
  const r = e.recipient || {};
  const whom = r.session_id ? `${r.name || r.session_id}@${r.host || "?"}` : e.to;
  const what = e.kind === "queued" ? `queued for ${whom} ${seconds(e.age_s)}` : `${e.kind} for ${whom}${e.code ? ` (${e.code})` : ""}`;
  li.append(el("span", { class: `kind ${e.kind === "queued" ? "ask" : "refusal"}` }, e.kind), " ", ...head, el("span", { class: "what" }, what), ...links(e));
  return li;
}

// An entry that has not changed keeps its node, so a form the overseer is filling in (an
// interview, a decision) survives updates about other entries (docs/web.md, "Attention").
function settled(e) {
  const { age_s, ...rest } = e;
  return JSON.stringify(rest);
}

export function renderAttention(entries) {
  const list = document.getElementById("attention-list");
  const kept = new Map();
  for (const li of list.children) kept.set(li.dataset.sig, li);
  list.replaceChildren(...entries.map((e) => {
    const sig = settled(e);
    const old = kept.get(sig);
    if (old) {
      const waited = old.querySelector(".waited");
      if (waited) waited.textContent = `waiting ${seconds(e.age_s)}`;
      return old;
    }
    const li = entry(e);
    li.dataset.sig = sig;
    return li;
  }));
  const count = entries.filter((e) => !(e.kind === "escalation" && e.escalation.kind === "progress_update")).length;
  document.getElementById("attention-count").textContent = String(count);
  document.getElementById("attention-empty").hidden = entries.length > 0;
  document.title = count ? `(${count}) ${baseTitle}` : baseTitle;
}
