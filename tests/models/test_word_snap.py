"""Word snapping: text parts of a mask become the box around their words; the rest stays."""
import numpy as np

from dociq.models.word_snap import keep_quoted, snap_to_words


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


def _two_paragraphs():
    return np.vstack([_paragraph(), _paragraph() + [0, 90, 0, 90]])     # 50..86 and 140..176


def _box_mask(y0, y1, x0, x1, shape=(200, 200)):
    m = np.zeros(shape, bool)
    m[y0:y1, x0:x1] = True
    return m


def test_a_mask_on_one_line_of_a_paragraph_is_completed_to_the_paragraph():
    from dociq.models.word_snap import snap_to_blocks

    words = _two_paragraphs()
    line = _box_mask(49, 61, 38, 162)                 # the first line: 2 of the paragraph's 6 words
    out = snap_to_blocks(line, words)
    assert np.array_equal(out, _box_mask(50, 86, 40, 160))       # the paragraph, not the other one
    # below `min_share` the block is left as `snap_to_words` draws it
    assert np.array_equal(snap_to_blocks(line, words, min_share=0.5), _box_mask(50, 60, 40, 160))


def test_a_click_inside_a_block_completes_it_and_a_negative_click_vetoes_it():
    from dociq.models.word_snap import snap_to_blocks

    words = _two_paragraphs()
    speck = _box_mask(141, 151, 42, 93)               # one word of the second paragraph (1 of 6)
    assert np.array_equal(snap_to_blocks(speck, words), _box_mask(140, 150, 40, 95))
    clicked = snap_to_blocks(speck, words, clicks=np.array([[60.0, 145.0]]))
    assert np.array_equal(clicked, _box_mask(140, 176, 40, 160))
    vetoed = snap_to_blocks(speck, words, clicks=np.array([[60.0, 145.0], [130.0, 170.0]]), click_labels=np.array([1, 0]))
    assert np.array_equal(vetoed, _box_mask(140, 150, 40, 95))
    empty = snap_to_blocks(np.zeros((200, 200), bool), words, clicks=np.array([[60.0, 55.0]]))
    assert np.array_equal(empty, _box_mask(50, 86, 40, 160))     # a click alone names its block


def test_a_box_prompts_mask_stays_inside_the_box_and_list_items_stay_apart():
    from dociq.models.word_snap import snap_to_blocks

    words = _two_paragraphs()
    spill = _box_mask(45, 92, 30, 170)
    out = snap_to_blocks(spill, words, box=np.array([40, 50, 160, 70]))
    assert np.array_equal(out, _box_mask(50, 70, 40, 160))
    # a bullet opens a new block: completing one item does not take the next
    items = np.array([[40, 50, 46, 60], [50, 50, 150, 60], [40, 63, 46, 73], [50, 63, 140, 73]], float)
    out = snap_to_blocks(_box_mask(49, 61, 38, 152), items, words=["•", "first", "•", "second"])
    assert np.array_equal(out, _box_mask(50, 60, 40, 150))
    merged = snap_to_blocks(_box_mask(49, 61, 38, 152), items)        # no text: one block of two lines
    assert np.array_equal(merged, _box_mask(50, 73, 40, 150))


def test_a_forms_labels_and_values_are_completed_apart():
    from dociq.models.word_snap import field_units, snap_to_blocks

    # "Name:  Kim Smith" over "Date of birth:  Jan 07": one block of two lines, two labels
    words = ["Name:", "Kim", "Smith", "Date", "of", "birth:", "Jan", "07"]
    boxes = np.array([[40, 50, 80, 60], [95, 50, 115, 60], [118, 50, 140, 60],
                      [40, 63, 60, 73], [63, 63, 73, 73], [76, 63, 110, 73], [125, 63, 140, 73], [143, 63, 155, 73]], float)
    units = [[words[k] for k in u] for u in field_units(list(range(8)), boxes, words)]
    assert units == [["Name:"], ["Kim", "Smith"], ["Date", "of", "birth:"], ["Jan", "07"]]
    # the mask on the first value (2 of the block's 8 words) is that value, not the whole form
    value = _box_mask(49, 61, 94, 141)
    assert np.array_equal(snap_to_blocks(value, boxes, words), _box_mask(50, 60, 95, 140))
    # one colon in prose, a space after it: the paragraph stays one block
    prose = ["as", "follows:", "the", "end", "and", "more"]
    lines = np.array([[0, 0, 10, 10], [13, 0, 50, 10], [53, 0, 70, 10], [73, 0, 90, 10], [0, 14, 20, 24], [23, 14, 50, 24]], float)
    assert field_units(list(range(6)), lines, prose) == [list(range(6))]


