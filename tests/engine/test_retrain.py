"""Retrain rounds and the simulated annotator (dociq.engine.retrain, dociq.engine.simulate)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dociq.data.schema import Page, Question
from dociq.data.synthetic.generator import generate_page
from dociq.engine.coco_export import export_coco
from dociq.engine.retrain import RoundFailedError, TrainJob, run_round
from dociq.engine.simulate import MAX_CLICKS, annotate_page, next_click, save_ground_truth, summarise
from dociq.engine.store import EngineStore


class ClickCountingPredictor:
    """Answers a question with a wrong (empty) mask until it has seen `k[question]` clicks, then
    with the truth; records the prompts of every call."""

    def __init__(self, targets: dict[str, np.ndarray], k):
        self.targets, self.calls = targets, []
        self.k = k if isinstance(k, dict) else {q: k for q in targets}

    def set_image(self, image, words=None, word_boxes=None):
        self.size = image.shape[:2]

    def predict_masks(self, question=None, points=None, point_labels=None, boxes=None, mask_input=None):
        questions = [question] if isinstance(question, str) else list(question)
        n = 0 if points is None else np.asarray(points).shape[1]
        if points is not None:
            assert np.asarray(points).shape == (len(questions), n, 2)
            assert np.asarray(mask_input).shape == (len(questions), 1, 16, 16)
        self.calls.append((questions, n, None if point_labels is None else np.asarray(point_labels).tolist(),
                           mask_input is not None))
        masks = np.stack([self.targets[q].copy() if n >= self.k[q] else np.zeros(self.size, bool)
                          for q in questions])
        return masks, np.ones(len(questions), np.float32), np.zeros((len(questions), 1, 16, 16), np.float32)


def _square_page(size=64) -> Page:
    image = np.full((size, size, 3), 255, np.uint8)
    a = np.zeros((size, size), bool)
    a[10:30, 8:40] = True
    b = np.zeros((size, size), bool)
    b[40:60, 20:50] = True
    boxes = np.array([[8, 10, 40, 30], [20, 40, 50, 60]], np.float32)
    return Page(image=image, words=["total", "date"], word_boxes=boxes,
                questions=[Question("the total", "layout", a), Question("the date", "reading", b)])


def _store_with_page(tmp_path, page, split="train"):
    store = EngineStore(tmp_path / "store", create=True)
    pid = store.add_page(page.image, page.words, page.word_boxes, "test", split=split)
    return store, pid


# ---- the simulated annotator ---------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 3, 7])
def test_annotator_counts_the_clicks_the_model_needs(tmp_path, k):
    page = _square_page()
    store, pid = _store_with_page(tmp_path, page)
    predictor = ClickCountingPredictor({q.text: q.mask for q in page.questions}, k)
    results = annotate_page(predictor, store, pid, page)
    assert [r.clicks for r in results] == [k, k]
    assert all(r.iou == 1.0 and not r.drawn for r in results)
    assert [r.first_iou for r in results] == ([1.0, 1.0] if k == 0 else [0.0, 0.0])
    # one call per click for all targets still being corrected, with the questions, every click so
    # far and (after the first answer) the previous logits
    assert [(c[0], c[1], c[3]) for c in predictor.calls] == (
        [(["the total", "the date"], 0, False)] + [(["the total", "the date"], n, True) for n in range(1, k + 1)])
    assert all(r.ious == [0.0] * k + [1.0] for r in results)
    saved = store.annotations(pid)
    assert [(a.question, a.clicks, a.kind, a.author) for a in saved] == [
        ("the total", k, "layout", "simulated"), ("the date", k, "reading", "simulated")]
    assert np.array_equal(saved[0].mask, page.questions[0].mask)


def test_annotator_drops_finished_targets_from_the_batch(tmp_path):
    page = _square_page()
    store, pid = _store_with_page(tmp_path, page)
    predictor = ClickCountingPredictor({q.text: q.mask for q in page.questions}, {"the total": 1, "the date": 4})
    results = annotate_page(predictor, store, pid, page)
    assert [r.clicks for r in results] == [1, 4]
    assert [c[0] for c in predictor.calls] == [["the total", "the date"]] * 2 + [["the date"]] * 3
    # the first click on an empty answer is positive, inside the missed region
    labels = predictor.calls[1][2]
    assert labels == [[1], [1]]
    s = summarise(results)
    assert (s["masks"], s["clicks_per_mask"], s["drawn_fraction"], s["noc@75"]) == (2, 2.5, 0.0, 2.5)


def test_annotator_draws_the_mask_after_max_clicks(tmp_path):
    page = _square_page()
    store, pid = _store_with_page(tmp_path, page)
    results = annotate_page(ClickCountingPredictor({q.text: q.mask for q in page.questions}, 99), store, pid, page)
    assert all(r.drawn and r.clicks == MAX_CLICKS and r.iou == 0.0 for r in results)
    # the hand-drawn truth is what is saved
    assert all(np.array_equal(a.mask, q.mask) for a, q in zip(store.annotations(pid), page.questions))


def test_next_click_is_inside_the_largest_error_with_its_sign():
    target = np.zeros((40, 40), bool)
    target[5:25, 5:25] = True                 # 400 px object
    pred = np.zeros_like(target)
    pred[5:25, 5:10] = True                   # missed 300 px of it ...
    pred[30:35, 30:35] = True                 # ... and spilled 25 px elsewhere
    x, y, label = next_click(pred, target)
    assert label == 1 and target[int(y), int(x)] and not pred[int(y), int(x)]
    assert 14 <= x <= 18 and 12 <= y <= 18   # the centre of the missed 20 x 15 block
    spill = np.zeros_like(target)
    spill[0:30, 0:30] = True                  # 500 px spilled around the object
    x, y, label = next_click(spill, target)
    assert label == 0 and spill[int(y), int(x)] and not target[int(y), int(x)]
    assert next_click(target, target) is None


# ---- the training mix ----------------------------------------------------------------------

ALLOWED_TARGETS = ("dociq.data.", "dociq.models.", "dociq.training.")


def _job(tmp_path, train_pages=3, annotate=True, **kw) -> TrainJob:
    """A TrainJob over a real train export of `train_pages` synthetic pages."""
    store, pages = _engine_store(tmp_path, train_pages=train_pages, heldout_pages=0)
    if annotate:
        _annotate_train(store, pages)
    train_json = export_coco(store, tmp_path / "export_train" / "annotations.json", split="train")
    kw = {"steps": 1, "batch_size": 1, "seed": 7, "synthetic_fraction": 0.5} | kw
    return TrainJob(init_from=tmp_path / "base.ckpt", train_json=train_json, work_dir=tmp_path / "round", **kw)


def _compose_run(job: TrainJob):
    """The config `job.command()` runs, composed as train.py composes it (--config-dir is a search path)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dociq.training.config import CONFIG_DIR

    job.write_config({"size": "tiny", "image_size": 128, "mask_unit_px": 32})
    cmd = job.command()
    at = cmd.index("--config-dir")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=[f"hydra.searchpath=['file://{cmd[at + 1]}']", *cmd[at + 2:]])


