"""Word grounding: box coverage, rasterisation, match features, gating and the word loss."""
import pytest
import torch

from dociq.data.lexical import CASEFOLD, EXACT
from dociq.models.grounding import (WordGrounding, block_extents, box_coverage, first_subtokens, rasterise,
                                    sparse_box_coverage)
from dociq.models.sizes import complete_model_config
from dociq.training.tasks.finetune import word_relevance_loss

# model=tiny on 128-px pages with one text and one fusion layer
SMALL = {"size": "tiny", "image_size": 128, "text_encoder": {"num_hidden_layers": 1}, "fusion": {"depth": 1}}


def test_box_coverage_is_the_covered_fraction_of_each_cell():
    # a 4x4 grid over the page: cells of 250 layout units
    boxes = torch.tensor([[[0, 0, 250, 250],          # exactly cell (0, 0)
                           [125, 500, 375, 625],      # half of (2,0)+(2,1) wide, half a cell high
                           [0, 0, 1000, 1000]]])      # the whole page
    cov = box_coverage(boxes, 4, 4).view(1, 3, 4, 4)
    expect0 = torch.zeros(4, 4)
    expect0[0, 0] = 1
    torch.testing.assert_close(cov[0, 0], expect0)
    expect1 = torch.zeros(4, 4)
    expect1[2, 0] = expect1[2, 1] = 0.25
    torch.testing.assert_close(cov[0, 1], expect1)
    torch.testing.assert_close(cov[0, 2], torch.ones(4, 4))
    # total coverage = box area in cells, at any resolution
    for side in (4, 16, 64):
        area = box_coverage(boxes, side, side).sum(-1) / side ** 2
        torch.testing.assert_close(area[0], torch.tensor([1 / 16, 1 / 32, 1.0]))


def test_rasterise_equals_a_per_cell_sum():
    torch.manual_seed(0)
    b, q, t, c, h, w = 2, 3, 5, 4, 4, 4
    feats = torch.randn(b * q, t, c)
    cov = torch.rand(b, t, h * w)
    out = rasterise(feats, cov, (h, w))
    assert out.shape == (b * q, c, h, w)
    for n in range(b * q):
        page = n // q
        naive = torch.einsum("tc,ts->cs", feats[n], cov[page]).view(c, h, w)
        torch.testing.assert_close(out[n], naive)


@pytest.mark.parametrize("side", [4, 16, 64])
def test_sparse_coverage_equals_the_dense_one_page_by_page(side):
    torch.manual_seed(side)
    lo = torch.randint(0, 990, (3, 40, 2))
    boxes = torch.cat([lo, lo + torch.randint(0, 300, (3, 40, 2))], -1).clamp(max=1000)  # some empty, some at the edge
    boxes[0, 0] = torch.tensor([0, 0, 1000, 1000])
    keep = torch.rand(3, 40) > 0.3
    sparse = sparse_box_coverage(boxes, side, side, keep=keep).to_dense()              # [B*h*w, B*T]
    dense = box_coverage(boxes, side, side) * keep[..., None]                          # [B, T, h*w]
    expect = torch.block_diag(*[dense[i].T for i in range(3)])
    torch.testing.assert_close(sparse, expect)
    feats = torch.randn(3 * 2, 40, 5)
    torch.testing.assert_close(rasterise(feats, sparse_box_coverage(boxes, side, side, keep=keep), (side, side)),
                               rasterise(feats, dense, (side, side)))


def test_a_kept_sparse_page_layout_grounds_as_the_dense_one():
    torch.manual_seed(0)
    boxes, word_index, block_index = _two_block_page()
    text, mask = torch.randn(1, 6, 16), torch.ones(1, 6, dtype=torch.bool)
    question = torch.randn(2, 9, 32)
    match, word_pos = torch.zeros(2, 1, 6, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.long)
    match[0, 0, 1] = match[1, 0, 4] = EXACT
    g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, text_blocks=True, click_words=False, box_words=False)
    args = (text, boxes, mask, word_index, question, match, word_pos, torch.ones(2, dtype=torch.bool), (4, 4))
    dense = g(*args, block_index=block_index)
    layout = g.page_layout(boxes, mask, word_index, (4, 4), block_index, block_extents(boxes, block_index), sparse=True)
    kept = g(*args, block_index=block_index, layout=layout)
    torch.testing.assert_close(kept.dense, dense.dense)
    torch.testing.assert_close(kept.high_res, dense.high_res)
    torch.testing.assert_close(kept.relevance, dense.relevance)
    assert dense.high_res.abs().sum() > 0 and kept.coverage_high_res is None


