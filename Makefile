# The two commands of the README: `make demo` and `make test` (and `make test-slow`, the
# tests marked slow that `make test` leaves out; `make bench-quick`, the benchmark smoke
# run into a temporary directory). All create the virtual environment on first use:
# torch pinned to 2.13.0 (the local CPU wheel) by constraints.txt.
VENV ?= .venv
PY := $(VENV)/bin/python
# pytest-xdist: a process per core (CI's machine has two), each test file in one process so
# that a file's session-wide fixtures (the CUDA path's rehearsal) run once.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile
PYTHON ?= python3

.PHONY: demo test test-slow bench-quick clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,examples,bench,triton]"
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/train_mnist1d.py

test: $(VENV)/.installed
	$(PYTEST)

test-slow: $(VENV)/.installed  # the tests `make test` leaves out (marked slow); CI runs both
	$(PYTEST) -m slow

bench-quick: $(VENV)/.installed
	$(PY) -m gact_fx.cli bench --quick --out "$$(mktemp -d)"

clean:
	rm -rf $(VENV) build *.egg-info