def test_on_a_form_page_a_lone_field_is_cut_at_its_label():
    from dociq.models.word_snap import field_units, form_page

    # six fields "Label: value", each a block of its own, a space after its label
    fields = [("Name:", "Kim"), ("Phone:", "0113"), ("City:", "Leeds"), ("Total:", "30.14"), ("Fax:", "0114"), ("Date:", "Jan")]
    words = [w for field in fields for w in field]
    boxes = np.array([[x0, 20 * k, x0 + 30, 20 * k + 10] for k in range(len(fields)) for x0 in (10, 43)], float)
    assert form_page(boxes, words)
    block = [0, 1]
    assert field_units(block, boxes, words) == [[0, 1]]                  # alone, a block keeps its one label
    assert field_units(block, boxes, words, form=True) == [[0], [1]]     # on a form, the label ends a unit
    # prose with a few "Note:"-lines is not a form: its labels are too few a share of its words
    prose = words + ["lorem"] * 200
    prose_boxes = np.concatenate([boxes, np.tile([[10, 200, 40, 210]], (200, 1))])
    assert not form_page(prose_boxes, prose)


def test_a_mask_that_brushes_one_word_of_a_small_block_does_not_complete_it():
    from dociq.models.word_snap import snap_to_blocks

    # a three-word line and, far below, a one-line neighbour: the mask holds 1 of its 3 words
    boxes = np.array([[40, 50, 80, 60], [85, 50, 120, 60], [125, 50, 160, 60]], float)
    one = _box_mask(49, 61, 39, 81)
    assert np.array_equal(snap_to_blocks(one, boxes), _box_mask(50, 60, 40, 80))
    two = _box_mask(49, 61, 39, 121)                       # 2 of 3: a hold
    assert np.array_equal(snap_to_blocks(two, boxes), _box_mask(50, 60, 40, 160))


def test_a_part_smaller_than_its_word_means_that_word():
    """A page number's digit is narrower than two cells of the decoder's grid: its mask is a blob
    off by a few pixels that covers under half of the word, yet lies on nothing else."""
    from dociq.models.word_snap import snap_to_blocks

    digit = np.array([[741, 20, 747, 30]], float)            # a 6 x 10 px folio
    body = _paragraph() + [0, 100, 0, 100]
    words = np.vstack([digit, body])
    mask = np.zeros((300, 800), bool)
    mask[23:30, 738:745] = True                              # 28 of its 49 pixels on the digit
    expect = np.zeros_like(mask)
    expect[20:30, 741:747] = True
    assert np.array_equal(snap_to_words(mask, words), expect)
    assert np.array_equal(snap_to_blocks(mask, words), expect)
    # a paragraph's mask that brushes the edge of a word of the next line keeps that word out
    ragged = np.zeros((300, 800), bool)
    ragged[150:174, 40:160] = True
    ragged[174:178, 40:60] = True                            # 4 of the last line's 10 rows, on one word
    out = snap_to_words(ragged, words)
    assert out[150:173, 40:160].all() and not out[180:186].any()


def test_a_value_beside_a_column_of_labels_is_completed_alone():
    from dociq.data.text_blocks import group_blocks
    from dociq.models.word_snap import field_values, snap_to_blocks

    # labels in a column of their own ("Name:", "City:", "Phone:"), the values in a column beside
    # them, as close as a paragraph's lines: the values make one block, each line a field's value
    words = ["Name:", "City:", "Phone:", "Kim", "Smith", "Lake", "Road", "976-593"]
    boxes = np.array([[20, 50, 50, 60], [20, 63, 48, 73], [20, 76, 55, 86],
                      [90, 50, 110, 60], [113, 50, 140, 60], [90, 63, 112, 73], [115, 63, 140, 73],
                      [90, 76, 135, 86]], float)
    assert [words[k] for k in np.flatnonzero(field_values(boxes, words))] == words[3:]
    assert [[words[k] for k in b] for b in group_blocks(boxes, words)] == [words[:3], words[3:]]
    # a perfect answer to "which value belongs to the field 'City'?" stays that value
    city = _box_mask(63, 73, 90, 140)
    assert np.array_equal(snap_to_blocks(city, boxes, words), city)
    # a paragraph with no labels beside it is still completed
    prose = ["one", "two", "three", "four"]
    para = np.array([[90, 50, 140, 60], [90, 63, 140, 73], [90, 76, 140, 86], [90, 89, 130, 99]], float)
    assert not field_values(para, prose).any()
    assert np.array_equal(snap_to_blocks(_box_mask(50, 73, 90, 140), para, prose), _box_mask(50, 99, 90, 140))


def test_a_form_label_on_a_line_of_its_own_opens_a_unit():
    from dociq.models.word_snap import field_units

    # "Date of birth: 08 Sep" spans both columns and joins the labels below it into one block
    words = ["Date", "of", "birth:", "08", "Sep", "Employer:", "Phone:"]
    boxes = np.array([[20, 50, 40, 60], [43, 50, 53, 60], [56, 50, 80, 60], [90, 50, 105, 60], [108, 50, 125, 60],
                      [20, 63, 62, 73], [20, 76, 52, 86]], float)
    units = [[words[k] for k in u] for u in field_units(list(range(7)), boxes, words)]
    assert units == [["Date", "of", "birth:"], ["08", "Sep"], ["Employer:"], ["Phone:"]]


