"""The HTML report's plots, inline SVG written by hand: no network, no script, readable as drawn.

A roofline per device: x the arithmetic intensity of a row's cost (FLOPs / bytes), y the FLOP/s
it achieved (its FLOPs over its median device time), both log scales; the device's limits from
the run's limits record are drawn as lines (the copy bandwidth's slope, FLOP/s = bandwidth ×
intensity, and one compute ceiling per compute dtype among the points). A point on the lines
runs at the limit (100% SOL); the distance below them is what is left. One point per workload
and regime for ours and one for the fastest alternative, each with a tooltip (SVG ``<title>``)
naming it. A run without limits (a CPU run not calibrated) gets a line saying so instead.

A ratio distribution per family: one strip per regime of the ratios (fastest alternative's time
over ours', as in the tables) on a log scale, a line at 1.0, the geometric mean marked.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from .report import (
    LEVEL,
    Entry,
    _geomean,
    _median,
    _quotient,
    fmt_ms,
    fmt_ratio,
    html_text,
    ratio_class,
)
from .results import Results

OURS_COLOR = "#1f5fbf"
ALT_COLOR = "#e07b00"
LIMIT_COLOR = "#444"
RATIO_COLORS = {"faster": "#1a8a1a", "slower": "#c01818", "level": "#888", "none": "#888"}
WIDTH, HEIGHT = 760, 460
LEFT, RIGHT, TOP, BOTTOM = 78, 180, 16, 52  # the plot area's margins; the legend sits in the right one
POINT_RADIUS = 3.5
FONT_SIZE = 11
CEILING_LABEL_RISE = 5  # a compute ceiling's label's baseline above its line


def _num(value: float) -> str:
    return f"{value:.1f}"


def _si(value: float, unit: str = "") -> str:
    """1e12 -> "1T" (a decade's tick label), or with a unit "1 TFLOP/s"; 1e-3 -> "0.001"."""
    for factor, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g}{' ' if unit else ''}{suffix}{unit}"
    return f"{value:.3g}{' ' if unit else ''}{unit}"


class LogAxis:
    """Maps values in [10^lo, 10^hi] onto pixels [start, end] on a log scale; ``lo`` and ``hi`` are
    the decades around the values, a decade further out where the lowest value would lie within
    ``margins_px[0]`` of ``start`` or the highest within ``margins_px[1]`` of ``end`` (a point on
    the frame, half of it outside the plot; a line's label above the frame)."""

    def __init__(self, values: list[float], start: float, end: float, margins_px: tuple[float, float] = (0.0, 0.0)):
        logs = [math.log10(v) for v in values]
        self.lo = math.floor(min(logs))
        self.hi = math.ceil(max(logs))
        if self.hi <= self.lo:
            self.hi = self.lo + 1
        px_per_decade = abs(end - start) / (self.hi - self.lo)
        if (min(logs) - self.lo) * px_per_decade < margins_px[0]:
            self.lo -= 1
        if (self.hi - max(logs)) * px_per_decade < margins_px[1]:
            self.hi += 1
        self.start, self.end = start, end

    def __call__(self, value: float) -> float:
        t = (math.log10(value) - self.lo) / (self.hi - self.lo)
        return self.start + t * (self.end - self.start)

    def clamp(self, value: float) -> float:
        return min(max(value, 10.0 ** self.lo), 10.0 ** self.hi)

    def decades(self) -> list[float]:
        return [10.0 ** k for k in range(self.lo, self.hi + 1)]


def _svg_open(title: str, width: int, height: int) -> str:
    return (f"<svg class='plot' width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' "
            f"font-family='system-ui,sans-serif' font-size='{FONT_SIZE}'><title>{html_text(title)}</title>"
            f"<rect x='0' y='0' width='{width}' height='{height}' fill='#fff'/>")


def _grid(xa: LogAxis, ya: LogAxis, x_title: str, y_title: str) -> list[str]:
    """Decade grid lines and labels, the frame and the axis titles."""
    parts = []
    for v in xa.decades():
        x = _num(xa(v))
        parts.append(f"<line class='grid' x1='{x}' y1='{_num(ya.start)}' x2='{x}' y2='{_num(ya.end)}' stroke='#e4e4e4'/>"
                     f"<text x='{x}' y='{_num(ya.start + 16)}' text-anchor='middle'>{_si(v)}</text>")
    for v in ya.decades():
        y = _num(ya(v))
        parts.append(f"<line class='grid' x1='{_num(xa.start)}' y1='{y}' x2='{_num(xa.end)}' y2='{y}' stroke='#e4e4e4'/>"
                     f"<text x='{_num(xa.start - 6)}' y='{y}' text-anchor='end' dominant-baseline='middle'>{_si(v)}</text>")
    parts.append(f"<rect x='{_num(xa.start)}' y='{_num(ya.end)}' width='{_num(xa.end - xa.start)}' "
                 f"height='{_num(ya.start - ya.end)}' fill='none' stroke='#999'/>")
    parts.append(f"<text x='{_num((xa.start + xa.end) / 2)}' y='{_num(ya.start + 36)}' text-anchor='middle'>"
                 f"{html_text(x_title)}</text>")
    mid = _num((ya.start + ya.end) / 2)
    parts.append(f"<text x='16' y='{mid}' text-anchor='middle' transform='rotate(-90 16 {mid})'>{html_text(y_title)}</text>")
    return parts


