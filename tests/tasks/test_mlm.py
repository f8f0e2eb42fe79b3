"""stage=mlm: the loss covers masked tokens only, it falls, and the stage config builds the task."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dociq.data.collate import DocumentCollator
from dociq.data.masking import MLMMasking
from dociq.data.schema import Page
from dociq.models.sizes import complete_model_config
from dociq.models.text_encoder import MLMHead
from dociq.training.tasks.mlm import MLMTask, mlm_loss

WORDS = ("invoice total amount due date customer name address phone number order item quantity "
         "price tax subtotal payment terms account bank reference signature approved").split()


def make_pages(n=4, words_per_page=14, seed=0):
    """Small text pages: one line of words per 16 px row on a 128 px page."""
    rng = np.random.default_rng(seed)
    pages = []
    for i in range(n):
        words = [WORDS[j] for j in rng.integers(0, len(WORDS), words_per_page)]
        boxes = np.array([[8 + 30 * (k % 4), 8 + 16 * (k // 4), 34 + 30 * (k % 4), 20 + 16 * (k // 4)]
                          for k in range(words_per_page)], dtype=np.float32)
        pages.append(Page(image=np.full((128, 128, 3), 255, np.uint8), words=words,
                          word_boxes=boxes, meta={"id": f"p{i}"}))
    return pages


def mlm_batch(pages, seed=0):
    collator = DocumentCollator(image_size=128, text_masking=MLMMasking(103, 30522, prob=0.3), seed=seed)
    return collator(pages)


def test_loss_is_cross_entropy_on_masked_positions_only():
    torch.manual_seed(0)
    head = MLMHead(8, 50)
    features = torch.randn(2, 5, 8)
    labels = torch.full((2, 5), -100)
    labels[0, 1], labels[1, 3] = 7, 11
    loss, accuracy, logits = mlm_loss(features, labels, head)
    expected = F.cross_entropy(head(torch.stack([features[0, 1], features[1, 3]])), torch.tensor([7, 11]))
    assert torch.allclose(loss, expected)
    assert logits.shape == (2, 50)
    # unmasked positions do not matter
    features2 = features.clone()
    features2[0, 0] += 5
    assert torch.allclose(mlm_loss(features2, labels, head)[0], loss)
    # nothing masked: a zero loss that still backpropagates
    features.requires_grad_(True)
    zero, _, _ = mlm_loss(features, torch.full((2, 5), -100), head)
    zero.backward()
    assert zero.item() == 0 and features.grad is not None


def test_mlm_loss_falls_and_accuracy_is_reported():
    torch.manual_seed(0)
    task = MLMTask(complete_model_config({"size": "tiny", "text_encoder": {"num_hidden_layers": 1}}))
    assert task.mlm_head.decoder.weight is task.text_encoder.word_embeddings.weight
    batch = mlm_batch(make_pages())
    optimizer = torch.optim.AdamW(task.parameters(), lr=2e-3)
    losses = []
    for _ in range(12):
        out = task(batch)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        losses.append(out["loss"].item())
    assert 0 <= out["mlm_acc"].item() <= 1
    assert losses[-1] < losses[0] - 1.0


def test_missing_mlm_keys_name_the_config():
    task = MLMTask(complete_model_config({"size": "tiny", "text_encoder": {"num_hidden_layers": 1}}))
    batch = DocumentCollator(image_size=128)(make_pages(2))
    with pytest.raises(KeyError, match="data.text_masking"):
        task(batch)


def test_stage_config_builds_the_task_and_masking():
    from hydra.utils import instantiate

    from dociq.training.config import compose

    cfg = compose(["stage=mlm", "model.text_encoder.num_hidden_layers=1"], return_hydra_config=False)
    assert cfg.stage.name == "mlm" and cfg.stage.monitor == "val/loss"
    masking = instantiate(cfg.data.text_masking)
    assert isinstance(masking, MLMMasking) and masking.prob == 0.15
    task = MLMTask(**instantiate(cfg.task, _convert_="all"))
    assert task.text_encoder.mask_token_id == masking.mask_token_id
    assert task.text_encoder.vocab_size == masking.vocab_size


def test_init_from_an_earlier_checkpoint(tmp_path):
    torch.manual_seed(3)
    first = MLMTask(complete_model_config({"size": "tiny", "text_encoder": {"num_hidden_layers": 1}}))
    path = tmp_path / "mlm.ckpt"
    torch.save({"state_dict": first.state_dict()}, path)
    second = MLMTask(complete_model_config({"size": "tiny", "text_encoder": {"num_hidden_layers": 1}}),
                     init={"text_encoder": str(path)})
    for name, tensor in first.text_encoder.state_dict().items():
        assert torch.equal(tensor, second.text_encoder.state_dict()[name]), name
