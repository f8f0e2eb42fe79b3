"""The Label Studio ML-backend routes (dociq.engine.label_studio): health, setup, interactive predict
(keypoint / rectangle context -> a brush mask in Label Studio's own RLE), webhook -> store."""
import base64
import io

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from dociq.engine.label_studio import (LabelConfig, decode_ls_rle, encode_ls_rle, ls_rle_to_mask,  # noqa: E402
                                       mask_to_ls_rle, mask_to_polygon, polygon_to_mask)
from dociq.engine.server import create_app  # noqa: E402
from dociq.engine.store import EngineStore  # noqa: E402
from dociq.inference.predictor import Predictor  # noqa: E402

LABEL_CONFIG = """
<View>
  <Image name="image" value="$image" zoom="true"/>
  <BrushLabels name="tag" toName="image">
    <Label value="Table" background="#FF0000"/>
    <Label value="Paragraph" background="#0d14d3"/>
  </BrushLabels>
  <KeyPointLabels name="tag2" toName="image" smart="true">
    <Label value="Table" smart="true"/>
  </KeyPointLabels>
  <RectangleLabels name="tag3" toName="image" smart="true">
    <Label value="Table"/>
  </RectangleLabels>
</View>"""
POLYGON_CONFIG = """<View><Image name="img" value="$page"/>
<PolygonLabels name="poly" toName="img"><Label value="Figure"/></PolygonLabels></View>"""


@pytest.fixture(scope="module")
def predictor(finetune_checkpoint):
    return Predictor.from_checkpoint(finetune_checkpoint[0])


@pytest.fixture
def engine(tmp_path, predictor):
    from dociq.data.synthetic.generator import SyntheticDocuments

    store = EngineStore(tmp_path / "data", create=True)
    page = SyntheticDocuments(1, image_size=(160, 128), seed=5)[0]
    page_id = store.add_page(page.image, page.words, page.word_boxes, source="synthetic")
    client = TestClient(create_app(store, predictor, ls_ocr="none",
                                   proposal_options={"points_per_side": 2, "pred_iou_thresh": 0.0,
                                                     "stability_score_thresh": 0.0, "min_region_area": 1,
                                                     "classify": False}))
    return client, store, page_id


def keypoint(x, y, w, h, positive=True, label="Table"):
    return {"original_width": w, "original_height": h, "image_rotation": 0, "id": "k1", "from_name": "tag2",
            "to_name": "image", "type": "keypointlabels", "origin": "manual", "is_positive": positive,
            "value": {"x": 100 * x / w, "y": 100 * y / h, "width": 0.3, "keypointlabels": [label]}}


# ---- Label Studio's brush RLE --------------------------------------------------------------------

def test_brush_rle_matches_label_studio_converter():
    # label_studio_converter 0.0.59: brush.mask2rle(m) for this 7x5 mask (m*255, uint8)
    mask = np.zeros((7, 5), bool)
    mask[2:5, 1:4] = True
    mask[6, 4] = True
    expected = [0, 0, 0, 140, 57, 27, 254, 43, 0, 183, 255, 56, 5, 191, 249, 192, 45, 255, 226, 112, 8, 255, 192]
    assert mask_to_ls_rle(mask) == expected
    assert np.array_equal(ls_rle_to_mask(expected, 7, 5), mask)


def test_brush_rle_round_trips_long_and_short_runs():
    rng = np.random.default_rng(1)
    mask = np.zeros((200, 150), bool)
    mask[20:180, 10:140] = True                      # runs far beyond 2^16 values of RGBA
    mask[rng.random(mask.shape) < 0.02] ^= True      # and runs of one
    assert np.array_equal(ls_rle_to_mask(mask_to_ls_rle(mask), 200, 150), mask)
    values = rng.integers(0, 256, 500).astype(np.uint8)
    assert np.array_equal(decode_ls_rle(encode_ls_rle(values)), values)
    with pytest.raises(ValueError, match="needs"):
        ls_rle_to_mask(mask_to_ls_rle(mask), 150, 200 + 1)
    with pytest.raises(ValueError, match="bytes"):
        decode_ls_rle([1, 2, 300, 4, 5, 6])


