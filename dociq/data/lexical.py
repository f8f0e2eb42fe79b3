"""Lexical match between a question and a page's OCR words (the reading-comprehension
"exact-match" feature of DrQA / BiDAF, graded for OCR noise).

The question tower (CLIP BPE) and the OCR text encoder (WordPiece) share no vocabulary at
initialisation, so "which paragraph mentions “Lawyer”?" cannot be answered by learning alone
in a few CPU minutes. The collator therefore tells the model, for every content word j of a
question and every OCR word w, how well they match:

    NO_MATCH 0 < FUZZY 1 (edit distance 1, words of >= 5 letters) < CASEFOLD 2 < EXACT 3

and where word j sits among the question's CLIP tokens, so the model can read what role the
word plays in the question ("what is the <column> of <row>?") from the tower's features there.
Function words ("the", "of", "which", ...) are not matched: they occur on every page.
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

NO_MATCH, FUZZY, CASEFOLD, EXACT = 0, 1, 2, 3
NUM_MATCH_CODES = 4
FUZZY_MIN_LENGTH = 5   # below this one edit turns a word into another word too easily

STOPWORDS = frozenset("""
a an the of to in on at by for from with and or but not no is are was were be been being do does
did has have had it its this that these those there here what which who whom whose where when
why how all any each every some my your his her our their me you he she we they them i as into
than then so if about up out over under can will shall would should could may might must
""".split())

_EDGE_PUNCT = re.compile(r"^[^\w]+|[^\w]+$", re.UNICODE)


def normalise(word: str) -> str:
    """Strip punctuation at both ends (quotes, colons, commas): `“Lawyer”?` -> `Lawyer`."""
    return _EDGE_PUNCT.sub("", word)


def _deletions(word: str) -> set[str]:
    """The word and every string one deletion away (symmetric-delete edit-distance test)."""
    return {word} | {word[:i] + word[i + 1:] for i in range(len(word))}


def within_one_edit(a: str, b: str) -> bool:
    """Levenshtein distance <= 1 (one substitution, insertion or deletion)."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) <= 1
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return short in _deletions(long_)


_QUOTES = "\"'\u2018\u2019\u201c\u201d\u00ab\u00bb"


def question_content_words(question: str) -> list[tuple[int, str]]:
    """(index among the question's whitespace words, normalised word) of its content words.
    A quoted word is always content ("which paragraph mentions “under”?")."""
    out = []
    for i, raw in enumerate(question.split()):
        word = normalise(raw)
        quoted = raw[:1] in _QUOTES or raw.rstrip("?.!,;:")[-1:] in _QUOTES
        if word and (quoted or word.casefold() not in STOPWORDS) and (len(word) > 1 or word.isdigit()):
            out.append((i, word))
    return out


# A quotation right after one of these words is text the answer holds ("which paragraph mentions
# “Hiera”?", "where does the section “Usage” start?"); after others it need not be ("which value
# belongs to the field ‘Name’?" asks for the region next to the quoted label).
HOLDING_WORDS = frozenset("""
mention mentions mentioning contain contains containing include includes including say says saying
read reads reading titled called named entitled section heading chapter word words term phrase
""".split())


# A question naming one of these asks for a whole text unit holding its quotation ("which bullet
# point mentions “Hiera”?"), not for the quoted words themselves ("where is the word “Hiera”?").
UNIT_NOUNS = frozenset("paragraph paragraphs bullet bullets item items entry entries footnote footnotes "
                       "caption captions".split())


def names_text_unit(question: str) -> bool:
    """Whether the question asks for a text unit (paragraph, bullet point, list item, entry,
    footnote, caption: `UNIT_NOUNS`) that holds a quotation of it (`answer_quotes`)."""
    return bool(answer_quotes(question)) and any(normalise(raw).casefold() in UNIT_NOUNS for raw in question.split())


def answer_quotes(question: str) -> list[str]:
    """The normalised words of the question's quotations that its answer holds: those opened
    right after a `HOLDING_WORDS` word ("which paragraph mentions “under”?" -> ["under"])."""
    out, inside, holds, before = [], False, False, ""
    for raw in question.split():
        opens = raw[:1] in _QUOTES
        closes = raw.rstrip("?.!,;:")[-1:] in _QUOTES and (len(raw.rstrip("?.!,;:")) > 1 or not opens)
        if not inside and opens:
            inside, holds = True, before in HOLDING_WORDS
        word = normalise(raw)
        if inside and holds and word:
            out.append(word)
        if inside and closes:
            inside = False
        before = word.casefold()
    return out


