"""Word snapping: text parts of a mask become the box around their words; the rest stays."""
import numpy as np

from dociq.models.word_snap import snap_to_words


def _paragraph():
    # three lines of two words, 40..160 x 50..86
    return np.array([[40, 50, 95, 60], [100, 50, 160, 60], [40, 63, 90, 73], [95, 63, 150, 73],
                     [40, 76, 120, 86], [125, 76, 158, 86]], float)


def test_a_ragged_mask_over_a_paragraph_becomes_the_box_of_its_words():
    words = _paragraph()
    mask = np.zeros((200, 200), bool)
    mask[47:84, 44:163] = True          # off by a few pixels on every side: the stride-4 wobble
    out = snap_to_words(mask, words)
    expect = np.zeros_like(mask)
    expect[50:86, 40:160] = True
    assert np.array_equal(out, expect)
    assert mask[47, 44] and not out[47, 44]     # the input is not modified, the margin is cut


def test_words_outside_the_mask_and_non_text_parts_are_left_alone():
    words = np.vstack([_paragraph(), [[20, 150, 40, 158]]])   # a word under the figure's corner
    mask = np.zeros((200, 200), bool)
    mask[120:195, 10:190] = True        # a figure: one label inside, mostly drawing
    out = snap_to_words(mask, words)
    assert np.array_equal(out, mask)    # not snapped to the label's box; the paragraph not added
    assert not snap_to_words(np.zeros((50, 50), bool), words).any()
    assert np.array_equal(snap_to_words(mask, np.zeros((0, 4))), mask)


def test_two_parts_snap_separately():
    words = np.vstack([_paragraph(), _paragraph() + [0, 90, 0, 90]])
    mask = np.zeros((200, 200), bool)
    mask[48:88, 38:162] = True
    mask[141:174, 42:158] = True        # the second paragraph, clipped short of its last line
    out = snap_to_words(mask, words)
    assert out[50:86, 40:160].all() and out[140:176, 40:160].all()
    assert not out[88:140].any()        # the gap between them stays empty


def test_painted_words_close_into_their_paragraph_and_leave_others_out():
    from dociq.models.word_snap import paint_words

    words = np.vstack([_paragraph(), _paragraph() + [0, 90, 0, 90]])
    relevant = np.array([True] * 6 + [False] * 6)
    out = paint_words((200, 200), words, relevant)
    assert out[50:86, 40:160].all()          # words, the gaps between them and between lines, the ragged edge
    assert not out[140:176].any()            # the other paragraph's words are not relevant
    assert not paint_words((200, 200), words, np.zeros(12, bool)).any()
