"""The HTML report's plots as a browser draws them: headless Chromium renders the page that
``npuops report --format html`` writes; the DOM it dumps must hold every plot's elements, and its
screenshot must show each plot's points in their colours where that DOM puts them, with ink in the
plot area around them.

Without Chromium the tests skip, unless NPUOPS_REQUIRE_CHROMIUM is set (CI installs Chromium and
sets it, so there a missing browser fails instead of passing unseen).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import zlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from html.parser import HTMLParser
from pathlib import Path

import pytest
from npuops.cli import main
from test_plots import write
from test_report import LIMITS, row

# Headless on a closed network (without these it waits on the sandbox, the GPU, updates and sync),
# and a screenshot of the window's size in CSS pixels, no scrollbar over the page.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--force-device-scale-factor=1")
CHROMIUM_TIMEOUT_S = 60
WINDOW = (1400, 2000)

# row() writes norm · RMSNormFwd bf16 rows; the pool rows say what differs
NORM_W1 = {"workload": "W1", "bytes": 4_000_000, "flops": 1_000_000}
NORM_W2 = {"workload": "W2", "bytes": 16_000_000, "flops": 12_000_000}
POOL = {"family": "pool", "op": "MaxPool2dFwd", "label": "resnet", "dtype": "f32", "compute_dtype": "f32"}
POOL_W1 = {**POOL, "workload": "W1", "bytes": 8_000_000, "flops": 16_000_000}
POOL_W2 = {**POOL, "workload": "W2", "bytes": 2_000_000, "flops": 7_000_000}
POOL_W3 = {**POOL, "workload": "W3", "bytes": 6_000_000, "flops": 30_000_000}
# Two families on one device, eager and graph: ours faster, slower and level (pool W2, whose two points
# coincide), a workload with no ours (pool W3), a wrong row. The times keep each of the other points
# clear of its neighbours, of the limit lines and of the grid, so that its centre shows its own colour.
ROWS = [
    row("ours_kernel", "ours", "eager", 0.0018, **NORM_W1),
    row("torch_compile", "torch_compile", "eager", 0.0028, **NORM_W1),
    row("torch_eager", "torch_eager", "eager", 0.0041, **NORM_W1),
    row("ours_kernel", "ours", "graph", 0.0071, **NORM_W1),
    row("torch_eager", "torch_eager", "graph", 0.0045, **NORM_W1),
    row("ours_kernel", "ours", "eager", 0.0061, **NORM_W2),
    row("torch_eager", "torch_eager", "eager", 0.0090, **NORM_W2),
    row("vendor_rms", "vendor", "eager", None, status="wrong", reason="output 0: 3 NaN", **NORM_W2),
    row("ours_kernel", "ours", "graph", 0.0151, **NORM_W2),
    row("torch_eager", "torch_eager", "graph", 0.0213, **NORM_W2),
    row("ours_kernel", "ours", "eager", 0.0042, **POOL_W1),
    row("torch_eager", "torch_eager", "eager", 0.0030, **POOL_W1),
    row("ours_kernel", "ours", "eager", 0.0012, **POOL_W2),
    row("torch_eager", "torch_eager", "eager", 0.001218, **POOL_W2),
    row("torch_eager", "torch_eager", "eager", 0.0036, **POOL_W3),
]


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    if os.environ.get("NPUOPS_REQUIRE_CHROMIUM"):
        pytest.fail("NPUOPS_REQUIRE_CHROMIUM is set but no chromium is on PATH")
    pytest.skip("needs headless Chromium to render the HTML report (apt-get install chromium)")


def run_chromium(binary: str, workdir: Path, *args: str) -> str:
    """Headless Chromium on a fresh profile under ``workdir``; its stdout."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir)
    proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its renderer and zygote processes too
        proc.communicate()
        pytest.fail(f"chromium {' '.join(args)} did not finish in {CHROMIUM_TIMEOUT_S} s")
    assert proc.returncode == 0, f"chromium {' '.join(args)} exited {proc.returncode}: {err[-2000:]}"
    return out


# -- the DOM ---------------------------------------------------------------------------------------


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""  # a <text>'s own text
    title: str = ""  # its tooltip, a <title> child

    def has_class(self, name: str) -> bool:
        return name in self.attrs.get("class", "").split()

    def __getitem__(self, name: str) -> float:
        return float(self.attrs[name])


