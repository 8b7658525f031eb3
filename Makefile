# Fresh machine: `make demo` (whole pipeline on the embedded fixtures) and `make test`, both installed from
# requirements/lock.txt (exactly what CI tests). `make test-latest` / `make test-oldest`: the decoding and
# mitigation tests and `medheval selftest` on the newest / oldest versions setup.cfg allows (own venvs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK := requirements/lock.txt
# torch first, at the lock's release: the CPU wheel on this project's machines (pip prefers /opt/wheels' +cpu
# build); set TORCH_SPEC="torch==X+cu124 --index-url ..." for a CUDA build of the same release elsewhere.
TORCH_SPEC ?= $(shell sed -n 's/^torch==\([^ ]*\).*/torch==\1/p' $(LOCK))
PIP_QUIET := --quiet --disable-pip-version-check
# the tests that exercise transformers' generation internals (the drift alarm's subset)
# (the compiled-path matrix is left out: compiling costs minutes per family; `make test-compiled` runs it)
DECODING_TESTS := $(filter-out tests/test_decoding_compiled.py,$(wildcard tests/test_decoding*.py tests/test_mitigations*.py)) tests/test_deprecations.py tests/test_backends.py
# what test-oldest and test-latest run: those, and text_generation's columns from nltk, rouge-score and sacrebleu
STACK_TESTS := $(DECODING_TESTS) tests/test_metric_text_generation_floors.py

.PHONY: demo test test-compiled bench install lock test-latest test-oldest interop test-interop clean

$(VENV)/.installed: setup.cfg pyproject.toml $(LOCK)
	@echo "install: a one-time setup of $(VENV), about 5 minutes on a fresh machine (pip is quiet: a line per step)"
	@echo "install 1/5: creating the virtual environment $(VENV) (seconds)"
	@$(PYTHON) -m venv $(VENV)
	@echo "install 2/5: $(TORCH_SPEC) (the largest download; 1-3 minutes)"
	@$(PY) -m pip install $(PIP_QUIET) $(TORCH_SPEC)
	@echo "install 3/5: the pinned dependencies of $(LOCK) (transformers, datasets, evaluate, ...; 2-4 minutes)"
	@$(PY) -m pip install $(PIP_QUIET) -r $(LOCK)
	@echo "install 4/5: medheval itself, editable (seconds)"
	@$(PY) -m pip install $(PIP_QUIET) --no-deps -e .
# WordNet for METEOR, offline: copies Debian's wordnet-base files into $(VENV)/nltk_data (apt-get only as root, only if missing)
	@echo "install 5/5: WordNet for METEOR into $(VENV)/nltk_data (seconds; apt-get only as root, only if missing)"
	@$(PY) -m medheval.scoring.nltk_data --apt --target $(VENV)/nltk_data
	@touch $@
	@echo "install: done. Use the tools as $(VENV)/bin/medheval, or 'source $(VENV)/bin/activate' for a bare 'medheval'"

install: $(VENV)/.installed

demo: $(VENV)/.installed
	HF_HUB_OFFLINE=1 HF_EVALUATE_OFFLINE=1 $(PY) -m medheval.cli demo --output runs/demo

# The suite in parallel (pytest-xdist): one worker per core, whole test files per worker (a file's tiny models
# and fixtures are built once), each worker's torch threads = cores / workers. `make test PYTEST_WORKERS=1` for
# fewer workers (0: one process), `make test PYTEST_ARGS="tests/test_decoding.py -x"` for a subset or options.
PYTEST_WORKERS ?= auto
PYTEST_ARGS ?=
test: $(VENV)/.installed
	HF_EVALUATE_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The compiled decode steps (torch.compile on the CPU) = eager, every method x tiny family: 49 cases, 25 graphs
# (5 per family: OPERA adds two look-ahead graphs), one family per worker; about 5 minutes on a quiet 2-core machine,
# empty inductor cache (CI runs it after `make test`); `make test` runs the LLaVA subset (plain, VCD, DoLa and
# OPERA with rollbacks: 3 graphs).
test-compiled: $(VENV)/.installed
	MEDHEVAL_COMPILE_MATRIX=1 HF_EVALUATE_OFFLINE=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup \
		tests/test_decoding_compiled.py $(PYTEST_ARGS)

# Re-resolve every dependency to the newest versions setup.cfg allows (torch held at requirements/lock-pins.in),
# with pip-tools in a throwaway venv; then update TESTED in medheval/versions.py (tests/test_versions.py checks).
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install $(PIP_QUIET) "pip-tools>=7.4,<8"
	.venv-lock/bin/pip-compile --quiet --upgrade --extra test --strip-extras --no-emit-index-url --no-emit-find-links \
		--output-file $(LOCK) setup.cfg requirements/lock-pins.in
	sed -i 's/^\(torch==[0-9.]*\)+[a-z0-9.]*/\1/' $(LOCK)  # the public release, not this machine's local +cpu label
	rm -rf .venv-lock

# The drift alarm: newest versions the ranges allow, no lock. Prints a one-line verdict naming the versions.
test-latest:
	.ci/stack_check latest .venv-latest "$(STACK_TESTS)"

# The lower bounds of setup.cfg (requirements/oldest.txt): the stack tests (STACK_TESTS) and the self-test.
test-oldest:
	.ci/stack_check oldest .venv-oldest "$(STACK_TESTS)"

# lmms-eval and inspect_ai in their own venv, for harness users: `make interop` builds .venv-interop from
# requirements/interop-lock.txt (torch: TORCH_SPEC as above) and runs `medheval integrations check` in it.
interop:
	TORCH_SPEC="$(TORCH_SPEC)" .ci/interop_install .venv-interop

# The same venv (why a venv of its own: .ci/interop_check), the documented pip install resolved in a fresh venv
# (.ci/interop_fresh), then the tests/test_interop_*.py files, which skip in the main venv.
test-interop:
	.ci/interop_check .venv-interop

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_build.py
	$(PY) benchmarks/bench_scoring.py
	$(PY) benchmarks/bench_hf_backend.py
	$(PY) benchmarks/bench_labeler.py
	$(PY) benchmarks/bench_degenerate.py
	$(PY) benchmarks/bench_image_check.py

clean:
	rm -rf $(VENV) .venv-latest .venv-oldest .venv-interop .venv-interop-fresh .venv-lock runs .pytest_cache