def _page_with_lines(bullets: bool, shape=(120, 200)):
    """A white page with three black text lines (words drawn as bars) and, if `bullets`, a 3x3-px
    dot left of each line, as a CSS list marker prints: not a word of the text layer."""
    image = np.full((*shape, 3), 255, np.uint8)
    boxes = []
    for row, y in enumerate((20, 33, 46)):
        for x0, x1 in ((40, 80), (84, 120)):
            image[y + 2:y + 8, x0:x1] = 0
            boxes.append([x0, y, x1, y + 10])
        if bullets:
            image[y + 4:y + 7, 28:31] = 0
    return image, np.array(boxes, float)


def test_bullets_drawn_left_of_the_lines_open_list_items():
    from dociq.data.text_blocks import drawn_bullets, group_blocks
    from dociq.models.word_snap import snap_to_blocks

    image, boxes = _page_with_lines(bullets=True)
    opens = drawn_bullets(image, boxes)
    assert np.flatnonzero(opens).tolist() == [0, 2, 4]          # the first word of each line
    items = group_blocks(boxes, None, opens_item=opens)
    assert items == [[0, 1], [2, 3], [4, 5]]
    # the mask on the second item stays that item, where one block of three lines would take all
    second = _box_mask(33, 43, 40, 120)
    assert np.array_equal(snap_to_blocks(second, boxes, blocks=items), second)
    assert snap_to_blocks(second, boxes).sum() > 2 * second.sum()
    # no marks, or a mark too big to be a bullet (a word the text layer lacks): one paragraph
    plain, _ = _page_with_lines(bullets=False)
    assert not drawn_bullets(plain, boxes).any()
    big = image.copy()
    big[20:40, 10:31] = 0
    assert not drawn_bullets(big, boxes)[[0, 2]].any()
    # a word in the strip left of a piece: the piece continues its line, whatever is drawn there
    assert not drawn_bullets(image, np.vstack([boxes, [[20, 33, 36, 43]]]))[2]


def test_an_indented_line_opens_a_block_unless_it_is_centred_or_wraps_an_item():
    from dociq.data.text_blocks import group_blocks

    # a definition: its term, then its text indented under it (as close as a paragraph's lines)
    term = np.array([[20, 50, 90, 60], [40, 63, 160, 73], [40, 76, 150, 86]], float)
    assert group_blocks(term, ["stat.S_IXOTH", "Others", "execute"], split_indented=True) == [[0], [1, 2]]
    assert group_blocks(term, ["stat.S_IXOTH", "Others", "execute"]) == [[0, 1, 2]]
    # a centred title over two lines: the shorter second line starts further right, and stays
    title = np.array([[20, 50, 180, 62], [50, 65, 150, 77]], float)
    assert group_blocks(title, ["A", "title"], split_indented=True) == [[0, 1]]
    # "• an item" wrapping: its second line starts right of the bullet, under the item's text
    item = np.array([[20, 50, 26, 60], [30, 50, 160, 60], [30, 63, 120, 73]], float)
    assert group_blocks(item, ["•", "first", "wraps"], split_indented=True) == [[0, 1, 2]]
    # a paragraph's indented first line is no reason to split it
    para = np.array([[40, 50, 160, 60], [20, 63, 160, 73], [20, 76, 100, 86]], float)
    assert group_blocks(para, ["Indented", "then", "flush"], split_indented=True) == [[0, 1, 2]]


def test_a_line_an_ocr_stretched_stays_in_its_paragraph():
    from dociq.data.text_blocks import page_blocks

    # three lines of a paragraph read by tesseract; in line 2 one word reaches 7 px towards line 3,
    # stretching that line's extent to 1.7 lines; after a paragraph's space, a second paragraph
    boxes = np.array([[20, 50, 80, 60], [85, 50, 160, 60],
                      [20, 64, 90, 74], [95, 64, 140, 74], [145, 67, 160, 81],
                      [20, 78, 100, 88], [105, 78, 150, 88],
                      [20, 110, 90, 120], [95, 110, 160, 120], [20, 124, 80, 134]], float)
    words = ["The", "arguments", "provided", "can", "be", "used", "to", "Each", "restriction", "is"]
    page = np.full((200, 200, 3), 255, np.uint8)
    assert page_blocks(page, boxes, words, slope=0.0, ocr=True) == [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9]]
    # by its extent, the stretched line is a heading's height: the paragraph falls apart
    assert page_blocks(page, boxes, words, slope=0.0) == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]


def test_bullets_an_ocr_read_as_letters_open_list_items():
    from dociq.data.text_blocks import page_blocks

    # four items of a bulleted list, 4 px apart like a paragraph's lines; tesseract read the
    # bullets as "e", "\u00a9", "\u00ab" and "+" (and a "e" inside a line is a word as any other)
    rows = [("e", "Operating", "System"), ("\u00a9", "Process", "Control"), ("\u00ab", "Data", "e"),
            ("+", "Codec", "registry")]
    boxes, words = [], []
    for r, row in enumerate(rows):
        y = 50 + 14 * r
        boxes += [[20, y, 25, y + 10], [33, y, 90, y + 10], [95, y, 150, y + 10]]
        words += list(row)
    boxes = np.array(boxes, float)
    page = np.full((200, 200, 3), 255, np.uint8)
    assert page_blocks(page, boxes, words, slope=0.0, ocr=True) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    # a text layer's "e" or "\u00a9" is what it says: the lines stay one block
    assert page_blocks(page, boxes, words, slope=0.0) == [list(range(12))]


