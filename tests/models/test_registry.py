"""The model registry: one table of sizes, one lookup, and every registered model builds and segments."""
import pytest
import torch
from omegaconf import OmegaConf

import dociq
from dociq.data.collate import DocumentCollator
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.data.tokenize import QuestionTokenizer
from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT, POSITIVE_POINT
from dociq.models.registry import build_model, list_models, register_model
from dociq.models.sizes import PARTS, SIZES, model_config, part_config
from dociq.models.segmenter import SegmentationModel

HEAVY = {"dociq-base"}   # Hiera-B+ at 1024 px, MiniLM, CLIP ViT-B/16: minutes on a CPU
MODELS = [pytest.param(name, marks=pytest.mark.slow) if name in HEAVY else name for name in list_models()]


def test_every_size_names_every_part():
    assert list(SIZES) == ["tiny", "base"]
    assert set(PARTS) == {"image_encoder", "text_encoder", "fusion", "predictor", "grounding",
                          "prompt_encoder", "mask_decoder"}
    for size in SIZES:
        assert set(SIZES[size]) == set(PARTS)


def test_the_model_configs_are_the_registry_sizes(repo_root):
    """configs/model/<size>.yaml is what the registered builder builds."""
    for size in SIZES:
        assert OmegaConf.to_container(OmegaConf.load(repo_root / "configs" / "model" / f"{size}.yaml")) \
            == model_config(size)


def test_unknown_size_or_part_names_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown fusion size 'huge'; choose one of \['base', 'tiny'\]"):
        part_config("huge", "fusion")
    with pytest.raises(KeyError, match="unknown model part 'neck'.*image_encoder, text_encoder, fusion"):
        part_config("tiny", "neck")
    with pytest.raises(KeyError, match=r"unknown model 'dociq-huge'; choose one of \['dociq-base', 'dociq-tiny'\]"):
        build_model("dociq-huge")
    with pytest.raises(TypeError, match="unknown override.*'fusoin'"):
        build_model("dociq-tiny", fusoin={"depth": 1})


def test_part_config_is_a_copy():
    part_config("tiny", "fusion")["dim"] = 1
    assert part_config("tiny", "fusion")["dim"] == 128


def test_register_model_and_the_public_api():
    assert dociq.list_models() == list_models() and "dociq-tiny" in dociq.list_models("dociq-*")
    assert dociq.build_model is build_model
    with pytest.raises(ValueError, match="already registered"):
        register_model(lambda: None, name="dociq-tiny")


@pytest.mark.parametrize("name", MODELS)
def test_every_registered_model_builds_and_segments_a_page(name):
    torch.manual_seed(0)
    model = build_model(name).eval()
    assert isinstance(model, SegmentationModel)
    side = model.prompt_encoder.input_image_size[0]
    questions = QuestionTokenizer(model.prompt_encoder.question_encoder.context_length)
    pages = SyntheticDocuments(num_pages=1, image_size=side, seed=0)
    batch = DocumentCollator(side, question_tokenizer=questions, questions=True, max_questions=2,
                             seed=0)([pages[0]])
    ids = batch["prompt_ids"].flatten(0, 1)
    n = ids.shape[0]
    # one click and the box of each answer, as stage=finetune prompts them
    coords = torch.cat([batch["points"].reshape(n, -1, 2)[:, :1] - 0.5, batch["boxes"].reshape(n, 2, 2)], dim=1)
    labels = torch.tensor([POSITIVE_POINT, BOX_TOP_LEFT, BOX_BOTTOM_RIGHT]).expand(n, 3)
    with torch.no_grad():
        page = model.embed_page(batch)
        q = model.encode_questions(ids)
        grounding = model.ground(page, q, batch["prompt_match"].flatten(0, 1),
                                 batch["prompt_word_pos"].flatten(0, 1), ids.ne(0).any(1))
        masks, iou = model.decode(page.image, page.high_res, q, (coords, labels), None, grounding)
    grid = model.unit_grid
    assert page.image.shape == (1, model.prompt_encoder.embed_dim, 2 * grid[0], 2 * grid[1])   # stride 16
    assert grounding is not None and model.box_maps is not None and model.click_maps is not None
    assert masks.shape == (n, 4, side // 4, side // 4)   # stride 4: single-mask token + 3 multimask
    assert iou.shape == (n, 4)
    assert torch.isfinite(masks).all() and torch.isfinite(iou).all()


def test_builder_overrides_replace_config_keys():
    model = build_model("dociq-tiny", image_size=128, text_encoder={"num_hidden_layers": 1},
                        fusion={"depth": 1}, grounding=None)
    assert model.image_encoder.image_size == (128, 128) and model.unit_grid == (4, 4)
    assert len(model.fusion.blocks) == 1 and model.grounding is None
