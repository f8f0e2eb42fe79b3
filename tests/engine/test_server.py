"""The engine's HTTP API (dociq.engine.server) through FastAPI's TestClient: every endpoint, every
bad input a 4xx with a JSON message, the page cache (one embedding per page), auth and binding."""
import base64
import io

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi")
pytest.importorskip("multipart")

from fastapi.testclient import TestClient  # noqa: E402

from dociq.engine import server  # noqa: E402
from dociq.engine.page_cache import PageCache  # noqa: E402
from dociq.engine.server import create_app, mask_to_rle, rle_to_mask  # noqa: E402
from dociq.engine.store import EngineStore  # noqa: E402
from dociq.inference.predictor import Predictor  # noqa: E402


def synthetic_pages(n, size=(160, 128)):
    from dociq.data.synthetic.generator import SyntheticDocuments

    return [SyntheticDocuments(n, image_size=size, seed=3)[i] for i in range(n)]


@pytest.fixture(scope="module")
def predictor(finetune_checkpoint):
    return Predictor.from_checkpoint(finetune_checkpoint[0])


@pytest.fixture
def store(tmp_path):
    store = EngineStore(tmp_path / "data", create=True)
    for i, page in enumerate(synthetic_pages(2)):
        store.add_page(page.image, page.words, page.word_boxes, source=f"synthetic-{i}")
    return store


def make_client(store, predictor, **kwargs):
    kwargs.setdefault("proposal_options", {"points_per_side": 2, "pred_iou_thresh": 0.0,
                                           "stability_score_thresh": 0.0, "min_region_area": 1,
                                           "classify": False})
    return TestClient(create_app(store, predictor, **kwargs))


@pytest.fixture
def client(store, predictor):
    return make_client(store, predictor)


def first_page(store):
    return store.pages()[0]


def png_bytes(size=(40, 30), colour=(255, 255, 255)):
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


# ---- pages -------------------------------------------------------------------------------------

def test_pages_list_detail_and_image(client, store):
    data = client.get("/api/pages").json()
    assert [p["id"] for p in data["pages"]] == [p.id for p in store.pages()]
    assert data["progress"]["pages"] == 2
    page = first_page(store)
    detail = client.get(f"/api/pages/{page.id}").json()
    words, boxes = store.page_words(page.id)
    assert (detail["width"], detail["height"]) == (page.width, page.height)
    assert [w["text"] for w in detail["words"]] == words
    np.testing.assert_allclose([w["box"] for w in detail["words"]], boxes, atol=1e-4)
    res = client.get(f"/api/pages/{page.id}/image")
    assert res.status_code == 200 and res.headers["content-type"] == "image/png"
    assert np.array_equal(np.array(Image.open(io.BytesIO(res.content)).convert("RGB")), store.page_image(page.id))


def test_unknown_page_is_404_everywhere(client):
    for method, url, body in [("get", "/api/pages/p999999", None), ("get", "/api/pages/p999999/image", None),
                              ("post", "/api/pages/p999999/predict", {"question": "the title"}),
                              ("post", "/api/pages/p999999/proposals", {}),
                              ("post", "/api/pages/p999999/annotations", {"question": "x"})]:
        res = getattr(client, method)(url, **({} if body is None else {"json": body}))
        assert res.status_code == 404, (url, res.text)
        assert "p999999" in res.json()["error"]


# ---- predict -----------------------------------------------------------------------------------

def test_predict_returns_page_sized_mask_and_embeds_once(client, store):
    page = first_page(store)
    cache = client.app.state.engine.cache
    first = client.post(f"/api/pages/{page.id}/predict", json={"question": "the title", "session": "s"}).json()
    assert first["embedded"] is True
    mask = rle_to_mask(first["mask"], (page.height, page.width))
    png = Image.open(io.BytesIO(base64.b64decode(first["mask_png"])))
    assert png.size == (page.width, page.height)
    assert np.array_equal(np.array(png) == 1, mask)
    assert first["area"] == int(mask.sum()) and isinstance(first["score"], float) and first["server_ms"] > 0
    for x in (10, 40, 70):
        res = client.post(f"/api/pages/{page.id}/predict",
                          json={"points": [[x, 50]], "point_labels": [1], "use_previous": True, "session": "s"})
        assert res.status_code == 200 and res.json()["embedded"] is False
    assert cache.embed_count == 1


