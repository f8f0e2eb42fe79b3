"""Progress of long loops outside training (evaluation pages, imported files).

`track(items, total, desc)` shows tqdm's bar on a terminal; when stderr is not a terminal (nohup,
CI, `> log`) it prints a plain line every `every_seconds` and one at the end, so a log shows how
far a 20-minute evaluation got.
"""
from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def track(items: Iterable[T], total: int | None = None, desc: str = "", every_seconds: float = 30.0,
          stream: TextIO | None = None, unit: str | None = None) -> Iterator[T]:
    """`items`, with progress on `stream` (module doc); `unit` names the items in the rate ("pages/s")."""
    stream = stream or sys.stderr
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if stream.isatty():
        yield from tqdm(items, total=total, desc=desc, file=stream, leave=False, unit=unit or "it")
        return
    start = last = time.monotonic()
    done = printed = 0
    for item in items:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= every_seconds:
            last, printed = now, done
            print(_line(desc, done, total, now - start, unit), file=stream, flush=True)
    if done != printed:
        print(_line(desc, done, total, time.monotonic() - start, unit), file=stream, flush=True)


def _line(desc: str, done: int, total: int | None, elapsed: float, unit: str | None = None) -> str:
    rate = done / elapsed if elapsed > 0 else float("inf")
    of = f"/{total}" if total else ""
    eta = f", ETA {(total - done) / rate:.0f} s" if total and rate > 0 and done < total else ""
    per = f" {unit}s" if unit else ""
    return f"[dociq] {desc}: {done}{of} ({rate:.2f}{per}/s, {elapsed:.0f} s{eta})"
