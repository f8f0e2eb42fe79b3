"""Shared set-up of the model tests."""
import numpy as np
import pytest
import torch


@pytest.fixture
def grounded_predictor(monkeypatch):
    """A Predictor over a 300x200 page with the words "Total due" at (40..150, 50..70), and the
    list of what each call of the model's word grounding returned: `make(model_config)`."""
    from dociq.inference.predictor import Predictor
    from dociq.models.segmenter import SegmentationModel

    def make(config: dict):
        torch.manual_seed(0)
        model = SegmentationModel.from_config(config)
        predictor = Predictor(model, 128)
        image = np.full((200, 300, 3), 255, np.uint8)
        word_boxes = np.array([[40, 50, 100, 70], [110, 50, 150, 70]], np.float32)
        predictor.set_image(image, words=["Total", "due"], word_boxes=word_boxes)
        grounded = []
        ground = model.ground
        monkeypatch.setattr(model, "ground", lambda *a, **kw: grounded.append(ground(*a, **kw)) or grounded[-1])
        return predictor, grounded

    return make
