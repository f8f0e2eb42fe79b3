"""Corpus sources: listing documents (packages, filters, deterministic caps), materializing
(gunzip, Mallard), and fetching Debian packages (checked with fake apt-get / dpkg-deb)."""
from __future__ import annotations

import gzip
import os
import stat
from pathlib import Path

import pytest

from dociq.corpus.sources import (DEBIAN_PACKAGES, RECIPE_PACKAGES, SourceDocument, SourceError,
                                       fetch_debian_packages, find_documents, list_documents, materialize)

LONG_TEXT = "Words of a real documentation page, long enough to count as content. " * 40
PDF_BYTES = b"%PDF-1.4\n% a stand-in: find_documents never opens PDFs\n%%EOF\n"
MALLARD = f"""<page xmlns="http://projectmallard.org/1.0/" id="topic">
  <info><credit><name>Someone</name></credit></info>
  <title>A help topic</title>
  <p>{LONG_TEXT}</p>
</page>"""


def _html(text: str) -> str:
    return f"<html><head><title>t</title><style>p {{ color: red }}</style></head><body><p>{text}</p></body></html>"


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


@pytest.fixture
def src(tmp_path) -> Path:
    root = tmp_path / "src"
    docs = root / "pydocs" / "usr" / "share" / "doc" / "pydocs" / "html"
    _write(root / "reports" / "a.pdf", PDF_BYTES)
    _write(root / "reports" / "sub" / "b.pdf.gz", gzip.compress(PDF_BYTES))
    _write(root / "top.pdf", PDF_BYTES)
    _write(docs / "library" / "os.html", _html(LONG_TEXT))
    _write(docs / "whatsnew" / "changelog.html.gz", gzip.compress(_html(LONG_TEXT).encode()))
    _write(docs / "genindex.html", _html(LONG_TEXT))
    _write(docs / "genindex-A.html", _html(LONG_TEXT))
    _write(docs / "search.html", _html(LONG_TEXT))
    _write(docs / "py-modindex.html", _html(LONG_TEXT))
    _write(docs / "_modules" / "index.html", _html(LONG_TEXT))
    _write(docs / "tiny.html", _html("Only a few words."))
    # page text hidden in <script>/<style> does not make a page long
    _write(docs / "scripted.html", f"<html><script>var s = '{LONG_TEXT}';</script><body>Hi</body></html>")
    _write(root / "help" / "C" / "topic.page", MALLARD)
    _write(root / "help" / "C" / "stub.page", MALLARD.replace(LONG_TEXT, "Short."))
    _write(root / "reports" / "notes.txt", LONG_TEXT)  # not a document kind
    _write(root / ".partial-x-123" / "half.pdf", PDF_BYTES)  # a killed extraction
    return root


def _ids(docs) -> list[str]:
    return [d.doc_id for d in docs]


def test_packages_come_from_the_first_path_component(src):
    docs = find_documents(src)
    assert _ids(docs) == [
        "help/C/topic.page",
        "local/top.pdf",
        "pydocs/usr/share/doc/pydocs/html/library/os.html",
        "pydocs/usr/share/doc/pydocs/html/whatsnew/changelog.html.gz",
        "reports/a.pdf",
        "reports/sub/b.pdf.gz",
    ]
    by_id = {d.doc_id: d for d in docs}
    assert by_id["local/top.pdf"].package == "local"
    assert by_id["reports/sub/b.pdf.gz"].package == "reports"
    assert by_id["reports/sub/b.pdf.gz"].kind == "pdf"
    assert by_id["help/C/topic.page"].kind == "mallard"
    assert by_id["pydocs/usr/share/doc/pydocs/html/whatsnew/changelog.html.gz"].kind == "html"
    assert by_id["reports/a.pdf"].path == src / "reports" / "a.pdf"
    assert docs == sorted(docs, key=lambda d: (d.package, d.doc_id))


def test_symlinks_outside_or_broken_are_skipped_and_inside_ones_not_doubled(src, tmp_path):
    outside = _write(tmp_path / "elsewhere" / "secret.pdf", PDF_BYTES)
    (src / "reports" / "outside.pdf").symlink_to(outside)
    (src / "reports" / "broken.pdf").symlink_to(src / "reports" / "missing.pdf")
    (src / "reports" / "alias.pdf").symlink_to(src / "reports" / "a.pdf")  # a second name
    (src / "reports" / "linked").symlink_to(src / "pydocs", target_is_directory=True)
    ids = _ids(find_documents(src))
    assert not any(x.endswith(("outside.pdf", "broken.pdf", "alias.pdf")) for x in ids)
    assert not any(x.startswith("reports/linked/") for x in ids)
    assert "reports/a.pdf" in ids


