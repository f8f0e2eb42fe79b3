"""The collator makes the batch contract: geometry, tokens with boxes, prompts, skipping bad pages."""
import numpy as np
import pytest
import torch

from dociq.data.collate import DocumentCollator, mask_box, normalise_boxes, visible_tokens
from dociq.data.schema import IMAGE_MEAN, IMAGE_STD, Page, Question
from dociq.data.tokenize import MAX_WORD_CHARS, OcrTokenizer, QuestionTokenizer, clean_word


def make_page(h=200, w=100) -> Page:
    image = np.full((h, w, 3), 255, dtype=np.uint8)
    image[20:40, 10:60] = 0  # a dark word
    words = ["Invoice", "total:", "$1,234.00"]
    boxes = np.array([[10, 20, 60, 40], [10, 50, 50, 60], [55, 50, 95, 60]], dtype=np.float32)
    mask = np.zeros((h, w), dtype=bool)
    mask[50:60, 55:95] = True
    q = Question(text="where is the invoice total?", kind="reading", mask=mask)
    return Page(image=image, words=words, word_boxes=boxes, questions=[q], meta={"page_id": "p0"})


def test_page_is_resized_on_longest_side_and_padded_with_paper():
    collate = DocumentCollator(image_size=256)
    batch = collate([make_page(200, 100)])
    img = batch["image"]
    assert img.shape == (1, 3, 256, 256)
    white = (1 - torch.tensor(IMAGE_MEAN)) / torch.tensor(IMAGE_STD)
    # 200x100 -> 256x128: the right half is padding and reads as white paper
    assert torch.allclose(img[0, :, 100, 200], white, atol=1e-5)
    black = (0 - torch.tensor(IMAGE_MEAN)) / torch.tensor(IMAGE_STD)
    assert torch.allclose(img[0, :, 38, 40], black, atol=1e-4)  # word pixel (y 20-40 -> 25.6-51.2)
    assert batch["meta"][0]["scale"] == pytest.approx(1.28)
    assert batch["meta"][0]["original_size"] == (200, 100)


def test_every_subtoken_carries_its_word_box_in_the_input_frame():
    tok = OcrTokenizer()
    batch = DocumentCollator(image_size=256, ocr_tokenizer=tok)([make_page()])
    ids, boxes, widx = batch["ocr_ids"][0], batch["ocr_boxes"][0], batch["ocr_word_index"][0]
    assert ids[0] == tok.hf.cls_token_id and ids[-1] == tok.hf.sep_token_id
    assert boxes[0].tolist() == [0, 0, 0, 0] and boxes[-1].tolist() == [1000, 1000, 1000, 1000]
    expected = normalise_boxes(make_page().word_boxes, 1.28, 256)
    assert expected[0].tolist() == [50, 100, 300, 200]  # 10*1.28/256*1000 = 50, ...
    for t in range(1, len(ids) - 1):
        assert boxes[t].tolist() == expected[widx[t]].tolist()
    # "$1,234.00" is split into several WordPiece tokens, all with the same word index
    assert (widx == 2).sum() > 1
    decoded = tok.hf.decode(ids[widx == 0])
    assert decoded == "invoice"


def test_truncation_is_counted():
    tok = OcrTokenizer(max_length=6)
    batch = DocumentCollator(image_size=256, ocr_tokenizer=tok)([make_page()])
    assert batch["ocr_ids"].shape[1] == 6
    assert batch["ocr_truncated"].tolist() == [1]  # "invoice total : $..." -> the amount is cut
    assert tok.truncated_words_total == 1


def test_words_that_are_not_text_are_cleaned_and_overlong_words_cut():
    """OCR words from a user's file: NUL and other control characters, a lone surrogate (JSON
    "\\ud800"), right-to-left and zero-width marks and a 2,000-character word tokenize, each word
    keeps its own tokens, and no word takes more than MAX_WORD_CHARS characters' worth."""
    tok = OcrTokenizer()
    leader = "." * 2000                       # a dot leader: every dot is a WordPiece token
    words = ["to\x00tal", "\ud800", "\u05e1\u05db\u05d5\u05dd", "zero\u200bwidth\u200f", leader, "amount\x07", "\u200f"]
    enc = tok(words, np.zeros((len(words), 4), np.int64))
    assert enc.truncated_words == 0          # the last word has no token (the tokenizer drops U+200F) but was not cut
    widx = enc.word_index
    assert tok.hf.decode(enc.ids[widx == 0]) == "total"
    assert tok.hf.decode(enc.ids[widx == 5]) == "amount"
    assert tok.hf.unk_token_id not in enc.ids[widx == 2].tolist()     # Hebrew is read, not [UNK]
    assert (widx == 4).sum() == MAX_WORD_CHARS
    assert clean_word("\ud800x") == "\ufffdx"
    assert clean_word("zero\u200bwidth\u200f") == "zero\u200bwidth\u200f"    # marks are text
    assert clean_word("\u05e1\u05db\u05d5\u05dd") == "\u05e1\u05db\u05d5\u05dd"