@dataclass
class Plot:
    svg: Element
    elements: list[Element] = field(default_factory=list)

    def find(self, tag: str, *classes: str) -> list[Element]:
        return [e for e in self.elements if e.tag == tag and all(e.has_class(c) for c in classes)]

    def texts(self) -> list[str]:
        return [e.text for e in self.find("text")]

    def points(self) -> list[Element]:
        """The data's circles (the roofline's rows, the ratios), not the legend's."""
        return [e for e in self.find("circle") if e.has_class("point") or e.has_class("ratio")]

    def area(self, dx: float = 0, dy: float = 0) -> tuple[float, float, float, float]:
        """The box the plot draws its data in (the roofline's frame, the ratios' strips together),
        moved by (``dx``, ``dy``): left, top, right, bottom."""
        boxes = [e for e in self.find("rect") if e.attrs.get("fill") == "none"]
        return (min(b["x"] for b in boxes) + dx, min(b["y"] for b in boxes) + dy,
                max(b["x"] + b["width"] for b in boxes) + dx, max(b["y"] + b["height"] for b in boxes) + dy)


class PlotsInDom(HTMLParser):
    """The page's ``<svg class="plot">`` elements, each with every element inside it."""

    def __init__(self, dom: str):
        super().__init__()
        self.plots: list[Plot] = []
        self.open: list[Element] = []  # the elements open inside the current plot, innermost last
        self.feed(dom)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        if tag == "svg" and element.has_class("plot"):
            self.plots.append(Plot(element))
        elif not self.open:
            return
        elif tag != "title":
            self.plots[-1].elements.append(element)
        self.open.append(element)

    def handle_endtag(self, tag: str) -> None:
        if not self.open:
            return
        element = self.open.pop()
        if tag == "title":
            self.open[-1].title = element.text

    def handle_data(self, data: str) -> None:
        if self.open:
            self.open[-1].text += data


# -- the screenshot ---------------------------------------------------------------------------------


WHITE = (255, 255, 255)


@dataclass
class Screenshot:
    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixels(self, y: int, x0: int = 0, x1: int | None = None) -> Iterator[tuple[int, int, int]]:
        """Row ``y``'s colours from ``x0`` to ``x1``."""
        c = self.channels
        line = self.rows[y][x0 * c:None if x1 is None else x1 * c]
        return zip(line[0::c], line[1::c], line[2::c])

    def rgb(self, x: int, y: int) -> tuple[int, int, int]:
        return next(self.pixels(y, x, x + 1))

    @cached_property
    def inked(self) -> dict[tuple[int, int, int], list[tuple[int, int]]]:
        """The position of every pixel that is not white, by its colour."""
        found: dict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)
        for y in range(self.height):
            for x, rgb in enumerate(self.pixels(y)):
                if rgb != WHITE:
                    found[rgb].append((x, y))
        return found

    def where(self, colour: tuple[int, int, int]) -> list[tuple[int, int]]:
        return [xy for rgb, xys in self.inked.items() if close(rgb, colour) for xy in xys]

    def ink(self, x0: int, y0: int, x1: int, y1: int) -> int:
        """How many pixels of the box [x0, x1) × [y0, y1) are not white."""
        return sum(rgb != WHITE for y in range(y0, y1) for rgb in self.pixels(y, x0, x1))


def _paeth(left: int, up: int, up_left: int) -> int:
    p = left + up - up_left
    pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
    return left if pa <= pb and pa <= pc else up if pb <= pc else up_left


def _unfilter(kind: int, line: bytes, prev: bytes, bpp: int) -> bytes:
    if kind == 0:
        return line
    if kind == 2:  # Up, the commonest: every byte at once, a bytewise sum with no carry between bytes
        low, high = int.from_bytes(b"\x7f" * len(line), "big"), int.from_bytes(b"\x80" * len(line), "big")
        a, b = int.from_bytes(line, "big"), int.from_bytes(prev, "big")
        return (((a & low) + (b & low)) ^ ((a ^ b) & high)).to_bytes(len(line), "big")
    out = bytearray(line)
    for i in range(len(out)):
        left = out[i - bpp] if i >= bpp else 0
        if kind == 1:
            predicted = left
        elif kind == 3:
            predicted = (left + prev[i]) >> 1
        else:
            predicted = _paeth(left, prev[i], prev[i - bpp] if i >= bpp else 0)
        out[i] = (out[i] + predicted) & 0xFF
    return bytes(out)


