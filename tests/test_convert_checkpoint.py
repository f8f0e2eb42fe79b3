"""`dociq convert-checkpoint`: a checkpoint (or model folder) stored before model configs were complete
is refused everywhere with the command that converts it; converted, it predicts what it predicted."""
import hashlib
import json
import re
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from dociq.cli import main as dociq
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.inference.convert import complete_old_model_config
from dociq.inference.model_folder import DociqSegmenter, export_checkpoint
from dociq.inference.predictor import Predictor
from dociq.io.checkpoint import CheckpointError, read_checkpoint
from dociq.models.fusion import FusionTrunk
from dociq.models.grounding import BoxMaps, WordGrounding
from dociq.models.image_encoder import ImageEncoder
from dociq.models.mask_decoder import MaskDecoder
from dociq.models.prompt_encoder import PromptEncoder
from dociq.models.segmenter import ImageEmbeddingNeck, SegmentationModel
from dociq.models.sizes import check_model_config, size_config
from dociq.models.text_encoder import TextEncoder

# What a stage=finetune checkpoint of model=tiny stored before complete configs: the overrides only
# (128-px pages, one text and one fusion layer), no switch at all.
OLD_CONFIG = {"size": "tiny", "image_size": 128, "mask_unit_px": 32, "image_encoder": {},
              "text_encoder": {"num_hidden_layers": 1}, "fusion": {"depth": 1}, "predictor": {},
              "prompt_encoder": {}, "mask_decoder": {}}


def old_model() -> SegmentationModel:
    """The model OLD_CONFIG built then, part by part: the size's arguments with the overrides, word
    grounding without clicked words, text blocks or box words, box maps, no click maps, no word
    classes, no relative token height."""
    tiny = size_config("tiny")
    image_encoder = ImageEncoder(img_size=128, **tiny["image_encoder"])
    text_encoder = TextEncoder.build(**{**tiny["text_encoder"], "num_hidden_layers": 1, "relative_height": False})
    fusion = FusionTrunk(image_encoder.embed_dim, text_encoder.hidden_size, **{**tiny["fusion"], "depth": 1})
    prompt_encoder = PromptEncoder(**tiny["prompt_encoder"], image_embedding_size=(8, 8), input_image_size=(128, 128))
    dims = image_encoder.stage_dims
    mask_decoder = MaskDecoder(**tiny["mask_decoder"], use_high_res_features=True, high_res_channels=(dims[0], dims[1]))
    grounding = WordGrounding(text_dim=fusion.dim, dim=64, high_res_dim=8, **{
        **tiny["grounding"], "click_words": False, "text_blocks": False, "box_words": False})
    return SegmentationModel(image_encoder, text_encoder, fusion, ImageEmbeddingNeck(fusion.dim, dims[2], 64),
                             prompt_encoder, mask_decoder, grounding, BoxMaps(64, 8), None, None)


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    """(path of an old stage=finetune checkpoint, the model it holds)."""
    torch.manual_seed(0)
    model = old_model().eval()
    path = tmp_path_factory.mktemp("old") / "old.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "global_step": 3,
                "hyper_parameters": {"model": OLD_CONFIG, "ocr": True, "lexical_match": True, "rounds": 2}}, path)
    return path, model


@pytest.fixture(scope="module")
def page():
    return SyntheticDocuments(num_pages=1, image_size=128, seed=5)[0]


def _predict(predictor: Predictor, page) -> tuple[np.ndarray, np.ndarray]:
    predictor.set_image(page.image, words=page.words, word_boxes=page.word_boxes)
    x0, y0, x1, y1 = page.word_boxes[0]
    return predictor.predict(question=[page.words[0], "the page title"], points=[[[(x0 + x1) / 2, (y0 + y1) / 2]]] * 2,
                             boxes=[[x0 - 2, y0 - 2, x1 + 2, y1 + 2]] * 2)[:2]


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_old_meaning_of_absent_keys():
    config = complete_old_model_config(OLD_CONFIG)
    check_model_config(config)
    tiny = size_config("tiny")
    assert config["box_maps"] is True and config["click_maps"] is False and config["word_classes"] is False
    assert config["text_encoder"] == {**tiny["text_encoder"], "num_hidden_layers": 1, "relative_height": False}
    assert config["grounding"] == {**tiny["grounding"], "click_words": False, "text_blocks": False, "box_words": False}
    assert config["fusion"] == {**tiny["fusion"], "depth": 1} and config["mask_decoder"] == tiny["mask_decoder"]
    # what a later checkpoint stated is kept; `grounding: false` was "no grounding"
    later = complete_old_model_config({**OLD_CONFIG, "click_maps": True, "grounding": {"click_words": True}})
    assert later["click_maps"] is True and later["grounding"]["click_words"] is True
    assert later["grounding"]["box_words"] is False
    assert complete_old_model_config({**OLD_CONFIG, "grounding": False})["grounding"] is None