def test_use_previous_sends_the_last_logits_as_mask_prompt(client, store, predictor):
    page = first_page(store)
    url = f"/api/pages/{page.id}/predict"
    client.post(url, json={"question": "all paragraphs", "session": "a"})
    refined = client.post(url, json={"points": [[30, 40]], "use_previous": True, "session": "a"}).json()
    plain = client.post(url, json={"points": [[30, 40]], "use_previous": False, "session": "b"}).json()
    # the same click with and without the mask prompt: the mask prompt changes the decoder's answer
    assert refined["score"] != pytest.approx(plain["score"], abs=1e-6)
    cache = client.app.state.engine.cache
    with cache.lock:
        cache.activate(page.id)
        previous = cache.last("b", page.id).logits
        _, scores, _ = predictor.predict_masks(points=[[30, 40]], point_labels=[1], mask_input=previous)
    again = client.post(url, json={"points": [[30, 40]], "use_previous": True, "session": "b"}).json()
    assert again["score"] == pytest.approx(float(scores[0]), abs=1e-5)


@pytest.mark.parametrize("body, words", [
    ({"points": [[5000, 10]]}, "outside"),
    ({"box": [50, 50, 10, 10]}, "negative size"),
    ({"box": [1, 2, 3]}, "box"),
    ({"points": [[1, 2, 3]]}, "points"),
    ({"points": [[10, 10]], "point_labels": [7]}, "not 0 or 1"),
    ({}, "needs a prompt"),
    ({"question": "   "}, "empty"),
    ({"question": "x", "colour": "red"}, "colour"),
    ({"points": "here"}, "points"),
])
def test_bad_prompts_are_422_with_the_reason(client, store, body, words):
    res = client.post(f"/api/pages/{first_page(store).id}/predict", json=body)
    assert res.status_code == 422, res.text
    assert words in res.json()["error"]


def test_unknown_routes_and_methods_are_json_4xx(client):
    res = client.get("/api/nothing-here")
    assert res.status_code == 404 and res.json()["error"] == "Not Found"
    res = client.delete("/api/pages")
    assert res.status_code == 405 and res.json()["error"]


def test_malformed_json_is_422(client, store):
    res = client.post(f"/api/pages/{first_page(store).id}/predict", content=b'{"question": ',
                      headers={"content-type": "application/json"})
    assert res.status_code == 422 and "not valid JSON" in res.json()["error"]


def test_nan_prompt_is_422(client, store):
    res = client.post(f"/api/pages/{first_page(store).id}/predict", content=b'{"points": [[NaN, 3]]}',
                      headers={"content-type": "application/json"})
    assert res.status_code == 422, res.text


# ---- annotations -------------------------------------------------------------------------------

def test_accept_last_prediction_undo_relabel_progress_export(client, store):
    page = first_page(store)
    pred = client.post(f"/api/pages/{page.id}/predict", json={"question": "all paragraphs", "session": "u"}).json()
    assert pred["area"] > 0
    saved = client.post(f"/api/pages/{page.id}/annotations",
                        json={"session": "u", "category": "paragraph", "clicks": 3, "seconds": 4.5})
    assert saved.status_code == 201, saved.text
    ann_id = saved.json()["id"]
    record = store.annotation(ann_id)
    assert record.question == "all paragraphs" and record.category == "paragraph" and record.clicks == 3
    assert np.array_equal(record.mask, rle_to_mask(pred["mask"], (page.height, page.width)))
    # the session's last prediction is used once: the next object starts from scratch
    again = client.post(f"/api/pages/{page.id}/annotations", json={"session": "u", "question": "x"})
    assert again.status_code == 422 and "predict" in again.json()["error"]

    rejected = client.post(f"/api/pages/{page.id}/annotations",
                           json={"question": "the table", "status": "rejected", "mask": pred["mask"]}).json()
    detail = client.get(f"/api/pages/{page.id}").json()
    assert {(a["id"], a["status"]) for a in detail["annotations"]} == {(ann_id, "accepted"),
                                                                       (rejected["id"], "rejected")}
    assert client.get("/api/progress").json()["accepted"] == 1

    patched = client.patch(f"/api/annotations/{ann_id}", json={"category": "table"})
    assert patched.status_code == 200 and patched.json()["category"] == "table"
    assert store.annotation(ann_id).category == "table"

    export = client.get("/api/export").json()
    assert [(a["id"], a["segmentation"]) for a in export["annotations"]] == [(ann_id, record.rle)]
    assert export["categories"] == [{"id": 1, "name": "table", "supercategory": "document"}]
    assert [img["page_id"] for img in export["images"]] == [page.id]

    assert client.post(f"/api/annotations/{ann_id}/undo").json() == {"id": ann_id, "undone": True}
    assert client.get("/api/progress").json()["accepted"] == 0
    assert client.post(f"/api/annotations/{ann_id}/undo").status_code == 422        # already undone
    assert client.post("/api/annotations/987654/undo").status_code == 404
    assert client.patch("/api/annotations/987654", json={"category": "x"}).status_code == 404
    assert client.patch(f"/api/annotations/{ann_id}", json={}).status_code == 422