def read_png(path: Path) -> Screenshot:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes), decoded with the stdlib."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is no PNG"
    pos, compressed = 8, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length  # length, type, body, CRC
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour_type in (2, 6) and interlace == 0, (depth, colour_type, interlace)
        elif kind == b"IDAT":
            compressed.append(body)
    channels = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(b"".join(compressed)), width * channels + 1
    rows, prev = [], bytes(stride - 1)
    for y in range(height):
        prev = _unfilter(raw[y * stride], raw[y * stride + 1:(y + 1) * stride], prev, channels)
        rows.append(prev)
    return Screenshot(width, height, channels, rows)


def colour_on_white(point: Element) -> tuple[int, int, int]:
    """The colour of ``point``'s fill (#rgb or #rrggbb) at its fill-opacity over the page's white."""
    fill, opacity = point.attrs["fill"][1:], point["fill-opacity"]
    digits = fill if len(fill) == 6 else "".join(d * 2 for d in fill)
    channels = (int(digits[i:i + 2], 16) for i in (0, 2, 4))
    return tuple(round(opacity * c + (1 - opacity) * 255) for c in channels)  # type: ignore[return-value]


def close(a: tuple[int, ...], b: tuple[int, ...], tolerance: int = 3) -> bool:
    return all(abs(x - y) <= tolerance for x, y in zip(a, b))


def visible_points(plot: Plot) -> list[Element]:
    """The plot's points whose centre no other point reaches: the centre shows the point's own
    colour over white, not a mix."""
    circles = plot.points()
    return [c for c in circles
            if all(o is c or (c["cx"] - o["cx"]) ** 2 + (c["cy"] - o["cy"]) ** 2 > (o["r"] + 1.5) ** 2 for o in circles)]


def locate(plot: Plot, shot: Screenshot) -> tuple[int, int, list[Element]]:
    """Where the browser drew ``plot``: the offset of its origin in the screenshot that puts the most
    of its visible points on a pixel of their colour, and the points it leaves off theirs."""
    points = visible_points(plot)
    assert points, f"{plot.svg.title}: every point overlaps another; nothing to find it by"
    colour = {id(p): colour_on_white(p) for p in points}

    def misplaced(dx: int, dy: int) -> list[Element]:
        out = []
        for p in points:
            x, y = round(p["cx"] + dx), round(p["cy"] + dy)
            if not (0 <= x < shot.width and 0 <= y < shot.height and close(shot.rgb(x, y), colour[id(p)])):
                out.append(p)
        return out

    anchor = points[0]
    candidates = {(x - round(anchor["cx"]), y - round(anchor["cy"])) for x, y in shot.where(colour[id(anchor)])}
    assert candidates, f"{plot.svg.title}: no pixel of its points' colour {colour[id(anchor)]} in the screenshot"
    fewest = min(len(misplaced(*offset)) for offset in candidates)
    # each centre shows its colour for a pixel or two either way: the middle of the offsets that fit best
    best = [offset for offset in candidates if len(misplaced(*offset)) == fewest]
    dx, dy = (round(sum(axis) / len(best)) for axis in zip(*best))
    return dx, dy, misplaced(dx, dy)


def drawn(shot: Screenshot, line: Element, dx: int, dy: int) -> bool:
    """Whether a pixel near the middle of ``line`` is dark: along it, a dash and a gap of a dashed
    line either way."""
    x1, y1, x2, y2 = line["x1"] + dx, line["y1"] + dy, line["x2"] + dx, line["y2"] + dy
    length = math.hypot(x2 - x1, y2 - y1)
    along = [((x1 + x2) / 2 + k * (x2 - x1) / length, (y1 + y2) / 2 + k * (y2 - y1) / length) for k in range(-5, 6)]
    return any(max(shot.rgb(round(x), round(y))) < 160 for x, y in along)


# -- the page, rendered once ------------------------------------------------------------------------