def _point_name(e: Entry, row: dict[str, Any]) -> str:
    return f"{e.family} · {e.op} {e.workload} {e.label} {e.dtype} · {e.regime} · {row['impl']} ({row['tier']})"


def _device_name(results: Results, e: Entry) -> str:
    row = e.rows[0]
    device = (results.env.get(str(row.get("run_id", "")), {}).get("device") or {})
    return str(device.get("model") or row.get("device") or "unknown device")


def _peak(limits: dict[str, Any], row: dict[str, Any]) -> float | None:
    """The compute ceiling :func:`npuops.report.row_metrics` uses for ``row``."""
    return limits["flops"].get(row["compute_dtype"]) or limits["flops"].get("f32")


def roofline_svg(device: str, entries: list[Entry], limits: dict[str, Any]) -> tuple[str, int]:
    """The roofline of ``entries`` (all of one device) against ``limits``, and how many rows could
    not be placed (no FLOPs or no bytes in their cost)."""
    points, unplaced = [], 0
    ceilings: dict[str, float] = {}
    for e in entries:
        for kind, row in (("ours", e.ours), ("alt", e.best_alt)):
            if row is None:
                continue
            # every division by a figure as read (a time underflows to 0 in seconds); None: out of range
            intensity = _quotient(row["flops"], row["bytes"]) if row["bytes"] else None
            per_ms = _quotient(row["flops"], _median(row))
            rate = per_ms * 1e3 if per_ms is not None else None
            if intensity is None or rate is None or not 0 < rate < math.inf:
                unplaced += 1
                continue
            peak = _peak(limits, row)
            if peak:
                ceilings[row["compute_dtype"] if row["compute_dtype"] in limits["flops"] else "f32"] = peak
            points.append((kind, intensity, rate, e, row))
    if not points:
        return "", unplaced
    bandwidth = limits["copy_bandwidth"]
    knees = [knee for knee in (_quotient(peak, bandwidth) for peak in ceilings.values()) if knee is not None]
    point_room = POINT_RADIUS + 2  # no point touches the frame
    xa = LogAxis([p[1] for p in points] + knees, LEFT, WIDTH - RIGHT, margins_px=(point_room, point_room))
    # at the top, room for the highest ceiling's label above its line too
    ya = LogAxis([p[2] for p in points] + list(ceilings.values()), HEIGHT - BOTTOM, TOP,
                 margins_px=(point_room, max(point_room, CEILING_LABEL_RISE + FONT_SIZE)))
    parts = [_svg_open(f"roofline: {device}", WIDTH, HEIGHT)]
    parts += _grid(xa, ya, "arithmetic intensity (FLOP per byte of the row's cost)", "achieved FLOP/s (median device time)")
    # the bandwidth slope, from the left edge (or the bottom) to the highest ceiling
    top = max(ceilings.values(), default=10.0 ** ya.hi)
    x0 = xa.clamp(max(10.0 ** xa.lo, 10.0 ** ya.lo / bandwidth))
    x1 = xa.clamp(top / bandwidth)
    parts.append(f"<line class='limit limit-bandwidth' x1='{_num(xa(x0))}' y1='{_num(ya(ya.clamp(bandwidth * x0)))}' "
                 f"x2='{_num(xa(x1))}' y2='{_num(ya(ya.clamp(bandwidth * x1)))}' stroke='{LIMIT_COLOR}' stroke-width='2'>"
                 f"<title>copy bandwidth {bandwidth / 1e12:.2f} TB/s</title></line>")
    # labelled along the slope, a third of the way up, clear of the ceilings' labels at the right
    px0, py0, px1, py1 = xa(x0), ya(ya.clamp(bandwidth * x0)), xa(x1), ya(ya.clamp(bandwidth * x1))
    lx, ly = px0 + (px1 - px0) / 3, py0 + (py1 - py0) / 3 - 6
    angle = math.degrees(math.atan2(py1 - py0, px1 - px0))
    parts.append(f"<text x='{_num(lx)}' y='{_num(ly)}' transform='rotate({angle:.1f} {_num(lx)} {_num(ly)})' "
                 f"fill='{LIMIT_COLOR}'>{bandwidth / 1e12:.2f} TB/s</text>")
    label_ys: list[float] = []
    for i, (dtype, peak) in enumerate(sorted(ceilings.items(), key=lambda kv: -kv[1])):
        xs = xa.clamp(peak / bandwidth)
        dash = "" if i == 0 else " stroke-dasharray='6 3'"  # the highest ceiling solid, the others dashed
        y = _num(ya(peak))
        # the label above its line, or below where the one above is within reach (bf16 and f16 nearly equal)
        label_y = (ya(peak) - CEILING_LABEL_RISE if not label_ys or ya(peak) - label_ys[-1] > 18
                   else ya(peak) + 13)
        label_ys.append(label_y)
        parts.append(f"<line class='limit limit-compute' x1='{_num(xa(xs))}' y1='{y}' x2='{_num(xa.end)}' y2='{y}' "
                     f"stroke='{LIMIT_COLOR}' stroke-width='2'{dash}>"
                     f"<title>{html_text(dtype)} peak {_si(peak, 'FLOP/s')}</title></line>"
                     f"<text x='{_num(xa.end - 4)}' y='{_num(label_y)}' text-anchor='end' fill='{LIMIT_COLOR}'>"
                     f"{html_text(dtype)} {_si(peak, 'FLOP/s')}</text>")
    for kind, intensity, rate, e, row in points:
        color = OURS_COLOR if kind == "ours" else ALT_COLOR
        tip = (f"{_point_name(e, row)}: {fmt_ms(_median(row))} ms, {_si(rate, 'FLOP/s')}, {intensity:.3g} FLOP/B"
               + (f", {e.metrics['sol_pct']:.1f}% SOL" if kind == "ours" and e.metrics.get("sol_pct") else ""))
        parts.append(f"<circle class='point {kind}' cx='{_num(xa(intensity))}' cy='{_num(ya(rate))}' r='{POINT_RADIUS}' "
                     f"fill='{color}' fill-opacity='0.65' stroke='{color}'><title>{html_text(tip)}</title></circle>")
    parts.append(_legend([("circle", OURS_COLOR, "ours"), ("circle", ALT_COLOR, "fastest alternative"),
                          ("line", LIMIT_COLOR, "device limits")]))
    parts.append("</svg>")
    return "".join(parts), unplaced


