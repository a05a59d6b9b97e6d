// The flow picture: hosts on a circle, an arrow per direction with its message count, a loop
// for same-host messages, and a dot that travels along the arrow as each new message arrives.

import { svg } from "./util.js";

// --- the flow picture: hosts on a circle, an edge per direction with its message count ---------


function positions(roster) {
  const names = roster.hosts.map((h) => h.host);
  const pos = new Map();
  names.forEach((n, i) => {
    const a = (2 * Math.PI * i) / Math.max(names.length, 1) - Math.PI / 2;
    pos.set(n, [180 + 110 * Math.cos(a), 130 + 75 * Math.sin(a)]);
  });
  return pos;
}

function edges(feed) {
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

export function drawFlow(roster, feed) {
  const box = document.getElementById("flow");
  const pos = positions(roster);
  const defs = svg("defs");
  const arrow = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
  arrow.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#64748b" }));
  defs.append(arrow);
  box.replaceChildren(defs);
  for (const [key, n] of edges(feed)) {
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

export function pulse(roster, m) {
  const pos = positions(roster);
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