def test_polygon_round_trip():
    mask = np.zeros((60, 80), bool)
    mask[10:40, 20:70] = True
    back = polygon_to_mask(mask_to_polygon(mask), 60, 80)
    assert (back & mask).sum() / (back | mask).sum() > 0.9


def test_label_config_parsing():
    config = LabelConfig.parse(LABEL_CONFIG)
    assert (config.image_name, config.image_key, config.from_name, config.output_type) == \
        ("image", "image", "tag", "brushlabels")
    assert config.labels == ["Table", "Paragraph"]
    assert config.label_for("paragraph") == "Paragraph" and config.label_for("figure") == "Table"
    poly = LabelConfig.parse(POLYGON_CONFIG)
    assert (poly.image_key, poly.from_name, poly.output_type) == ("page", "poly", "polygonlabels")
    with pytest.raises(ValueError, match="BrushLabels"):
        LabelConfig.parse("<View><Image name='i' value='$image'/></View>")
    with pytest.raises(ValueError, match="not XML"):
        LabelConfig.parse("<View>")


# ---- routes ----------------------------------------------------------------------------------

def test_health_and_setup(engine):
    client, _store, _page = engine
    health = client.get("/health").json()
    assert health["status"] == "UP" and health["model_class"] == "DociqEngine"
    assert client.get("/").json()["status"] == "UP"                     # Label Studio's GET / check
    res = client.post("/setup", json={"project": "3.1700000000", "schema": LABEL_CONFIG})
    assert res.status_code == 200, res.text
    assert res.json()["model_version"].startswith("dociq")
    assert client.post("/setup", json={"project": "3", "schema": "<View>"}).status_code == 422


def test_predict_keypoint_context_returns_a_brush_mask(engine, predictor):
    client, store, page_id = engine
    page = store.page(page_id)
    w, h = page.width, page.height
    body = {"tasks": [{"id": 7, "data": {"image": f"/api/pages/{page_id}/image"}}], "label_config": LABEL_CONFIG,
            "project": "3.1700000000", "params": {"context": {"result": [keypoint(40, 60, w, h)]}}}
    res = client.post("/predict", json=body)
    assert res.status_code == 200, res.text
    (prediction,) = res.json()["results"]
    assert prediction["model_version"].startswith("dociq")
    (result,) = prediction["result"]
    assert result["type"] == "brushlabels" and result["from_name"] == "tag" and result["to_name"] == "image"
    assert (result["original_width"], result["original_height"]) == (w, h)
    assert result["value"]["format"] == "rle" and result["value"]["brushlabels"] == ["Table"]
    mask = ls_rle_to_mask(result["value"]["rle"], h, w)
    # the same click through the Predictor directly gives the same mask
    predictor.set_image(store.page_image(page_id), *store.page_words(page_id))
    expected, score, _ = predictor.predict_masks(points=[[40, 60]], point_labels=[1])
    assert np.array_equal(mask, expected[0]) and prediction["score"] == pytest.approx(float(score[0]), abs=1e-5)


def test_predict_rectangle_polygon_config_and_proposals(engine):
    client, store, page_id = engine
    page = store.page(page_id)
    w, h = page.width, page.height
    rect = {"type": "rectanglelabels", "original_width": w, "original_height": h,
            "value": {"x": 10, "y": 10, "width": 50, "height": 40, "rectanglelabels": ["Figure"]}}
    res = client.post("/predict", json={"tasks": [{"id": 1, "data": {"page": f"/api/pages/{page_id}/image"}}],
                                        "label_config": POLYGON_CONFIG, "params": {"context": {"result": [rect]}}})
    assert res.status_code == 200, res.text
    (result,) = res.json()["results"][0]["result"]
    assert result["type"] == "polygonlabels" and result["value"]["polygonlabels"] == ["Figure"]
    assert all(0 <= x <= 100 and 0 <= y <= 100 for x, y in result["value"]["points"])
    # no context: the page's proposals, one result each
    res = client.post("/predict", json={"tasks": [{"id": 2, "data": {"page_id": page_id}}],
                                        "label_config": LABEL_CONFIG})
    results = res.json()["results"][0]["result"]
    assert results and all(r["type"] == "brushlabels" for r in results)