@dataclass
class Rendered:
    plots: dict[str, Plot]  # by the svg's title
    screenshot: Path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    binary = chromium_binary()
    workdir = tmp_path_factory.mktemp("render")
    results = write(workdir / "results.jsonl", LIMITS, ROWS)
    page = workdir / "report.html"
    assert main(["report", str(results), "--format", "html", "--output", str(page)]) == 0
    dom = run_chromium(binary, workdir, "--dump-dom", page.as_uri())
    shot = workdir / "report.png"
    run_chromium(binary, workdir, f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", page.as_uri())
    return Rendered({p.svg.title: p for p in PlotsInDom(dom).plots}, shot)


def test_the_browser_dom_holds_every_plot_element(rendered):
    assert set(rendered.plots) == {"roofline: H200", "ratio distribution: norm", "ratio distribution: pool"}
    roofline = rendered.plots["roofline: H200"]
    # ours: norm W1 and W2 in both regimes, pool W1 and W2; the fastest alternative of those and pool W3
    ours, alts = roofline.find("circle", "point", "ours"), roofline.find("circle", "point", "alt")
    assert len(ours) == 6 and len(alts) == 7
    assert all("(ours)" in p.title for p in ours) and not any("vendor_rms" in p.title for p in ours + alts)
    assert [p.title.split(" · ")[1] for p in alts if "W3" in p.title] == ["MaxPool2dFwd W3 resnet f32"]
    # the axes: a grid line per decade, each labelled at the frame's edge; both axis titles
    grid = roofline.find("line", "grid")
    columns, rows = [g for g in grid if g["x1"] == g["x2"]], [g for g in grid if g["y1"] == g["y2"]]
    assert len(columns) >= 2 and len(rows) >= 2
    labels = roofline.find("text")
    assert all(any(t.attrs.get("x") == g.attrs["x1"] and t.text for t in labels) for g in columns)
    assert all(any(t.attrs.get("y") == g.attrs["y1"] and t.text for t in labels) for g in rows)
    texts = roofline.texts()
    assert "arithmetic intensity (FLOP per byte of the row's cost)" in texts
    assert "achieved FLOP/s (median device time)" in texts
    # the device limits: the bandwidth slope, a ceiling per compute dtype among the rows, each labelled
    assert len(roofline.find("line", "limit-bandwidth")) == 1 and len(roofline.find("line", "limit-compute")) == 2
    assert {"4.00 TB/s", "bf16 800 TFLOP/s", "f32 50 TFLOP/s", "ours", "fastest alternative", "device limits"} <= set(texts)
    assert len(roofline.find("g", "legend")) == 1

    norm, pool = rendered.plots["ratio distribution: norm"], rendered.plots["ratio distribution: pool"]
    assert [p.attrs["class"] for p in norm.find("circle", "ratio")] == ["ratio faster", "ratio faster",
                                                                        "ratio slower", "ratio faster"]
    assert [p.attrs["class"] for p in pool.find("circle", "ratio")] == ["ratio slower", "ratio level"]
    for plot, regimes in ((norm, ["eager", "graph"]), (pool, ["eager"])):
        texts = plot.texts()
        assert [t for t in texts if t in ("eager", "graph")] == regimes and texts.count("n=2") == len(regimes)
        assert len(plot.find("line", "unity")) == 1 and len(plot.find("line", "geomean")) == len(regimes)
        assert "1×" in texts and any(t.startswith("ratio: fastest alternative's time over ours'") for t in texts)
    for plot in rendered.plots.values():  # every point inside the plot area, clear of its edges
        left, top, right, bottom = plot.area()
        for p in plot.points():
            assert left < p["cx"] - p["r"] and p["cx"] + p["r"] < right, p.title
            assert top < p["cy"] - p["r"] and p["cy"] + p["r"] < bottom, p.title


def test_the_screenshot_shows_the_plots_where_the_dom_puts_them(rendered):
    shot = read_png(rendered.screenshot)
    assert (shot.width, shot.height) == WINDOW
    assert len(shot.inked) > 100  # colours besides white: a blank page has none, plain text a few greys
    for title, plot in rendered.plots.items():
        dx, dy, misplaced = locate(plot, shot)
        assert not misplaced, f"{title}: not drawn in their colour where the DOM puts them: {[p.title for p in misplaced]}"
        width, height = plot.svg["width"], plot.svg["height"]
        assert 0 <= dx and dx + width <= shot.width and 0 <= dy and dy + height <= shot.height, (title, dx, dy)
        x0, y0, x1, y1 = (round(v) for v in plot.area(dx, dy))
        inked = shot.ink(x0, y0, x1, y1)
        assert inked > 0.005 * (x1 - x0) * (y1 - y0), f"{title}: its plot area is blank ({inked} non-white pixels)"
        for line in plot.find("line", "limit") + plot.find("line", "unity") + plot.find("line", "geomean"):
            assert drawn(shot, line, dx, dy), f"{title}: {line.title} not drawn"
