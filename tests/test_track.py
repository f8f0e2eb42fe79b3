"""Progress of long loops: a bar on a terminal, plain lines in a log file."""
import io

from dociq.io.track import track


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_when_not_a_terminal():
    out = io.StringIO()
    assert list(track(range(5), desc="pages", every_seconds=0.0, stream=out)) == list(range(5))
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[0].startswith("[dociq] pages: 1/5") and "ETA" in lines[0]
    assert lines[-1].startswith("[dociq] pages: 5/5")


def test_one_closing_line_for_a_quick_loop_and_none_for_an_empty_one():
    out = io.StringIO()
    list(track([1, 2, 3], desc="files", every_seconds=3600, stream=out))
    (line,) = out.getvalue().splitlines()
    assert line.startswith("[dociq] files: 3/3")
    empty = io.StringIO()
    assert list(track([], desc="files", stream=empty)) == [] and empty.getvalue() == ""


def test_a_bar_on_a_terminal():
    term = FakeTerminal()
    assert list(track(range(3), desc="pages", stream=term)) == [0, 1, 2]
    assert "pages" in term.getvalue() and "[dociq]" not in term.getvalue()