def test_padding_and_attention_mask_across_pages():
    p1, p2 = make_page(), make_page()
    p2.words, p2.word_boxes = ["x"], p2.word_boxes[:1]
    batch = DocumentCollator(image_size=128)([p1, p2])
    assert batch["ocr_mask"][1].sum() == 3  # [CLS] x [SEP]
    assert (batch["ocr_ids"][1][~batch["ocr_mask"][1]] == 0).all()  # pad id of the vocabulary


def test_question_masks_points_and_boxes_follow_the_target():
    collate = DocumentCollator(image_size=256, questions=True, points_per_prompt=3,
                               question_tokenizer=QuestionTokenizer(32), seed=0)
    batch = collate([make_page()])
    mask = batch["masks"][0, 0]
    assert batch["masks"].shape == (1, 1, 256, 256)
    # target region x 55-95, y 50-60 scaled by 1.28
    assert mask[70, 100] == 1 and mask[10, 10] == 0
    assert batch["boxes"][0, 0].tolist() == mask_box(mask).tolist()
    x0, y0, x1, y1 = batch["boxes"][0, 0].tolist()
    # 55*1.28=70.4, 50*1.28=64, 95*1.28=121.6, 60*1.28=76.8: within a pixel of nearest resizing
    assert all(abs(a - b) <= 1 for a, b in zip((x0, y0, x1, y1), (70.4, 64, 121.6, 76.8)))
    for x, y in batch["points"][0, 0].tolist():
        assert mask[int(y), int(x)] == 1
    assert batch["point_labels"][0, 0].tolist() == [1, 1, 1]
    assert batch["prompt_ids"].shape == (1, 1, 32)
    assert batch["prompt_kind"] == [["reading"]]
    assert batch["prompt_valid"].tolist() == [[True]]


def test_a_click_lands_on_one_region_of_a_plural_answer():
    """'all paragraphs' is two regions: `region_masks` is one of them (within the answer), and the
    click lies on it — a click alone can name one region, not the whole answer."""
    from dociq.data.schema import Region
    page = make_page()
    h, w = page.image.shape[:2]
    left, right = np.zeros((h, w), bool), np.zeros((h, w), bool)
    left[100:140, 5:45], right[100:140, 55:95] = True, True
    page.regions = [Region("paragraph", np.array([5, 100, 45, 140.]), left),
                    Region("paragraph", np.array([55, 100, 95, 140.]), right)]
    page.questions = [Question("all paragraphs", "layout", left | right, region_ids=[0, 1])]
    collate = DocumentCollator(image_size=200, questions=True, points_per_prompt=2,
                               question_tokenizer=QuestionTokenizer(32), seed=0)
    seen = set()
    for seed in range(12):
        batch = collate([page], batch_seed=seed)
        union, region = batch["masks"][0, 0], batch["region_masks"][0, 0]
        assert (region <= union).all() and 0 < region.sum() < union.sum()
        for x, y in batch["points"][0, 0].tolist():
            assert region[int(y), int(x)] == 1
        seen.add("left" if region[120, 20] == 1 else "right")
    assert seen == {"left", "right"}                      # either region can be drawn


def test_a_question_without_regions_clicks_its_own_mask():
    batch = DocumentCollator(image_size=256, questions=True, question_tokenizer=QuestionTokenizer(32),
                             seed=0)([make_page()])
    assert torch.equal(batch["region_masks"], batch["masks"])


def test_pages_with_fewer_questions_are_padded_and_marked_invalid():
    p1, p2 = make_page(), make_page()
    p1.questions = p1.questions * 3
    batch = DocumentCollator(image_size=64, questions=True, seed=0)([p1, p2])
    assert batch["prompt_valid"].tolist() == [[True, True, True], [True, False, False]]
    assert batch["masks"][1, 1:].sum() == 0


def test_skipped_pages_are_dropped_and_counted():
    collate = DocumentCollator(image_size=64)
    batch = collate([make_page(), None, make_page()])
    assert batch["image"].shape[0] == 2 and batch["skipped"] == 1
    with pytest.raises(RuntimeError, match="all 2 pages of a batch were bad"):
        collate([None, None])


def test_visible_tokens_follow_the_context_units():
    # 2x2 grid; token 0 centred in unit 0 (top-left), token 1 in unit 3 (bottom-right)
    boxes = torch.tensor([[[100, 100, 200, 200], [700, 700, 900, 900]]])
    assert visible_tokens(boxes, torch.tensor([[0, 1]]), (2, 2)).tolist() == [[True, False]]
    assert visible_tokens(boxes, torch.tensor([[3, 2]]), (2, 2)).tolist() == [[False, True]]


