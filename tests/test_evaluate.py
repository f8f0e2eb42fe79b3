"""Held-out evaluation (dociq.evaluate): prompt sets, per-kind counts, OCR removal, CLI errors."""
import json

import pytest
import torch

from dociq.evaluate import PROMPT_SETS, evaluate, load_task, main

@pytest.fixture(scope="module")
def checkpoint(finetune_checkpoint):
    return finetune_checkpoint[0]


def test_loaded_task_has_the_checkpoint_weights(checkpoint):
    task = load_task(checkpoint)
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    for name, value in task.state_dict().items():
        torch.testing.assert_close(value, saved[name], msg=name)
    assert not task.training


def test_every_prompt_set_scores_every_question(checkpoint, monkeypatch):
    task = load_task(checkpoint)
    seen_ocr = []
    run_rounds = task.run_rounds

    def oracle(batch, rounds, kinds=None):
        # record whether the words reach the model, then answer with the targets themselves
        seen_ocr.append((tuple(kinds), task.use_ocr))
        out = run_rounds(batch, rounds, kinds)
        out["masks"] = out["targets"] * 2 - 1          # logits > 0 exactly on the target
        return out

    monkeypatch.setattr(task, "run_rounds", oracle)
    results = evaluate(task, pages=4, batch_size=2, max_questions=3)
    assert set(results) == set(PROMPT_SETS)
    for r in results.values():
        assert r["miou"] == pytest.approx(1.0)
        assert sum(v for k, v in r.items() if k.startswith("count_")) >= 4
    assert (("question",), False) in seen_ocr and (("question",), True) in seen_ocr
    assert task.use_ocr                                  # restored after the no-OCR pass


def test_cli_writes_json_and_names_a_missing_checkpoint(checkpoint, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([str(checkpoint), "--pages", "2", "--batch-size", "2", "--prompts", "box", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data[str(checkpoint)]) == {"box"} and 0.0 <= data[str(checkpoint)]["box"]["miou"] <= 1.0
    assert "| checkpoint | prompt | mIoU" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.ckpt")]) == 2
    assert "missing.ckpt does not exist" in capsys.readouterr().err