def test_numbered_steps_whose_badges_an_ocr_misread_open_items_by_their_hanging_indent():
    from dociq.data.text_blocks import hanging_markers, page_blocks

    # a paragraph, then two steps whose numbers are drawn in badges: tesseract read them as "w -"
    # and "N ."; each step's second line starts under its text, right of the marker, 4 px below
    lines = [(20, ("Printing", "on", "both", "sides")), (20, ("of", "the", "paper", "needs")),
             (20, ("w", "-", "Open", "the", "dialog")), (44, ("and", "choose", "Print")),
             (20, ("N", ".", "Go", "to", "Setup")), (44, ("and", "pick", "Two-sided"))]
    boxes, words = [], []
    for r, (x, row) in enumerate(lines):
        y = 50 + 14 * r
        for word in row:
            width = 6 if len(word) == 1 else 8 * len(word)
            boxes.append([x, y, x + width, y + 10])
            words.append(word)
            x += width + 6
    boxes = np.array(boxes, float)
    page = np.full((200, 300, 3), 255, np.uint8)
    assert np.flatnonzero(hanging_markers(boxes, words)).tolist() == [8, 16]      # "w" and "N"
    assert page_blocks(page, boxes, words, slope=0.0, ocr=True) == [list(range(8)), list(range(8, 16)),
                                                                     list(range(16, 24))]
    # the same lines flush left are a paragraph's: no marker hangs, and "of the" opens nothing
    flush = boxes.copy()
    flush[[13, 14, 15, 21, 22, 23], 0::2] -= 24
    assert not hanging_markers(flush, words).any()
    # a text layer's "w" is a word: the step's first line joins the paragraph, its wrapped line is set apart
    assert page_blocks(page, boxes, words, slope=0.0) == [list(range(13)), list(range(13, 21)), [21, 22, 23]]


def test_contents_entries_whose_leaders_an_ocr_left_out_stay_apart_and_whole():
    from dociq.data.text_blocks import drawn_leaders, page_blocks

    # three contents entries 4 px apart: a title, dot leaders drawn on the page (the OCR read none
    # of them), the page number at the right margin
    page = np.full((120, 300, 3), 255, np.uint8)
    boxes, words = [], []
    for r, (title, number) in enumerate([("Introduction", "4"), ("Usage", "7"), ("Options", "12")]):
        y = 20 + 14 * r
        boxes += [[20, y, 90, y + 10], [262, y, 275, y + 10]]
        words += [title, number]
        for x in range(100, 255, 6):
            page[y + 7:y + 9, x:x + 2] = 0               # a dot on the baseline
    boxes = np.array(boxes, float)
    assert drawn_leaders(page, boxes).tolist() == [True, False] * 3
    assert page_blocks(page, boxes, words, slope=0.0, ocr=True) == [[0, 1], [2, 3], [4, 5]]
    # without the dots the titles are a paragraph's lines, the numbers a column of their own
    blank = np.full_like(page, 255)
    assert not drawn_leaders(blank, boxes).any()
    assert page_blocks(blank, boxes, words, slope=0.0, ocr=True) == [[0, 2, 4], [1, 3, 5]]
    # a dash drawn there is no leader
    page[22:30, 100:255] = 255
    page[25:27, 100:255] = 0
    assert not drawn_leaders(page, boxes)[0]


def test_a_tables_cells_are_completed_apart_even_with_narrow_gutters():
    from dociq.models.word_snap import field_units, snap_to_blocks

    # two rows of a narrow table: "ACC-4431  2006-08-30  8,134.27", gutters of one line height
    words = ["ACC-4431", "2006-08-30", "8,134.27", "ACC-8997", "2012-07-02", "2,492.68"]
    boxes = np.array([[20, 50, 60, 60], [70, 50, 110, 60], [120, 50, 150, 60],
                      [20, 63, 60, 73], [70, 63, 110, 73], [120, 63, 150, 73]], float)
    units = [[words[k] for k in u] for u in field_units(list(range(6)), boxes, words)]
    assert units == [[w] for w in words]
    balance = _box_mask(63, 73, 120, 150)
    assert np.array_equal(snap_to_blocks(balance, boxes, words), balance)
    # a value over two lines, the second under the first: one unit
    words = ["Address:", "242", "Jennifer", "Valleys", "Apt.", "889"]
    boxes = np.array([[20, 50, 60, 60], [80, 50, 95, 60], [98, 50, 130, 60], [133, 50, 160, 60],
                      [80, 63, 100, 73], [103, 63, 120, 73]], float)
    units = [[words[k] for k in u] for u in field_units(list(range(6)), boxes, words)]
    assert units == [["Address:"], ["242", "Jennifer", "Valleys", "Apt.", "889"]]


