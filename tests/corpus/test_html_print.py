"""HTML → tagged PDF: page styles, header/footer templates, and (where Chromium is installed)
real prints whose tag trees and untagged running headers the labeller relies on."""
from __future__ import annotations

import http.server
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest

from dociq.corpus.html_print import (PAGE_NUMBER_POSITIONS, HtmlPrinter, PrintError, PrintStyle,
                                          find_chromium, header_footer_templates, sample_style, style_css)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on PATH (apt-get install chromium) to print HTML with")

TWO_COLUMNS = PrintStyle(columns=2, font_family='"DejaVu Serif", serif', font_size_pt=10, line_height=1.3,
                         margin_mm=18, paper="A4", header="title", page_number="page-n-bottom", justify=True)
PARAGRAPH = ("The pump station logs pressure, flow and temperature every minute; operators review the "
             "readings each morning and note anything unusual in the shift book. ")


# -- styles (no browser) ------------------------------------------------------------------------

def test_sample_style_is_deterministic_and_within_ranges():
    styles = [sample_style(seed) for seed in range(300)]
    assert styles == [sample_style(seed) for seed in range(300)]
    for s in styles:
        assert s.columns in (1, 2, 3) and s.paper in ("A4", "Letter")
        assert 8.5 <= s.font_size_pt <= 12 and 1.15 <= s.line_height <= 1.6 and 10 <= s.margin_mm <= 28
        assert s.header in ("title", "package", None)
        assert s.page_number in PAGE_NUMBER_POSITIONS + (None,)
    # the running header and page number must vary for the labeller to meet many kinds
    assert len(Counter(s.page_number for s in styles)) == len(PAGE_NUMBER_POSITIONS) + 1
    assert len(Counter(s.header for s in styles)) == 3
    assert len(Counter(s.columns for s in styles)) == 3 and len(Counter(s.font_family for s in styles)) > 5


def test_style_css_lays_out_the_page_and_hides_navigation():
    css = style_css(PrintStyle(columns=3, font_size_pt=9, line_height=1.25, margin_mm=15, paper="Letter",
                               justify=True))
    assert "@page { size: Letter; margin: 15mm 15mm; }" in css
    assert "column-count: 3" in css and "font-size: 9pt" in css and "line-height: 1.25" in css
    assert "text-align: justify" in css
    assert "break-inside: avoid; column-span: none" in css
    for chrome in (".related", ".sphinxsidebar", ".navheader", ".navfooter", "#searchbox", ".headerlink", "nav"):
        assert chrome in css
    assert "text-align: left" in style_css(PrintStyle(justify=False))


def test_header_and_footer_templates_follow_the_style():
    header, footer = header_footer_templates(PrintStyle(header="title", page_number="top-right"), "A <b> title")
    assert "A &lt;b&gt; title" in header and 'class="pageNumber"' in header and 'pageNumber' not in footer
    header, footer = header_footer_templates(PrintStyle(header=None, page_number="page-n-of-m-bottom"), "x")
    assert header == "<span></span>" and "Page " in footer and 'class="totalPages"' in footer
    header, footer = header_footer_templates(PrintStyle(header=None, page_number=None), "x")
    assert header == footer == "<span></span>"  # never Chromium's default date/URL footer
    # a header on the side where the page number goes moves to the other side
    header, _ = header_footer_templates(PrintStyle(header="package", header_align="right",
                                                   page_number="top-right"), "pkg")
    left, right = header.index("pkg"), header.index("pageNumber")
    assert left < right


def test_missing_chromium_is_a_print_error_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("DOCIQ_CHROMIUM", raising=False)
    with pytest.raises(PrintError, match="apt-get install chromium"):
        find_chromium()
    with pytest.raises(PrintError, match="no-such-browser"):
        HtmlPrinter(executable=str(tmp_path / "no-such-browser"))


# -- printing (Chromium) ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def printer():
    if CHROMIUM is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium) to print HTML with")
    with HtmlPrinter(executable=CHROMIUM, timeout_s=20) as p:
        yield p


def _tiny_png(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (40, 24), (200, 30, 30)).save(path)
    return path


def _report_html(tmp_path: Path, paragraphs: int = 30, image_src: str = "chart.png") -> Path:
    _tiny_png(tmp_path / "chart.png")
    body = "".join(f"<p>{PARAGRAPH * 2}</p>\n" for _ in range(paragraphs))
    html = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>Pump station report</title></head>