def test_first_subtokens_pick_one_row_per_word():
    word_index = torch.tensor([[-1, 0, 0, 1, 2, 2, 2, -1, -1]])
    assert first_subtokens(word_index).tolist() == [[False, True, False, True, True, False, False, False, False]]


def _inputs(n_pages=2, q=2, t=6, text_dim=16, dim=32, j=3, length=8):
    torch.manual_seed(0)
    text = torch.randn(n_pages, t, text_dim)
    boxes = torch.tensor([[i * 150, 100, i * 150 + 120, 160] for i in range(t)]).expand(n_pages, t, 4).clone()
    mask = torch.ones(n_pages, t, dtype=torch.bool)
    word_index = torch.arange(t).expand(n_pages, t).clone()
    question = torch.randn(n_pages * q, 1 + length, dim)
    match = torch.zeros(n_pages * q, j, t, dtype=torch.uint8)
    word_pos = torch.full((n_pages * q, j), -1)
    return text, boxes, mask, word_index, question, match, word_pos


def test_outputs_have_the_decoder_shapes_and_no_question_means_no_map():
    g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, click_words=False, text_blocks=False, box_words=False)
    text, boxes, mask, word_index, question, match, word_pos = _inputs()
    has_q = torch.tensor([True, False, True, True])
    out = g(text, boxes, mask, word_index, question, match, word_pos, has_q, (4, 4))
    assert out.relevance.shape == (4, 6)
    assert out.dense.shape == (4, 32, 4, 4) and out.high_res.shape == (4, 4, 16, 16)
    assert out.dense[1].abs().sum() == 0 and out.high_res[1].abs().sum() == 0   # a box/click-only prompt
    assert out.dense[0].abs().sum() > 0
    # maps are zero where no word lies (row 0 of the 4x4 grid: boxes span y 100..160 of 1000)
    assert out.dense[0, :, 0].abs().sum() > 0 and out.dense[0, :, 2:].abs().sum() == 0


def test_a_matched_word_changes_its_own_relevance_and_knows_which_question_word():
    # no mixing between tokens (no blocks, no line/column alignment): the effect stays on the token
    g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, depth=0, alignment=False, click_words=False,
                      text_blocks=False, box_words=False)
    text, boxes, mask, word_index, question, match, word_pos = _inputs(n_pages=1, q=1)
    has_q = torch.ones(1, dtype=torch.bool)
    base = g(text, boxes, mask, word_index, question, match, word_pos, has_q, (4, 4)).relevance
    word_pos[0, 0], word_pos[0, 1] = 2, 5
    match1 = match.clone()
    match1[0, 0, 3] = EXACT                                   # token 3 matches question word 0
    r1 = g(text, boxes, mask, word_index, question, match1, word_pos, has_q, (4, 4)).relevance
    changed = (r1 - base).abs() > 1e-6
    assert changed.tolist() == [[False, False, False, True, False, False]]
    match2 = match.clone()
    match2[0, 1, 3] = EXACT                                   # same grade, another question word
    r2 = g(text, boxes, mask, word_index, question, match2, word_pos, has_q, (4, 4)).relevance
    assert not torch.allclose(r1[0, 3], r2[0, 3])
    match3 = match.clone()
    match3[0, 0, 3] = CASEFOLD                                # same word, another grade
    r3 = g(text, boxes, mask, word_index, question, match3, word_pos, has_q, (4, 4)).relevance
    assert not torch.allclose(r1[0, 3], r3[0, 3])