def _legend(items: list[tuple[str, str, str]]) -> str:
    x = WIDTH - RIGHT + 16
    parts = ["<g class='legend'>"]
    for i, (shape, color, text) in enumerate(items):
        y = TOP + 10 + 20 * i
        if shape == "circle":
            parts.append(f"<circle cx='{x + 6}' cy='{y}' r='4' fill='{color}' stroke='{color}'/>")
        else:
            parts.append(f"<line x1='{x}' y1='{y}' x2='{x + 14}' y2='{y}' stroke='{color}' stroke-width='2'/>")
        parts.append(f"<text x='{x + 20}' y='{y}' dominant-baseline='middle'>{html_text(text)}</text>")
    parts.append("</g>")
    return "".join(parts)


def rooflines_html(results: Results, entries: list[Entry]) -> str:
    by_device: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.ours is not None or e.best_alt is not None:
            by_device[_device_name(results, e)].append(e)
    parts = []
    for device, group in sorted(by_device.items()):
        parts.append(f"<h3>Roofline: {html_text(device)}</h3>")
        limits = next((e.limits for e in group if e.limits), None)
        if not limits:
            parts.append(f"<p class='env no-roofline'>No roofline for {html_text(device)}: its run recorded no device "
                         "limits (a CPU run, or a device not calibrated: npuops calibrate), so there are no lines to "
                         "draw the points against.</p>")
            continue
        svg, unplaced = roofline_svg(device, group, limits)
        parts.append(svg or "<p class='env'>No row could be placed on the roofline.</p>")
        mixed = len({str(e.limits) for e in group if e.limits}) > 1
        notes = [("One point per workload and regime: ours (blue) and the fastest alternative (orange); hover a point "
                  "for its name. Lines: the copy bandwidth's slope and the compute ceiling per compute dtype; a point "
                  "on them runs at the device limit.")]
        if unplaced:
            notes.append(f"{unplaced} rows with no FLOPs or no bytes in their cost are not drawn.")
        if mixed:
            notes.append("The rows come from runs with different limits: the lines are the first run's.")
        parts.append(f"<p class='env'>{html_text(' '.join(notes))}</p>")
    return "".join(parts)


