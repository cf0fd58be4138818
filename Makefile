# The two entry points a new user needs: `make quickstart` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: quickstart quickstart-docker test test-deps lint schemas clean

# The runtime alone: what `make quickstart` runs needs nothing more.
$(BIN)/dstack: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -q --disable-pip-version-check -e .
	touch $(BIN)/dstack

# The test and lint toolchain (the `test` extra: pytest, moto, the cloud SDKs, ...).
TEST_EXTRAS := $(VENV)/.test-extras
$(TEST_EXTRAS): $(BIN)/dstack
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $(TEST_EXTRAS)

quickstart: $(BIN)/dstack
	$(BIN)/dstack apply -y --attach --replace task.hello examples/quickstart

quickstart-docker: $(BIN)/dstack test-deps
	$(BIN)/python -c "from tests.infra.docker_images import ensure_busybox_image as b; \
	    b(name='dstack-plan-examples/busybox:latest')"
	$(BIN)/dstack apply -y --attach --replace task.hello-docker examples/quickstart-docker

test-deps:
	bash scripts/test-deps.sh

# 4 pytest-xdist workers (the tests mostly wait on agents, sshd and dockerd), each idle one
# taking queued tests from the busiest (worksteal); PYTEST_ARGS="-n 0" runs in one process.
# Bytecode is written even under PYTHONDONTWRITEBYTECODE: the suite starts thousands of
# Python processes, each of which would compile dstack_plan again (__pycache__ is ignored).
test: $(TEST_EXTRAS) test-deps
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -p no:cacheprovider -n 4 --dist worksteal $(PYTEST_ARGS)

lint: $(TEST_EXTRAS)
	$(BIN)/ruff check dstack_plan tests benchmarks scripts
	$(BIN)/ruff format --check dstack_plan tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python scripts/check_layers.py

schemas: $(TEST_EXTRAS)
	$(BIN)/python scripts/generate_schemas.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
