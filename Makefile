# Fresh machine: `make demo` (whole pipeline on the embedded fixtures) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel on this project's machines; set TORCH_SPEC="torch" (or a CUDA index) elsewhere.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test bench install clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
# WordNet for METEOR, offline: copies Debian's wordnet-base files into $(VENV)/nltk_data (apt-get only as root, only if missing)
	$(PY) -m medheval.nltk_data --apt --target $(VENV)/nltk_data
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	HF_HUB_OFFLINE=1 HF_EVALUATE_OFFLINE=1 $(PY) -m medheval.cli demo --output runs/demo

test: $(VENV)/.installed
	HF_EVALUATE_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_build.py
	$(PY) benchmarks/bench_scoring.py
	$(PY) benchmarks/bench_hf_backend.py
	$(PY) benchmarks/bench_labeler.py

clean:
	rm -rf $(VENV) runs .pytest_cache