def test_word_loss_labels_words_inside_the_target_and_trains_relevance():
    g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, click_words=False, text_blocks=False, box_words=False)
    text, boxes, mask, word_index, question, match, word_pos = _inputs(n_pages=1, q=2)
    has_q = torch.ones(2, dtype=torch.bool)
    targets = torch.zeros(2, 64, 64)
    targets[0, :, :16] = 1        # x < 250 of 1000: words 0 (0..120) and 1 (150..270, 100/120 inside)
    targets[1, :, 32:] = 1        # x >= 500: words 4, 5 and 2/3 of word 3 (450..570)
    prompts = torch.tensor([True, True])
    opt = torch.optim.Adam(g.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        out = g(text, boxes, mask, word_index, question, match, word_pos, has_q, (16, 16))
        loss = word_relevance_loss(out, targets, prompts)
        opt.zero_grad()
        loss.loss.backward()
        opt.step()
        losses.append(loss.loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert loss.accuracy.item() == pytest.approx(1.0)
    # no prompt scored: zero loss that still back-propagates
    none = word_relevance_loss(out, targets, torch.tensor([False, False]))
    assert none.loss.item() == 0.0 and none.loss.requires_grad


def test_box_maps_paint_inside_the_box_only_and_skip_prompts_without_one():
    from dociq.models.grounding import BoxMaps

    maps = BoxMaps(dim=8, high_res_dim=2)
    boxes = torch.tensor([[0.0, 0.0, 128.0, 64.0], [10.0, 10.0, 20.0, 20.0]])   # pixels of a 256-px frame
    dense, high_res = maps(boxes, torch.tensor([True, False]), 256, (4, 4))
    assert dense.shape == (2, 8, 4, 4) and high_res.shape == (2, 2, 16, 16)
    inside = torch.zeros(4, 4, dtype=torch.bool)
    inside[:1, :2] = True                                  # 0..128 x 0..64 px = columns 0-1, row 0
    assert (dense[0][:, inside] != 0).all() and (dense[0][:, ~inside] == 0).all()
    torch.testing.assert_close(dense[0][:, 0, 0], maps.dense)
    assert dense[1].abs().sum() == 0 and high_res[1].abs().sum() == 0


def test_a_box_prompt_reaches_the_decoder_through_the_maps():
    from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT, NOT_A_POINT
    from dociq.models.segmenter import SegmentationModel

    torch.manual_seed(0)
    model = SegmentationModel.from_config(complete_model_config({**SMALL, "click_maps": False})).eval()
    emb = torch.randn(1, 64, 8, 8)
    high = [torch.randn(1, model.image_encoder.stage_dims[0], 32, 32),
            torch.randn(1, model.image_encoder.stage_dims[1], 16, 16)]
    coords = torch.tensor([[[0.0, 0.0], [8.0, 8.0], [60.0, 40.0]]])
    labels = torch.tensor([[NOT_A_POINT, BOX_TOP_LEFT, BOX_BOTTOM_RIGHT]])
    with torch.no_grad():
        with_maps, _ = model.decode(emb, high, None, (coords, labels), None)
        model.box_maps.high_res.zero_()
        model.box_maps.dense.zero_()
        without, _ = model.decode(emb, high, None, (coords, labels), None)
    assert not torch.allclose(with_maps, without)


def test_click_maps_peak_at_the_click_one_vector_per_polarity():
    from dociq.models.grounding import ClickMaps
    from dociq.models.prompt_encoder import BOX_TOP_LEFT, NEGATIVE_POINT, NOT_A_POINT, POSITIVE_POINT

    maps = ClickMaps(dim=8, high_res_dim=2)
    # prompt 0: a positive click at pixel (200, 40) and a negative one at (20, 220); prompt 1: a box
    # corner and an unused slot only (no click: zero maps)
    coords = torch.tensor([[[199.5, 39.5], [19.5, 219.5]], [[10.0, 10.0], [0.0, 0.0]]])
    labels = torch.tensor([[POSITIVE_POINT, NEGATIVE_POINT], [BOX_TOP_LEFT, NOT_A_POINT]])
    bumps = maps.bumps(coords, labels, 256, 16, 16).view(2, 2, 16, 16)
    assert bumps[0, 0].flatten().argmax().item() == 2 * 16 + 12      # row 40 // 16, column 200 // 16
    assert bumps[0, 1].flatten().argmax().item() == 13 * 16 + 1
    assert bumps[0, 0, 2, 12] > 0.9 and bumps[0, 0, 13, 1] < 1e-6       # each row sees its own clicks
    assert bumps[1].abs().sum() == 0
    dense, high_res = maps(coords, labels, 256, (16, 16))
    assert dense.shape == (2, 8, 16, 16) and high_res.shape == (2, 2, 64, 64)
    torch.testing.assert_close(dense[0][:, 2, 12], bumps[0, 0, 2, 12] * maps.dense[0] + bumps[0, 1, 2, 12] * maps.dense[1])
    assert dense[1].abs().sum() == 0


def test_a_click_reaches_the_decoder_through_the_click_maps():
    from dociq.models.prompt_encoder import POSITIVE_POINT
    from dociq.models.segmenter import SegmentationModel

    torch.manual_seed(0)
    model = SegmentationModel.from_config(complete_model_config(SMALL)).eval()
    emb = torch.randn(1, 64, 8, 8)
    high = [torch.randn(1, model.image_encoder.stage_dims[0], 32, 32),
            torch.randn(1, model.image_encoder.stage_dims[1], 16, 16)]
    points = (torch.tensor([[[60.0, 40.0]]]), torch.tensor([[POSITIVE_POINT]]))
    with torch.no_grad():
        with_maps, _ = model.decode(emb, high, None, points, None)
        model.click_maps.high_res.zero_()
        model.click_maps.dense.zero_()
        without, _ = model.decode(emb, high, None, points, None)
    assert not torch.allclose(with_maps, without)


def test_click_maps_off_builds_none():
    from dociq.models.segmenter import SegmentationModel

    model = SegmentationModel.from_config(complete_model_config({**SMALL, "click_maps": False}))
    assert model.click_maps is None and not any(k.startswith("click_maps.") for k in model.state_dict())


def test_row_and_column_overlap():
    from dociq.models.grounding import row_column_overlap

    boxes = torch.tensor([[[0, 0, 100, 20],        # a header, top left
                           [200, 5, 300, 25],      # same line, another column
                           [10, 50, 90, 70]]])     # below the header, same column
    row, column = row_column_overlap(boxes)
    assert row[0, 0, 1].item() == pytest.approx(15 / 20) and row[0, 0, 2] == 0
    assert column[0, 0, 2].item() == pytest.approx(1.0) and column[0, 0, 1] == 0
    assert (row[0].diagonal() == 0).all() and torch.equal(row, row.transpose(1, 2))


def test_alignment_tells_a_cell_which_matched_words_share_its_row_and_column():
    g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, depth=0, click_words=False, text_blocks=False,
                      box_words=False)
    text, _, mask, word_index, question, match, word_pos = _inputs(n_pages=1, q=1, t=4)
    # a 2x2 table: header "price" (token 0) above the answer (token 3); row key (token 2) left of it
    boxes = torch.tensor([[[500, 100, 600, 120], [100, 100, 200, 120], [100, 300, 200, 320], [500, 300, 600, 320]]])
    has_q = torch.ones(1, dtype=torch.bool)
    word_pos[0, 0], word_pos[0, 1] = 4, 6
    base = g(text, boxes, mask, word_index, question, match, word_pos, has_q, (4, 4)).relevance
    match[0, 0, 0] = EXACT          # question word 0 (the column header) matches token 0
    match[0, 1, 2] = EXACT          # question word 1 (the row key) matches token 2
    r = g(text, boxes, mask, word_index, question, match, word_pos, has_q, (4, 4)).relevance
    changed = ((r - base).abs() > 1e-6)[0].tolist()
    assert changed == [True, True, True, True]   # token 1 shares the header's line, token 3 both
    g.alignment = False
    r_no = g(text, boxes, mask, word_index, question, match, word_pos, has_q, (4, 4)).relevance
    assert ((r_no - base).abs() > 1e-6)[0].tolist() == [True, False, True, False]


def test_matched_on_line_and_column_equals_a_loop_over_tokens():
    from dociq.models.grounding import matched_on_line_and_column, row_column_overlap

    torch.manual_seed(0)
    b, q, j, t = 2, 3, 4, 7
    xy = torch.randint(0, 900, (b, t, 2))
    boxes = torch.cat([xy, xy + torch.randint(10, 100, (b, t, 2))], dim=-1)
    matched = (torch.rand(b * q, j, t) < 0.2).float()
    in_row, in_column = matched_on_line_and_column(matched, boxes)
    row, column = row_column_overlap(boxes)
    for n in range(b * q):
        for jj in range(j):
            for tt in range(t):
                expect_r = max([float(row[n // q, tt, u]) for u in range(t) if matched[n, jj, u]] or [0.0])
                expect_c = max([float(column[n // q, tt, u]) for u in range(t) if matched[n, jj, u]] or [0.0])
                assert in_row[n, jj, tt].item() == pytest.approx(expect_r)
                assert in_column[n, jj, tt].item() == pytest.approx(expect_c)


def test_block_helpers_equal_a_loop_over_blocks():
    from dociq.models.grounding import block_extents, block_means, in_tagged_block
    torch.manual_seed(0)
    block_index = torch.tensor([[-1, 0, 0, 1, 1, 1, -1], [-1, 2, 0, 0, 2, -1, -1]])
    x = torch.randn(4, 7, 3)                                      # 2 pages x 2 prompts
    means, slots = block_means(x, block_index)
    per_token = means.gather(1, slots[..., None].expand_as(x))
    for n in range(4):
        page = block_index[n // 2]
        for t in range(7):
            k = int(page[t])
            expect = torch.zeros(3) if k < 0 else x[n, page == k].mean(0)
            torch.testing.assert_close(per_token[n, t], expect)
    tagged = torch.zeros(4, 2, 7)
    tagged[0, 0, 2] = 1                 # a word of block 0 on page 0
    tagged[3, 1, 4] = 1                 # a word of block 2 on page 1
    tagged[1, 0, 0] = 1                 # a special token: in no block
    hit = in_tagged_block(tagged, block_index)
    assert hit[0, 0].tolist() == [0, 1, 1, 0, 0, 0, 0] and hit[0, 1].sum() == 0
    assert hit[3, 1].tolist() == [0, 1, 0, 0, 1, 0, 0]
    assert hit[1].sum() == 0 and hit[2].sum() == 0
    boxes = torch.tensor([[[0, 0, 0, 0], [10, 10, 50, 20], [10, 30, 40, 40], [100, 5, 120, 9],
                           [130, 5, 140, 9], [100, 12, 110, 15], [0, 0, 0, 0]]]).repeat(2, 1, 1)
    extents = block_extents(boxes, block_index)
    assert extents[0, 1].tolist() == [10, 10, 50, 40] and extents[0, 2].tolist() == [100, 5, 140, 15]
    assert extents[0, 0].tolist() == [0, 0, 0, 0] and extents[1, 2].tolist() == [0, 0, 0, 0]
    assert extents[1, 3].tolist() == [10, 5, 140, 20]      # block 2 of page 1: tokens 1 and 4


def _two_block_page():
    """Tokens 1-2 in block 0 on two lines that share neither a line nor a column; tokens 3-4 in
    block 1, far below; 0 and 5 are [CLS] and [SEP]."""
    boxes = torch.tensor([[[0, 0, 0, 0], [100, 100, 200, 130], [300, 160, 400, 190],
                           [500, 600, 600, 630], [700, 700, 800, 730], [1000, 1000, 1000, 1000]]])
    word_index = torch.tensor([[-1, 0, 1, 2, 3, -1]])
    block_index = torch.tensor([[-1, 0, 0, 1, 1, -1]])
    return boxes, word_index, block_index


def test_a_click_reaches_the_rest_of_its_block_and_nothing_else():
    torch.manual_seed(0)
    boxes, word_index, block_index = _two_block_page()
    text, mask = torch.randn(1, 6, 16), torch.ones(1, 6, dtype=torch.bool)
    question = torch.randn(1, 9, 32)
    match, word_pos = torch.zeros(1, 1, 6, dtype=torch.uint8), torch.full((1, 1), -1)
    clicked = torch.zeros(1, 2, 6)
    clicked[0, 0, 1] = 1                                            # a positive click on token 1
    for text_blocks in (True, False):
        g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, depth=0, alignment=False,
                          click_words=True, text_blocks=text_blocks, box_words=False)
        args = (text, boxes, mask, word_index, question, match, word_pos, torch.zeros(1, dtype=torch.bool), (4, 4))
        kwargs = {"block_index": block_index}
        with_click = g(*args, clicked=clicked, **kwargs).relevance
        without = g(*args, clicked=torch.zeros_like(clicked), **kwargs).relevance
        changed = (with_click - without).abs()[0] > 1e-6
        assert changed[1]                                           # the clicked word itself
        assert bool(changed[2]) is text_blocks                      # its block's other line
        assert not changed[3] and not changed[4]                    # the other block


def test_blocks_are_painted_over_the_space_between_their_lines():
    torch.manual_seed(0)
    boxes = torch.tensor([[[0, 0, 0, 0], [0, 0, 1000, 100], [0, 400, 1000, 500], [1000, 1000, 1000, 1000]]])
    word_index = torch.tensor([[-1, 0, 1, -1]])
    block_index = torch.tensor([[-1, 0, 0, -1]])
    text, mask = torch.randn(1, 4, 16), torch.ones(1, 4, dtype=torch.bool)
    question = torch.randn(1, 9, 32)
    match, word_pos = torch.zeros(1, 1, 4, dtype=torch.uint8), torch.zeros(1, 1, dtype=torch.long)
    match[0, 0, 1] = EXACT
    has_q = torch.ones(1, dtype=torch.bool)
    for text_blocks, painted in ((True, True), (False, False)):
        g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, text_blocks=text_blocks, click_words=False,
                          box_words=False)
        out = g(text, boxes, mask, word_index, question, match, word_pos, has_q, (10, 10), block_index=block_index)
        gap = out.dense[0, :, 2:4]                                  # rows 2-3 of 10: between the two lines
        assert bool(gap.abs().sum() > 0) is painted
        assert out.dense[0, :, 6:].abs().sum() == 0                 # below the block: nothing
    with pytest.raises(KeyError, match="ocr_block_index"):
        WordGrounding(text_dim=16, dim=32, high_res_dim=4, text_blocks=True, click_words=False, box_words=False)(
            text, boxes, mask, word_index, question, match, word_pos, has_q, (10, 10))
