"""The unit classifier (dociq.inference.unit_classifier): scikit-learn's boosted trees run as numpy
arrays, the features they read (dociq.inference.unit_features), and the classifier the package ships."""
import numpy as np
import pytest
from scipy.special import softmax
from sklearn.ensemble import HistGradientBoostingClassifier

from dociq.data.schema import REGION_CLASSES
from dociq.inference.class_answers import text_units
from dociq.data.text_blocks import page_blocks
from dociq.inference.unit_classifier import NOT_A_REGION, UnitClassifier, default_unit_classifier
from dociq.inference.unit_features import FEATURE_NAMES, unit_features

CLASSES = ("title", "paragraph", "page_number", NOT_A_REGION)


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 5))
    x[rng.random(x.shape) < 0.05] = np.nan                    # missing values take their learned side
    y = (x[:, 0] > 0).astype(int) + 2 * (np.nan_to_num(x[:, 1]) > 0.5)
    model = HistGradientBoostingClassifier(max_iter=30, max_leaf_nodes=7, early_stopping=False,
                                           random_state=0).fit(x, y)
    names = [f"f{i}" for i in range(5)]
    return model, UnitClassifier.from_sklearn(model, CLASSES, features=names), x


def test_the_stored_trees_give_scikit_learns_probabilities(fitted):
    model, classifier, x = fitted
    test = np.random.default_rng(1).normal(size=(200, 5))
    test[::7, 2] = np.nan
    for data in (x, test):
        np.testing.assert_allclose(softmax(classifier.raw_scores(data), axis=1), model.predict_proba(data), rtol=0, atol=1e-12)
    probs = classifier.probabilities(test)
    assert probs.shape == (200, len(REGION_CLASSES))
    k = [REGION_CLASSES.index(c) for c in CLASSES[:3]]
    np.testing.assert_allclose(probs[:, k], model.predict_proba(test)[:, :3], atol=1e-12)   # "none" left out
    assert np.all(np.delete(probs, k, axis=1) == 0)


def test_a_saved_classifier_loads_with_the_same_answers_and_bad_files_say_what_to_do(fitted, tmp_path):
    _, classifier, x = fitted
    classifier.save(tmp_path / "units.npz")
    loaded = UnitClassifier.load(tmp_path / "units.npz")
    assert loaded.classes == CLASSES
    np.testing.assert_array_equal(loaded.raw_scores(x), classifier.raw_scores(x))
    with pytest.raises(FileNotFoundError, match="fit_unit_classifier.py"):
        UnitClassifier.load(tmp_path / "absent.npz")
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(ValueError, match="not a unit classifier file"):
        UnitClassifier.load(tmp_path / "other.npz")
    with pytest.raises(ValueError, match=r"\[units, 5\]"):
        classifier.raw_scores(np.zeros((2, 4)))