def test_caps_are_deterministic_and_seed_dependent(tmp_path):
    root = tmp_path / "src"
    for i in range(30):
        _write(root / "many" / f"doc{i:02d}.pdf", PDF_BYTES)
    _write(root / "few" / "only.pdf", PDF_BYTES)
    first = find_documents(root, max_docs_per_package=5, seed=0)
    assert first == find_documents(root, max_docs_per_package=5, seed=0)
    assert [d.package for d in first].count("many") == 5
    assert "few/only.pdf" in _ids(first)
    other = find_documents(root, max_docs_per_package=5, seed=1)
    assert _ids(other) != _ids(first)
    # a larger cap extends the smaller one's choice rather than starting over
    assert set(_ids(first)) <= set(_ids(find_documents(root, max_docs_per_package=8, seed=0)))


def test_cap_counts_only_documents_that_pass_the_text_filter(tmp_path):
    root = tmp_path / "src"
    for i in range(10):
        _write(root / "web" / f"tiny{i}.html", _html("short"))
    _write(root / "web" / "long.html", _html(LONG_TEXT))
    assert _ids(find_documents(root, max_docs_per_package=1)) == ["web/long.html"]


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such"):
        find_documents(tmp_path / "no-such")


# -- materialize --------------------------------------------------------------------------------

def _doc_for(docs, suffix) -> SourceDocument:
    return next(d for d in docs if d.doc_id.endswith(suffix))


def test_pdf_gz_is_gunzipped_into_the_work_dir(src, tmp_path):
    doc = _doc_for(find_documents(src), "b.pdf.gz")
    out = materialize(doc, tmp_path / "work")
    assert out.parent == tmp_path / "work" and out.suffix == ".pdf"
    assert out.read_bytes() == PDF_BYTES
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp")]  # no temp file left


def test_html_gz_keeps_its_relative_links(src, tmp_path):
    doc = _doc_for(find_documents(src), "changelog.html.gz")
    out = materialize(doc, tmp_path / "work")
    html = out.read_text()
    assert out.suffix == ".html" and LONG_TEXT[:40] in html
    assert f'<base href="{doc.path.parent.resolve().as_uri()}/">' in html


def test_plain_files_are_returned_as_they_are(src, tmp_path):
    doc = _doc_for(find_documents(src), "os.html")
    assert materialize(doc, tmp_path / "work") == doc.path


def test_mallard_is_converted_to_html(src, tmp_path):
    doc = _doc_for(find_documents(src), "topic.page")
    out = materialize(doc, tmp_path / "work")
    html = out.read_text()
    assert out.suffix == ".html" and "<h1>A help topic</h1>" in html and "Someone" not in html


def test_corrupt_gzip_raises_source_error_naming_the_file(tmp_path):
    bad = _write(tmp_path / "src" / "pkg" / "broken.pdf.gz", b"\x1f\x8b\x08\x00 this is not deflate data")
    doc = SourceDocument(path=bad, kind="pdf", package="pkg", doc_id="pkg/broken.pdf.gz")
    with pytest.raises(SourceError, match="broken.pdf.gz"):
        materialize(doc, tmp_path / "work")


def test_missing_file_raises_source_error(tmp_path):
    doc = SourceDocument(path=tmp_path / "gone.pdf", kind="pdf", package="local", doc_id="local/gone.pdf")
    with pytest.raises(SourceError, match="gone.pdf"):
        materialize(doc, tmp_path / "work")


# -- fetching Debian packages -------------------------------------------------------------------

def test_package_lists():
    assert set(RECIPE_PACKAGES) <= set(DEBIAN_PACKAGES)
    assert DEBIAN_PACKAGES["gnome-user-docs"] == "mallard"
    assert {DEBIAN_PACKAGES[p] for p in RECIPE_PACKAGES} == {"pdf", "html", "mallard"}


def test_unknown_package_is_a_value_error_listing_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="no-such-doc.*texlive-science-doc"):
        fetch_debian_packages(["no-such-doc"], tmp_path)


