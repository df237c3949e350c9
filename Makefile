# Each target creates/uses the local virtualenv .venv itself: `make demo` and `make test` are the
# only two commands a newcomer needs on a fresh machine. The `ray` extra is installed too, so the
# distributed engine's tests (tests/test_ray.py) run on every submission instead of skipping.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check lint docker-up clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,ray]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/bisect demo

# Starts the Docker engine and builds the offline base image where that is possible (the Docker
# tests skip with the reason where it is not), then runs the whole suite.
test: $(STAMP)
	-bash scripts/docker-up.sh
	$(BIN)/python -m pytest -q -ra

# The fast tier for a change in progress, under two minutes on 2 cores: no Docker, nothing marked
# slow (end-to-end demo runs, stress, statistical, exhaustive and fuzz checks); `make test` runs
# everything, as CI does.
check: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not docker"

lint: $(STAMP)
	$(BIN)/ruff check bisect_tool tests bench
	$(BIN)/mypy bisect_tool bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
