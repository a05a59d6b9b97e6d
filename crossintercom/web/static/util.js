// Small helpers shared by the page's modules. Text is only ever set as text (textContent or
// text nodes): nothing from a message is parsed as markup.

export const csrf = document.querySelector('meta[name="csrf-token"]').content;

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "for") node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
export function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

export function who(p) { return `${p.name || p.id}@${p.host}`; }

// "3 min ago", with the absolute time (UTC, to the second) for the title attribute.
export function age(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return String(iso ?? "");
  const s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min ago`;
  return `${Math.floor(s / 86400)} d ago`;
}
export function absolute(iso) {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? String(iso ?? "") : new Date(t).toISOString().replace(/\.\d+Z$/, "Z").replace("T", " ");
}
export function when(iso) {
  return el("time", { class: "when", dateTime: iso, title: absolute(iso) }, age(iso));
}
// Ages move on: every <time class="when"> is rewritten each half minute.
setInterval(() => {
  for (const t of document.querySelectorAll("time.when")) t.textContent = age(t.dateTime);
}, 30_000);

export async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin" });
  return r.json();
}

export async function postJSON(url, body) {
  const r = await fetch(url, {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify(body),
  });
  return r.json();
}