def test_task_images_local_data_url_and_refusals(engine):
    client, store, _page = engine
    folder = store.data_dir / "incoming"
    folder.mkdir()
    Image.new("RGB", (50, 40), (250, 250, 250)).save(folder / "scan.png")
    buf = io.BytesIO()
    Image.new("RGB", (30, 20), (10, 200, 10)).save(buf, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    def predict(image):
        return client.post("/predict", json={"tasks": [{"id": 1, "data": {"image": image}}],
                                             "label_config": LABEL_CONFIG,
                                             "params": {"context": {"result": [keypoint(5, 5, 50, 40)]}}})

    assert predict("incoming/scan.png").status_code == 200
    assert predict("/data/local-files/?d=incoming/scan.png").status_code == 200
    assert len(store.pages()) == 2                                   # the same file: one page
    assert predict(data_url).status_code == 200 and len(store.pages()) == 3
    for bad, status in [("https://example.com/page.png", 422), ("/etc/passwd", 403),
                        ("../outside.png", 403), ("incoming/missing.png", 404),
                        ("data:text/plain;base64,aGk=", 422), ("s3://bucket/page.png", 422)]:
        res = predict(bad)
        assert res.status_code == status, (bad, res.text)
        assert res.json()["error"]
    assert len(store.pages()) == 3
    assert client.post("/predict", json={"tasks": []}).status_code == 422
    assert client.post("/predict", content=b"[", headers={"content-type": "application/json"}).status_code == 422


def test_webhook_stores_updates_and_deletes_annotations(engine, monkeypatch):
    from dociq.engine import server

    if server.retrain_available():       # START_TRAINING below: record the call, train nothing
        from dociq.engine import retrain

        started = []
        monkeypatch.setattr(retrain, "run_round", lambda store, **kw: started.append(kw) or {"status": "refused"})
    client, store, page_id = engine
    page = store.page(page_id)
    h, w = page.height, page.width
    mask = np.zeros((h, w), bool)
    mask[20:60, 10:90] = True
    result = {"id": "r1", "type": "brushlabels", "from_name": "tag", "to_name": "image",
              "original_width": w, "original_height": h,
              "value": {"format": "rle", "rle": mask_to_ls_rle(mask), "brushlabels": ["Table"]}}
    payload = {"action": "ANNOTATION_CREATED", "project": {"id": 3, "label_config": LABEL_CONFIG},
               "task": {"id": 7, "data": {"image": f"/api/pages/{page_id}/image"}},
               "annotation": {"id": 41, "result": [result]}}
    res = client.post("/webhook", json=payload)
    assert res.status_code == 201, res.text
    (saved,) = store.annotations(page_id)
    assert saved.category == "Table" and saved.question == "segment the table" and np.array_equal(saved.mask, mask)
    assert saved.author == "label-studio:annotation:41"

    mask2 = np.zeros((h, w), bool)
    mask2[5:15, 5:15] = True
    result["value"]["rle"] = mask_to_ls_rle(mask2)
    client.post("/webhook", json={**payload, "action": "ANNOTATION_UPDATED"})
    (updated,) = store.annotations(page_id)                        # replaced, not added
    assert np.array_equal(updated.mask, mask2)
    client.post("/webhook", json={**payload, "action": "ANNOTATION_DELETED"})
    assert store.annotations(page_id) == []

    assert client.post("/webhook", json={"action": "PROJECT_UPDATED"}).json()["status"] == "Unknown event"
    res = client.post("/webhook", json={"action": "START_TRAINING", "project": {"id": 3}})
    assert res.status_code in (200, 201) and res.json()["status"] in ("ok", "busy")
    bad = client.post("/webhook", json={"action": "ANNOTATION_CREATED", "project": {}})
    assert bad.status_code == 422
