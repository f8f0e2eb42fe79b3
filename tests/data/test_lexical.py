"""Lexical match of questions with OCR words: grades, content words, CLIP positions, batch keys."""
import numpy as np
import open_clip
import torch

from dociq.data.collate import DocumentCollator, lexical_match
from dociq.data.lexical import (CASEFOLD, EXACT, FUZZY, NO_MATCH, answer_quotes, names_text_unit, clip_word_positions,
                                quoted_in_parts,
                                match_code, match_matrix, question_content_words, within_one_edit)
from dociq.data.schema import Page, Question


def test_grades_exact_casefold_fuzzy_none():
    assert match_code("Lawyer", "Lawyer") == EXACT
    assert match_code("Lawyer", "“Lawyer”,") == EXACT          # punctuation at the ends is not the word
    assert match_code("Lawyer", "LAWYER") == CASEFOLD
    assert match_code("Lawyer", "Lawycr") == FUZZY             # one OCR substitution
    assert match_code("Lawyer", "Lawyers") == FUZZY            # one insertion
    assert match_code("Lawyer", "Layer") == FUZZY              # one deletion
    assert match_code("Lawyer", "Lower") == NO_MATCH           # two edits
    assert match_code("Acme", "Acne") == NO_MATCH              # short words need an exact/case-folded match
    assert match_code("Lawyer", "...") == NO_MATCH


def test_edit_distance_one_against_a_brute_force_levenshtein():
    def lev(a, b):
        d = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            prev, d[0] = d[0], i
            for j, cb in enumerate(b, 1):
                prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (ca != cb))
        return d[-1]

    rng = np.random.default_rng(0)
    for _ in range(400):
        a = "".join(rng.choice(list("abc"), rng.integers(1, 6)))
        b = "".join(rng.choice(list("abc"), rng.integers(1, 6)))
        assert within_one_edit(a, b) == (lev(a, b) <= 1), (a, b)


def test_content_words_skip_function_words_but_keep_quoted_ones():
    assert question_content_words("what is the balance of ACC-4945?") == [(3, "balance"), (5, "ACC-4945")]
    # "under" is a function word, but quoted it is what the question is about
    assert [w for _, w in question_content_words("which paragraph mentions \u201cunder\u201d?")] == \
        ["paragraph", "mentions", "under"]


def test_match_matrix_marks_the_words_and_nothing_else():
    words = ["The", "lawyer", "met", "Lawyers", "today.", "Lawyer:"]
    codes, word_ids = match_matrix("which paragraph mentions \u201cLawyer\u201d?", words, max_words=12)
    assert word_ids == [1, 2, 3]
    assert codes.shape == (3, 6)
    assert codes[:2].sum() == 0                                  # "paragraph", "mentions" are not on the page
    assert codes[2].tolist() == [NO_MATCH, CASEFOLD, NO_MATCH, FUZZY, NO_MATCH, EXACT]


def test_clip_positions_point_at_each_words_first_token():
    question = "what is the open date of ACC-7789 in \u201cBerlin\u201d?"
    ids = open_clip.tokenize([question], context_length=32)[0]
    from open_clip.tokenizer import _tokenizer
    words = question.split()
    positions = clip_word_positions(question, range(len(words)), 32)
    for word, pos in zip(words, positions):
        assert ids[pos].item() == _tokenizer.encode(word)[0], word
    # a word past the context length has no position
    long_question = " ".join(["word"] * 40) + " Berlin"
    assert clip_word_positions(long_question, [40], 32) == [-1]


def _page(words, questions):
    boxes = np.array([[10 + 30 * i, 10, 35 + 30 * i, 20] for i in range(len(words))], np.float32)
    mask = np.zeros((128, 128), bool)
    mask[10:20, 10:40] = True
    return Page(image=np.full((128, 128, 3), 255, np.uint8), words=words, word_boxes=boxes,
                questions=[Question(text=q, kind="reading", mask=mask, region_ids=[]) for q in questions])


def test_collator_expands_word_matches_to_subtokens():
    page = _page(["Quixotically", "cats", "sleep"], ["where is \u201cquixotically\u201d?", "segment the table"])
    batch = DocumentCollator(128, questions=True, max_questions=4, seed=0, max_question_words=5)([page])
    match, word_pos = batch["prompt_match"], batch["prompt_word_pos"]
    assert match.shape == (1, 2, 5, batch["ocr_ids"].shape[1]) and match.dtype == torch.uint8
    first = match[0, 0, 0]
    tokens_of_word0 = batch["ocr_word_index"][0] == 0
    assert tokens_of_word0.sum() > 1                            # WordPiece splits it ...
    assert (first[tokens_of_word0] == CASEFOLD).all()           # ... and every piece carries the match
    assert (first[~tokens_of_word0] == 0).all()                 # [CLS], [SEP], other words: none
    assert word_pos[0, 0].tolist() == [3, -1, -1, -1, -1]       # "where"(1) "is"(2) "unbelievable"(3)
    # "segment the table": "segment" and "table" are content words, but nothing on the page matches
    assert match[0, 1].sum() == 0 and (word_pos[0, 1, :2] > 0).all()


def test_lexical_match_without_words_is_empty():
    match, word_pos = lexical_match([[]], [["where is Berlin?"]], torch.full((1, 2), -1), 4, 32)
    assert match.shape == (1, 1, 4, 2) and match.sum() == 0
    assert word_pos[0, 0, 0].item() == 3


def test_a_question_names_a_text_unit_only_with_a_quotation_it_holds():
    assert names_text_unit("which paragraph mentions “Hiera”?")
    assert names_text_unit("which bullet point mentions “Hiera”?")
    assert not names_text_unit("where is the word “Hiera”?")
    assert not names_text_unit("where does the section “Usage” start?")
    assert not names_text_unit("all paragraphs")


def test_a_quoted_word_is_found_as_a_letter_run_of_a_compound_word():
    words = ["SPI_getbinval", "self-serve", "method’s", "co-authors,", "servant", "getbin"]
    held = quoted_in_parts(["getbinval", "serve", "Method", "authors", "getbinvel", "bin"], words)
    assert held.tolist() == [
        [True, False, False, False, False, False],    # after the underscore
        [False, True, False, False, False, False],    # after the hyphen; "servant" is no run of it
        [False, False, True, False, False, False],    # case-folded, before the apostrophe
        [False, False, False, True, False, False],
        [True, False, False, False, False, False],    # one edit away, long enough
        [False, False, False, False, False, False],   # a run's piece is not a run
    ]


def test_answer_quotes_are_the_quotations_the_answer_holds():
    assert answer_quotes("which paragraph mentions “Hiera”?") == ["Hiera"]
    assert answer_quotes("where does the section “1 Usage - Options” start?") == ["1", "Usage", "Options"]
    assert answer_quotes('the paragraph that contains "foo bar"') == ["foo", "bar"]
    # the answer is the region next to the quoted label, not the label
    assert answer_quotes("which value belongs to the field ‘Name’?") == []
    assert answer_quotes("what is “X”?") == [] and answer_quotes("the page footer") == []
