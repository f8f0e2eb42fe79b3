"""scripts/sharpen_readings.py: each reading of a scan scored against the text layer, and the rules
that choose between the two readings from what tesseract says of its words."""
import numpy as np
import pytest

from dociq.data.ocr import OcrWords
from script_module import load_script


def _script():
    return load_script("sharpen_readings")


def test_a_reading_is_scored_by_the_true_words_it_reads_and_counted_by_its_sure_ones():
    read = OcrWords(["Total", "due", "42", "zzz"], np.zeros((4, 4)), (10, 10), np.array([96, 40, 80, -1], np.float32))
    row = _script().reading_row(["total:", "dues", "42", "EUR"], read)
    assert row["recall"] == 0.5                       # "Total" and "42" (case and punctuation aside)
    assert row["words"] == 4 and row["sure"] == 2     # over 50
    assert row["confidence_sum"] == pytest.approx(2.16)     # 0.96 + 0.40 + 0.80, the unknown -1 as 0


def test_the_default_rule_keeps_the_reading_with_more_sure_words_and_the_ceiling_the_better_one():
    def row(plain_sure, sharp_sure, plain_recall, sharp_recall):
        reading = {"words": 10, "mean_confidence": 80.0, "confidence_sum": 8.0}
        return {"plain": {**reading, "sure": plain_sure, "recall": plain_recall},
                "sharpened": {**reading, "sure": sharp_sure, "recall": sharp_recall}}

    rows = [row(5, 9, 0.4, 0.8), row(9, 5, 0.9, 0.7), row(7, 7, 0.6, 0.9)]
    chosen = dict(_script().rules(rows))
    np.testing.assert_array_equal(chosen['more sure words (the default, `sharpen="surer"`)'], [True, False, False])
    np.testing.assert_array_equal(chosen["the better reading (a ceiling: reads the text layer)"], [True, False, True])
    assert not chosen["never (`sharpen=False`)"].any() and chosen["always (`sharpen=True`)"].all()
