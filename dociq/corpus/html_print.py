"""HTML → tagged PDF with headless Chromium (Playwright), in varied page styles.

Chromium's tagged PDF output carries a structure tree (H1–H6, P, L/LI, Table/TR/TH/TD, Code,
Figure, Caption) that the labeller reads as ground truth. The page style is sampled per document
(columns, fonts, sizes, margins, paper) so printed pages do not all look alike, and the running
header and page number (printed outside the tag tree, as artifacts) vary in text and position,
so the labeller, which finds them by repetition, sees many kinds. Navigation chrome of Sphinx,
DocBook and the Debian handbook is hidden; nothing is fetched from the network; JavaScript of
the page does not run.

One `HtmlPrinter` keeps one browser for many documents; it is never downloaded: Debian's
`chromium` (or `DOCIQ_CHROMIUM`) is used.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from html import escape
from pathlib import Path

# what an unset page_number / header means is "absent"
PAGE_NUMBER_POSITIONS = ("bottom-center", "bottom-right", "bottom-left", "top-right", "top-left",
                         "page-n-bottom", "page-n-of-m-bottom")
HEADERS = ("title", "package")
FONT_FAMILIES = (
    '"DejaVu Serif", serif',
    '"Liberation Serif", "Times New Roman", serif',
    '"DejaVu Serif Condensed", "DejaVu Serif", serif',
    "serif",
    '"DejaVu Sans", sans-serif',
    '"Liberation Sans", Arial, Helvetica, sans-serif',
    '"Liberation Sans Narrow", "Arial Narrow", sans-serif',
    '"DejaVu Sans Condensed", "DejaVu Sans", sans-serif',
    "sans-serif",
)
_MONO = '"DejaVu Sans Mono", "Liberation Mono", monospace'
_PAPER_MM = {"A4": (210.0, 297.0), "Letter": (215.9, 279.4)}
_PT_MM = 25.4 / 72
DEFAULT_MAX_PAGES = 24  # the labeller keeps at most ~20 pages a document; longer prints only cost

_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
_CHROMIUM_FIX = "Fix: `apt-get install chromium`, or set DOCIQ_CHROMIUM to a Chromium/Chrome binary"
# --no-sandbox: containers and root; the rest keep Chromium from calling home on its own
_LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run"]
_NETWORK_URL = re.compile(r"^(https?|wss?|ftp)://", re.IGNORECASE)

# navigation and page furniture of Sphinx (classic/pydoctheme, scikit-learn), DocBook
# (PostgreSQL), Publican (Debian handbook) and generic sites: printed pages show content only
_CHROME_SELECTOR = (
    ".related, .sphinxsidebar, #sidebarbutton, .footer, footer, nav, .navheader, .navfooter, "
    "header.navbar, #navbar, .navbar, #searchbox, .headerlink, .mobile-nav, .skip-link, "
    ".sk-sidebar, #sk-sidebar-wrapper, .sk-sidebar-toc-wrapper, #sk-sidemenu-toggle, "
    ".sk-btn-toggle-toc, .sk-navbar, .sk-btn-rellink, .prev-next-area, ul.docnav, #banner, "
    "body > p#title, .breadcrumbs, script, noscript, iframe, form, button, input, select"
)


class PrintError(RuntimeError):
    """An HTML file could not be printed (or no browser could be started)."""

    def __init__(self, path, reason: str) -> None:
        self.path = None if path is None else str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}" if self.path else reason)


@dataclass(frozen=True)
class PrintStyle:
    columns: int = 1  # 1-3
    font_family: str = FONT_FAMILIES[0]  # a CSS font stack
    font_size_pt: float = 10.5
    line_height: float = 1.35
    margin_mm: float = 20.0
    paper: str = "A4"  # "A4" | "Letter"
    header: str | None = "title"  # "title" | "package" | None
    page_number: str | None = "bottom-center"  # one of PAGE_NUMBER_POSITIONS, or None
    justify: bool = False
    header_align: str = "left"  # "left" | "center" | "right"


def sample_style(seed: int) -> PrintStyle:
    """A page style drawn from `seed` alone (same seed, same style on every machine)."""
    rng = random.Random(seed)
    columns = rng.choices((1, 2, 3), weights=(0.5, 0.35, 0.15))[0]
    font_size = round(rng.uniform(8.5, 12.0) * 2) / 2
    margin = round(rng.uniform(10.0, 28.0))
    if columns == 3:  # three columns of 12pt text are a few words wide
        font_size, margin = min(font_size, 10.0), min(margin, 20)
    return PrintStyle(
        columns=columns,
        font_family=rng.choice(FONT_FAMILIES),
        font_size_pt=font_size,
        line_height=round(rng.uniform(1.15, 1.6), 2),
        margin_mm=float(margin),
        paper=rng.choice(("A4", "A4", "Letter")),
        header=rng.choice(HEADERS + (None,)),
        page_number=rng.choice(PAGE_NUMBER_POSITIONS + (None,)),
        justify=rng.random() < 0.4,
        header_align=rng.choice(("left", "center", "right")),
    )


def _margins_mm(style: PrintStyle) -> tuple[float, float]:
    """(top/bottom, left/right) margins: the running header and page number need room."""
    return max(style.margin_mm, 12.0), style.margin_mm


def style_css(style: PrintStyle) -> str:
    """The stylesheet that lays a page out in `style` and hides navigation chrome."""
    vertical, horizontal = _margins_mm(style)
    gap = max(4.0, min(8.0, style.font_size_pt * 0.6))
    return f"""