def _targets(node):
    if isinstance(node, dict):
        if isinstance(node.get("_target_"), str):
            yield node["_target_"]
        for value in node.values():
            yield from _targets(value)
    elif isinstance(node, list):
        for value in node:
            yield from _targets(value)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.7])
def test_round_trains_on_a_mixed_documents_mix_of_user_and_synthetic_pages(tmp_path, fraction):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from dociq.data.mixture import MixedDocuments
    from dociq.training.config import compose

    job = _job(tmp_path, train_pages=3, synthetic_fraction=fraction)
    cfg = _compose_run(job)
    mix = instantiate(cfg.data.train_set)
    assert isinstance(mix, MixedDocuments) and mix.seed == 7          # the round's seed
    # every user page at least once plus its share of synthetic pages
    assert len(mix) == int(np.ceil(3 / (1 - fraction) - 1e-9))
    sources = [mix.source_of(i) for i in range(len(mix))]
    assert sum(k == 1 for k, _ in sources) == round(fraction * len(mix))   # exactly the synthetic share
    assert {j for k, j in sources if k == 0} == {0, 1, 2}
    assert sources == [instantiate(cfg.data.train_set).source_of(i) for i in range(len(mix))]
    assert len(mix.datasets) == (1 if fraction == 0 else 2)
    assert isinstance(mix[sources.index((0, 0))], Page)
    # the run's data config is the shipped data group with only the train set replaced, no validation
    data = OmegaConf.to_container(cfg.data, resolve=True)
    shipped = OmegaConf.to_container(compose(["stage=finetune", "data=corpus_mixed", "model.image_size=128",
                                              "seed=7", f"data.batch_size={job.batch_size}"]).data, resolve=True)
    assert data.pop("val_set") is None and shipped.pop("val_set")
    assert set(data.pop("train_set")) == set(shipped.pop("train_set")) and data == shipped
    # no engine class is built by training: every dociq target of the run's groups is below it
    written = [t for group in ("data", "model", "callbacks")
               for t in _targets(OmegaConf.to_container(cfg[group], resolve=False))]
    assert "dociq.data.mixture.MixedDocuments" in written
    assert not [t for t in written if t.startswith("dociq.") and not t.startswith(ALLOWED_TARGETS)]