def test_bad_annotations_are_4xx(client, store):
    page = first_page(store)
    url = f"/api/pages/{page.id}/annotations"
    h, w = page.height, page.width
    empty = mask_to_rle(np.zeros((h, w), bool))
    full = mask_to_rle(np.ones((h, w), bool))
    cases = [
        ({"question": "x", "mask": empty}, "at least one pixel"),
        ({"question": "x", "mask": mask_to_rle(np.ones((h + 1, w), bool))}, "size"),
        ({"question": "x", "mask": {"size": [h, w], "counts": "garbage!!"}}, "counts"),
        ({"question": "x", "mask": {"size": [h, w], "counts": [5, 5]}}, "covers"),
        ({"question": "x", "mask": full, "status": "maybe"}, "status"),
        ({"question": "x", "mask": full, "kind": "poem"}, "kind"),
        ({"question": "", "mask": full}, "question"),
        ({"question": "x", "mask": full, "clicks": -1}, "clicks"),
    ]
    for body, words in cases:
        res = client.post(url, json=body)
        assert res.status_code == 422, (body, res.text)
        assert words in res.json()["error"], (body, res.json())
    assert store.annotations(status=None) == []


def test_proposals_are_rle_box_score_category(client, store):
    page = first_page(store)
    res = client.post(f"/api/pages/{page.id}/proposals", json={})
    assert res.status_code == 200, res.text
    regions = res.json()["regions"]
    assert regions, "relaxed thresholds keep at least one region"
    for r in regions:
        mask = rle_to_mask(r["mask"], (page.height, page.width))
        assert mask.sum() == r["area"] > 0
        ys, xs = np.nonzero(mask)
        assert r["box"] == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        assert 0.0 <= r["score"] <= 1.0 and isinstance(r["category"], str)
    assert client.app.state.engine.cache.embed_count == 1
    assert client.post(f"/api/pages/{page.id}/proposals", json={}).json()["regions"] == regions   # cached
    assert client.post(f"/api/pages/{page.id}/proposals", json={"points_per_side": 0}).status_code == 422


# ---- page cache --------------------------------------------------------------------------------

def test_page_cache_lru_bound_and_swap(store, predictor):
    ids = [p.id for p in store.pages()]
    cache = PageCache.from_store(predictor, store, capacity=1)
    cache.predict(ids[0], points=[[10, 10]])
    cache.predict(ids[1], points=[[10, 10]])
    cache.predict(ids[0], points=[[10, 10]])          # evicted by page 2: embedded again
    assert cache.embed_count == 3 and cache.cached_pages() == [ids[0]]
    cache = PageCache.from_store(predictor, store, capacity=2)
    a = cache.predict(ids[0], question="the title")
    cache.predict(ids[1], question="the title")
    b = cache.predict(ids[0], question="the title")   # swapped back in, not re-embedded
    assert cache.embed_count == 2
    assert np.array_equal(a.mask, b.mask) and a.score == pytest.approx(b.score, abs=1e-6)
    with pytest.raises(ValueError, match="capacity"):
        PageCache.from_store(predictor, store, capacity=0)


# ---- uploads -----------------------------------------------------------------------------------

def upload(client, name, data, ocr="none"):
    return client.post("/api/uploads", files=[("files", (name, data, "application/octet-stream"))],
                       data={"ocr": ocr})


def test_upload_png_adds_a_page(client, store):
    res = upload(client, "new page.png", png_bytes(colour=(200, 10, 10)))
    assert res.status_code == 201, res.text
    (page_id,) = res.json()["pages"]
    assert store.page(page_id).size == (30, 40)
    assert upload(client, "same.png", png_bytes(colour=(200, 10, 10))).json()["existing"] == [page_id]