@page {{ size: {style.paper}; margin: {vertical}mm {horizontal}mm; }}
html, body {{ margin: 0 !important; padding: 0 !important; background: #fff !important;
  width: auto !important; min-width: 0 !important; max-width: none !important; }}
html {{ font-size: {style.font_size_pt}pt !important; }}
body {{ column-count: {style.columns}; column-gap: {gap:.1f}mm; column-fill: auto;
  font-family: {style.font_family} !important; font-size: {style.font_size_pt}pt !important;
  line-height: {style.line_height} !important; text-align: {"justify" if style.justify else "left"} !important;
  color: #000; -webkit-print-color-adjust: exact; }}
body * {{ font-family: inherit !important; max-width: 100% !important; }}
/* Chromium leaves text runs that hold a ligature (fi, fl) out of the tag tree */
* {{ font-variant-ligatures: none !important; font-feature-settings: "liga" 0, "clig" 0 !important; }}
pre, code, kbd, samp, tt, pre *, code * {{ font-family: {_MONO} !important; }}
div.document, div.documentwrapper, div.bodywrapper, div.body, div.container, main, article,
div.content, div.section, section, #content, .sk-page-content {{ width: auto !important;
  min-width: 0 !important; margin-left: 0 !important; margin-right: 0 !important;
  float: none !important; position: static !important; }}
img, svg, video, canvas {{ max-width: 100% !important; height: auto !important; }}
pre {{ white-space: pre-wrap !important; overflow-wrap: break-word; overflow: visible !important;
  text-align: left !important; }}