def draw_page(scale: int = 1):
    """A page with a large title, two paragraphs and a page number centred at the bottom."""
    h, w = 800 * scale, 600 * scale
    image = np.full((h, w, 3), 255, np.uint8)
    words, boxes = [], []

    def line(texts, x, y, height, char=7):
        for text in texts:
            width = char * len(text) * height / 12
            boxes.append([x, y, x + width, y + height])
            words.append(text)
            x += width + 0.4 * height

    line(["A", "Study", "of", "Pages"], 60, 60, 28)
    for y in range(140, 140 + 6 * 16, 16):
        line(["Body", "text", "runs", "on", "here", "across", "the", "whole", "column", "of", "text."], 60, y, 12)
    for y in range(280, 280 + 4 * 16, 16):
        line(["Another", "paragraph", "follows", "it", "with", "more", "words", "in", "it."], 60, y, 12)
    line(["17"], 295, 760, 12)
    boxes = np.array(boxes, float) * scale
    for x0, y0, x1, y1 in boxes.astype(int):
        image[y0 + (y1 - y0) // 4:y1 - (y1 - y0) // 4, x0:x1] = 20      # ink where the words are
    return image, words, boxes


def test_unit_features_are_ratios_of_the_page():
    image, words, boxes = draw_page()
    units = text_units(page_blocks(image, boxes, words), boxes, words)
    assert len(units) == 4
    features = unit_features(image, boxes, words, units)
    assert features.shape == (4, len(FEATURE_NAMES)) and features.dtype == np.float32
    big_image, _, big_boxes = draw_page(scale=2)
    big = unit_features(big_image, big_boxes, words, units)
    np.testing.assert_allclose(big, features, rtol=1e-3, atol=0.02)     # the same page at twice the resolution
    named = dict(zip(FEATURE_NAMES, features[-1]))
    assert named["all_numbers"] == 1 and named["bottommost"] == 1 and named["words"] == 1
    assert unit_features(image, boxes, words, []).shape == (0, len(FEATURE_NAMES))


def test_the_packaged_classifier_names_a_title_paragraphs_and_a_page_number():
    image, words, boxes = draw_page()
    units = text_units(page_blocks(image, boxes, words), boxes, words)
    probs = default_unit_classifier().unit_probabilities(image, boxes, words, units)
    assert probs.shape == (4, len(REGION_CLASSES))
    named = [REGION_CLASSES[k] for k in probs.argmax(1)]
    assert named[1:] == ["paragraph", "paragraph", "page_number"], named
    assert probs[0, REGION_CLASSES.index("title")] == probs[:, REGION_CLASSES.index("title")].max()


def list_page(bullet: str):
    """A paragraph, then three list items at its margin, each opened by `bullet` (typeset, or as an OCR
    reads one: "e", "«")."""
    image = np.full((800, 600, 3), 255, np.uint8)
    words, boxes = [], []

    def line(texts, y, height=12, char=7):
        x = 60
        for text in texts:
            width = char * len(text) * height / 12
            boxes.append([x, y, x + width, y + height])
            words.append(text)
            x += width + 0.4 * height

    for y in range(100, 100 + 5 * 16, 16):
        line(["Body", "text", "runs", "on", "here", "across", "the", "whole", "column", "of", "text."], y)
    for y in range(200, 200 + 3 * 24, 24):
        line([bullet, "An", "item", "of", "the", "list", "says", "one", "thing."], y)
    boxes = np.array(boxes, float)
    for x0, y0, x1, y1 in boxes.astype(int):
        image[y0 + (y1 - y0) // 4:y1 - (y1 - y0) // 4, x0:x1] = 20
    return image, words, boxes


@pytest.mark.parametrize("bullet", ["e", "\u00ab"])
def test_a_bullet_an_ocr_read_as_a_letter_opens_a_list_item(bullet):
    """On an OCR's words a bullet read as "e" or "«" counts as the bullet it was (as it opens a block in
    `page_blocks`): the items are named list items, as with a typeset "•"; on a text layer it does not."""
    classifier, item = default_unit_classifier(), REGION_CLASSES.index("list_item")
    image, words, boxes = list_page("\u2022")
    typeset = classifier.unit_probabilities(image, boxes, words, text_units(page_blocks(image, boxes, words), boxes, words))
    image, words, boxes = list_page(bullet)
    units = text_units(page_blocks(image, boxes, words, ocr=True), boxes, words)
    assert len(units) == 4
    opens = FEATURE_NAMES.index("opens_with_bullet")
    assert unit_features(image, boxes, words, units, ocr=True)[:, opens].tolist() == [0, 1, 1, 1]
    assert unit_features(image, boxes, words, units)[:, opens].tolist() == [0, 0, 0, 0]
    read = classifier.unit_probabilities(image, boxes, words, units, ocr=True)
    as_text = classifier.unit_probabilities(image, boxes, words, units)
    assert [REGION_CLASSES[k] for k in read.argmax(1)] == ["paragraph", "list_item", "list_item", "list_item"]
    np.testing.assert_allclose(read, typeset)
    assert np.all(as_text[1:, item] < 0.5)


def test_the_fit_script_labels_each_unit_with_its_words_class():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from fit_unit_classifier import CLASS_NAMES, page_units, unit_labels
    from dociq.data.synthetic.generator import generate_page

    page = generate_page(0, seed=3, image_size=256)
    boxes = np.asarray(page.word_boxes, np.float64)
    units = text_units(page_blocks(page.image, boxes, page.words), boxes, page.words)
    labels = unit_labels(page, units)
    region_of = {}
    for region in sorted(page.regions, key=lambda r: -float(np.prod(r.box[2:] - r.box[:2]))):
        for k in region.word_ids:
            region_of[k] = region.label
    for unit, label in zip(units, labels):
        named = [region_of[k] for k in unit if k in region_of]
        if 2 * len(named) >= len(unit):
            most = min(set(named), key=lambda c: (-named.count(c), CLASS_NAMES.index(c)))   # ties: the first class
            assert CLASS_NAMES[label] == most
        else:
            assert CLASS_NAMES[label] == NOT_A_REGION
    x, y = page_units([page, None])                          # a page that failed to load is skipped
    assert x.shape == (len(units), len(FEATURE_NAMES)) and np.array_equal(y, labels)


def test_the_fit_script_reads_scanned_pages_units_from_the_ocrs_words(tmp_path, monkeypatch):
    import sys
    from pathlib import Path
    from dociq.data import scanned
    from dociq.data.ocr import OcrWords
    sys.path.insert(0, str(Path(__file__).resolve().parent / "data" / "corpus"))
    from corpus_testdata import build
    sys.path.pop(0)
    from script_module import load_script
    script = load_script("fit_unit_classifier")

    class TitleRead:
        """An OCR that reads each test page's title as one word, a third of the page wide, and
        its paragraph's two words where the text layer has them."""
        def __init__(self, cache=None):
            pass

        def recognise(self, image):
            boxes = [[4, 4, 39.25, 11.5], [4, 22, 18, 29], [20, 22, 58.5, 29]]
            return OcrWords(["Installstep", "run", "it"], boxes, image.shape[:2])

    build(tmp_path / "corpus")
    monkeypatch.setattr(scanned, "TesseractOCR", TitleRead)
    clean_x, clean_y = script.corpus_units(str(tmp_path / "corpus"), "train")
    x, y = script.corpus_units(str(tmp_path / "corpus"), "train", scan_seed=0, max_pages=3, ocr_cache=str(tmp_path))
    assert len(clean_y) == 2 * 9 and len(y) == 2 * 3        # a title and a paragraph a page; 3 of the 9 scanned
    assert script.scanned_spec("data/forms:all:100") == ("data/forms", "all", 100)
    assert script.scanned_spec("data/forms:all") == ("data/forms", "all", None)
    assert sorted(script.CLASS_NAMES[k] for k in y) == ["paragraph"] * 3 + ["title"] * 3   # labelled by the regions
    words = FEATURE_NAMES.index("words")
    assert sorted(x[:, words]) == [1, 1, 1, 2, 2, 2] and sorted(clean_x[:, words]) == [2] * 18   # the OCR's words
