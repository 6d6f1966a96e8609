# mgpu-env: `make` lists the targets. `make train` and `make test` set everything up themselves.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml requirements.lock requirements-dev.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

.PHONY: venv
venv: $(STAMP) ## Create .venv with the pinned dependencies (requirements*.lock)

.PHONY: train
train: $(STAMP) ## Train the seed's model on every selected GPU (settings: .env, env vars)
	$(BIN)/mgpu train

.PHONY: doctor
doctor: $(STAMP) ## Check driver, CUDA, cuDNN, GPUs and TensorFlow; say how to fix problems
	$(BIN)/mgpu doctor

.PHONY: bench
bench: $(STAMP) ## Measure samples/s and scaling efficiency against replica count
	$(BIN)/mgpu bench

.PHONY: test
test: $(STAMP) ## Run the whole test suite (container tests too when Docker is there)
	$(BIN)/pytest $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: $(STAMP) ## Run the tests that need neither Docker nor long training
	$(BIN)/pytest -m "not slow and not docker" $(PYTEST_ARGS)

.PHONY: lint
lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check mgpu_env entrypoint tests benchmarks
	$(BIN)/mypy

.PHONY: clean
clean: ## Remove the virtual environment and caches (runs/ is kept)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