<body>
<div class="related"><a href="index.html">Navigation that must not print</a></div>
<h1>Quarterly pump report</h1>
<p>{PARAGRAPH}</p>
<h2>Readings</h2>
<ul><li>Pressure stayed within limits</li><li>Flow dropped twice in March</li></ul>
<table><thead><tr><th>Month</th><th>Flow</th></tr></thead>
<tbody><tr><td>January</td><td>410</td></tr><tr><td>February</td><td>398</td></tr></tbody></table>
<pre><code>readings = load("station-7")
print(readings.mean())</code></pre>
<figure><img src="{image_src}" alt="flow chart"><figcaption>Figure 1: monthly flow</figcaption></figure>
{body}
</body></html>"""
    path = tmp_path / "report.html"
    path.write_text(html, encoding="utf-8")
    return path


def _tag_types(nodes) -> Counter:
    types = Counter()
    for node in nodes:
        types[node["type"]] += 1
        types += _tag_types(node.get("children", []))
    return types


@needs_chromium
def test_prints_a_tagged_pdf_with_untagged_running_header_and_page_number(printer, tmp_path):
    import pdfplumber

    out = printer.print_pdf(_report_html(tmp_path), tmp_path / "out" / "report.pdf", TWO_COLUMNS,
                            title="Station 7 report")
    assert out == tmp_path / "out" / "report.pdf"
    assert [p.name for p in out.parent.iterdir()] == ["report.pdf"]  # no temp file left
    with pdfplumber.open(out) as pdf:
        assert len(pdf.pages) >= 2
        page = pdf.pages[0]
        assert abs(page.width - 595) < 2 and abs(page.height - 842) < 2  # A4
        types = _tag_types(page.structure_tree)
        for tag in ("H1", "H2", "P", "LI", "Table", "Code", "Figure"):
            assert types[tag] >= 1, f"no {tag} in {dict(types)}"
        assert types["TD"] + types["TH"] >= 4
        # pdfplumber has no space characters where a line wraps: compare without spaces
        untagged = "".join(c["text"] for c in page.chars if c.get("mcid") is None).replace(" ", "")
        assert "Station7report" in untagged and "Page1" in untagged
        tagged = [c for c in page.chars if c.get("mcid") is not None]
        text = "".join(c["text"] for c in tagged).replace(" ", "")
        assert "Quarterlypumpreport" in text and "Figure1:monthlyflow" in text
        assert "Navigation" not in text
        # two columns: tagged text on both halves of the page
        assert min(c["x0"] for c in tagged) < page.width * 0.3
        assert max(c["x0"] for c in tagged) > page.width * 0.55


@needs_chromium
def test_max_pages_caps_the_print(printer, tmp_path):
    import pypdfium2 as pdfium

    style = PrintStyle(columns=1, header=None, page_number="bottom-right")
    out = printer.print_pdf(_report_html(tmp_path, paragraphs=80), tmp_path / "short.pdf", style, max_pages=1)
    assert len(pdfium.PdfDocument(out)) == 1


@needs_chromium
def test_nothing_is_fetched_from_the_network(printer, tmp_path):
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/tracker.png"
        html = _report_html(tmp_path, paragraphs=2, image_src=url)
        html.write_text(html.read_text().replace(
            "</head>", f'<link rel="stylesheet" href="http://127.0.0.1:{server.server_port}/x.css"></head>'))
        printer.print_pdf(html, tmp_path / "offline.pdf", PrintStyle())
    finally:
        server.shutdown()
    assert hits == []


@needs_chromium
def test_bad_inputs_raise_print_error_and_the_printer_goes_on(printer, tmp_path):
    missing = tmp_path / "missing-page.html"
    with pytest.raises(PrintError, match="missing-page.html") as info:
        printer.print_pdf(missing, tmp_path / "missing.pdf", PrintStyle())
    assert info.value.path == str(missing) and "no such file" in info.value.reason

    junk = tmp_path / "junk.html"
    junk.write_bytes(bytes(range(256)) * 64)
    try:
        printer.print_pdf(junk, tmp_path / "junk.pdf", PrintStyle())
    except PrintError as err:
        assert err.path == str(junk)
        assert not (tmp_path / "junk.pdf").exists()  # never a partial PDF
    else:
        assert (tmp_path / "junk.pdf").read_bytes().startswith(b"%PDF-")

    out = printer.print_pdf(_report_html(tmp_path, paragraphs=2), tmp_path / "after.pdf", PrintStyle())
    assert out.read_bytes().startswith(b"%PDF-")


@needs_chromium
def test_a_dead_browser_is_restarted_for_the_next_document(printer, tmp_path):
    printer._browser.close()  # what a crashed Chromium looks like from here: disconnected
    out = printer.print_pdf(_report_html(tmp_path, paragraphs=2), tmp_path / "restarted.pdf", PrintStyle())
    assert out.read_bytes().startswith(b"%PDF-")