def _contents():
    # two contents lines: number, title, dot leaders, page number; 10 px tall, 6 px apart
    row = lambda y: [[20, y, 28, y + 10], [40, y, 70, y + 10], [74, y, 120, y + 10]] + \
        [[x, y + 7, x + 2, y + 10] for x in range(126, 170, 6)] + [[180, y, 188, y + 10]]
    return np.array(row(50) + row(66), float)


def test_a_box_prompt_answers_every_word_it_frames_as_one_region():
    from dociq.models.word_snap import snap_to_blocks

    words = _contents()
    title = _box_mask(50, 60, 40, 120)                  # the decoder painted the title only
    out = snap_to_blocks(title, words, box=np.array([20, 50, 188, 60]))
    assert np.array_equal(out, _box_mask(50, 60, 20, 188))   # number, title, leaders and page number
    # without the box the leaders and the page number are not the mask's
    assert not snap_to_blocks(title, words)[50:60, 180:188].any()
    # a word only brushed by the box is not framed; a negative click keeps its line out
    loose = snap_to_blocks(title, words, box=np.array([20, 50, 188, 68]))
    assert np.array_equal(loose, _box_mask(50, 60, 20, 188))
    vetoed = snap_to_blocks(title, words, clicks=np.array([[184.0, 55.0]]), click_labels=np.array([0]),
                            box=np.array([20, 50, 188, 60]))
    assert not vetoed[50:60, 180:188].any()


def test_a_box_prompt_takes_a_listings_ragged_lines_whole_and_the_glyphs_the_ocr_missed():
    from dociq.data.text_blocks import page_ink
    from dociq.models.word_snap import snap_to_blocks

    # a code listing of three ragged lines, 10 px tall, 4 px apart; the decoder paints its first line
    listing = np.array([[20, 30, 150, 40], [30, 44, 90, 54], [30, 58, 120, 68]], float)
    framed = snap_to_blocks(_box_mask(30, 40, 20, 150), listing, box=np.array([20, 30, 150, 68]))
    assert np.array_equal(framed, _box_mask(30, 68, 20, 150))        # one rectangle, not three lines
    # a contents entry whose leaders and page number the OCR did not read: their ink is the entry's,
    # a figure framed beside it (taller than a line) is not, nor is a speck on the line below
    page = np.full((200, 200, 3), 255, np.uint8)
    entry = np.array([[20, 50, 28, 60], [40, 50, 120, 60]], float)
    for x0, y0, x1, y1 in entry.astype(int):
        page[y0:y1, x0:x1] = 0
    for x in range(126, 170, 6):
        page[57:60, x:x + 2] = 0                         # leader dots
    page[50:60, 180:186] = 0                             # the page number
    ink = page_ink(page)
    out = snap_to_blocks(_box_mask(50, 60, 40, 120), entry, box=np.array([20, 50, 196, 60]), ink=ink)
    assert np.array_equal(out, _box_mask(50, 60, 20, 186))
    page[50:60, 180:186] = 255
    page[30:100, 176:196] = 0                            # a figure right of the entry's line instead
    page[75:78, 100:103] = 0                             # a speck under the line
    ink = page_ink(page)
    out = snap_to_blocks(_box_mask(50, 60, 40, 120), entry, box=np.array([20, 25, 198, 105]), ink=ink)
    assert np.array_equal(out, _box_mask(50, 60, 20, 170))         # up to the last leader dot


def test_a_box_drawn_tight_around_a_line_sets_its_edges_and_a_loose_one_does_not():
    from dociq.models.word_snap import snap_to_blocks

    words = np.array([[40, 52, 100, 64], [104, 52, 150, 64]], float)    # ink-tight boxes, 12 px tall
    painted = _box_mask(52, 64, 40, 150)
    tight = snap_to_blocks(painted, words, box=np.array([39, 51, 151, 65]))   # 1 px off: within 0.15 of a line
    assert np.array_equal(tight, _box_mask(51, 65, 39, 151))
    for loose in ([36, 48, 154, 68], [20, 30, 180, 90]):                # 4 px off, and far off
        assert np.array_equal(snap_to_blocks(painted, words, box=np.array(loose)), painted)
    one_side = snap_to_blocks(painted, words, box=np.array([20, 51, 180, 90]))   # only the top drawn tight
    assert np.array_equal(one_side, _box_mask(51, 64, 40, 150))


def test_a_box_prompt_over_a_drawing_answers_the_drawing_not_the_decoders_blobs():
    from dociq.data.text_blocks import page_ink
    from dociq.models.word_snap import snap_to_blocks

    page = np.full((200, 200, 3), 255, np.uint8)
    page[20:90, 100] = page[20:90, 179] = page[20, 100:180] = page[89, 100:180] = (30, 90, 200)   # a plot's frame
    page[40:70, 120:160:6] = (250, 120, 10)                                                      # its bars
    page[150:160, 40:90] = 0                                                                     # a word below
    words = np.array([[40, 150, 90, 160]], float)
    blob = _box_mask(50, 58, 130, 140)                   # the decoder paints a blob inside the plot
    ink = page_ink(page)
    assert ink[20, 100] and ink[50, 120] and not ink[30, 110]
    out = snap_to_blocks(blob, words, box=np.array([95, 15, 185, 95]), ink=ink)
    assert np.array_equal(out, _box_mask(20, 90, 100, 180))          # the frame's box, all of it
    assert np.array_equal(snap_to_blocks(blob, words, box=np.array([95, 15, 185, 95])), blob)   # no page: as painted
    # a blob on blank paper next to the plot does not take it; nor does a box without a drawing
    beside = _box_mask(100, 110, 130, 140)
    assert np.array_equal(snap_to_blocks(beside, words, box=np.array([95, 15, 185, 120]), ink=ink), beside)