def _ratio_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    for k in range(math.floor(lo) - 1, math.ceil(hi) + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** k
            if lo - 1e-9 <= math.log10(v) <= hi + 1e-9:
                ticks.append(v)
    return ticks


def ratio_svg(family: str, entries: list[Entry]) -> str:
    """Strips of ours' ratios in ``family``, one per regime, log scale, a line at 1.0."""
    from .summary import _regime_order

    by_regime: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        by_regime[e.regime].append(e)
    regimes = sorted(by_regime, key=_regime_order)
    band, width, left, right = 56, WIDTH, 90, 40
    height = TOP + band * len(regimes) + BOTTOM
    logs = [math.log10(e.ratio) for e in entries]  # type: ignore[arg-type]
    lo = min(min(logs), -math.log10(2)) - 0.05
    hi = max(max(logs), math.log10(2)) + 0.05

    def x_of(ratio: float) -> float:
        return left + (math.log10(ratio) - lo) / (hi - lo) * (width - left - right)

    bottom = TOP + band * len(regimes)
    parts = [_svg_open(f"ratio distribution: {family}", width, height)]
    for v in _ratio_ticks(lo, hi):
        x = _num(x_of(v))
        parts.append(f"<line class='grid' x1='{x}' y1='{TOP}' x2='{x}' y2='{bottom}' stroke='#e4e4e4'/>"
                     f"<text x='{x}' y='{bottom + 16}' text-anchor='middle'>{v:g}×</text>")
    parts.append(f"<text x='{_num((left + width - right) / 2)}' y='{bottom + 36}' text-anchor='middle'>ratio: fastest "
                 "alternative's time over ours' (above 1, ours is faster; log scale)</text>")
    # the lines first, the points over them: a point at 1.0 or at the geomean stays in sight
    one = _num(x_of(1.0))
    parts.append(f"<line class='unity' x1='{one}' y1='{TOP}' x2='{one}' y2='{bottom}' stroke='#000' stroke-width='1.5'>"
                 "<title>1.0: as fast as the fastest alternative</title></line>")
    for i, regime in enumerate(regimes):
        group = by_regime[regime]
        y0 = TOP + band * i
        parts.append(f"<rect x='{left}' y='{y0}' width='{width - left - right}' height='{band}' fill='none' stroke='#ddd'/>"
                     f"<text x='{left - 8}' y='{y0 + band / 2 - 6}' text-anchor='end' dominant-baseline='middle'>"
                     f"{html_text(regime)}</text><text x='{left - 8}' y='{y0 + band / 2 + 8}' text-anchor='end' "
                     f"dominant-baseline='middle' fill='#666'>n={len(group)}</text>")
        g = _geomean([e.ratio for e in group])  # type: ignore[misc]
        gx = _num(x_of(g))
        parts.append(f"<line class='geomean' x1='{gx}' y1='{y0 + 4}' x2='{gx}' y2='{y0 + band - 4}' stroke='#000' "
                     f"stroke-width='2' stroke-dasharray='3 2'><title>{html_text(regime)} geomean {fmt_ratio(g)}</title></line>")
        for j, e in enumerate(group):
            jitter = ((j * 0.6180339887) % 1.0 - 0.5) * band * 0.7  # the same spread on every render
            color = RATIO_COLORS[ratio_class(e.ratio)]
            tip = (f"{e.op} {e.workload} {e.label} {e.dtype}: {fmt_ratio(e.ratio)} (ours {fmt_ms(_median(e.ours))} ms, "  # type: ignore[arg-type]
                   f"{e.best_alt['impl']} {fmt_ms(_median(e.best_alt))} ms)")  # type: ignore[index, arg-type]
            parts.append(f"<circle class='ratio {ratio_class(e.ratio)}' cx='{_num(x_of(e.ratio))}' "  # type: ignore[arg-type]
                         f"cy='{_num(y0 + band / 2 + jitter)}' r='3' fill='{color}' fill-opacity='0.7'>"
                         f"<title>{html_text(tip)}</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


def ratio_distributions_html(entries: list[Entry]) -> str:
    by_family: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.ratio is not None:
            by_family[e.family].append(e)
    if not by_family:
        return ""
    parts = [(f"<p class='env'>One point per workload: green, ours faster than the fastest alternative; red, slower; "
              f"grey, within {LEVEL:.0%}. Solid line: 1.0; dashed: the regime's geometric mean. Ratios by device time.</p>")]
    for family in sorted(by_family):
        parts.append(f"<h3>Ratio distribution: {html_text(family)}</h3>{ratio_svg(family, by_family[family])}")
    return "".join(parts)


def plots_html(results: Results, entries: list[Entry]) -> str:
    """The plots section of the HTML report."""
    return "<h2>Plots</h2>" + rooflines_html(results, entries) + ratio_distributions_html(entries)
