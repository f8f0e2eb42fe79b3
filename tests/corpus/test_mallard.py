"""Mallard help pages become semantic HTML; broken XML is a ValueError naming the file."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dociq.corpus.mallard import mallard_to_html

PAGE = """<?xml version="1.0" encoding="utf-8"?>
<page xmlns="http://projectmallard.org/1.0/" xmlns:if="http://projectmallard.org/if/1.0/"
      type="topic" id="net-ports">
  <info>
    <credit type="author"><name>Jane Writer</name></credit>
    <desc>Metadata that is not shown.</desc>
  </info>
  <title>Network ports &amp; firewalls</title>
  <p>Open the <gui>Settings</gui> and press <keyseq><key>Ctrl</key><key>Q</key></keyseq> when x &lt; y.</p>
  <section id="steps">
    <title>Open a port</title>
    <steps>
      <item><p>Run <cmd>firewall-cmd</cmd>.</p></item>
      <item><p>Check the <link xref="other">list</link>.</p></item>
    </steps>
    <section id="deeper">
      <title>Details</title>
      <terms>
        <item><title>TCP</title><p>Connection oriented.</p></item>
      </terms>
    </section>
  </section>
  <table>
    <thead><tr><td><p>Port</p></td><td><p>Name</p></td></tr></thead>
    <tbody><tr><td><p>631/tcp</p></td><td><p>Printing</p></td></tr></tbody>
  </table>
  <screen>$ ss -tlnp
LISTEN 0 128 *:631</screen>
  <note style="tip"><title>Careful</title><p>Keep the firewall on.</p></note>
  <list><item><p>One</p></item><item><p>Two</p></item></list>
  <media type="image" src="figures/ports.png"><p>Fallback text of an image</p></media>
  <figure><title>The panel</title><desc>Where the ports are listed.</desc>
    <media type="image" src="figures/panel.png"/></figure>
  <if:choose>
    <if:when test="platform:gnome-classic"><p>Classic branch.</p></if:when>
    <if:else><p>Other branch.</p></if:else>
  </if:choose>
  <unknownthing>Kept unknown text.</unknownthing>
</page>
"""


@pytest.fixture
def html(tmp_path) -> str:
    page = tmp_path / "net-ports.page"
    page.write_text(PAGE, encoding="utf-8")
    out = mallard_to_html(page, tmp_path / "out" / "net-ports.html")
    assert out == tmp_path / "out" / "net-ports.html"
    return out.read_text(encoding="utf-8")


def test_structure_becomes_html(html):
    assert '<meta charset="utf-8">' in html
    assert "<title>Network ports &amp; firewalls</title>" in html
    assert "<h1>Network ports &amp; firewalls</h1>" in html
    assert "<section><h2>Open a port</h2>" in html
    assert "<section><h3>Details</h3>" in html
    assert re.search(r"<ol>\s*<li><p>Run <code class=\"cmd\">firewall-cmd</code>.</p>\s*</li>", html)
    assert "<dl>" in html and "<dt>TCP</dt>" in html and re.search(r"<dd><p>Connection oriented.</p>\s*</dd>", html)
    assert "<table>" in html and "<tr><th>Port</th><th>Name</th></tr>" in html
    assert "<tr><td>631/tcp</td><td>Printing</td></tr>" in html
    assert "<pre><code>$ ss -tlnp\nLISTEN 0 128 *:631</code></pre>" in html
    assert '<div class="note"><p class="title"><strong>Careful</strong></p><p>Keep the firewall on.</p>' in html
    assert re.search(r"<ul>\s*<li><p>One</p>\s*</li>\s*<li><p>Two</p>\s*</li>\s*</ul>", html)
    assert "<figure><figcaption>The panel Where the ports are listed.</figcaption></figure>" in html


def test_inline_markup_and_escaping(html):
    assert '<span class="gui">Settings</span>' in html
    assert '<span class="key">Ctrl</span>+<span class="key">Q</span>' in html
    assert "when x &lt; y." in html
    assert '<span class="link">list</span>' in html


def test_metadata_media_and_other_branches_are_dropped(html):
    for hidden in ("Jane Writer", "Metadata that is not shown", "Fallback text of an image", "Other branch"):
        assert hidden not in html
    assert "Classic branch." in html  # a conditional prints its first branch once
    assert "Kept unknown text." in html


def test_malformed_xml_is_a_value_error_naming_the_file(tmp_path):
    page = tmp_path / "broken-topic.page"
    page.write_text('<page xmlns="http://projectmallard.org/1.0/"><title>Unclosed</page>')
    with pytest.raises(ValueError, match="broken-topic.page"):
        mallard_to_html(page, tmp_path / "out.html")
    assert not (tmp_path / "out.html").exists()


def test_xml_that_is_not_a_page_is_rejected(tmp_path):
    page = tmp_path / "legal.xml"
    page.write_text('<p xmlns="http://projectmallard.org/1.0/">Only a fragment.</p>')
    with pytest.raises(ValueError, match="legal.xml.*not a Mallard page"):
        mallard_to_html(page, Path(tmp_path / "out.html"))