def test_each_contents_entry_is_a_block_of_its_own_and_its_leaders_join_its_page_number():
    from dociq.data.text_blocks import group_blocks, leader_words
    from dociq.models.word_snap import snap_to_blocks

    # dot leaders as a LaTeX text layer gives them: full-height boxes ~9 px apart (a cell's gap)
    def entry(y, title_x1, page):
        dots = [[x, y, x + 3, y + 12] for x in range(title_x1 + 11, 300, 9)]
        return [[40, y, title_x1, y + 12]] + dots + [[310, y, 322, y + 12]], ["Title"] + ["."] * len(dots) + [page]

    boxes, words = [], []
    for y, x1, page in ((50, 150, "5"), (65, 120, "12"), (80, 170, "18")):
        b, w = entry(y, x1, page)
        boxes += b
        words += w
    boxes = np.array(boxes, float)
    assert leader_words(words).sum() == len(words) - 6
    assert len(group_blocks(boxes, words)) == 1                          # the model's input: one block
    entries = group_blocks(boxes, words, split_entries=True)
    assert len(entries) == 3 and all(words[b[-1]] in ("5", "12", "18") for b in entries)
    # a click on the second entry's title answers the whole entry line, page number included
    out = snap_to_blocks(np.zeros((120, 340), bool), boxes, words, clicks=np.array([[60.0, 70.0]]), blocks=entries)
    assert np.array_equal(out, _box_mask(65, 77, 40, 322, shape=(120, 340)))


def test_a_click_on_a_picture_answers_the_picture_and_a_frame_around_text_is_no_picture():
    from dociq.data.text_blocks import page_ink
    from dociq.models.word_snap import drawing_boxes, picture_boxes, snap_to_blocks

    page = np.full((200, 200, 3), 255, np.uint8)
    page[20:90, 100] = page[20:90, 179] = page[20, 100:180] = page[89, 100:180] = (30, 90, 200)   # a plot's frame
    page[40:70, 120:160:6] = (250, 120, 10)                                                      # its bars
    page[110, 10:190] = page[190, 10:190] = page[110:191, 10] = page[110:191, 189] = 0           # a frame around text
    words = np.array([[20, 130, 180, 142], [20, 146, 180, 158], [20, 162, 120, 174]], float)      # a paragraph in it
    drawings = drawing_boxes(page_ink(page), words)
    found = set(map(tuple, drawings.tolist()))
    assert {(10, 110, 190, 191), (100, 20, 180, 90)} <= found       # the text's frame; the plot's (its bars apart)
    pictures = set(map(tuple, picture_boxes(drawings, words).tolist()))
    assert (100, 20, 180, 90) in pictures and (10, 110, 190, 191) not in pictures   # a frame full of words
    pictures = picture_boxes(drawings, words)
    empty = np.zeros((200, 200), bool)
    out = snap_to_blocks(empty, words, clicks=np.array([[110.0, 30.0]]), drawings=pictures)
    assert np.array_equal(out, _box_mask(20, 90, 100, 180))        # a click on blank paper in the plot
    vetoed = snap_to_blocks(empty, words, clicks=np.array([[110.0, 30.0], [150.0, 80.0]]),
                            click_labels=np.array([1, 0]), drawings=pictures)
    assert not vetoed.any()
    on_text = snap_to_blocks(empty, words, clicks=np.array([[50.0, 150.0]]), drawings=drawing_boxes(page_ink(page), words))
    assert np.array_equal(on_text, _box_mask(130, 174, 20, 180))   # a click on the paragraph: the paragraph only


def test_mask_parts_on_blank_paper_are_dropped_unless_the_whole_mask_is_blank():
    from dociq.models.word_snap import snap_to_blocks

    words = _paragraph()
    ink = np.zeros((200, 200), bool)
    for x0, y0, x1, y1 in words.astype(int):
        ink[y0 + 2:y1 - 2, x0 + 1:x1 - 1] = True                    # the glyphs inside each word's box
    answer = _box_mask(50, 86, 40, 160)
    blobs = answer | _box_mask(0, 6, 20, 30) | _box_mask(0, 6, 60, 70)   # the decoder's blobs along the top edge
    assert np.array_equal(snap_to_blocks(blobs, words, ink=ink), answer)
    assert np.array_equal(snap_to_blocks(blobs, words), blobs)             # without the page: as painted
    blank = _box_mask(150, 160, 20, 30)
    assert np.array_equal(snap_to_blocks(blank, words, ink=ink), blank)    # all blank: kept, not emptied