@pytest.mark.parametrize("name, data, status", [
    ("../evil.png", png_bytes(), 400),
    ("/etc/evil.png", png_bytes(), 400),
    ("..\\evil.png", png_bytes(), 400),
    ("sub/evil.png", png_bytes(), 400),
    ("C:evil.png", png_bytes(), 400),
    ("notes.txt", b"just some text", 415),
    ("fake.png", b"GIF89a....", 415),
    ("broken.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, 422),
])
def test_bad_uploads(client, store, name, data, status):
    res = upload(client, name, data)
    assert res.status_code == status, res.text
    assert res.json()["error"]
    assert len(store.pages()) == 2


def test_upload_size_cap_is_413(store, predictor):
    client = make_client(store, predictor, max_upload_bytes=2000)
    res = upload(client, "big.png", png_bytes(size=(600, 600)) + b"\x00" * 4000)
    assert res.status_code == 413 and "2000" in res.json()["error"]
    big = b"\x89PNG\r\n\x1a\n" + b"\x00" * (3 * 2**20)       # beyond the limit by Content-Length alone
    assert upload(client, "huge.png", big).status_code == 413
    assert len(store.pages()) == 2


def wait_for_retrain(client, seconds=30.0):
    import time

    deadline = time.time() + seconds
    while time.time() < deadline:
        state = client.get("/api/retrain").json()
        if not state["running"]:
            return state
        time.sleep(0.05)
    raise AssertionError("the retrain round did not finish")


def test_retrain_runs_a_round_in_the_background_and_reloads_a_promoted_model(store, predictor, monkeypatch,
                                                                              finetune_checkpoint, tmp_path):
    if not server.retrain_available():
        res = make_client(store, predictor).post("/api/retrain", json={})
        assert res.status_code == 501 and "not available" in res.json()["error"]
        return
    import shutil

    from dociq.engine import retrain

    calls = []
    promoted = tmp_path / "round1.ckpt"
    shutil.copy(finetune_checkpoint[0], promoted)

    def fake_round(store_, base_checkpoint=None, **options):   # no training in tests: the round's contract
        calls.append((store_, base_checkpoint, options))
        if options.get("steps") == 13:
            raise ValueError("no accepted annotations: nothing to train on")
        store_.set_checkpoint(promoted)
        return {"status": "promoted"}

    monkeypatch.setattr(retrain, "run_round", fake_round)
    client = make_client(store, predictor, checkpoint=finetune_checkpoint[0])
    page = first_page(store)
    client.post(f"/api/pages/{page.id}/predict", json={"question": "the title"})
    assert client.post("/api/retrain", json={"steps": 0}).status_code == 422
    assert client.post("/api/retrain", json={"overrides": ["trainer.max_steps=1"]}).status_code == 422
    res = client.post("/api/retrain", json={"steps": 5})
    assert res.status_code == 202, res.text
    state = wait_for_retrain(client)
    assert state["error"] is None and state["last"] == {"status": "promoted"}
    assert calls[0][0] is store and calls[0][1] == finetune_checkpoint[0] and calls[0][2] == {"steps": 5}
    engine = client.app.state.engine
    assert engine.checkpoint == promoted.resolve() and engine.cache.cached_pages() == []   # new model, fresh cache
    assert client.post(f"/api/pages/{page.id}/predict", json={"question": "the title"}).json()["embedded"] is True
    assert client.post("/api/retrain", json={"steps": 13}).status_code == 202
    assert "nothing to train on" in wait_for_retrain(client)["error"]


# ---- auth, static files, binding ---------------------------------------------------------------

def test_token_required_on_every_route(store, predictor):
    token = "s3cret-token"
    client = make_client(store, predictor, token=token)
    page = first_page(store)
    for url in ("/api/pages", f"/api/pages/{page.id}/image", "/health", "/static/app.js", "/api/export"):
        assert client.get(url).status_code == 401, url
        assert client.get(url, headers={"Authorization": "Bearer wrong-token"}).status_code == 401, url
    assert client.post(f"/api/pages/{page.id}/predict", json={"question": "x"}).status_code == 401
    auth = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/pages", headers=auth).status_code == 200
    basic = base64.b64encode(f"ls:{token}".encode()).decode()
    assert client.get("/health", headers={"Authorization": f"Basic {basic}"}).status_code == 200
    # ?token= on what the browser loads (a GET), which also sets the page's cookie ...
    res = client.get(f"/api/pages/{page.id}/image?token={token}")
    assert res.status_code == 200 and server.TOKEN_COOKIE in res.cookies
    assert client.get("/api/pages").status_code == 200            # the cookie now travels along
    client.cookies.clear()
    # ... but never on a POST (a link must not change the store)
    res = client.post(f"/api/pages/{page.id}/annotations?token={token}", json={"question": "x"})
    assert res.status_code == 401


def test_cross_origin_writes_and_foreign_hosts_are_refused(store, predictor):
    client = make_client(store, predictor)
    page = first_page(store)
    url = f"/api/pages/{page.id}/predict"
    res = client.post(url, json={"question": "x"}, headers={"Origin": "http://evil.example"})
    assert res.status_code == 403 and "cross-origin" in res.json()["error"]
    assert client.post(url, json={"question": "x"}, headers={"Origin": "http://testserver"}).status_code == 200
    assert client.get("/api/pages", headers={"Origin": "http://evil.example"}).status_code == 200   # reads: CORS
    res = client.post(
        "/api/uploads", files=[("files", ("a.png", png_bytes(), "image/png"))], headers={"Origin": "null"})
    assert res.status_code == 403 and len(store.pages()) == 2
    guarded = make_client(store, predictor, trusted_hosts=list(server.LOOPBACK_NAMES))
    assert guarded.get("/api/pages").status_code == 400                       # Host: testserver
    assert guarded.get("/api/pages", headers={"Host": "127.0.0.1:8765"}).status_code == 200


def test_static_files_and_index(client):
    assert "dociq data engine" in client.get("/", headers={"accept": "text/html"}).text
    assert client.get("/static/app.js").status_code == 200
    for url in ("/static/../server.py", "/static/%2e%2e/server.py", "/static/..%2fserver.py"):
        res = client.get(url)
        assert res.status_code == 404 or "create_app" not in res.text, url


def test_check_bind(monkeypatch, capsys):
    monkeypatch.delenv(server.TOKEN_ENV, raising=False)
    assert server.check_bind("127.0.0.1", None) is None
    assert server.check_bind("localhost", None) is None
    assert server.check_bind("::1", None) is None
    with pytest.raises(ValueError, match="--token"):
        server.check_bind("0.0.0.0", None)
    assert "WARNING" in capsys.readouterr().err
    assert server.check_bind("0.0.0.0", "long-enough-token") == "long-enough-token"
    monkeypatch.setenv(server.TOKEN_ENV, "token-from-env")
    assert server.check_bind("192.168.1.5", None) == "token-from-env"
    with pytest.raises(ValueError, match="at least 8"):
        server.check_bind("127.0.0.1", "short")


def test_main_refuses_a_network_host_without_token(tmp_path, monkeypatch, capsys):
    from dociq.cli.engine_serve import main as serve_main

    monkeypatch.delenv(server.TOKEN_ENV, raising=False)
    code = serve_main([str(tmp_path / "data"), "--host", "0.0.0.0", "--checkpoint", "x.ckpt"])
    err = capsys.readouterr().err
    assert code == 2 and "WARNING" in err and "no token" in err
    code = serve_main(["--data", str(tmp_path / "missing")])
    assert code == 2 and "engine store" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_main([])                      # no store folder: argparse's usage error


def test_rle_helpers_round_trip():
    rng = np.random.default_rng(0)
    mask = rng.random((23, 17)) > 0.6
    rle = mask_to_rle(mask)
    assert np.array_equal(rle_to_mask(rle, (23, 17)), mask)
    from itertools import groupby

    runs = [(bool(v), len(list(g))) for v, g in groupby(mask.T.ravel())]   # column-major, zeros first
    counts = ([0] if runs[0][0] else []) + [n for _, n in runs]
    assert np.array_equal(rle_to_mask({"size": [23, 17], "counts": counts}, (23, 17)), mask)


def test_build_app_from_a_store_folder(store, finetune_checkpoint):
    with pytest.raises(ValueError, match="--checkpoint"):
        server.build_app(store.data_dir)
    store.set_checkpoint(finetune_checkpoint[0])                 # the store's promoted checkpoint is the default
    client = TestClient(server.build_app(store.data_dir, trusted_hosts=["testserver"]))
    page = first_page(store)
    assert client.post(f"/api/pages/{page.id}/predict", json={"question": "the title"}).status_code == 200
    assert client.get("/health").json()["model_version"].startswith(f"dociq-{finetune_checkpoint[0].stem}")
