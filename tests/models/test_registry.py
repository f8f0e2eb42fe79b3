"""Model sizes and the registry: one file per size, read by training and inference alike, strict
model configs, and every registered model builds and segments."""
import pytest
import torch
from omegaconf import OmegaConf

import dociq
from dociq.data.collate import DocumentCollator
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.data.tokenize import QuestionTokenizer
from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT, POSITIVE_POINT
from dociq.models.registry import build_model, list_models, register_model
from dociq.models.sizes import (IncompleteModelConfig, ModelConfigError, check_model_config, complete_model_config,
                                list_sizes, size_config)
from dociq.models.segmenter import SegmentationModel

HEAVY = {"dociq-base"}   # Hiera-B+ at 1024 px, MiniLM, CLIP ViT-B/16: minutes on a CPU
MODELS = [pytest.param(name, marks=pytest.mark.slow) if name in HEAVY else name for name in list_models()]
PARTS = {"image_encoder", "text_encoder", "fusion", "predictor", "grounding", "prompt_encoder", "mask_decoder"}


def key_paths(config: dict) -> set[str]:
    return {f"{k}.{sub}" if isinstance(v, dict) else k for k, v in config.items()
            for sub in (v if isinstance(v, dict) else [None])}


def test_every_size_is_one_file_with_the_same_keys():
    assert list_sizes() == ["base", "tiny"]
    tiny = size_config("tiny")
    assert {k for k, v in tiny.items() if isinstance(v, dict)} == PARTS
    for size in list_sizes():
        config = size_config(size)
        assert config["size"] == size and key_paths(config) == key_paths(tiny)
        check_model_config(config)
        assert all(config[switch] is True for switch in ("box_maps", "click_maps", "word_classes"))
        assert config["text_encoder"]["relative_height"] is True
        assert all(config["grounding"][s] is True for s in ("click_words", "text_blocks", "box_words"))


def test_training_composes_the_same_file():
    """`python train.py model=<size>` composes exactly what inference reads for that size."""
    from dociq.training.config import compose

    for size in list_sizes():
        composed = OmegaConf.to_container(compose([f"model={size}"]).model, resolve=True)
        assert composed == size_config(size)
    overridden = compose(["model=tiny", "model.fusion.depth=4", "model.image_size=384"]).model
    assert OmegaConf.to_container(overridden) == complete_model_config(
        {"size": "tiny", "fusion": {"depth": 4}, "image_size": 384})


def test_unknown_size_key_or_model_names_the_known_ones():
    with pytest.raises(ModelConfigError, match=r"unknown model size 'huge'. Fix: choose one of \['base', 'tiny'\]"):
        size_config("huge")
    with pytest.raises(ModelConfigError, match=r"unknown model config key\(s\) \['fusoin'\].*'fusion'"):
        complete_model_config({"size": "tiny", "fusoin": {"depth": 1}})
    with pytest.raises(KeyError, match=r"unknown model 'dociq-huge'; choose one of \['dociq-base', 'dociq-tiny'\]"):
        build_model("dociq-huge")
    with pytest.raises(ModelConfigError, match="fusoin"):
        build_model("dociq-tiny", fusoin={"depth": 1})


def test_size_config_is_a_copy():
    size_config("tiny")["fusion"]["dim"] = 1
    assert size_config("tiny")["fusion"]["dim"] == 128


def test_complete_model_config_lays_keys_over_the_size():
    config = complete_model_config({"size": "tiny", "image_size": 128, "fusion": {"depth": 1}, "grounding": None,
                                    "click_maps": False})
    tiny = size_config("tiny")
    assert config["fusion"] == {**tiny["fusion"], "depth": 1} and config["image_size"] == 128
    assert config["grounding"] is None and config["click_maps"] is False
    assert config["text_encoder"] == tiny["text_encoder"]
    check_model_config(config)                      # grounding: null is a complete config


def test_an_incomplete_config_names_what_it_lacks_and_the_converter():
    partial = {"size": "tiny", "image_size": 128, "mask_unit_px": 32, "image_encoder": {}, "text_encoder": {},
               "fusion": {"depth": 1}, "predictor": {}, "prompt_encoder": {}, "mask_decoder": {}}
    with pytest.raises(IncompleteModelConfig, match=r"lacks grounding, box_maps, click_maps, word_classes, "
                                                    r"image_encoder.embed_dim.*dociq convert-checkpoint"):
        SegmentationModel.from_config(partial)
    with pytest.raises(IncompleteModelConfig, match="lacks click_maps: it predates"):
        SegmentationModel.from_config({k: v for k, v in size_config("tiny").items() if k != "click_maps"})
    lacking_switch = size_config("tiny")
    del lacking_switch["grounding"]["box_words"]
    with pytest.raises(IncompleteModelConfig, match="lacks grounding.box_words"):
        SegmentationModel.from_config(lacking_switch)


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


def test_a_complete_config_of_a_size_the_package_does_not_ship_builds():
    # a user's own configs/model/mine.yaml: its checkpoint stores the whole shape, no file is needed
    mine = {**size_config("tiny"), "size": "mine", "image_size": 128, "fusion": {**size_config("tiny")["fusion"], "depth": 1}}
    check_model_config(mine)
    model = SegmentationModel.from_config(mine)
    assert len(model.fusion.blocks) == 1 and model.prompt_encoder.input_image_size == (128, 128)
    del mine["click_maps"]
    with pytest.raises(IncompleteModelConfig, match="lacks click_maps"):
        check_model_config(mine)
