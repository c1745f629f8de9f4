# Two commands do all the setup on a fresh clone:
#   make test   create .venv if needed, install, run the test suite
#   make demo   create .venv if needed, install, run the offline demo pipeline
#   make docs   build the documentation site into site/ (strict: a broken link fails)
# The install uses constraints/dev.txt, which pins the CPU build of torch the development machines
# carry locally; users with their own (CUDA) torch run `pip install -e .` instead.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# One thread per process: on tiny models two threads under load were measured 10-50x slower.
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test test-fast test-portable demo docs clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints/dev.txt -e '.[test,demo,hub,lora,docs]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# The fast tests on the portable CPU kernels (no AVX): results must not depend on the kernels.
test-portable: $(STAMP)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m rlhf_lit.demo.pipeline $(DEMO_ARGS)

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) logs/* .pytest_cache site