def test_round_mix_length_covers_the_run_or_is_num_pages(tmp_path):
    long_run = _job(tmp_path / "a", steps=10, batch_size=4, synthetic_fraction=0.5)
    assert long_run.train_set()["length"] == 40     # steps x batch: synthetic pages do not repeat
    assert _job(tmp_path / "b", num_pages=5).train_set()["length"] == 5


def test_round_refuses_a_mix_it_cannot_build_before_training(tmp_path):
    with pytest.raises(ValueError, match="synthetic_fraction=1.0: need 0 <= f < 1"):
        _job(tmp_path / "a", synthetic_fraction=1.0)
    with pytest.raises(ValueError, match="synthetic_fraction=-0.1"):
        _job(tmp_path / "b", synthetic_fraction=-0.1)
    with pytest.raises(ValueError, match="synthetic set is empty"):
        _job(tmp_path / "c", synthetic=None, synthetic_fraction=0.5)
    with pytest.raises(ValueError, match="num_pages=0"):
        _job(tmp_path / "d", num_pages=0)
    assert _job(tmp_path / "e", synthetic=None, synthetic_fraction=0.0).train_set()["weights"] == [1.0]
    empty = _job(tmp_path / "f", annotate=False)
    with pytest.raises(ValueError, match=r"holds no page.*annotate \(accept\) masks on train pages"):
        empty.write_config({})
    assert not empty.config_dir.exists()
    # run_round refuses it before it exports or trains anything
    store, pages = _engine_store(tmp_path / "g")
    _annotate_train(store, pages)
    base = tmp_path / "base.ckpt"
    base.write_bytes(b"x")
    with pytest.raises(ValueError, match="synthetic_fraction"):
        run_round(store, base_checkpoint=base, heldout_min=1, synthetic_fraction=1.0,
                  train=lambda job: pytest.fail("no training"))
    assert not (store.data_dir / "rounds").exists() and store.rounds() == []


# ---- the round: promotion rule, failures ---------------------------------------------------


def _engine_store(tmp_path, train_pages=2, heldout_pages=1, size=128):
    store = EngineStore(tmp_path / "store", create=True)
    pages = {}
    for i in range(train_pages + heldout_pages):
        page = generate_page(i, seed=77, image_size=size, questions_per_page=4)
        split = "train" if i < train_pages else "heldout"
        pid = store.add_page(page.image, page.words, page.word_boxes, "synthetic", split=split)
        pages[pid] = page
        if split == "heldout":
            save_ground_truth(store, pid, page)
    return store, pages