def test_visible_only_text_masking_needs_image_masking():
    class TextMasking:
        visible_only = True

    with pytest.raises(ValueError, match="data.image_masking"):
        DocumentCollator(image_size=64, text_masking=TextMasking())


def test_mismatched_words_and_boxes_name_the_problem():
    page = make_page()
    page.word_boxes = page.word_boxes[:2]
    with pytest.raises(ValueError, match="3 words but 2 boxes"):
        DocumentCollator(image_size=64)([page])


def test_a_landscape_page_whose_rounded_width_would_overshoot_the_frame_collates():
    """A real page 100 x 513 px: its height ratio times its width rounds to 257 > 256; masks
    must land in the image's own resized frame."""
    import numpy as np

    from dociq.data.collate import DocumentCollator
    from dociq.data.schema import Page, Question
    from dociq.data.tokenize import QuestionTokenizer

    mask = np.zeros((100, 513), bool)
    mask[10:40, 500:513] = True              # reaches the right edge
    page = Page(image=np.full((100, 513, 3), 255, np.uint8), words=["total"],
                word_boxes=np.array([[500, 10, 512, 40]], np.float32), regions=[],
                questions=[Question("where is the total?", "reading", mask)], meta={"page_id": "wide"})
    batch = DocumentCollator(256, question_tokenizer=QuestionTokenizer(32), questions=True, seed=0)([page])
    target = batch["masks"][0, 0]
    assert target.shape == (256, 256) and target[:, 255].any() and not target[60:].any()


def test_every_token_carries_the_class_of_the_smallest_region_holding_its_word():
    from dociq.data.schema import REGION_CLASSES, Region
    page = make_page()
    h, w = page.image.shape[:2]
    full = np.ones((h, w), bool)
    page.regions = [Region("table", np.array([0, 0, 100, 100.]), full, word_ids=[0, 1, 2]),
                    Region("table_cell", np.array([50, 45, 100, 65.]), full, word_ids=[2]),
                    Region("doodle", np.array([0, 0, 50, 50.]), full, word_ids=[0]),     # not a layout class
                    Region("title", np.array([0, 0, 10, 10.]), full, word_ids=[7])]      # a stale word id
    collate = DocumentCollator(image_size=256, questions=True, question_tokenizer=QuestionTokenizer(32), seed=0)
    batch = collate([page])
    classes, word_index = batch["ocr_word_class"][0], batch["ocr_word_index"][0]
    expected = {0: "table", 1: "table", 2: "table_cell"}
    for token, word in enumerate(word_index.tolist()):
        want = -1 if word < 0 else REGION_CLASSES.index(expected[word])
        assert classes[token].item() == want, (token, word)
    # "$1,234.00" is several sub-tokens: all of them are cells
    assert (word_index == 2).sum() > 1
    page.regions = []                                            # no regions: nothing to learn from
    assert (collate([page])["ocr_word_class"] == -1).all()


def two_paragraph_page() -> Page:
    """Two blocks of two lines each, far apart: words 0-3 and 4-7."""
    image = np.full((400, 300, 3), 255, dtype=np.uint8)
    words = ["One", "two", "three", "four", "Five", "six", "seven", "eight"]
    boxes = np.array([[20, 20, 60, 32], [70, 20, 110, 32], [20, 36, 60, 48], [70, 36, 110, 48],
                      [20, 200, 60, 212], [70, 200, 110, 212], [20, 216, 60, 228], [70, 216, 110, 228]],
                     dtype=np.float32)
    mask = np.zeros((400, 300), dtype=bool)
    mask[20:48, 20:110] = True
    q = Question(text="where is the first paragraph?", kind="layout", mask=mask)
    return Page(image=image, words=words, word_boxes=boxes, questions=[q], meta={"page_id": "b0"})


def test_every_token_carries_its_words_text_block_and_specials_none():
    collate = DocumentCollator(image_size=256, questions=True, question_tokenizer=QuestionTokenizer(32), seed=0)
    batch = collate([two_paragraph_page(), make_page()])
    blocks, widx = batch["ocr_block_index"], batch["ocr_word_index"]
    assert blocks.shape == widx.shape
    page0 = {int(w): int(k) for w, k in zip(widx[0], blocks[0]) if w >= 0}
    assert page0 == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    assert (blocks[widx < 0] == -1).all()          # [CLS], [SEP] and padding lie in no block
    assert (blocks[1][widx[1] >= 0] >= 0).all()


def test_text_blocks_are_made_for_prompts_and_skipped_in_pretraining():
    assert "ocr_block_index" not in DocumentCollator(image_size=128)([make_page()])
    assert "ocr_block_index" in DocumentCollator(image_size=128, blocks=True)([make_page()])
