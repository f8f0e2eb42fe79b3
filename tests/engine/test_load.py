"""Concurrent annotators against a real uvicorn server on 127.0.0.1: N clients (threads + httpx)
each predict and save M masks; every save comes back from the store, none is lost or doubled."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from dociq.engine.server import ServerThread, create_app, mask_to_rle  # noqa: E402
from dociq.engine.store import EngineStore  # noqa: E402
from dociq.inference.predictor import Predictor  # noqa: E402

CLIENTS = 4
SAVES = 10


def test_concurrent_annotators_lose_nothing(tmp_path, finetune_checkpoint):
    from dociq.data.synthetic.generator import SyntheticDocuments

    store = EngineStore(tmp_path / "data", create=True)
    pages = SyntheticDocuments(3, image_size=(160, 128), seed=2)
    ids = [store.add_page(p.image, p.words, p.word_boxes, source=f"s{i}") for i, p in enumerate(pages)]
    app = create_app(store, Predictor.from_checkpoint(finetune_checkpoint[0]), token="load-test-token")
    headers = {"Authorization": "Bearer load-test-token"}

    def annotator(client_index: int) -> list[int]:
        saved = []
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            for k in range(SAVES):
                page_id = ids[(client_index + k) % len(ids)]
                session = f"client-{client_index}"
                if k % 2 == 0:      # from the session's last prediction
                    res = http.post(f"/api/pages/{page_id}/predict",
                                    json={"points": [[20 + 10 * client_index, 30 + 5 * k]], "session": session})
                    assert res.status_code == 200, res.text
                    body = {"session": session, "question": f"q{client_index}-{k}", "status": "rejected"}
                else:               # an explicit mask
                    h, w = store.page(page_id).size
                    mask = np.zeros((h, w), bool)
                    mask[k:k + 10, client_index:client_index + 20] = True
                    body = {"question": f"q{client_index}-{k}", "mask": mask_to_rle(mask), "clicks": k}
                res = http.post(f"/api/pages/{page_id}/annotations", json=body)
                assert res.status_code == 201, res.text
                saved.append(res.json()["id"])
        return saved

    with ServerThread(app) as url:
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(annotator, range(CLIENTS)))
        progress = httpx.get(url + "/api/progress", headers=headers).json()

    returned = [i for r in results for i in r]
    assert len(returned) == len(set(returned)) == CLIENTS * SAVES
    stored = store.annotations(status=None)
    assert sorted(a.id for a in stored) == sorted(returned)
    assert sorted(a.question for a in stored) == sorted(f"q{c}-{k}" for c in range(CLIENTS) for k in range(SAVES))
    assert progress["accepted"] + progress["rejected"] == CLIENTS * SAVES
    assert store.integrity_check() == "ok"
    assert app.state.engine.cache.embed_count == len(ids)     # each page embedded once for all clients
