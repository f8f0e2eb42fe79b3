"""An OCR cache's entries told apart: readings of whole pages, and the small crops `TesseractOCR`
reads again alone (short words alone on their line, with `read_unread_ink`)."""
import json
from pathlib import Path


def page_readings(files) -> set[Path]:
    """The cache entries (JSON files) that read a whole page: those larger than a quarter of the largest
    entry's area — a crop is a word with a line's height of paper round it, far smaller."""
    areas = {}
    for path in files:
        height, width = json.loads(Path(path).read_text())["size"]
        areas[Path(path)] = height * width
    largest = max(areas.values(), default=0)
    return {path for path, area in areas.items() if area > 0.25 * largest}