def match_code(question_word: str, page_word: str) -> int:
    """The graded match of one normalised question word with one (raw) OCR word."""
    w = normalise(page_word)
    if not w:
        return NO_MATCH
    if w == question_word:
        return EXACT
    if w.casefold() == question_word.casefold():
        return CASEFOLD
    if min(len(w), len(question_word)) >= FUZZY_MIN_LENGTH and within_one_edit(
            w.casefold(), question_word.casefold()):
        return FUZZY
    return NO_MATCH


def match_matrix(question: str, words: Sequence[str], max_words: int) -> tuple[np.ndarray, list[int]]:
    """Match codes uint8 [J, W] of the first `max_words` content words of `question` against the
    page's words, and the whitespace-word index of each of those J content words."""
    content = question_content_words(question)[:max_words]
    codes = np.zeros((len(content), len(words)), dtype=np.uint8)
    if not content or not len(words):
        return codes, [i for i, _ in content]
    folded = {}
    for w_idx, raw in enumerate(words):
        folded.setdefault(normalise(raw).casefold(), []).append(w_idx)
    for j, (_, q) in enumerate(content):
        qf = q.casefold()
        for w_idx in folded.get(qf, ()):                      # exact or case-folded
            codes[j, w_idx] = match_code(q, words[w_idx])
        if len(q) >= FUZZY_MIN_LENGTH:
            for key, idxs in folded.items():
                if key != qf and len(key) >= FUZZY_MIN_LENGTH and within_one_edit(key, qf):
                    codes[j, idxs] = FUZZY
    return codes, [i for i, _ in content]


# A word's letter runs: "SPI_getbinval" -> SPI, getbinval; "self-serve" -> self, serve. A page's
# questions quote such runs (`dociq.data.synthetic.questions`), and an OCR reads a compound as one word.
_LETTER_RUN = re.compile(r"[^\W\d_]+", re.UNICODE)


def quoted_in_parts(quoted: Sequence[str], words: Sequence[str]) -> np.ndarray:
    """bool [J, K]: whether page word k holds quoted word j as one of its letter runs, case-folded
    ("getbinval" in "SPI_getbinval", "serve" in "self-serve"), or one edit away from one for words
    of FUZZY_MIN_LENGTH letters or more (an OCR's misread letter)."""
    out = np.zeros((len(quoted), len(words)), bool)
    runs = [[r.casefold() for r in _LETTER_RUN.findall(str(w))] for w in words]
    for j, q in enumerate(quoted):
        qf = q.casefold()
        fuzzy = len(qf) >= FUZZY_MIN_LENGTH
        for k, parts in enumerate(runs):
            out[j, k] = any(r == qf or (fuzzy and len(r) >= FUZZY_MIN_LENGTH and within_one_edit(r, qf))
                            for r in parts)
    return out


@lru_cache(maxsize=4096)
def _bpe_length(word: str) -> int:
    from open_clip.tokenizer import _tokenizer

    return len(_tokenizer.encode(word))


def clip_word_positions(question: str, word_indices: Sequence[int], context_length: int,
                        bpe_length: Callable[[str], int] | None = None) -> list[int]:
    """Position of the first CLIP BPE token of each whitespace word `word_indices` of `question`
    in `open_clip.tokenize(question)` (position 0 is the start-of-text token); -1 when the word
    was cut by the context length. open_clip BPE-encodes whitespace-separated pieces
    independently, so the positions add up word by word. `bpe_length`: the BPE token count of a
    word (default: open_clip's tokenizer; the ONNX runner counts with the `tokenizers` one)."""
    bpe_length = bpe_length or _bpe_length
    starts, pos = [], 1
    for raw in question.split():
        starts.append(pos)
        pos += bpe_length(raw)
    last = context_length - 2            # the final slot holds the end-of-text token
    return [starts[i] if starts[i] <= last else -1 for i in word_indices]


def word_recall(truth: list[str], read: list[str]) -> float:
    """Share of the true words (with repeats) among the words read."""
    want = Counter(normalise(w).casefold() for w in truth)
    got = Counter(normalise(w).casefold() for w in read)
    return sum((want & got).values()) / max(sum(want.values()), 1)


def word_precision(truth: list[str], read: list[str]) -> float:
    """Share of the words read (with repeats) that are true words; 1 when none is read."""
    return word_recall(read, truth) if read else 1.0