def test_missing_apt_get_names_the_package_and_the_fix(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(SourceError) as info:
        fetch_debian_packages(["texlive-science-doc"], tmp_path / "dest")
    message = str(info.value)
    assert "texlive-science-doc" in message and "apt-get" in message
    assert "apt-get update" in message and "dociq corpus build" in message


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_apt(tmp_path, monkeypatch) -> Path:
    """apt-get and dpkg-deb stand-ins that log their calls to calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    _fake_tool(bin_dir, "apt-get", f"""echo "apt-get $*" >> {log}
if [ "$2" = "texlive-science-doc" ]; then
  echo "W: Download is performed unsandboxed as root" >&2
  echo fake > "$2_2022_all.deb"; exit 0
fi
echo "E: Unable to locate package $2" >&2; exit 100
""")
    _fake_tool(bin_dir, "dpkg-deb", f"""echo "dpkg-deb $*" >> {log}
[ -n "$FAIL_DPKG" ] && {{ echo "dpkg-deb: error: broken archive" >&2; exit 2; }}
mkdir -p "$3/usr/share/doc/pkg" && echo '%PDF-1.4' > "$3/usr/share/doc/pkg/manual.pdf"
""")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_fetch_downloads_unpacks_and_skips_finished_packages(tmp_path, fake_apt):
    dest = tmp_path / "dest"
    out = fetch_debian_packages(["texlive-science-doc"], dest)
    folder = out["texlive-science-doc"]
    assert folder == dest / "texlive-science-doc"
    assert (folder / "usr/share/doc/pkg/manual.pdf").is_file()
    assert (dest / "debs" / "texlive-science-doc_2022_all.deb").is_file()
    assert [d.doc_id for d in find_documents(dest)] == ["texlive-science-doc/usr/share/doc/pkg/manual.pdf"]
    calls = fake_apt.read_text()
    assert fetch_debian_packages(["texlive-science-doc"], dest) == out
    assert fake_apt.read_text() == calls  # nothing downloaded or unpacked the second time


def test_failed_download_names_the_package_and_apt_error(tmp_path, fake_apt):
    with pytest.raises(SourceError) as info:
        fetch_debian_packages(["texlive-humanities-doc"], tmp_path / "dest")
    message = str(info.value)
    assert "texlive-humanities-doc" in message and "Unable to locate package" in message
    assert "apt-get update" in message
    assert not list((tmp_path / "dest" / "debs").iterdir())  # no partial download left behind


def test_failed_extraction_never_looks_finished(tmp_path, fake_apt, monkeypatch):
    dest = tmp_path / "dest"
    monkeypatch.setenv("FAIL_DPKG", "1")
    with pytest.raises(SourceError, match="broken archive"):
        fetch_debian_packages(["texlive-science-doc"], dest)
    assert not (dest / "texlive-science-doc").exists()
    assert not [p for p in dest.iterdir() if p.name.startswith(".partial")]
    monkeypatch.delenv("FAIL_DPKG")
    out = fetch_debian_packages(["texlive-science-doc"], dest)  # the cached .deb is reused
    assert (out["texlive-science-doc"] / "usr/share/doc/pkg/manual.pdf").is_file()
    assert fake_apt.read_text().count("apt-get download") == 1


def test_translations_under_help_and_html_roots_are_skipped(tmp_path):
    root = tmp_path / "src"
    help_root = root / "gnome-user-docs" / "usr" / "share" / "help"
    for lang in ("C", "de", "pt_BR", "sr@latin"):
        _write(help_root / lang / "gnome-help" / "topic.page", MALLARD)
    book = root / "debian-handbook" / "usr" / "share" / "doc" / "debian-handbook" / "html"
    for lang in ("en-US", "zh-CN"):
        _write(book / lang / "intro.html", _html(LONG_TEXT))
    _write(root / "pydocs" / "html" / "faq" / "general.html", _html(LONG_TEXT))  # not a locale
    ids = sorted(d.doc_id for d in find_documents(root))
    assert ids == ["debian-handbook/usr/share/doc/debian-handbook/html/en-US/intro.html",
                   "gnome-user-docs/usr/share/help/C/gnome-help/topic.page",
                   "pydocs/html/faq/general.html"]


def test_a_non_utf8_file_name_is_skipped_and_reported(src):
    latin1 = os.path.join(os.fsencode(src / "reports"), b"caf\xe9.pdf")      # once: UnicodeEncodeError
    with open(latin1, "wb") as f:
        f.write(PDF_BYTES)
    docs, skipped = list_documents(src)
    assert _ids(docs) == _ids(find_documents(src)) and "reports/a.pdf" in _ids(docs)
    assert not any("caf" in d for d in _ids(docs))
    reasons = {Path(s.path).name: s.reason for s in skipped}
    assert reasons["caf\\xe9.pdf"].startswith("name is not valid UTF-8")
    assert reasons["notes.txt"] == "not a document type this command reads"


@pytest.mark.parametrize("argv, expected", [
    (["--recipe"], list(RECIPE_PACKAGES)),
    (["--recipe", "--packages", "texlive-games"], [*RECIPE_PACKAGES, "texlive-games"]),
    (["--packages", "texlive-games", "texlive-music"], ["texlive-games", "texlive-music"]),
    ([], list(DEBIAN_PACKAGES)),
])
def test_fetch_takes_the_recipe_and_named_packages_together(monkeypatch, tmp_path, argv, expected):
    import dociq.cli.corpus as corpus_cli

    asked = []
    monkeypatch.setattr(corpus_cli, "fetch_debian_packages",
                        lambda names, dest: asked.extend(names) or {n: dest / n for n in names})
    assert corpus_cli.main(["fetch", str(tmp_path), *argv]) == 0
    assert asked == expected
