"""The HTML report's plots: inline SVG, self-contained, a roofline per device and a ratio
distribution per family."""

from __future__ import annotations

import re

from npuops.cli import main
from npuops.plots import FONT_SIZE
from npuops.results import ResultsWriter
from test_report import LIMITS, row


def html(capsys, path):
    assert main(["report", str(path), "--format", "html"]) == 0
    return capsys.readouterr().out


def svgs(page):
    return re.findall(r"<svg\b.*?</svg>", page, re.DOTALL)


def write(path, env_limits, rows):
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda", "model": "H200"}, "limits": env_limits,
                  "versions": {"torch": "2.11"}, "git": "abc"})
        for r in rows:
            w.append(r)
    return path


ROWS = [row("ours_kernel", "ours", "eager", 0.002), row("torch_eager", "torch_eager", "eager", 0.004),
        row("torch_compile", "torch_compile", "eager", 0.003),
        row("ours_kernel", "ours", "graph", 0.004), row("torch_eager", "torch_eager", "graph", 0.002),
        row("torch_eager", "torch_eager", "eager", 0.010, workload="W2"),  # no ours: its best alternative alone
        {**row("ours_kernel", "ours", "eager", 0.001, workload="W3"), "compute_dtype": "f32", "flops": 40_000_000},
        {**row("torch_eager", "torch_eager", "eager", 0.0015, workload="W3"), "compute_dtype": "f32", "flops": 40_000_000}]


def test_roofline_and_ratio_distribution_are_inline_svg(capsys, tmp_path):
    page = html(capsys, write(tmp_path / "r.jsonl", LIMITS, ROWS))
    plots = svgs(page)
    assert len(plots) == 2  # one device's roofline, one family's ratio distribution
    roofline, ratios = plots
    assert "<title>roofline: H200</title>" in roofline and "<title>ratio distribution: norm</title>" in ratios
    # the limits: the bandwidth slope and a ceiling per compute dtype among the points (bf16, f32)
    assert roofline.count("class='limit limit-bandwidth'") == 1 and roofline.count("class='limit limit-compute'") == 2
    assert "bf16 800 TFLOP/s" in roofline and "f32 50 TFLOP/s" in roofline and "4.00 TB/s" in roofline
    # one point per workload and regime for ours (W1 eager, W1 graph, W3) and for the best alternative (and W2's)
    assert roofline.count("class='point ours'") == 3 and roofline.count("class='point alt'") == 4
    tips = re.findall(r"<circle class='point [a-z]+'[^>]*><title>([^<]*)</title>", roofline)
    assert len(tips) == 7 and "norm · RMSNormFwd W1 decode bf16 · eager · ours_kernel (ours): 0.0020 ms" in tips[0]
    assert "class='legend'" in roofline and ">ours<" in roofline and ">fastest alternative<" in roofline
    assert ">device limits<" in roofline
    # ratios: W1 eager 1.5, W1 graph 0.5, W3 1.5, one strip per regime, a line at 1.0
    assert ratios.count("<circle class='ratio") == 3 and ratios.count("class='unity'") == 1
    assert ratios.count("class='ratio faster'") == 2 and ratios.count("class='ratio slower'") == 1
    assert ">eager<" in ratios and ">graph<" in ratios and ratios.count("class='geomean'") == 2


def test_points_sit_on_the_limits_where_a_row_runs_at_the_limit(capsys, tmp_path):
    """A row at 100% SOL is drawn on the bandwidth line: the plot's arithmetic is the report's."""
    at_limit = row("ours_kernel", "ours", "eager", 0.001)  # 4 MB at 4 TB/s = 1 us: 100% SOL
    page = html(capsys, write(tmp_path / "r.jsonl", LIMITS, [at_limit, row("torch_eager", "torch_eager", "eager", 0.002)]))
    roofline = svgs(page)[0]
    (line,) = re.findall(r"<line class='limit limit-bandwidth' x1='([\d.]+)' y1='([\d.]+)' x2='([\d.]+)' y2='([\d.]+)'", roofline)
    x1, y1, x2, y2 = map(float, line)
    cx, cy = map(float, re.search(r"class='point ours' cx='([\d.]+)' cy='([\d.]+)'", roofline).groups())
    assert abs(y1 + (y2 - y1) * (cx - x1) / (x2 - x1) - cy) < 0.2


def test_self_contained_no_network_no_script(capsys, tmp_path):
    page = html(capsys, write(tmp_path / "r.jsonl", LIMITS, ROWS))
    lowered = page.lower()
    for needle in ("http:", "https:", "//", "<script", "src=", "href=", "url(", "@import", "<link", "<img", "onload", "onmouse"):
        assert needle not in lowered.replace("</", "<"), needle  # "</" is a closing tag, not a protocol-relative URL


def test_a_run_without_limits_says_so_instead_of_a_roofline(capsys, tmp_path):
    rows = [{**r, "device": "cpu"} for r in ROWS]
    page = html(capsys, write(tmp_path / "r.jsonl", None, rows))
    plots = svgs(page)
    assert len(plots) == 1 and "ratio distribution" in plots[0]  # the ratios need no limits
    assert "class='env no-roofline'" in page and "recorded no device limits" in page
    assert "class='limit" not in page


def test_text_in_tooltips_is_escaped(capsys, tmp_path):
    rows = [row("<b>ours</b>", "ours", "eager", 0.002, label="x<script>y</script>"),
            row("torch_eager", "torch_eager", "eager", 0.004)]
    page = html(capsys, write(tmp_path / "r.jsonl", LIMITS, rows))
    assert "<script" not in page and "&lt;b&gt;ours&lt;/b&gt;" in svgs(page)[0]


def test_rows_without_flops_are_counted_not_drawn(capsys, tmp_path):
    rows = [{**row("ours_kernel", "ours", "eager", 0.002), "flops": 0}, row("torch_eager", "torch_eager", "eager", 0.004)]
    page = html(capsys, write(tmp_path / "r.jsonl", LIMITS, rows))
    assert svgs(page)[0].count("class='point") == 1 and "1 rows with no FLOPs or no bytes" in page


def test_points_and_labels_clear_the_frame_and_points_lie_over_the_lines(capsys, tmp_path):
    """W2's alternative runs at exactly 100 GFLOP/s, on a decade: the axis takes one more, so that the
    point is not on the frame; the bf16 ceiling's label fits inside the frame above its line; the ratios'
    points come after the 1.0 line and their regime's geomean line, so that no line hides them."""
    roofline, ratios = svgs(html(capsys, write(tmp_path / "r.jsonl", LIMITS, ROWS)))
    frame = re.search(r"<rect x='([\d.]+)' y='([\d.]+)' width='([\d.]+)' height='([\d.]+)' fill='none'", roofline)
    left, top, width, height = map(float, frame.groups())
    for cx, cy, r in (map(float, p) for p in re.findall(r"class='point [a-z]+' cx='([\d.]+)' cy='([\d.]+)' r='([\d.]+)'", roofline)):
        assert left < cx - r and cx + r < left + width and top < cy - r and cy + r < top + height
    ceiling_labels = re.findall(r"<text x='[\d.]+' y='([\d.]+)' text-anchor='end' fill='#444'>", roofline)
    assert len(ceiling_labels) == 2 and all(float(y) - FONT_SIZE >= top for y in ceiling_labels)
    first_point = ratios.index("<circle class='ratio")
    assert ratios.index("class='unity'") < first_point and ratios.index("class='geomean'") < first_point
