// The flow picture: hosts on a circle, an arrow per direction labelled with its message count
// (near its source, so the two directions of a pair never share a spot), a loop for same-host
// messages, and a dot that travels along the arrow as each new message arrives. The circle
// grows with the number of hosts and names sit outside it, so 20 hosts stay readable; the same
// counts are listed as text under the picture. Counts are of the messages this page holds.

import { el, svg } from "./util.js";

function geometry(n) {
  const r = n <= 6 ? 24 : 14;  // node radius
  const R = Math.max(90, (n * (2 * r + 34)) / (2 * Math.PI));
  const c = R + r + 70;  // room for the names outside the circle
  return { r, R, c };
}

function positions(roster) {
  const names = roster.hosts.map((h) => h.host);
  const { R, c } = geometry(names.length);
  const pos = new Map();
  names.forEach((name, i) => {
    const a = (2 * Math.PI * i) / Math.max(names.length, 1) - Math.PI / 2;
    pos.set(name, [c + R * Math.cos(a), c + R * Math.sin(a), a]);
  });
  return pos;
}

function edges(feed) {
  const counts = new Map();
  for (const m of feed.values()) {
    const targets = new Set((m.recipients || []).map((r) => r.host).filter(Boolean));
    if (targets.size === 0) targets.add(m.from.host);
    for (const t of targets) {
      const key = `${m.from.host}\u0000${t}`;
      counts.set(key, (counts.get(key) || 0) + 1);
    }
  }
  return counts;
}

function label(box, x, y, text, title, edge) {
  const w = 7 * text.length + 8;
  const g = svg("g", { class: "count", "data-edge": edge });
  g.append(svg("rect", { x: x - w / 2, y: y - 8, width: w, height: 16, rx: 4 }),
    svg("text", { x, y: y + 4 }, text), svg("title", {}, title));
  box.append(g);
}

let pending = null;
// Redrawn at most every half second: a burst of messages redraws once, not once each.
export function drawFlow(roster, feed) {
  if (pending) return;
  pending = setTimeout(() => { pending = null; draw(roster, feed); }, 500);
}

export function draw(roster, feed) {
  const box = document.getElementById("flow");
  const pos = positions(roster);
  const { r, c } = geometry(pos.size);
  box.setAttribute("viewBox", `0 0 ${2 * c} ${2 * c}`);
  const defs = svg("defs");
  const arrow = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
  arrow.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#64748b" }));
  defs.append(arrow);
  box.replaceChildren(defs);
  const counts = [...edges(feed)].sort((x, y) => y[1] - x[1]);
  const labels = [];
  for (const [key, n] of counts) {
    const [from, to] = key.split("\u0000");
    const a = pos.get(from), b = pos.get(to);
    if (!a || !b) continue;
    const edge = `${from}->${to}`;
    const title = `${from} → ${to}: ${n} message(s)`;
    if (from === to) {
      // Same-host messages: a loop on the outer side of the host.
      const ux = Math.cos(a[2]), uy = Math.sin(a[2]);
      const lx = a[0] + ux * (r + 12), ly = a[1] + uy * (r + 12);
      box.append(svg("circle", { cx: lx, cy: ly, r: 10, fill: "none", stroke: "#94a3b8", "data-edge": edge }));
      labels.push([lx + ux * 22, ly + uy * 22, String(n), title, edge]);
      continue;
    }
    // Two directions side by side: each line a little to its own left, arrow at its end.
    const dx = b[0] - a[0], dy = b[1] - a[1], len = Math.hypot(dx, dy) || 1;
    const ox = (-dy / len) * 4, oy = (dx / len) * 4;
    const ux = dx / len, uy = dy / len;
    const x1 = a[0] + ox + ux * r, y1 = a[1] + oy + uy * r, x2 = b[0] + ox - ux * r, y2 = b[1] + oy - uy * r;
    box.append(svg("line", { x1, y1, x2, y2, "stroke-width": Math.min(1 + Math.log2(n + 1), 5), "marker-end": "url(#arrow)", "data-edge": edge }));
    // The count near the source end, off to the line's own side.
    labels.push([x1 + (x2 - x1) * 0.28 + ox * 3, y1 + (y2 - y1) * 0.28 + oy * 3, String(n), title, edge]);
  }
  for (const [name, [x, y, angle]] of pos) {
    const g = svg("g", { class: "node", "data-host": name });
    g.append(svg("circle", { cx: x, cy: y, r }), svg("title", {}, name));
    const short = name.length > 14 ? name.slice(0, 13) + "…" : name;
    const lx = x + Math.cos(angle) * (r + 6), ly = y + Math.sin(angle) * (r + 6) + 4;
    const anchor = Math.abs(Math.cos(angle)) < 0.3 ? "middle" : Math.cos(angle) > 0 ? "start" : "end";
    g.append(svg("text", { class: "name", x: lx, y: ly + (Math.sin(angle) > 0.7 ? 8 : Math.sin(angle) < -0.7 ? -4 : 0), "text-anchor": anchor }, short));
    box.append(g);
  }
  for (const l of labels) label(box, ...l);  // on top of lines and nodes
  document.getElementById("flow-list").replaceChildren(...counts.map(([key, n]) => {
    const [from, to] = key.split("\u0000");
    return el("li", { "data-edge": `${from}->${to}` }, `${from} → ${to}: ${n}`);
  }));
}

export function pulse(roster, m) {
  const pos = positions(roster);
  const a = pos.get(m.from.host);
  const targets = (m.recipients || []).map((r) => r.host).filter(Boolean);
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
