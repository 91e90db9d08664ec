# The two commands: `make demo` and `make test` (`make test-fast` for the quick loop). Each creates or refreshes .venv
# as it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# The demo is often a newcomer's first command, and its first install downloads torch and the SDKs: pip shows its
# progress (what it collects, downloads and installs) instead of minutes of silence.
PIP_SHOWN := $(PY) -m pip --disable-pip-version-check
# The versions CI tests, pinned: both commands install from them (see `make constraints`).
CONSTRAINTS := enginefarm/constraints.txt

.PHONY: demo test test-fast lint bench clean constraints

$(VENV)/bin/python:
	@echo "creating $(VENV) with $$($(PYTHON) --version)"
	$(PYTHON) -m venv $(VENV)

# Stamps re-run the install (which also compiles the codec's C loop) whenever pyproject.toml or the C source changes.
$(VENV)/.demo-deps: pyproject.toml $(CONSTRAINTS) cache/_interleave.c | $(VENV)/bin/python
	@echo "installing enginefarm into $(VENV) with the onnxruntime, openvino, build, cli and export extras (pinned: $(CONSTRAINTS))"
	$(PIP_SHOWN) install --progress-bar on -c $(CONSTRAINTS) -e '.[onnxruntime,openvino,build,cli,export]'
	touch $@

$(VENV)/.test-deps: pyproject.toml $(CONSTRAINTS) cache/_interleave.c | $(VENV)/bin/python
	$(PIP) install -c $(CONSTRAINTS) -e '.[test]'
	touch $@ $(VENV)/.demo-deps

demo: $(VENV)/.demo-deps
	$(PY) ci/demo.py

test: $(VENV)/.test-deps
	@$(PY) -m pytest -q $(PYTEST_ARGS); code=$$?; \
	if [ $$code -eq 5 ]; then echo "error: pytest collected no tests" >&2; fi; exit $$code

# The quick loop: every test but those marked slow, which tests/conftest.py marks by fixture (a test that uses a
# fixture declared with `builds`: engine builds, exports, servers). CI runs `make test`, which runs everything.
test-fast: $(VENV)/.test-deps
	@$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS); code=$$?; \
	if [ $$code -eq 5 ]; then echo "error: pytest collected no tests" >&2; fi; exit $$code

# ruff check, ruff format --check and mypy (configured in pyproject.toml); .ci/run runs it before the tests.
lint: $(VENV)/.test-deps
	$(PY) ci/lint.py

# Benchmarks need the SD VAE decoder ONNX: see docs/benchmarks.md.
bench: $(VENV)/.test-deps
	$(PY) bench/pick.py
	$(PY) bench/ttfi.py

# Re-resolve every dependency of the test extra at its newest release in a scratch venv and pin the result.
constraints:
	rm -rf .venv-constraints && $(PYTHON) -m venv .venv-constraints
	.venv-constraints/bin/python -m pip --disable-pip-version-check -q install -e '.[test]'
	{ sed -n '/^#/p' $(CONSTRAINTS); .venv-constraints/bin/python -m pip freeze --exclude-editable | grep -v '^enginefarm'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS) && rm -rf .venv-constraints

clean:
	rm -rf .enginefarm build dist *.egg-info cache/_interleave.*.so cache/_interleave.*.pyd
	rm -f $(VENV)/.demo-deps $(VENV)/.test-deps  # so the next demo/test reinstalls and recompiles