def _annotate_train(store, pages, k=2):
    for pid, page in pages.items():
        if store.page(pid).split == "train":
            annotate_page(ClickCountingPredictor({q.text: q.mask for q in page.questions}, k), store, pid, page)


def _fake_train(tmp_path):
    def train(job: TrainJob) -> Path:
        assert job.train_json.is_file() and job.steps == 5
        ckpt = job.output_dir / "checkpoints" / "last.ckpt"
        ckpt.parent.mkdir(parents=True)
        ckpt.write_bytes(b"new weights")
        return ckpt
    return train


@pytest.mark.parametrize("old, new, promoted", [(0.60, 0.59, False), (0.60, 0.60, True), (0.60, 0.75, True)])
def test_round_promotes_only_when_heldout_miou_does_not_drop(tmp_path, old, new, promoted):
    store, pages = _engine_store(tmp_path)
    _annotate_train(store, pages, k=3)
    base = tmp_path / "base.ckpt"
    base.write_bytes(b"old weights")
    seen = []

    def evaluate(ckpt, annotations, store_):
        seen.append((Path(ckpt).read_bytes(), len(annotations)))
        return {"miou": old if Path(ckpt).read_bytes() == b"old weights" else new}

    result = run_round(store, base_checkpoint=base, steps=5, heldout_min=2, evaluate=evaluate,
                       train=_fake_train(tmp_path))
    heldout = len([a for a in store.annotations() if store.page(a.page_id).split == "heldout"])
    assert seen == [(b"old weights", heldout), (b"new weights", heldout)]
    assert result.promoted is promoted and result.status == ("promoted" if promoted else "refused")
    expected = Path(result.new_checkpoint) if promoted else base.resolve()
    assert store.checkpoint() == expected     # refused: the base becomes the store's current checkpoint
    assert Path(result.checkpoint) == expected
    [recorded] = store.rounds()
    m = recorded["metrics"]
    assert (m["round"], m["steps"], m["promoted"], m["miou_old"], m["miou_new"]) == (1, 5, promoted, old, new)
    train_anns = [a for a in store.annotations() if store.page(a.page_id).split == "train"]
    assert m["train_annotations"] == len(train_anns) == m["new_annotations"] and m["mean_clicks_new"] == 3.0
    assert (Path(result.work_dir) / "export_heldout" / "annotations.json").is_file()


def test_second_round_counts_only_the_new_annotations_clicks(tmp_path):
    store, pages = _engine_store(tmp_path, train_pages=2)
    train_ids = [p for p in pages if store.page(p).split == "train"]
    first = {train_ids[0]: pages[train_ids[0]]}
    _annotate_train(store, first, k=4)
    base = tmp_path / "base.ckpt"
    base.write_bytes(b"old weights")
    def always_better(ckpt, anns, s):
        return {"miou": 0.5 if Path(ckpt).read_bytes() == b"old weights" else 0.6}
    run_round(store, base_checkpoint=base, steps=5, heldout_min=2, evaluate=always_better, train=_fake_train(tmp_path))
    _annotate_train(store, {train_ids[1]: pages[train_ids[1]]}, k=1)
    second = run_round(store, steps=5, heldout_min=2, evaluate=always_better, train=_fake_train(tmp_path))
    assert second.round == 2 and second.mean_clicks_new == 1.0
    assert second.old_checkpoint == str(store.rounds()[0]["metrics"]["new_checkpoint"])  # trained from round 1's
    assert second.work_dir != store.rounds()[0]["metrics"]["work_dir"]


def test_round_needs_heldout_annotations_and_a_checkpoint(tmp_path):
    store, pages = _engine_store(tmp_path)
    _annotate_train(store, pages)
    base = tmp_path / "base.ckpt"
    base.write_bytes(b"x")
    with pytest.raises(ValueError, match="heldout_min=999"):
        run_round(store, base_checkpoint=base, heldout_min=999)
    with pytest.raises(ValueError, match="--checkpoint"):
        run_round(store, heldout_min=1)
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        run_round(store, base_checkpoint=tmp_path / "missing.ckpt", heldout_min=1)
    assert store.rounds() == [] and store.checkpoint() is None


