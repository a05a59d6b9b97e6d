"""The benchmark as a picture: one self-contained HTML file (inline SVG, no script, nothing
fetched) with the latency distributions as cumulative curves, crossintercom beside its raw
baseline on each path, and the throughputs as bars. Written beside the table by ``--chart``.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from crossintercom.tools.bench.report import BenchReport

WIDTH, HEIGHT = 640, 300
PAD_L, PAD_R, PAD_T, PAD_B = 56, 16, 16, 40
COLOURS = {"crossintercom": "#2563eb", "baseline": "#9ca3af"}


def _cdf_svg(title: str, series: dict[str, list[float]]) -> str:
    """Cumulative share of sends (y) done within a latency (x, ms, log scale)."""
    values = [v for s in series.values() for v in s if v > 0]
    if not values:
        return f"<h2>{html.escape(title)}</h2><p>no samples</p>"
    lo, hi = math.log10(min(values)), math.log10(max(values))
    if hi - lo < 1e-9:
        hi = lo + 1
    plot_w, plot_h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B

    def x(v: float) -> float:
        return PAD_L + (math.log10(max(v, 10**lo)) - lo) / (hi - lo) * plot_w

    def y(f: float) -> float:
        return PAD_T + (1 - f) * plot_h

    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">']
    parts.append(
        f'<rect x="{PAD_L}" y="{PAD_T}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#d1d5db"/>'
    )
    for f in (0.5, 0.99):
        parts.append(
            f'<line x1="{PAD_L}" x2="{PAD_L + plot_w}" y1="{y(f):.1f}" y2="{y(f):.1f}" '
            'stroke="#e5e7eb" stroke-dasharray="4 3"/>'
            f'<text x="{PAD_L - 6}" y="{y(f) + 4:.1f}" text-anchor="end" font-size="11">'
            f"p{round(f * 100)}</text>"
        )
    decade = math.floor(lo)
    while decade <= math.ceil(hi):
        v = 10.0**decade
        if 10**lo <= v <= 10**hi:
            parts.append(
                f'<text x="{x(v):.1f}" y="{HEIGHT - PAD_B + 16}" text-anchor="middle" '
                f'font-size="11">{v:g} ms</text>'
            )
        decade += 1
    for name, samples in series.items():
        ordered = sorted(s for s in samples if s > 0)
        if not ordered:
            continue
        n = len(ordered)
        points = " ".join(f"{x(v):.1f},{y((i + 1) / n):.1f}" for i, v in enumerate(ordered))
        colour = COLOURS["crossintercom" if name.startswith("crossintercom") else "baseline"]
        parts.append(
            f'<polyline class="series" data-series="{html.escape(name)}" points="{points}" '
            f'fill="none" stroke="{colour}" stroke-width="2"/>'
        )
    legend_y = HEIGHT - 8
    for i, name in enumerate(series):
        colour = COLOURS["crossintercom" if name.startswith("crossintercom") else "baseline"]
        parts.append(
            f'<rect x="{PAD_L + i * 260}" y="{legend_y - 9}" width="12" height="4" '
            f'fill="{colour}"/><text x="{PAD_L + i * 260 + 16}" y="{legend_y - 4}" '
            f'font-size="11">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return f"<h2>{html.escape(title)}</h2>" + "".join(parts)


def _throughput_svg(report: BenchReport) -> str:
    rates = [f for f in report.figures if f.unit == "msg/s"]
    bars = [(f"{f.path} {f.metric} crossintercom", f.crossintercom) for f in rates] + [
        (f"{f.path} {f.metric} raw baseline", f.baseline) for f in rates
    ]
    bars.sort(key=lambda b: b[0])
    top = max((v for _, v in bars), default=1.0) or 1.0
    row_h, label_w = 28, 200
    height = row_h * len(bars) + 10
    parts = [f'<svg viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}">']
    for i, (label, value) in enumerate(bars):
        w = value / top * (WIDTH - label_w - 90)
        colour = COLOURS["baseline" if "baseline" in label else "crossintercom"]
        y = 5 + i * row_h
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end" font-size="12">'
            f"{html.escape(label)}</text>"
            f'<rect class="bar" data-bar="{html.escape(label)}" x="{label_w}" y="{y}" '
            f'width="{w:.1f}" height="{row_h - 8}" fill="{colour}"/>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 16}" font-size="12">{value:,.0f} msg/s</text>'
        )
    parts.append("</svg>")
    return "<h2>Throughput</h2>" + "".join(parts)


def write_chart(report: BenchReport, path: Path) -> Path:
    lat = report.latency_ms
    title = (
        f"crossintercom bench: {report.backend} ({report.store}), "
        f"{'quick' if report.quick else 'full'} run, {report.date}"
    )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        _cdf_svg(
            "Same-host send latency (cumulative)",
            {
                "crossintercom same-host": lat.get("same-host", []),
                "raw Unix-socket echo": lat.get("same-host raw", []),
            },
        ),
        _cdf_svg(
            "Cross-host send latency (cumulative)",
            {
                "crossintercom cross-host": lat.get("cross-host", []),
                "raw store round trip": lat.get("cross-host raw", []),
            },
        ),
        _throughput_svg(report),
    ]
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:2em}h1{font-size:1.2em}"
        "h2{font-size:1em;margin-top:1.6em}</style></head><body>" + "".join(body) + "</body></html>"
    )
    path.write_text(page, encoding="utf-8")
    return path