def _quoted_page():
    """Two paragraphs of three words, one above the other: "alpha beta gamma" / "delta required epsilon"."""
    boxes = np.array([[20, 20, 60, 30], [65, 20, 100, 30], [105, 20, 150, 30],
                      [20, 80, 60, 90], [65, 80, 120, 90], [125, 80, 170, 90]], float)
    words = ["alpha", "beta", "gamma", "delta", "required", "epsilon"]
    return boxes, words, [[0, 1, 2], [3, 4, 5]]


def _both_paragraphs_painted():
    mask = np.zeros((120, 200), bool)
    mask[20:30, 20:150] = True
    mask[80:90, 20:170] = True
    return mask


def test_a_quoted_word_keeps_the_part_that_holds_it_and_drops_the_rest():
    boxes, words, blocks = _quoted_page()
    mask = _both_paragraphs_painted()
    out = keep_quoted(mask, boxes, words, "which paragraph mentions “beta”?", blocks)
    assert out[25, 80] and not out[85, 80]
    # "requires" is one edit from "required": the second paragraph holds the quotation
    out = keep_quoted(mask, boxes, words, "which paragraph mentions “requires”?", blocks)
    assert out[85, 80] and not out[25, 80]


def test_a_mask_without_the_quoted_word_becomes_the_block_that_holds_it():
    boxes, words, blocks = _quoted_page()
    mask = np.zeros((120, 200), bool)
    mask[20:30, 20:150] = True                       # the model painted the other paragraph
    out = keep_quoted(mask, boxes, words, "which paragraph mentions “epsilon”?", blocks)
    expect = np.zeros_like(mask)
    expect[80:90, 20:170] = True
    assert np.array_equal(out, expect)


def test_a_question_naming_a_unit_gets_the_whole_block_holding_the_quoted_word():
    boxes, words, blocks = _quoted_page()
    word_only = np.zeros((120, 200), bool)
    word_only[80:90, 65:120] = True                  # the decoder painted the quoted word alone
    paragraph = np.zeros_like(word_only)
    paragraph[80:90, 20:170] = True
    for question in ("which paragraph mentions “required”?", "which bullet point mentions “required”?"):
        assert np.array_equal(keep_quoted(word_only, boxes, words, question, blocks), paragraph)
    # the mask over both paragraphs, the word in one: that one alone
    out = keep_quoted(_both_paragraphs_painted(), boxes, words, "which paragraph mentions “required”?", blocks)
    assert np.array_equal(out, paragraph)
    # a question about the words themselves names no unit: the words stay the answer
    assert np.array_equal(keep_quoted(word_only, boxes, words, "where is the word “required”?", blocks), word_only)


def test_a_quoted_word_inside_a_compound_word_finds_the_block_holding_it():
    """Questions quote a word's letter runs ("getbinval"); the page, as an OCR reads it, holds the
    compound ("SPI_getbinval")."""
    boxes, words, blocks = _quoted_page()
    words[4] = "SPI_required()"
    word_only = np.zeros((120, 200), bool)
    word_only[20:30, 65:100] = True                  # the decoder painted a word of the other paragraph
    paragraph = np.zeros_like(word_only)
    paragraph[80:90, 20:170] = True
    out = keep_quoted(word_only, boxes, words, "which paragraph mentions “required”?", blocks)
    assert np.array_equal(out, paragraph)
    # a whole-word match elsewhere on the page is the better match
    words[1] = "required"
    out = keep_quoted(word_only, boxes, words, "which paragraph mentions “required”?", blocks)
    assert out[25, 80] and not out[85, 80]


def test_quotations_the_answer_need_not_hold_and_words_the_page_lacks_change_nothing():
    boxes, words, blocks = _quoted_page()
    mask = np.zeros((120, 200), bool)
    mask[80:90, 20:170] = True
    for question in ("which value belongs to the field ‘alpha’?", "which paragraph mentions “zeta”?",
                     "the second paragraph"):
        assert np.array_equal(keep_quoted(mask, boxes, words, question, blocks), mask)


def test_the_part_holding_more_of_a_quoted_title_wins():
    boxes, words, blocks = _quoted_page()
    mask = _both_paragraphs_painted()
    out = keep_quoted(mask, boxes, words, "where does the section “gamma delta required” start?", blocks)
    assert out[85, 80] and not out[25, 80]           # two of three quoted words against one


