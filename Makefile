# Two commands do all the set-up on a fresh machine: `make pretrain` and `make test`.
# `make finetune` is the default question-answering recipe: pretrain, then fine-tune from it.
# Both create .venv if missing and install dociq with its dependencies into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch/torchvision pinned to the releases this workplace serves from local disk.
TORCH_PIN := torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed

# One run name for both stages of `make finetune`; outputs go under $DOCIQ_ROOT (default: here).
RUN := recipe_$(shell date +%Y-%m-%d_%H-%M-%S)
OUTPUTS = $${DOCIQ_ROOT:-.}/outputs

.PHONY: install pretrain finetune test test-all notebook clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

pretrain: $(STAMP)
	$(PY) train.py stage=pretrain $(ARGS)

# Stage 1 `stage=pretrain` (PRETRAIN_ARGS), stage 2 `stage=finetune init.from=<its last.ckpt>` (ARGS).
finetune: $(STAMP)
	$(PY) train.py stage=pretrain 'paths.output_dir=$${paths.log_dir}/pretrain/runs/$(RUN)' $(PRETRAIN_ARGS)
	$(PY) train.py stage=finetune 'paths.output_dir=$${paths.log_dir}/finetune/runs/$(RUN)' \
		'init.from=$${paths.log_dir}/pretrain/runs/$(RUN)/checkpoints/last.ckpt' $(ARGS)
	@echo "[dociq] fine-tuned checkpoint: $(OUTPUTS)/finetune/runs/$(RUN)/checkpoints/last.ckpt"

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
