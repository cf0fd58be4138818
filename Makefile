# The two entry points a new user needs: `make quickstart` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: quickstart quickstart-docker test test-deps lint schemas clean

$(BIN)/dstack: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/dstack

quickstart: $(BIN)/dstack
	$(BIN)/dstack apply -y --attach --replace task.hello examples/quickstart

quickstart-docker: $(BIN)/dstack test-deps
	$(BIN)/python -c "from tests.infra.docker_images import ensure_busybox_image as b; \
	    b(name='dstack-plan-examples/busybox:latest')"
	$(BIN)/dstack apply -y --attach --replace task.hello-docker examples/quickstart-docker

test-deps:
	bash scripts/test-deps.sh

test: $(BIN)/dstack test-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(BIN)/dstack
	$(BIN)/ruff check dstack_plan tests benchmarks scripts
	$(BIN)/ruff format --check dstack_plan tests benchmarks scripts
	$(BIN)/mypy

schemas: $(BIN)/dstack
	$(BIN)/python scripts/generate_schemas.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
