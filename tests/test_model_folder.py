"""Model folders (dociq/inference/model_folder.py): a stage=finetune checkpoint exported to the Hugging Face layout
loads offline, from safetensors only, into the same weights and the same predictions."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from dociq.cli.export import main
from dociq.inference.model_folder import DociqSegmenter, export_checkpoint
from dociq.inference.predictor import predictor_from_pretrained
from dociq.models.sizes import check_model_config

PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"}


@pytest.fixture(scope="module")
def exported(finetune_checkpoint, tmp_path_factory):
    ckpt, _ = finetune_checkpoint
    return export_checkpoint(ckpt, tmp_path_factory.mktemp("export") / "dociq-small")


@pytest.fixture
def no_network_no_pickle(monkeypatch):
    """Loading must not reach the hub nor unpickle anything: both fail loudly here."""
    import huggingface_hub.hub_mixin as hub_mixin

    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected call with {args} {kwargs}")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_mixin, "hf_hub_download", refuse)
    monkeypatch.setattr(torch, "load", refuse)


def test_folder_layout(exported):
    from dociq.data.tokenize import MAX_OCR_TOKENS, default_vocab_dir

    files = {p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "README.md", "ocr_tokenizer/vocab.txt",
            "ocr_tokenizer/tokenizer.json", "ocr_tokenizer/tokenizer_config.json",
            "question_tokenizer/bpe_simple_vocab_16e6.txt.gz"} <= files
    assert not [f for f in files if os.path.splitext(f)[1] in PICKLE_SUFFIXES]
    assert not [p for p in exported.parent.iterdir() if p.name.endswith(".tmp")]   # the temporary folder is gone
    umask = os.umask(0)
    os.umask(umask)
    assert exported.stat().st_mode & 0o777 == 0o777 & ~umask                       # not mkdtemp's 0700
    assert (exported / "ocr_tokenizer" / "vocab.txt").read_bytes() == (default_vocab_dir() / "vocab.txt").read_bytes()
    config = json.loads((exported / "config.json").read_text())
    assert config["library_name"] == "dociq" and config["image_size"] == 128
    assert config["ocr"] is True and config["lexical_match"] is True
    assert config["model"]["text_encoder"]["num_hidden_layers"] == 1
    check_model_config(config["model"])                                            # the complete shape
    assert config["ocr_tokenizer"]["max_length"] == MAX_OCR_TOKENS   # whole pages: the default budget
    assert config["question_tokenizer"]["context_length"] == 32


def test_from_pretrained_is_offline_and_bit_exact(exported, finetune_checkpoint, no_network_no_pickle):
    _, task = finetune_checkpoint
    segmenter = DociqSegmenter.from_pretrained(exported)
    expected = {k[len("model."):]: v for k, v in task.state_dict().items() if k.startswith("model.")}
    loaded = segmenter.model.state_dict()
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    assert not segmenter.training
    assert segmenter.ocr_vocab_source == exported / "ocr_tokenizer"


@pytest.fixture(scope="module")
def reference(finetune_checkpoint):
    """The Predictor of the Lightning checkpoint (read before torch.load is refused)."""
    from dociq.inference.predictor import Predictor

    return Predictor.from_checkpoint(finetune_checkpoint[0])


def test_a_loaded_folder_saves_the_same_folder(exported, tmp_path, no_network_no_pickle):
    """What push_to_hub uploads: save_pretrained of a loaded model, card and tokenizers included."""
    DociqSegmenter.from_pretrained(exported).save_pretrained(tmp_path / "again")
    for path in exported.rglob("*"):
        if path.is_file() and path.name != "model.safetensors":
            assert (tmp_path / "again" / path.relative_to(exported)).read_bytes() == path.read_bytes(), path
    first, second = load_file(exported / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_predictor_matches_the_checkpoint_predictor(exported, reference, no_network_no_pickle):
    from dociq.data.synthetic.generator import generate_page

    page = generate_page(3, seed=11, image_size=(176, 128), questions_per_page=2)
    assert page.words and page.questions
    prompts = dict(question=[q.text for q in page.questions], words=page.words, word_boxes=page.word_boxes)
    predictor = predictor_from_pretrained(exported)
    assert predictor.collator.ocr_tokenizer.vocab_dir == str(exported / "ocr_tokenizer")
    assert (predictor.image_size, predictor.use_ocr, predictor.use_lexical_match, predictor.max_question_words) == \
        (reference.image_size, reference.use_ocr, reference.use_lexical_match, reference.max_question_words)
    for kwargs in (prompts, dict(points=[[60.0, 40.0]], words=page.words, word_boxes=page.word_boxes)):
        masks, scores = predictor.predict(page.image, **kwargs)
        ref_masks, ref_scores = reference.predict(page.image, **kwargs)
        assert masks.shape == ref_masks.shape == (len(scores), 176, 128)
        np.testing.assert_array_equal(masks, ref_masks)
        np.testing.assert_array_equal(scores, ref_scores)
    from dociq.inference.predictor import Predictor   # Predictor.from_pretrained calls predictor_from_pretrained

    _, scores = Predictor.from_pretrained(exported).predict(page.image, **prompts)
    np.testing.assert_array_equal(scores, reference.predict(page.image, **prompts)[1])


def test_settings_follow_the_checkpoint(finetune_checkpoint, tmp_path):
    from dociq.inference.predictor import Predictor

    ckpt, _ = finetune_checkpoint
    data = torch.load(ckpt, weights_only=True)
    data["hyper_parameters"] = {**data["hyper_parameters"], "ocr": False, "lexical_match": False}
    torch.save(data, tmp_path / "layout_only.ckpt")
    folder = export_checkpoint(tmp_path / "layout_only.ckpt", tmp_path / "layout_only")
    predictor, reference = predictor_from_pretrained(folder), Predictor.from_checkpoint(tmp_path / "layout_only.ckpt")
    assert (predictor.use_ocr, predictor.use_lexical_match) == (reference.use_ocr, reference.use_lexical_match) \
        == (False, False)


def test_model_card_holds_the_training_config_and_metrics(finetune_checkpoint, tmp_path):
    from huggingface_hub import ModelCard

    from dociq.data.tokenize import default_vocab_dir

    ckpt, _ = finetune_checkpoint
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / "csv").mkdir()
    data = torch.load(ckpt, weights_only=True)
    data["global_step"] = 20
    data["callbacks"] = {"ModelCheckpoint{'monitor': 'val/miou', 'mode': 'max'}": {
        "monitor": "val/miou", "best_model_score": torch.tensor(0.5), "current_score": torch.tensor(0.42)}}
    torch.save(data, run / "checkpoints" / "last.ckpt")
    vocab = tmp_path / "my_vocab"          # a tokenizer folder with only vocab.txt, as data.tokenizer.vocab_dir
    vocab.mkdir()
    shutil.copyfile(default_vocab_dir() / "vocab.txt", vocab / "vocab.txt")
    (run / ".hydra" / "config.yaml").write_text(
        "seed: 7\nstage:\n  name: finetune\noptim:\n  lr: 0.0003\n"
        "paths:\n  output_dir: ${unique_dir:${paths.log_dir}/finetune}\n"      # train.py's resolver: not here
        f"data:\n  image_size: ${{model.image_size}}\n  max_question_words: 9\n"
        f"  tokenizer:\n    vocab_dir: {vocab}\n    max_length: 200\n")
    (run / "csv" / "metrics.csv").write_text("step,train/loss,val/miou,val/box_miou\n"
                                             "10,1.5,0.31,0.2\n20,1.2,0.42,\n30,1.1,0.99,0.98\n")
    folder = export_checkpoint(run / "checkpoints" / "last.ckpt", tmp_path / "carded")
    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "dociq" and card.data.license == "apache-2.0"
    assert "dociq" in card.data.tags
    text = card.text
    assert "| val/miou | 0.4200 |" in text          # the last value up to the checkpoint's step 20, not 0.99
    assert "| val/box_miou | 0.2000 |" in text      # a column's last non-empty value
    assert "| val/miou (best checkpoint) | 0.5000 |" in text
    assert "0.99" not in text and "train/loss" not in text
    assert "lr: 0.0003" in text and "seed: 7" in text          # the Hydra config
    assert "loss_size: null" in text and "lexical_match: true" in text   # the hyper-parameters
    assert "predictor_from_pretrained" in text
    assert "${unique_dir:${paths.log_dir}/finetune}" in text    # the config as written, not resolved
    config = json.loads((folder / "config.json").read_text())
    assert config["max_question_words"] == 9 and config["ocr_tokenizer"]["max_length"] == 200   # the run's data.*
    assert sorted(p.name for p in (folder / "ocr_tokenizer").iterdir()) == ["vocab.txt"]     # from vocab_dir
    assert predictor_from_pretrained(folder).collator.ocr_tokenizer.max_length == 200

    (run / ".hydra" / "config.yaml").write_text(f"data:\n  tokenizer:\n    vocab_dir: {tmp_path / 'gone'}\n")
    with pytest.raises(FileNotFoundError, match=r"data.tokenizer.vocab_dir=.*gone, which does not exist"):
        export_checkpoint(run / "checkpoints" / "last.ckpt", tmp_path / "never")


def _write_bad(folder, tmp_path, name):
    bad = tmp_path / name
    shutil.copytree(folder, bad)
    return bad


def test_clear_errors_for_wrong_folders(exported, tmp_path, no_network_no_pickle):
    with pytest.raises(ValueError, match=r"model folder .*nowhere: does not exist.*export"):
        DociqSegmenter.from_pretrained(tmp_path / "nowhere")

    lightning_only = tmp_path / "lightning_only"
    lightning_only.mkdir()
    (lightning_only / "last.ckpt").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"lightning_only: has no config.json \(it holds last.ckpt; pickled "
                                         r"weights are not loaded\).*dociq export CKPT DIR"):
        DociqSegmenter.from_pretrained(lightning_only)

    no_weights = _write_bad(exported, tmp_path, "no_weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no_weights: has no model.safetensors"):
        predictor_from_pretrained(no_weights)

    other = _write_bad(exported, tmp_path, "bert")
    (other / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match=r"bert: config.json is not a dociq model config \(it describes 'bert'\)"):
        DociqSegmenter.from_pretrained(other)

    cut = _write_bad(exported, tmp_path, "cut")
    weights = load_file(cut / "model.safetensors")
    dropped = sorted(weights)[0]
    del weights[dropped]
    save_file(weights, cut / "model.safetensors")
    with pytest.raises(ValueError, match=rf"cut: model.safetensors lacks 1 weights .*{dropped}.*Fix: .*export"):
        DociqSegmenter.from_pretrained(cut)

    garbage = _write_bad(exported, tmp_path, "garbage")
    (garbage / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"garbage: model.safetensors does not match"):
        DociqSegmenter.from_pretrained(garbage)

    edited = _write_bad(exported, tmp_path, "edited")
    config = json.loads((edited / "config.json").read_text())
    config["model"]["fusion"]["enormous"] = 1        # no argument of the fusion trunk
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"edited: config.json describes a model dociq cannot build .*enormous"):
        DociqSegmenter.from_pretrained(edited)

    other_bpe = _write_bad(exported, tmp_path, "other_bpe")
    (other_bpe / "question_tokenizer" / "bpe_simple_vocab_16e6.txt.gz").write_bytes(b"\x1f\x8b other merges")
    with pytest.raises(ValueError, match=r"other_bpe: question_tokenizer/bpe_simple_vocab_16e6.txt.gz is not the "
                                         r"file config.json names"):
        predictor_from_pretrained(other_bpe)

    no_vocab = _write_bad(exported, tmp_path, "no_vocab")
    shutil.rmtree(no_vocab / "ocr_tokenizer")
    with pytest.raises(ValueError, match=r"no_vocab: has no ocr_tokenizer/vocab.txt"):
        DociqSegmenter.from_pretrained(no_vocab)


def test_cli_export_and_one_line_errors(finetune_checkpoint, tmp_path, capsys):
    ckpt, _ = finetune_checkpoint
    assert main(["export", str(ckpt), str(tmp_path / "cli")]) == 0
    assert "exported" in capsys.readouterr().out
    assert (tmp_path / "cli" / "model.safetensors").is_file()

    assert main(["export", str(ckpt), str(tmp_path / "cli")]) == 2        # not empty: refuse to overwrite
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err and "--overwrite" in err
    assert main(["export", str(ckpt), str(tmp_path / "cli"), "--overwrite"]) == 0
    capsys.readouterr()

    (tmp_path / "state_only.ckpt").write_bytes(b"")
    assert main(["export", str(tmp_path / "state_only.ckpt"), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dociq export: error: checkpoint ") and err.count("\n") == 1 and "is empty" in err
    assert not (tmp_path / "x").exists()

    torch.save({"state_dict": {}}, tmp_path / "pretrain.ckpt")
    assert main(["export", str(tmp_path / "pretrain.ckpt"), str(tmp_path / "y")]) == 2
    assert "not a stage=finetune Lightning checkpoint" in capsys.readouterr().err


def test_module_entry_point_prints_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dociq.cli", "export", str(tmp_path / "missing.ckpt"),
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "missing.ckpt: does not exist" in result.stderr