def test_failed_training_leaves_the_store_unchanged_and_names_the_log(tmp_path, finetune_checkpoint):
    ckpt, _ = finetune_checkpoint
    store, pages = _engine_store(tmp_path)
    _annotate_train(store, pages)
    store.set_checkpoint(ckpt)
    history = len(store.history())
    with pytest.raises(RoundFailedError) as err:
        run_round(store, steps=2, heldout_min=2, overrides=["trainer.log_every_n_steps=abc"],
                  evaluate=lambda *a: pytest.fail("no evaluation after a failed run"))
    log = err.value.log_path
    assert str(log) in str(err.value) and log.is_file()
    assert "trainer.log_every_n_steps" in log.read_text()   # the log holds the run's own error
    assert store.checkpoint() == Path(ckpt).resolve()
    assert store.rounds() == [] and len(store.history()) == history


@pytest.mark.slow
def test_one_real_round_on_a_tiny_store(tmp_path, finetune_checkpoint):
    """annotate (scripted) -> train.py for 2 steps from the fixture checkpoint -> evaluate both with
    the Predictor -> promote or refuse by the rule -> round recorded."""
    ckpt, _ = finetune_checkpoint
    store, pages = _engine_store(tmp_path, train_pages=2, heldout_pages=1)
    _annotate_train(store, pages, k=1)
    result = run_round(store, base_checkpoint=ckpt, steps=2, heldout_min=2,
                       overrides=["data.batch_size=2", "data.train_set.datasets.1.num_pages=8"])
    assert Path(result.new_checkpoint).is_file() and Path(result.log).is_file()
    assert 0.0 <= result.miou_old <= 1.0 and 0.0 <= result.miou_new <= 1.0
    assert result.promoted == (result.miou_new >= result.miou_old)
    expected = Path(result.new_checkpoint) if result.promoted else Path(ckpt).resolve()
    assert store.checkpoint() == expected
    [recorded] = store.rounds()
    assert recorded["metrics"]["status"] == result.status and recorded["metrics"]["steps"] == 2
    # the new checkpoint is a stage=finetune checkpoint the Predictor (and the next round) can load
    from dociq.inference.predictor import Predictor
    Predictor.from_checkpoint(result.new_checkpoint)


def test_cli_runs_a_round_and_reports_it(tmp_path, monkeypatch, capsys):
    from dociq.cli.engine import main as engine_main
    from dociq.engine import retrain

    store, pages = _engine_store(tmp_path)
    _annotate_train(store, pages)
    base = tmp_path / "base.ckpt"
    base.write_bytes(b"old weights")
    monkeypatch.setattr(retrain, "train_subprocess", _fake_train(tmp_path))
    monkeypatch.setattr(retrain, "heldout_miou", lambda ckpt, anns, s: {
        "miou": 0.5 if Path(ckpt).read_bytes() == b"old weights" else 0.55, "per_kind": {}})
    assert engine_main(["retrain", "--data", str(store.data_dir), "--steps", "5", "--checkpoint", str(base),
                        "--heldout-min", "2"]) == 0
    out = capsys.readouterr().out
    assert "round 1:" in out and "50.0 -> 55.0" in out and "PROMOTED" in out
    assert store.checkpoint() is not None and store.checkpoint() != base.resolve()

    def failing(job):
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        job.log_path.write_text("boom")
        raise retrain.RoundFailedError(f"the round's training run failed; its log is {job.log_path}", job.log_path)
    monkeypatch.setattr(retrain, "train_subprocess", failing)
    assert engine_main(["retrain", "--data", str(store.data_dir), "--steps", "5", "--heldout-min", "2"]) == 1
    assert "train.log" in capsys.readouterr().err
    assert len(store.rounds()) == 1