def test_an_old_checkpoint_is_refused_with_the_command_that_converts_it(old, tmp_path, capsys):
    from dociq.training.heldout import load_task

    path, _ = old
    for load in (Predictor.from_checkpoint, load_task, lambda p: export_checkpoint(p, tmp_path / "folder")):
        where = re.escape(str(path))
        with pytest.raises(CheckpointError, match=rf"checkpoint {where}: model config lacks grounding, box_maps, "
                                                  rf".*Fix: convert it once with `dociq convert-checkpoint {where} "
                                                  r"NEW.ckpt`"):
            load(path)
    png = tmp_path / "page.png"
    Image.new("RGB", (128, 128), "white").save(png)
    assert dociq(["predict", str(path), str(png), "--question", "the title"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dociq predict: error: checkpoint ") and "convert-checkpoint" in err[0]


def test_converted_checkpoint_is_complete_and_predicts_the_old_masks(old, page, tmp_path, capsys):
    path, model = old
    before = _sha(path)
    new = tmp_path / "new.ckpt"
    assert dociq(["convert-checkpoint", str(path), str(new)]) == 0
    assert f"converted {path} -> {new}" in capsys.readouterr().out
    assert _sha(path) == before                                             # OLD is never changed
    ckpt = read_checkpoint(new)
    check_model_config(ckpt["hyper_parameters"]["model"])
    assert ckpt["hyper_parameters"]["model"] == complete_old_model_config(OLD_CONFIG)
    assert ckpt["hyper_parameters"]["rounds"] == 2 and ckpt["global_step"] == 3   # the rest is kept

    masks, scores = _predict(Predictor.from_checkpoint(new), page)
    old_masks, old_scores = _predict(Predictor(model, 128), page)
    assert masks.shape == (2, *page.image.shape[:2]) and masks.any()
    np.testing.assert_array_equal(masks, old_masks)
    np.testing.assert_allclose(scores, old_scores, rtol=0, atol=1e-6)

    assert dociq(["convert-checkpoint", str(path), str(new)]) == 2         # NEW exists: refused, untouched
    assert "already exists" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="already stores a complete model config"):
        from dociq.inference.convert import convert_checkpoint
        convert_checkpoint(new, tmp_path / "again.ckpt")
    assert not (tmp_path / "again.ckpt").exists()


def test_weights_that_do_not_fit_the_converted_config_write_nothing(old, tmp_path):
    from dociq.inference.convert import convert_checkpoint

    path, model = old
    ckpt = read_checkpoint(path)
    ckpt["hyper_parameters"]["model"] = {**OLD_CONFIG, "grounding": None}    # weights hold a grounding
    edited = tmp_path / "edited.ckpt"
    torch.save(ckpt, edited)
    with pytest.raises(CheckpointError, match=r"edited.ckpt: its weights do not fit the converted model config "
                                              r"\(missing \[\], unexpected \['grounding\."):
        convert_checkpoint(edited, tmp_path / "new.ckpt")
    assert not (tmp_path / "new.ckpt").exists()


def test_an_old_model_folder_is_refused_then_converted(old, page, tmp_path):
    from dociq.inference.convert import convert_checkpoint

    path, model = old
    complete = convert_checkpoint(path, tmp_path / "complete.ckpt")
    folder = export_checkpoint(complete, tmp_path / "folder")
    config = json.loads((folder / "config.json").read_text())
    config["model"] = OLD_CONFIG                                           # as an older export wrote it
    (folder / "config.json").write_text(json.dumps(config))
    where = re.escape(str(folder))
    with pytest.raises(ValueError, match=rf"model folder {where}: config.json's model config lacks grounding.*"
                                         rf"`dociq convert-checkpoint {where} NEW_FOLDER`"):
        Predictor.from_pretrained(folder)

    converted = convert_checkpoint(folder, tmp_path / "converted")
    assert json.loads((folder / "config.json").read_text())["model"] == OLD_CONFIG    # OLD is never changed
    assert sorted(p.name for p in converted.iterdir()) == sorted(p.name for p in folder.iterdir())
    assert DociqSegmenter.from_pretrained(converted).model_config == complete_old_model_config(OLD_CONFIG)
    masks, scores = _predict(Predictor.from_pretrained(converted), page)
    old_masks, old_scores = _predict(Predictor(model, 128), page)
    np.testing.assert_array_equal(masks, old_masks)
    np.testing.assert_allclose(scores, old_scores, rtol=0, atol=1e-6)
    shutil.rmtree(converted)