def test_the_predictors_snapping_keeps_a_quotation_for_questions_alone():
    from types import SimpleNamespace

    from dociq.inference.prompts import Prompts
    from dociq.inference.snapping import snap_masks

    boxes, words, _ = _quoted_page()
    image = np.full((120, 200, 3), 255, np.uint8)
    for x0, y0, x1, y1 in boxes.astype(int):
        image[y0 + 2:y1 - 2, x0 + 2:x1 - 2] = 0                  # ink where the words are
    mask = np.zeros((1, 120, 200), bool)
    mask[0, 20:30, 20:150] = True                              # the model painted the first paragraph
    question = ["which paragraph mentions “epsilon”?"]

    def snapped(boxes_prompt=None):
        page = SimpleNamespace(image=image, words=words, text_blocks=None, ink=None, drawings=None, slope=None,
                               word_confidences=None)
        prompts = Prompts(count=1, questions=question, points=None, labels=None, boxes=boxes_prompt)
        return snap_masks(mask, prompts, page, boxes, "blocks")[0]

    out = snapped()
    assert out[85, 100] and not out[25, 80]                    # moved to the paragraph holding "epsilon"
    framed = snapped(np.array([[10.0, 10.0, 160.0, 40.0]]))
    assert framed[25, 80] and not framed[85, 100]              # a box says where: the quotation does not move it


def test_a_numbered_heading_or_item_is_one_unit_and_a_numbered_table_row_stays_cells():
    from dociq.models.word_snap import field_units, snap_to_blocks

    # "5.3  Installing the server": a space of ~1.1 line heights after the number, as LaTeX sets it
    words = ["5.3", "Installing", "the", "server"]
    boxes = np.array([[40, 50, 64, 64], [80, 50, 140, 64], [144, 50, 162, 64], [166, 50, 210, 64]], float)
    assert field_units(list(range(4)), boxes, words) == [[0, 1, 2, 3]]
    title = _box_mask(50, 64, 80, 210)                    # the decoder painted the title, not its number
    assert np.array_equal(snap_to_blocks(title, boxes, words), _box_mask(50, 64, 40, 210))
    # a list item's enumerator and a bullet open their line's text the same way
    for opener in ("3.", "b)", "\u2022", "A.2"):
        assert field_units(list(range(4)), boxes, [opener] + words[1:]) == [[0, 1, 2, 3]]
    # a word that numbers nothing keeps its cell, and so does a number in a row of three cells
    assert field_units(list(range(4)), boxes, ["Total"] + words[1:]) == [[0], [1, 2, 3]]
    row = np.array([[40, 50, 48, 64], [64, 50, 100, 64], [116, 50, 150, 64]], float)
    assert field_units([0, 1, 2], row, ["7", "ACC-4431", "8,134.27"]) == [[0], [1], [2]]


def _skewed_heading(slope: float):
    """A heading of five words on a page turned by `slope` (dy / dx), and its region as the scan
    turns it: a band 14 px tall rising along the line."""
    shape = (120, 420)
    spans = [(20, 90), (98, 160), (168, 250), (258, 320), (328, 400)]
    boxes = np.array([[x0, 50 + slope * (x0 + x1) / 2 - 7, x1, 50 + slope * (x0 + x1) / 2 + 7] for x0, x1 in spans])
    rows, cols = np.mgrid[:shape[0], :shape[1]]
    band = (cols >= 20) & (cols < 400) & (np.abs(rows + 0.5 - 50 - slope * (cols + 0.5)) <= 7)
    return shape, boxes, band


def _iou(a, b):
    return (a & b).sum() / (a | b).sum()


def test_a_unit_on_a_skewed_scan_is_drawn_along_its_line_and_upright_on_a_level_page():
    from dociq.models.word_snap import fill_unit, pixel_boxes

    slope = np.tan(np.radians(2.0))
    shape, boxes, band = _skewed_heading(slope)
    along, upright = np.zeros(shape, bool), np.zeros(shape, bool)
    fill_unit(along, boxes, slope)
    fill_unit(upright, boxes)
    assert _iou(along, band) > 0.9 > 0.6 > _iou(upright, band)
    x0, y0, x1, y1 = pixel_boxes(np.r_[boxes[:, :2].min(0), boxes[:, 2:].max(0)], shape)[0]
    assert np.array_equal(upright, _box_mask(y0, y1, x0, x1, shape))        # slope 0: the box around the words


def test_snapping_on_a_skewed_scan_follows_the_line():
    from dociq.models.word_snap import snap_to_blocks

    slope = np.tan(np.radians(2.0))
    shape, boxes, band = _skewed_heading(slope)
    blob = np.zeros(shape, bool)
    blob[44:70, 95:330] = True                                        # the decoder's mask on the heading's middle words
    out = snap_to_blocks(blob, boxes, ["A", "Heading", "on", "a", "scan"], slope=slope)
    assert _iou(out, band) > 0.9
    assert _iou(snap_to_blocks(blob, boxes, ["A", "Heading", "on", "a", "scan"]), band) < 0.6


def test_the_block_a_quoted_word_names_on_a_skewed_scan_follows_the_line():
    slope = np.tan(np.radians(2.0))
    shape, boxes, band = _skewed_heading(slope)
    words = ["A", "Heading", "on", "a", "scan"]
    word_only = np.zeros(shape, bool)
    word_only[40:62, 98:160] = True                                   # the decoder painted the quoted word alone
    question = "which paragraph mentions “Heading”?"
    assert _iou(keep_quoted(word_only, boxes, words, question, [list(range(5))], slope), band) > 0.9
    assert _iou(keep_quoted(word_only, boxes, words, question, [list(range(5))]), band) < 0.6
