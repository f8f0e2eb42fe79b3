"""The unit-class linear probe (dociq/training/probe.py): labels land on the right units, an encoder that
knows the classes scores near 1, and one that ignores the page scores no better than position."""
import numpy as np
import torch
from torch import nn

from dociq.data.schema import Page, Region
from dociq.training.probe import CLASSES, neighbour_predictability, page_std, probe_encoder, unit_labels


def region(label, y0, x0, y1, x1, size=128):
    mask = np.zeros((size, size), dtype=bool)
    mask[y0:y1, x0:x1] = True
    return Region(label=label, box=np.array([x0, y0, x1, y1], dtype=np.float32), mask=mask)


def page_with(regions, size=128):
    return Page(image=np.full((size, size, 3), 255, np.uint8), words=[],
                word_boxes=np.zeros((0, 4), np.float32), regions=regions)


def test_unit_labels_follow_the_regions():
    # A table over units (0,0)-(0,1); a cell inside it on unit (0,1) wins (smaller, painted last);
    # a title covering 20% of unit (2,2) is below min_cover, one covering all of (3,3) is not.
    page = page_with([region("table", 0, 0, 32, 64), region("table_cell", 0, 32, 32, 64),
                      region("title", 64, 64, 70, 96), region("title", 96, 96, 128, 128)])
    labels = unit_labels(page, image_size=128, unit_px=32).reshape(4, 4)
    assert labels[0, 0] == CLASSES.index("table")
    assert labels[0, 1] == CLASSES.index("table_cell")
    assert labels[2, 2] == 0 and labels[3, 3] == CLASSES.index("title")
    assert int((labels != 0).sum()) == 3


def test_unit_labels_in_the_padded_input_frame():
    # A 64x128 (H x W) page is resized to 64x128 in a 128 frame: the bottom half is padding.
    page = Page(image=np.full((64, 128, 3), 255, np.uint8), words=[], word_boxes=np.zeros((0, 4), np.float32),
                regions=[Region("paragraph", np.array([0, 0, 128, 64], np.float32), np.ones((64, 128), bool))])
    labels = unit_labels(page, image_size=128, unit_px=32).reshape(4, 4)
    assert (labels[:2] == CLASSES.index("paragraph")).all() and (labels[2:] == 0).all()


class OracleEncoder(nn.Module):
    """Tokens = one-hot of the unit's class (read off the page's red channel) + noise."""

    def forward(self, images):
        red = images[:, 0, ::32, ::32]                       # one pixel per unit
        cls = (red * 0.229 + 0.485).mul(255).round().long().clamp(0, len(CLASSES) - 1)
        onehot = torch.nn.functional.one_hot(cls.flatten(1), len(CLASSES)).float()
        return onehot + 0.01 * torch.randn_like(onehot)


class ConstantEncoder(nn.Module):
    def forward(self, images):
        return torch.ones(images.shape[0], 16, 8)


def coded_pages(n, seed):
    """Pages whose units carry a random class both as region and as a red value = class index."""
    rng = np.random.default_rng(seed)
    pages = []
    for _ in range(n):
        image = np.full((128, 128, 3), 255, np.uint8)
        regions = []
        for unit in range(16):
            c = int(rng.integers(0, 4))
            if c:
                r, k = divmod(unit, 4)
                regions.append(region(CLASSES[c], 32 * r, 32 * k, 32 * r + 32, 32 * k + 32))
            image[32 * (unit // 4):32 * (unit // 4) + 32, 32 * (unit % 4):32 * (unit % 4) + 32, 0] = c
        pages.append(Page(image=image, words=[], word_boxes=np.zeros((0, 4), np.float32), regions=regions))
    return pages


def test_probe_separates_an_informative_encoder_from_a_collapsed_one():
    torch.manual_seed(0)
    train, test = coded_pages(24, 0), coded_pages(8, 1)
    oracle = probe_encoder(OracleEncoder(), train, test, image_size=128, unit_px=32)
    assert oracle.balanced_accuracy > 0.95 and oracle.page_std > 0.1
    collapsed = probe_encoder(ConstantEncoder(), train, test, image_size=128, unit_px=32)
    assert collapsed.balanced_accuracy < 0.4 and collapsed.page_std < 1e-6
    assert collapsed.position_balanced_accuracy < 0.4     # classes are random per unit
    assert np.isnan(collapsed.neighbour_unexplained)       # nothing varies: nothing to predict


def test_page_std_is_zero_only_when_pages_agree():
    same = torch.randn(1, 4, 8).expand(3, 4, 8)
    assert page_std(same) < 1e-6 and page_std(torch.randn(3, 4, 8)) > 0.5


def test_pretraining_logs_the_probe_of_both_encoders_at_every_validation(tmp_path):
    import csv

    from omegaconf import open_dict

    from dociq.training.config import compose
    from dociq.training.train import train

    cfg = compose(["experiment=pretrain_smoke", "trainer.max_steps=4", "trainer.val_check_interval=2",
                   f"paths.root_dir={tmp_path}", "trainer.enable_progress_bar=false"], return_hydra_config=False)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
    metrics = train(cfg)
    assert 0.0 <= metrics["val/probe_bacc"] <= 1.0 and 0.0 <= metrics["val/probe_bacc_target"] <= 1.0
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        logged = [row for row in csv.DictReader(f) if row.get("val/probe_bacc")]
    assert [int(row["step"]) for row in logged] == [0, 1, 3]       # the start, after steps 2 and 4


def test_the_probe_leaves_the_runs_random_stream_alone():
    from types import SimpleNamespace

    from dociq.training.probe_callback import UnitClassProbe

    class Task(nn.Module):
        def __init__(self):
            super().__init__()
            self.image_encoder = OracleEncoder()
            self.hparams = {"model": {"image_size": 128, "mask_unit_px": 32}}

        @property
        def device(self):
            return torch.device("cpu")

    pages = SimpleNamespace(train_set=coded_pages(6, 0), val_set=coded_pages(3, 1))
    trainer = SimpleNamespace(datamodule=pages, sanity_checking=False, global_step=0, loggers=[])
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    values = UnitClassProbe(train_pages=6, test_pages=3)._measure(trainer, Task())
    assert values["val/probe_bacc"] > 0.9                       # the oracle's classes are read off the page
    assert torch.equal(torch.rand(3), expected)


def test_neighbour_predictability_tells_a_smooth_page_from_noise():
    """A token field that varies smoothly across the page is predicted from the 8 neighbours far
    better than from each unit's mean; independent noise per unit is not predictable at all."""
    torch.manual_seed(0)
    h = w = 8

    def smooth(pages):   # per page, a low-frequency field: neighbours share most of a unit's token
        coarse = torch.randn(pages, 16, 3, 3)
        field = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=True)
        return field.permute(0, 2, 3, 1).reshape(pages, h * w, 16)

    mean_error, ridge_error = neighbour_predictability(smooth(200), smooth(50), (h, w))
    assert 0.9 < mean_error < 1.2 and ridge_error < 0.3
    mean_error, ridge_error = neighbour_predictability(torch.randn(200, h * w, 16), torch.randn(50, h * w, 16), (h, w))
    assert 0.9 < mean_error < 1.2 and ridge_error > 0.95
