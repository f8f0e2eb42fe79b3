"""Word-level grounding: which OCR words answer this prompt, drawn onto the page.

The mask decoder sees the page through a stride-16 embedding; a reading question ("which
paragraph mentions “Lawyer”?") names one word among hundreds, and at 16 px a cell holds parts
of several. `WordGrounding` lets the prompt reach the OCR words at word resolution:

1. every OCR token (the fusion trunk's text stream, one row per token, with its box) is tagged
   with its lexical match against the question's content words (`prompt_match`, see
   dociq.data.lexical): the match grade's embedding plus the question tower's feature at the
   matched word, so a token knows *which* question word it matches, not only that it does;
2. a small transformer runs per prompt over the page's tokens: self-attention with 2-D Fourier
   features of the boxes (a word can see that a matched key sits on its row, a matched
   header above its column), cross-attention to the question tokens;
3. each word gets a relevance logit (trained by a word-level loss: is the word inside the
   target mask?) and a feature vector; both are rasterised onto the word boxes by area
   coverage, giving a per-prompt dense map at stride 16 (added to the decoder's dense prompt
   embedding, SAM's slot for mask prompts) and one at stride 4 (added to the decoder's
   upscaled features just before the hypernetwork product, so masks can follow word edges).

Clicks take the same path (`click_words`): a click lands on words, and the words under it, with
their line and column, say which region is meant far better than a Gaussian bump at stride 16 can.
The word nearest each click (within `click_margin` layout units) is tagged as clicked, positive or
negative, and the tokens on its line and in its column get the click's row / column roles, as
matched question words do; the same transformer then spreads the click to its block.

With `text_blocks`, the page's text blocks (paragraphs, list items, headings: `ocr_block_index`,
grouped from the word boxes by dociq.data.text_blocks) join in: the tokens in the block of a
clicked or matched word get that block's role, every grounding layer adds each token its block's
mean, and the features are also painted over each block's whole box, so a mask can fill the
spaces between a paragraph's lines that no word box covers. A user clicking a paragraph means the
paragraph; at stride 4 of a 256-px page its lines are 3 px apart.

With `box_words`, a box prompt tags the words with at least half their box inside it (and, with
text blocks, the tokens of their blocks): a box drawn around a page number holds that number's
word, which a 3-px-tall line at stride 4 cannot show the decoder.

Prompts with neither a question nor a tagged word get zero maps: the decoder then behaves as SAM.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dociq.data.lexical import NUM_MATCH_CODES
from dociq.data.schema import LAYOUT_SCALE
from dociq.models.fusion import FusionAttention, FusionMLP, windowed_self_attention
from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT
from dociq.models.prompt_encoder import NEGATIVE_POINT as NEGATIVE_LABEL
from dociq.models.prompt_encoder import POSITIVE_POINT as POSITIVE_LABEL


def row_column_overlap(boxes: Tensor, others: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """How much two tokens share a text line and a column: the overlap of their y- (x-) extents
    over the smaller extent, in 0..1. boxes [B, T, 4] against `others` [B, S, 4] (default: the
    same boxes, with zero on the diagonal — a word is not its own neighbour) -> [B, T, S] each."""
    same = others is None
    a = boxes.float()
    o = a if same else others.float()

    def overlap(lo: Tensor, hi: Tensor, lo2: Tensor, hi2: Tensor) -> Tensor:
        inter = torch.minimum(hi[..., :, None], hi2[..., None, :]) - torch.maximum(lo[..., :, None], lo2[..., None, :])
        size, size2 = (hi - lo).clamp(min=1.0), (hi2 - lo2).clamp(min=1.0)
        out = inter.clamp(min=0) / torch.minimum(size[..., :, None], size2[..., None, :])
        if same:
            out = out * (1 - torch.eye(out.shape[-1], device=out.device, dtype=out.dtype))
        return out
    return overlap(a[..., 1], a[..., 3], o[..., 1], o[..., 3]), overlap(a[..., 0], a[..., 2], o[..., 0], o[..., 2])


def box_coverage(boxes: Tensor, height: int, width: int) -> Tensor:
    """Fraction of each cell of an `height` x `width` grid over the page that each box covers.

    boxes long/float [B, T, 4] in 0..LAYOUT_SCALE of the (square) input frame -> [B, T, h*w].
    Separable: the x-overlap of the box with each column times the y-overlap with each row."""
    b = boxes.float() / LAYOUT_SCALE
    cols = torch.arange(width, device=boxes.device, dtype=b.dtype)
    rows = torch.arange(height, device=boxes.device, dtype=b.dtype)
    x0, x1 = b[..., 0:1] * width, b[..., 2:3] * width
    y0, y1 = b[..., 1:2] * height, b[..., 3:4] * height
    ox = (torch.minimum(x1, cols + 1) - torch.maximum(x0, cols)).clamp(min=0)   # [B, T, w]
    oy = (torch.minimum(y1, rows + 1) - torch.maximum(y0, rows)).clamp(min=0)   # [B, T, h]
    return (oy[..., :, None] * ox[..., None, :]).flatten(-2)


@torch.no_grad()   # geometry of the inputs: no parameters inside
def sparse_box_coverage(boxes: Tensor, height: int, width: int, keep: Tensor | None = None) -> Tensor:
    """`box_coverage` as one sparse CSR matrix [B*h*w, B*T] (block-diagonal over the pages; the
    boxes of tokens where `keep` [B, T] is False left out): a word covers a few cells of the grid,
    so painting with it costs what the covered cells do, not h*w*T."""
    b, t, _ = boxes.shape
    f = boxes.float().reshape(-1, 4) / LAYOUT_SCALE
    x0, x1, y0, y1 = f[:, 0] * width, f[:, 2] * width, f[:, 1] * height, f[:, 3] * height
    c0, r0 = x0.floor().clamp(0, width).long(), y0.floor().clamp(0, height).long()
    nx = (x1.ceil().clamp(0, width).long() - c0).clamp(min=0)
    ny = (y1.ceil().clamp(0, height).long() - r0).clamp(min=0)
    if keep is not None:
        nx = nx * keep.reshape(-1).long()
    sizes = nx * ny
    token = torch.repeat_interleave(torch.arange(b * t, device=boxes.device), sizes)
    local = torch.arange(token.numel(), device=boxes.device) - (torch.cumsum(sizes, 0) - sizes)[token]
    col, row = c0[token] + local % nx[token], r0[token] + local // nx[token]
    value = ((torch.minimum(x1[token], col + 1) - torch.maximum(x0[token], col)).clamp(min=0)
             * (torch.minimum(y1[token], row + 1) - torch.maximum(y0[token], row)).clamp(min=0))
    cell = (token // t) * (height * width) + row * width + col
    coverage = torch.sparse_coo_tensor(torch.stack([cell, token]), value, (b * height * width, b * t),
                                       check_invariants=False).coalesce()
    with warnings.catch_warnings():     # torch calls CSR "beta" once per process; CSR @ dense is all we use
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return coverage.to_sparse_csr()


def first_subtokens(word_index: Tensor) -> Tensor:
    """bool [B, T]: the first WordPiece token of each OCR word (one row per word is rasterised)."""
    previous = F.pad(word_index[:, :-1], (1, 0), value=-1)
    return (word_index >= 0) & (word_index != previous)


def rasterise(features: Tensor, coverage: Tensor, grid: tuple[int, int]) -> Tensor:
    """Per-prompt token features [B*Q, T, C] painted with per-page coverage [B, T, h*w] (or its
    `sparse_box_coverage`) -> [B*Q, C, h, w]: each cell gets the coverage-weighted sum of the
    tokens over it."""
    n, t, c = features.shape
    sparse = coverage.layout == torch.sparse_csr                       # `sparse_box_coverage`
    b = coverage.shape[1] // t if sparse else coverage.shape[0]
    q = n // b
    per_page = features.view(b, q, t, c).permute(0, 2, 1, 3).reshape(b, t, q * c)
    if sparse:
        painted = (coverage @ per_page.reshape(b * t, q * c)).view(b, -1, q * c)   # [B, h*w, Q*C]
    else:
        painted = coverage.transpose(1, 2) @ per_page
    return painted.view(b, -1, q, c).permute(0, 2, 3, 1).reshape(n, c, *grid)


@torch.no_grad()   # geometry of the inputs: no parameters inside
def matched_on_line_and_column(matched: Tensor, boxes: Tensor) -> tuple[Tensor, Tensor]:
    """For prompt n, question word j and token t: the largest line (column) overlap between t and a
    token that matches word j. matched [N, J, T] (0/1, N = B*Q image-major), boxes [B, T, 4] ->
    two [N, J, T]. Only the matched tokens' rows of the overlap are read, so memory grows with
    the number of matches times T, not Q*J*T*T (a page of 3,000 tokens has ~9M token pairs)."""
    n, j, t = matched.shape
    b = boxes.shape[0]
    q = n // b
    in_row = torch.zeros(n * j, t, device=boxes.device)
    in_column = torch.zeros_like(in_row)
    for i in range(b):
        prompt_word, token = matched[i * q:(i + 1) * q].reshape(q * j, t).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        row, column = row_column_overlap(boxes[i:i + 1, token], boxes[i:i + 1])      # [1, K, T]
        own = torch.arange(token.numel(), device=token.device)
        row[0, own, token] = 0      # a word is not its own neighbour
        column[0, own, token] = 0
        target = (prompt_word + i * q * j)[:, None].expand(-1, t)
        in_row.scatter_reduce_(0, target, row[0], reduce="amax")
        in_column.scatter_reduce_(0, target, column[0], reduce="amax")
    return in_row.view(n, j, t), in_column.view(n, j, t)


@torch.no_grad()   # geometry of the inputs: no parameters inside
def clicked_words(coords: Tensor, labels: Tensor, boxes: Tensor, word_index: Tensor, input_size: int,
                  margin: float) -> Tensor:
    """Which tokens each prompt's clicks fall on: float [N, 2, T], row 0 positive clicks, row 1
    negative. A click takes the word whose box is nearest to it (distance 0 inside the box), all
    of that word's sub-tokens, if that distance is at most `margin` layout units; a click on an
    empty margin takes no word. coords float [N, P, 2] pixel indices of the square input frame,
    labels [N, P] (1 positive, 0 negative, others ignored), boxes [B, T, 4] in 0..LAYOUT_SCALE,
    word_index long [B, T] (-1: special or padding), N = B*Q image-major."""
    n, b = coords.shape[0], boxes.shape[0]
    q = n // b
    xy = (coords.float() + 0.5) / input_size * LAYOUT_SCALE                       # pixel centres
    bx = boxes.float().repeat_interleave(q, dim=0)[:, None]                         # [N, 1, T, 4]
    x, y = xy[..., 0:1], xy[..., 1:2]                                              # [N, P, 1]
    dx = (bx[..., 0] - x).clamp(min=0) + (x - bx[..., 2]).clamp(min=0)
    dy = (bx[..., 1] - y).clamp(min=0) + (y - bx[..., 3]).clamp(min=0)
    dist = torch.hypot(dx, dy)                                                      # [N, P, T]
    is_word = (word_index >= 0).repeat_interleave(q, dim=0)[:, None]
    dist = dist.masked_fill(~is_word, float("inf"))
    nearest = dist.amin(dim=-1, keepdim=True)
    hit = (dist <= nearest + 1e-3) & (nearest <= margin)
    rows = [(hit & (labels == label)[..., None]).any(dim=1) for label in (POSITIVE_LABEL, NEGATIVE_LABEL)]
    return torch.stack(rows, dim=1).float()


def box_prompts(coords: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """The box of each prompt from its BOX_TOP_LEFT / BOX_BOTTOM_RIGHT points: float [N, 4] (x0, y0,
    x1, y1 in the points' pixels; zeros where a corner is missing) and has_box bool [N]."""
    corners = []
    for label in (BOX_TOP_LEFT, BOX_BOTTOM_RIGHT):
        pick = (labels == label).to(coords.dtype)[..., None]
        corners.append((coords * pick).sum(1) / pick.sum(1).clamp(min=1))            # [N, 2]
    has_box = (labels == BOX_TOP_LEFT).any(1) & (labels == BOX_BOTTOM_RIGHT).any(1)
    return torch.cat(corners, dim=1), has_box


def boxed_words(coords: Tensor, labels: Tensor, boxes: Tensor, word_index: Tensor, input_size: int,
                min_inside: float = 0.5) -> Tensor:
    """Which tokens each prompt's box holds: float [N, 1, T], 1 for every sub-token of a word with at
    least `min_inside` of its box's area inside the prompt box (`box_prompts`; prompts without a
    box hold none). coords float [N, P, 2] pixel indices of the square input frame, labels [N, P],
    boxes [B, T, 4] in 0..LAYOUT_SCALE, word_index long [B, T]."""
    n, b = coords.shape[0], boxes.shape[0]
    prompt, has_box = box_prompts(coords.float(), labels)
    p = (prompt / input_size * LAYOUT_SCALE)[:, None]                                  # [N, 1, 4]
    bx = boxes.float().repeat_interleave(n // b, dim=0)                                # [N, T, 4]
    iw = (torch.minimum(bx[..., 2], p[..., 2]) - torch.maximum(bx[..., 0], p[..., 0])).clamp(min=0)
    ih = (torch.minimum(bx[..., 3], p[..., 3]) - torch.maximum(bx[..., 1], p[..., 1])).clamp(min=0)
    area = ((bx[..., 2] - bx[..., 0]) * (bx[..., 3] - bx[..., 1])).clamp(min=1e-6)
    inside = (iw * ih / area >= min_inside) & (word_index >= 0).repeat_interleave(n // b, dim=0)
    return (inside & has_box[:, None]).float()[:, None]


def _block_slots(block_index: Tensor, prompts: int, count: int | None = None) -> tuple[Tensor, int]:
    """Per prompt and token, its block's slot: long [N, T] (0 = no block, k + 1 = block k) and
    the number of slots (`count` when the caller knows it: a traced graph cannot read it off the
    values)."""
    slots = (block_index.long() + 1).clamp(min=0).repeat_interleave(prompts, dim=0)
    if count is not None:
        return slots, count
    return slots, int(slots.max()) + 1 if slots.numel() else 1


@torch.no_grad()   # geometry of the inputs: no parameters inside
def in_tagged_block(tagged: Tensor, block_index: Tensor) -> Tensor:
    """For prompt n, row k and token t: 1 when t lies in a text block that holds a token tagged in
    row k. tagged [N, K, T] (0/1; N = B*Q image-major), block_index long [B, T] (-1: no block) ->
    float [N, K, T]."""
    n, k, _ = tagged.shape
    slots, count = _block_slots(block_index, n // block_index.shape[0])
    index = slots[:, None].expand(-1, k, -1)
    hit = tagged.new_zeros(n, k, count, dtype=torch.float32)
    hit.scatter_reduce_(2, index, (tagged > 0).float(), reduce="amax")
    hit[..., 0] = 0                      # tokens in no block share nothing
    return hit.gather(2, index)


def block_means(x: Tensor, block_index: Tensor, count: int | None = None) -> tuple[Tensor, Tensor]:
    """Per prompt, the mean token feature of every text block: x [N, T, C], block_index [B, T] ->
    (means [N, S, C] per slot, slot 0 = tokens in no block, zeroed; slots long [N, T])."""
    n, _, c = x.shape
    slots, count = _block_slots(block_index, n // block_index.shape[0], count)
    sums = x.new_zeros(n, count, c).scatter_add_(1, slots[..., None].expand(-1, -1, c), x)
    counts = x.new_zeros(n, count).scatter_add_(1, slots, torch.ones_like(slots, dtype=x.dtype))
    means = sums / counts.clamp(min=1)[..., None]
    return torch.cat([torch.zeros_like(means[:, :1]), means[:, 1:]], dim=1), slots


@torch.no_grad()
def block_extents(boxes: Tensor, block_index: Tensor) -> Tensor:
    """The box around each text block's tokens: boxes [B, T, 4], block_index [B, T] -> float
    [B, S, 4] per slot (slot 0 and absent blocks: an empty box)."""
    slots, count = _block_slots(block_index, 1)
    b = boxes.float()
    lo = b.new_full((b.shape[0], count, 2), float("inf")).scatter_reduce_(
        1, slots[..., None].expand(-1, -1, 2), b[..., :2], reduce="amin")
    hi = b.new_full((b.shape[0], count, 2), float("-inf")).scatter_reduce_(
        1, slots[..., None].expand(-1, -1, 2), b[..., 2:], reduce="amax")
    out = torch.cat([lo, hi], dim=-1)
    out[:, 0] = 0
    return torch.where(torch.isfinite(out), out, torch.zeros_like(out))


def prompt_geometry(match: Tensor, boxes: Tensor, clicked: Tensor | None = None, boxed: Tensor | None = None,
                    block_index: Tensor | None = None, alignment: bool = True) -> dict[str, Tensor]:
    """What the grounding reads of the prompts' and words' geometry, computed from its inputs
    alone (no parameters): the lines and columns of matched question words ("match_row",
    "match_column", with `alignment`) and of clicked words ("click_row", "click_column"), the
    blocks holding matched, clicked and boxed words ("match_block", "click_block", "box_block")
    and the blocks' extents ("block_boxes" [B, S, 4], `block_extents`), each only when its input
    is given. dociq.inference.onnx_geometry computes the same in numpy for the exported graph."""
    on = (match.long() > 0).float()
    out: dict[str, Tensor] = {}
    if alignment:
        out["match_row"], out["match_column"] = matched_on_line_and_column(on, boxes)
    if clicked is not None:
        out["click_row"], out["click_column"] = matched_on_line_and_column(clicked.float(), boxes)
    if block_index is not None:
        out["match_block"] = in_tagged_block(on, block_index)
        if clicked is not None:
            out["click_block"] = in_tagged_block(clicked.float(), block_index)
        if boxed is not None:
            out["box_block"] = in_tagged_block(boxed.float(), block_index)
        out["block_boxes"] = block_extents(boxes, block_index)
    return out


class BoxFourierFeatures(nn.Module):
    """Box centre (sin/cos at octave frequencies) and size -> `dim`. Dot products of these
    features are smooth functions of centre differences: "same row", "same column"."""

    def __init__(self, dim: int, num_frequencies: int = 8) -> None:
        super().__init__()
        self.register_buffer("freqs", math.pi * 2.0 ** torch.arange(num_frequencies).float(), persistent=False)
        self.proj = nn.Linear(4 * num_frequencies + 2, dim)

    def forward(self, boxes: Tensor) -> Tensor:
        b = boxes.float() / LAYOUT_SCALE
        centre = torch.stack([(b[..., 0] + b[..., 2]) / 2, (b[..., 1] + b[..., 3]) / 2], dim=-1)
        size = torch.stack([b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]], dim=-1)
        angles = (centre[..., None] * self.freqs).flatten(-2)            # [B, T, 2F]
        return self.proj(torch.cat([angles.sin(), angles.cos(), size], dim=-1))


class GroundingBlock(nn.Module):
    """Pre-norm: self-attention over the page's tokens (positions on q/k), cross-attention to
    the question tokens, MLP."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, window: int | None = None,
                 shift: bool = False) -> None:
        super().__init__()
        self.window, self.shift = window, shift
        self.norm_self, self.norm_cross, self.norm_mlp = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.self_attn = FusionAttention(dim, num_heads)
        self.cross_attn = FusionAttention(dim, num_heads)
        self.mlp = FusionMLP(dim, mlp_ratio)

    def forward(self, x: Tensor, pos: Tensor, key_mask: Tensor, question: Tensor) -> Tensor:
        h = self.norm_self(x) + pos
        x = x + windowed_self_attention(self.self_attn, h, key_mask, self.window, self.shift)
        x = x + self.cross_attn(self.norm_cross(x) + pos, question)
        return x + self.mlp(self.norm_mlp(x))


@dataclass
class Grounding:
    relevance: Tensor          # [N, T] logit: this token's word lies in the answer
    dense: Tensor              # [N, C, h, w] stride-16 map (zero for prompts without a question)
    high_res: Tensor           # [N, C/8, 4h, 4w] stride-4 map (likewise)
    coverage_high_res: Tensor | None  # [B, T, 4h*4w] per-page coverage at stride 4 (first sub-tokens
                                      # only); None with a sparse `PageLayout`
    words: Tensor              # bool [B, T] the rasterised tokens (first sub-token of each word)
    active: Tensor             # bool [N] prompts with a question or tagged words (maps not zero)


@dataclass
class PageLayout:
    """What the grounding paints its maps with, from the page's tokens alone (no prompt, no
    parameter): computed once per page by `WordGrounding.page_layout`. Coverage is dense [B, T,
    cells] (training: the word loss reads it) or `sparse_box_coverage` (a Predictor's page)."""
    words: Tensor                       # bool [B, T] the rasterised tokens (first sub-token of each word)
    coverage: Tensor                    # the words' stride-16 coverage
    coverage_high_res: Tensor           # the words' stride-4 coverage
    block_coverage: Tensor | None = None            # the text blocks' boxes (`block_extents`), stride 16
    block_coverage_high_res: Tensor | None = None   # and stride 4

    @property
    def sparse(self) -> bool:
        return self.coverage.layout == torch.sparse_csr


class WordGrounding(nn.Module):
    def __init__(self, text_dim: int, dim: int, high_res_dim: int, depth: int = 2, num_heads: int = 4,
                 mlp_ratio: float = 2.0, num_frequencies: int = 8, alignment: bool = True,
                 window: int | None = None, *, click_words: bool, text_blocks: bool, box_words: bool,
                 click_margin: float = 20.0) -> None:
        """text_dim: width of the fusion trunk's text tokens; dim: the decoder width (question
        tokens arrive at this width); high_res_dim: channels of the decoder's stride-4 features.
        alignment: also tell each token which question words are matched on its text line and in
        its column (a table cell is where the row key's line crosses the header's column).
        click_words: clicks tag the word they fall on (see `clicked_words`); click_margin: how far
        from a word, in layout units (0..1000 of the page frame), a click still takes it.
        text_blocks: use the page's text blocks (module docstring; the batch key `ocr_block_index`).
        box_words: the words inside a box prompt are tagged too (see `boxed_words`)."""
        super().__init__()
        self.alignment = alignment
        self.click_words, self.click_margin = bool(click_words), float(click_margin)
        self.text_blocks = bool(text_blocks)
        if self.click_words:
            # [positive, negative]: the clicked word itself, tokens on its line, tokens in its column
            self.click_embed = nn.Parameter(torch.randn(2, dim) * 0.02)
            self.click_row = nn.Parameter(torch.randn(2, dim) * 0.02)
            self.click_column = nn.Parameter(torch.randn(2, dim) * 0.02)
            if self.text_blocks:   # tokens in the clicked word's block
                self.click_block = nn.Parameter(torch.randn(2, dim) * 0.02)
        self.box_words = bool(box_words)
        if self.box_words:     # a word inside the prompt box, and (with text blocks) a token in its block
            self.box_embed = nn.Parameter(torch.randn(dim) * 0.02)
            if self.text_blocks:
                self.box_block = nn.Parameter(torch.randn(dim) * 0.02)
        if self.text_blocks:
            self.block_role = nn.Linear(dim, dim)     # question word matched in the token's block
            self.block_mix = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim)) for _ in range(depth))
            self.block_to_dense = nn.Linear(dim + 1, dim)
            self.block_to_high_res = nn.Linear(dim + 1, high_res_dim)
        if alignment:
            self.row_role = nn.Linear(dim, dim)
            self.column_role = nn.Linear(dim, dim)
        self.text_in = nn.Sequential(nn.LayerNorm(text_dim), nn.Linear(text_dim, dim))
        self.word_role = nn.Linear(dim, dim)            # question tower feature of the matched word
        self.match_embed = nn.Embedding(NUM_MATCH_CODES, dim)   # summed over matched question words
        self.best_match_embed = nn.Embedding(NUM_MATCH_CODES, dim)
        self.pos = BoxFourierFeatures(dim, num_frequencies)
        self.blocks = nn.ModuleList(GroundingBlock(dim, num_heads, mlp_ratio, window, shift=i % 2 == 1)
                                    for i in range(depth))
        self.norm_out = nn.LayerNorm(dim)
        self.relevance_head = nn.Linear(dim, 1)
        self.to_dense = nn.Linear(dim + 1, dim)
        self.to_high_res = nn.Linear(dim + 1, high_res_dim)

    def forward(self, text_tokens: Tensor, boxes: Tensor, token_mask: Tensor, word_index: Tensor,
                question_tokens: Tensor, match: Tensor, word_pos: Tensor, has_question: Tensor,
                grid: tuple[int, int], clicked: Tensor | None = None,
                block_index: Tensor | None = None, boxed: Tensor | None = None,
                geometry: dict[str, Tensor] | None = None, layout: PageLayout | None = None) -> Grounding:
        """text_tokens [B,T,Dt] (fusion text stream), boxes long [B,T,4], token_mask bool [B,T]
        (real tokens), word_index long [B,T]; per prompt (N = B*Q, image-major): question_tokens
        [N, 1+L, dim] (pooled, then one per CLIP position), match uint8 [N,J,T], word_pos long
        [N,J] (CLIP position of content word j, -1 none), has_question bool [N], clicked float
        [N, 2, T] (`clicked_words`; only with click_words). grid: the stride-16 (h, w) of the
        decoder's image embedding. block_index long [B,T] (`ocr_block_index`; with text_blocks).
        boxed float [N, 1, T] (`boxed_words`; only with box_words). geometry: what
        `prompt_geometry` computes from these inputs alone (no parameters), given precomputed
        (an exported graph gets it from the ONNX runner, which computes it in numpy). layout: the
        page's `page_layout`, when the caller keeps it for many prompts (computed here otherwise)."""
        b, t, _ = text_tokens.shape
        n = question_tokens.shape[0]
        if n % b:
            raise ValueError(f"WordGrounding: {n} prompts for {b} pages; prompts are flattened B*Q")
        if self.text_blocks and block_index is None:
            raise KeyError("this model's word grounding uses the page's text blocks: the batch needs the key "
                           "`ocr_block_index` (DocumentCollator(..., blocks=True) makes it)")
        blocks = block_index if self.text_blocks else None
        if geometry is None:
            geometry = prompt_geometry(match, boxes, clicked, boxed, blocks, self.alignment)
        q = n // b
        x = self.text_in(text_tokens).repeat_interleave(q, dim=0)                 # [N, T, C]
        x = x + self._match_features(question_tokens, match, word_pos, geometry, blocks)
        active = has_question.bool()
        if clicked is not None:
            if not self.click_words:
                raise ValueError("WordGrounding got clicks but was built with click_words=False")
            x = x + self._click_features(clicked, geometry, blocks)
            active = active | clicked.flatten(1).bool().any(1)
        if boxed is not None:
            if not self.box_words:
                raise ValueError("WordGrounding got boxed words but was built with box_words=False")
            x = x + self._box_features(boxed, geometry, blocks)
            active = active | boxed.flatten(1).bool().any(1)
        pos = self.pos(boxes).repeat_interleave(q, dim=0)
        key_mask = token_mask.bool().repeat_interleave(q, dim=0)
        x = x + pos
        for i, block in enumerate(self.blocks):
            x = block(x, pos, key_mask, question_tokens)
            if blocks is not None:   # every token hears its whole text block, whatever the window
                means, slots = block_means(x, blocks, geometry["block_boxes"].shape[1])
                x = x + self.block_mix[i](means.gather(1, slots[..., None].expand_as(x)))
        x = self.norm_out(x)
        relevance = self.relevance_head(x)                                           # [N, T, 1]
        feats = torch.cat([x, relevance], dim=-1)
        if layout is None:
            layout = self.page_layout(boxes, token_mask, word_index, grid, blocks, geometry.get("block_boxes"))
        h, w = grid
        dense = rasterise(self.to_dense(feats), layout.coverage, (h, w))
        high_res = rasterise(self.to_high_res(feats), layout.coverage_high_res, (4 * h, 4 * w))
        if blocks is not None:
            means, _ = block_means(feats, blocks, geometry["block_boxes"].shape[1])     # [N, S, C+1]
            dense = dense + rasterise(self.block_to_dense(means), layout.block_coverage, (h, w))
            high_res = high_res + rasterise(self.block_to_high_res(means), layout.block_coverage_high_res,
                                            (4 * h, 4 * w))
        gate = active.to(x.dtype)[:, None, None, None]
        return Grounding(relevance[..., 0], dense * gate, high_res * gate,
                         None if layout.sparse else layout.coverage_high_res, layout.words, active)

    def page_layout(self, boxes: Tensor, token_mask: Tensor, word_index: Tensor, grid: tuple[int, int],
                    block_index: Tensor | None = None, extents: Tensor | None = None,
                    sparse: bool = False) -> PageLayout:
        """The page's `PageLayout` on the decoder's stride-16 `grid` (h, w) and its stride-4 grid:
        the coverage of each word's box (first sub-tokens of real tokens), and with text blocks of
        each block's box (`extents` [B, S, 4], `block_extents`, computed when not given).
        sparse: `sparse_box_coverage` (for inference: a Predictor keeps it per page)."""
        h, w = grid
        words = first_subtokens(word_index) & token_mask.bool()

        def cover(source: Tensor, gh: int, gw: int, keep: Tensor | None = None) -> Tensor:
            if sparse:
                return sparse_box_coverage(source, gh, gw, keep=keep)
            out = box_coverage(source, gh, gw)
            return out if keep is None else out * keep[..., None]
        layout = PageLayout(words, cover(boxes, h, w, words), cover(boxes, 4 * h, 4 * w, words))
        if self.text_blocks and block_index is not None:
            if extents is None:
                extents = block_extents(boxes, block_index)
            layout.block_coverage = cover(extents, h, w)
            layout.block_coverage_high_res = cover(extents, 4 * h, 4 * w)
        return layout

    def _click_features(self, clicked: Tensor, geometry: dict[str, Tensor],
                        block_index: Tensor | None = None) -> Tensor:
        """Per token: the click roles of the word it is (clicked), of the clicked word on its line,
        in its column and (with text blocks) in its block. clicked [N, 2, T] -> [N, T, C]."""
        clicked = clicked.to(self.click_embed.dtype)
        in_row, in_column = geometry["click_row"], geometry["click_column"]
        out = (torch.einsum("nkt,kc->ntc", clicked, self.click_embed)
               + torch.einsum("nkt,kc->ntc", in_row.to(clicked.dtype), self.click_row)
               + torch.einsum("nkt,kc->ntc", in_column.to(clicked.dtype), self.click_column))
        if block_index is not None:
            in_block = geometry["click_block"].to(clicked.dtype)
            out = out + torch.einsum("nkt,kc->ntc", in_block, self.click_block)
        return out

    def _box_features(self, boxed: Tensor, geometry: dict[str, Tensor], block_index: Tensor | None = None) -> Tensor:
        """Per token: the box role when its word lies inside the prompt box, and (with text blocks)
        the box-block role when its block holds such a word. boxed [N, 1, T] -> [N, T, C]."""
        boxed = boxed.to(self.box_embed.dtype)
        out = boxed[:, 0, :, None] * self.box_embed
        if block_index is not None:
            in_block = geometry["box_block"].to(boxed.dtype)
            out = out + in_block[:, 0, :, None] * self.box_block
        return out

    def _match_features(self, question_tokens: Tensor, match: Tensor, word_pos: Tensor,
                        geometry: dict[str, Tensor], block_index: Tensor | None = None) -> Tensor:
        """Per token: sum over the question words it matches of (role of that word + grade
        embedding), plus the embedding of its best grade; with `alignment`, plus the roles of the
        question words matched on its line and in its column; with text blocks, plus the roles of
        the question words matched in its block. -> [N, T, C]"""
        codes = match.long()
        valid = (word_pos >= 0).to(question_tokens.dtype)                           # [N, J]
        index = (word_pos.clamp(min=0) + 1).clamp(max=question_tokens.shape[1] - 1)  # +1: pooled token first
        word_feats = question_tokens.gather(1, index[..., None].expand(-1, -1, question_tokens.shape[-1]))
        role = self.word_role(word_feats) * valid[..., None]                        # [N, J, C]
        on = (codes > 0).to(role.dtype)
        out = torch.einsum("njt,njc->ntc", on, role)
        grades = F.one_hot(codes, NUM_MATCH_CODES).to(role.dtype).sum(1)[..., 1:]   # [N, T, 3]
        out = out + grades @ self.match_embed.weight[1:]
        if self.alignment:
            in_row, in_column = geometry["match_row"], geometry["match_column"]    # [N, J, T] each
            valid_j = valid[..., None]
            out = out + torch.einsum("njt,njc->ntc", in_row * valid_j, self.row_role(word_feats)) \
                + torch.einsum("njt,njc->ntc", in_column * valid_j, self.column_role(word_feats))
        if block_index is not None:
            in_block = geometry["match_block"].to(role.dtype) * valid[..., None]
            out = out + torch.einsum("njt,njc->ntc", in_block, self.block_role(word_feats))
        return out + self.best_match_embed(codes.amax(dim=1))   # J >= 1: the collator always pads to J


class BoxMaps(nn.Module):
    """Box prompts painted onto the decoder's grids, next to SAM's two corner tokens.

    A box's corner tokens tell the decoder where the box is only through attention; on a CPU
    budget the decoder had not learned to use them after 250 steps (box-only mIoU ~0). Painting
    the box's coverage (the same `box_coverage` as the words) times a learned vector onto the
    stride-16 dense prompt and the stride-4 upscaled features gives every image position "inside
    the box or not" directly; the corner tokens still carry the box for attention."""

    def __init__(self, dim: int, high_res_dim: int) -> None:
        super().__init__()
        self.dense = nn.Parameter(torch.zeros(dim))
        self.high_res = nn.Parameter(torch.zeros(high_res_dim))
        nn.init.normal_(self.dense, std=0.02)
        nn.init.normal_(self.high_res, std=0.02)

    def forward(self, boxes: Tensor, has_box: Tensor, input_size: int, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """boxes float [N, 4] pixels of the input frame, has_box bool [N] -> (dense [N, C, h, w],
        high_res [N, C/8, 4h, 4w]); zero for prompts without a box."""
        h, w = grid
        layout = (boxes / input_size * LAYOUT_SCALE).clamp(0, LAYOUT_SCALE)[:, None]     # [N, 1, 4]
        on = has_box.to(boxes.dtype)[:, None]
        cov16 = box_coverage(layout, h, w)[:, 0] * on                                     # [N, h*w]
        cov4 = box_coverage(layout, 4 * h, 4 * w)[:, 0] * on
        dense = cov16[:, None, :] * self.dense[None, :, None]
        high_res = cov4[:, None, :] * self.high_res[None, :, None]
        return dense.view(-1, self.dense.shape[0], h, w), high_res.view(-1, self.high_res.shape[0], 4 * h, 4 * w)



class ClickMaps(nn.Module):
    """Clicks painted onto the decoder's grids (RITM's click maps), next to SAM's point tokens.

    Like box corners, a click token tells the decoder where it is only through attention, and on
    a CPU budget the decoder did not learn it (a lone click scored ~5 mIoU after 2000 steps).
    Each click adds a Gaussian bump (sigma = `sigma` x the input size: 8 px at 256 px) times a
    learned vector — one for positive, one for negative clicks, the max over clicks of each kind
    — to the stride-16 dense prompt and the stride-4 upscaled features."""

    def __init__(self, dim: int, high_res_dim: int, sigma: float = 1 / 32) -> None:
        super().__init__()
        self.sigma = float(sigma)
        self.dense = nn.Parameter(torch.zeros(2, dim))          # [positive, negative]
        self.high_res = nn.Parameter(torch.zeros(2, high_res_dim))
        nn.init.normal_(self.dense, std=0.02)
        nn.init.normal_(self.high_res, std=0.02)

    def bumps(self, coords: Tensor, labels: Tensor, input_size: int, h: int, w: int) -> Tensor:
        """[N, 2, h*w]: per prompt, the max over its positive (row 0) / negative (row 1) clicks
        of exp(-d^2 / 2 sigma^2), d the distance of each grid cell's centre to the click (px)."""
        ys = (torch.arange(h, device=coords.device, dtype=coords.dtype) + 0.5) * (input_size / h)
        xs = (torch.arange(w, device=coords.device, dtype=coords.dtype) + 0.5) * (input_size / w)
        centres = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1).view(1, 1, h * w, 2)
        # coords are pixel indices; +0.5 moves them to pixel centres, as the cell centres are
        d2 = ((coords[:, :, None, :] + 0.5) - centres).square().sum(-1)                 # [N, P, h*w]
        bump = torch.exp(-d2 / (2 * (self.sigma * input_size) ** 2))
        out = []
        for label in (POSITIVE_LABEL, NEGATIVE_LABEL):
            on = (labels == label).to(bump.dtype)[..., None]
            out.append((bump * on).amax(dim=1))
        return torch.stack(out, dim=1)

    def forward(self, coords: Tensor, labels: Tensor, input_size: int,
                grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """coords float [N, P, 2] pixels of the input frame, labels [N, P] (1 positive, 0 negative,
        others ignored) -> (dense [N, C, h, w], high_res [N, C/8, 4h, 4w])."""
        h, w = grid
        b16 = self.bumps(coords, labels, input_size, h, w)                     # [N, 2, h*w]
        b4 = self.bumps(coords, labels, input_size, 4 * h, 4 * w)
        dense = torch.einsum("nkp,kc->ncp", b16, self.dense)
        high_res = torch.einsum("nkp,kc->ncp", b4, self.high_res)
        return dense.view(-1, self.dense.shape[1], h, w), high_res.view(-1, self.high_res.shape[1], 4 * h, 4 * w)