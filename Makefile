# Two commands do all the set-up on a fresh machine: `make pretrain` and `make test`.
# Both create .venv if missing and install dociq with its dependencies into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch/torchvision pinned to the releases this workplace serves from local disk.
TORCH_PIN := torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed

.PHONY: install pretrain test test-all clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

pretrain: $(STAMP)
	$(PY) train.py stage=pretrain $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q -m "" $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
