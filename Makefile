# Each target creates/uses the local virtualenv .venv itself: `make demo` and `make test` are the
# only two commands a newcomer needs on a fresh machine. Neither changes anything outside this
# folder: the system changes the Docker tests need are `make docker-up`'s, asked for first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# what the demo needs: the package and its dependencies (133 MB)
DEMO_STAMP := $(VENV)/.installed-demo
# what the tests need besides: the dev extra and the ray extra, so that the distributed engine's
# tests (tests/test_ray.py) run on every submission instead of skipping (683 MB in all)
STAMP := $(VENV)/.installed

.PHONY: demo test check lint docker-up docker-down clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,ray]'
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/bisect demo

# The whole suite. The Docker tests run where an engine is already up and skip with the reason
# where none is (tests/conftest.py); `make docker-up` starts one, as CI does (.ci/run).
test: $(STAMP)
	$(BIN)/python -m pytest -q -ra

# The fast tier for a change in progress: no Docker, nothing marked slow (end-to-end demo runs,
# stress, statistical, exhaustive and fuzz checks), in two processes at once (scripts/check.sh);
# `make test` runs everything, as CI does.
check: $(STAMP)
	PY=$(BIN)/python bash scripts/check.sh

lint: $(STAMP)
	$(BIN)/ruff check bisect_tool tests bench
	$(BIN)/mypy bisect_tool bench

# The system changes the Docker tests need (apt packages as root, a root dockerd, the offline
# base image): printed first, then asked for; CONFIRM=yes answers without asking. `make
# docker-down` undoes what it recorded, removing only what it proves is the tool's own.
docker-up:
	CONFIRM=$(CONFIRM) bash scripts/docker-up.sh

docker-down:
	CONFIRM=$(CONFIRM) bash scripts/docker-down.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