td, th {{ overflow-wrap: break-word; }}
table, pre, figure, .figure, blockquote {{ break-inside: avoid; column-span: none; }}
h1, h2, h3, h4, h5, h6 {{ break-after: avoid; break-inside: avoid; line-height: 1.2 !important; }}
{_CHROME_SELECTOR} {{ display: none !important; }}
"""


# -- running header and page number (Chromium's header/footer templates) -----------------------

def _band(style: PrintStyle, left: str, center: str, right: str) -> str:
    _, horizontal = _margins_mm(style)
    size = max(7.0, style.font_size_pt - 2)
    cell = "flex: 1; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;"
    return (f'<div style="width: 100%; box-sizing: border-box; padding: 0 {horizontal}mm; display: flex; '
            f'font-family: {escape(style.font_family)}; font-size: {size}pt; color: #333;">'
            f'<span style="{cell} text-align: left;">{left}</span>'
            f'<span style="{cell} text-align: center;">{center}</span>'
            f'<span style="{cell} text-align: right;">{right}</span></div>')


def header_footer_templates(style: PrintStyle, header_text: str) -> tuple[str, str]:
    """(header_template, footer_template) for Chromium: the running header and page number."""
    number = '<span class="pageNumber"></span>'
    top = {"left": "", "center": "", "right": ""}
    bottom = {"left": "", "center": "", "right": ""}
    if style.header:
        top[style.header_align] = escape(header_text)
    position = style.page_number
    if position in ("top-right", "top-left"):
        side = position.split("-")[1]
        if style.header and style.header_align == side:  # the header moves over to make room
            top["left" if side == "right" else "right"], top[side] = top[side], ""
        top[side] = number
    elif position in ("bottom-center", "bottom-right", "bottom-left"):
        bottom[position.split("-")[1]] = number
    elif position == "page-n-bottom":
        bottom["center"] = f"Page {number}"
    elif position == "page-n-of-m-bottom":
        bottom["right"] = f'Page {number} of <span class="totalPages"></span>'
    empty = "<span></span>"  # an empty template would make Chromium print its default one
    header = _band(style, top["left"], top["center"], top["right"]) if any(top.values()) else empty
    footer = _band(style, bottom["left"], bottom["center"], bottom["right"]) if any(bottom.values()) else empty
    return header, footer


# -- the printer -------------------------------------------------------------------------------

def find_chromium(executable: str | None = None) -> str:
    """The Chromium binary: the argument, else $DOCIQ_CHROMIUM, else one on PATH."""
    candidate = executable or os.environ.get("DOCIQ_CHROMIUM")
    if candidate:
        found = shutil.which(candidate)
        if found is None:
            raise PrintError(candidate, f"not an executable Chromium binary. {_CHROMIUM_FIX}")
        return found
    for name in _CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise PrintError(None, f"no Chromium found (looked for {', '.join(_CHROMIUM_NAMES)} on PATH "
                           f"and DOCIQ_CHROMIUM). {_CHROMIUM_FIX}")


def _check_html_file(path: Path) -> None:
    if not path.exists():
        raise PrintError(path, "no such file")
    if not path.is_file():
        raise PrintError(path, "not a file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(8192)
    except OSError as err:
        raise PrintError(path, f"unreadable ({err.strerror or err})") from err
    if not head.strip():
        raise PrintError(path, "empty file")
    utf16 = head.startswith((b"\xff\xfe", b"\xfe\xff"))
    if head.startswith(b"%PDF") or (b"\x00" in head and not utf16):
        raise PrintError(path, "not an HTML file (binary content)")


def _check_pdf_file(path: Path, html_path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(5)
    if head != b"%PDF-" or path.stat().st_size < 200:
        raise PrintError(html_path, "Chromium wrote an empty or invalid PDF")


def _chars_per_page(style: PrintStyle) -> int:
    """A generous estimate of the characters a page of `style` holds."""
    width, height = _PAPER_MM[style.paper]
    vertical, horizontal = _margins_mm(style)
    char_w = 0.5 * style.font_size_pt * _PT_MM
    line_h = style.font_size_pt * _PT_MM * style.line_height
    return int((width - 2 * horizontal) / char_w * (height - 2 * vertical) / line_h)


# cut the document after `budget` characters of content (navigation chrome not counted), at the
# end of a block: Chromium's paged multi-column layout grows faster than linearly with length
_TRUNCATE_JS = """([budget, chrome]) => {
  if (!document.body) return 0;
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let n = 0, node = null;
  while ((node = walker.nextNode())) {
    const parent = node.parentElement;
    if (parent && parent.closest(chrome)) continue;
    n += node.textContent.length;
    if (n > budget) break;
  }
  if (!node) return n;
  let cur = node.parentElement.closest('p, li, tr, pre, dt, dd, h1, h2, h3, h4, h5, h6') || node.parentElement;
  while (cur && cur !== document.body) {
    while (cur.nextSibling) cur.nextSibling.remove();
    cur = cur.parentNode;
  }
  return n;
}"""
# page scripts are off, so add_style_tag (which waits on the style's load event) would hang
_ADD_STYLE_JS = """(css) => {
  const style = document.createElement('style');
  style.textContent = css;
  (document.head || document.documentElement).appendChild(style);
}"""


class HtmlPrinter:
    """Prints HTML files to tagged PDFs with one headless Chromium; use as a context manager."""

    def __init__(self, executable: str | None = None, timeout_s: float = 30.0) -> None:
        self.executable = find_chromium(executable)
        self.timeout_s = timeout_s
        self._playwright = None
        self._browser = None
        self._context = None

    def __enter__(self) -> "HtmlPrinter":
        self._ensure_browser()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._drop_browser()
        if self._playwright is not None:
            try:
                self._playwright.stop()
            except Exception:  # already gone: nothing left to release
                pass
            self._playwright = None

    # -- browser lifecycle ---------------------------------------------------------------------

    def _drop_browser(self) -> None:
        browser, self._browser, self._context = self._browser, None, None
        if browser is not None:
            try:
                browser.close()
            except Exception:  # a crashed browser cannot be closed; its process is gone
                pass

    def _ensure_browser(self) -> None:
        if self._browser is not None and self._browser.is_connected():
            return
        self._drop_browser()  # crashed: start a new one
        try:
            from playwright.sync_api import Error as PlaywrightError
            from playwright.sync_api import sync_playwright
        except ImportError as err:
            raise PrintError(None, "the Python package playwright is not installed. Fix: "
                                   "`pip install playwright` (no browser download is needed)") from err

        if self._playwright is None:
            self._playwright = sync_playwright().start()
        try:
            browser = self._playwright.chromium.launch(
                executable_path=self.executable, args=_LAUNCH_ARGS, timeout=60_000)
        except PlaywrightError as err:
            raise PrintError(self.executable, f"could not start Chromium ({_first_line(err)}). "
                                              + _CHROMIUM_FIX) from err
        context = browser.new_context(java_script_enabled=False, offline=True)
        context.route(_NETWORK_URL, lambda route: route.abort())  # nothing leaves the machine
        context.set_default_timeout(self.timeout_s * 1000)
        self._browser, self._context = browser, context

    # -- printing ------------------------------------------------------------------------------

    def print_pdf(self, html_path, out_pdf, style: PrintStyle, title: str = "", package: str = "",
                  max_pages: int | None = DEFAULT_MAX_PAGES) -> Path:
        """Print `html_path` to `out_pdf` (a tagged PDF, written atomically) in `style`.

        The running header (when the style has one) is `title` (else the document's <title>) or
        `package` (else the title). At most `max_pages` pages are printed. Any failure raises
        PrintError; the printer stays usable for the next document."""
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

        html_path, out_pdf = Path(html_path), Path(out_pdf)
        _check_html_file(html_path)
        self._ensure_browser()
        out_pdf.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out_pdf.name}.", suffix=".tmp", dir=out_pdf.parent)
        os.close(fd)
        page = None
        try:
            page = self._context.new_page()
            page.goto(html_path.resolve().as_uri(), timeout=self.timeout_s * 1000, wait_until="load")
            if max_pages is not None:
                page.evaluate(_TRUNCATE_JS, [max_pages * _chars_per_page(style), _CHROME_SELECTOR])
            header_text = self._header_text(page, style, title, package, html_path)
            page.evaluate(_ADD_STYLE_JS, style_css(style))
            page.pdf(path=tmp, **_pdf_options(style, header_text, max_pages))
            _check_pdf_file(Path(tmp), html_path)
            os.replace(tmp, out_pdf)
            return out_pdf
        except PlaywrightTimeoutError as err:
            raise PrintError(html_path, f"timed out after {self.timeout_s:g} s ({_first_line(err)})") from err
        except PlaywrightError as err:
            if self._browser is None or not self._browser.is_connected():
                self._drop_browser()  # the next document gets a fresh browser
                raise PrintError(html_path, f"Chromium crashed ({_first_line(err)})") from err
            raise PrintError(html_path, _first_line(err)) from err
        finally:
            if page is not None:
                try:
                    page.close()
                except Exception:  # the page or the browser died with the error above
                    pass
            Path(tmp).unlink(missing_ok=True)

    @staticmethod
    def _header_text(page, style: PrintStyle, title: str, package: str, html_path: Path) -> str:
        if style.header is None:
            return ""
        document_title = (page.title() or "").strip()
        if style.header == "package":
            return package or title or document_title or html_path.stem
        return title or document_title or html_path.stem


def _pdf_options(style: PrintStyle, header_text: str, max_pages: int | None) -> dict:
    vertical, horizontal = _margins_mm(style)
    header, footer = header_footer_templates(style, header_text)
    options = dict(
        tagged=True, outline=True, format=style.paper, print_background=True,
        prefer_css_page_size=True, display_header_footer=True,
        header_template=header, footer_template=footer,
        margin={"top": f"{vertical}mm", "bottom": f"{vertical}mm",
                "left": f"{horizontal}mm", "right": f"{horizontal}mm"},
    )
    if max_pages is not None:
        options["page_ranges"] = f"1-{max_pages}"  # a range starting at page 1 always exists
    return options


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__
