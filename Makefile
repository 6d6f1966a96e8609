# mgpu-env: `make` lists the targets. `make train` and `make test` set everything up themselves.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@# Colour only on a terminal, and never with NO_COLOR (https://no-color.org): logs stay plain.
	@if [ -t 1 ] && [ -z "$${NO_COLOR:-}" ]; then on="$$(printf '\033[36m')"; off="$$(printf '\033[0m')"; fi; \
	awk -v on="$${on:-}" -v off="$${off:-}" 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %s%-16s%s %s\n", on, $$1, off, $$2}' $(MAKEFILE_LIST)

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
lint: $(STAMP) ## ruff, mypy and hadolint
	$(BIN)/ruff check mgpu_env entrypoint tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

.PHONY: clean
clean: ## Remove the virtual environment and caches (runs/ is kept)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# --- Container (Dockerfile, docker-compose*.yml, docker/) -------------------------------
# Compose v2 where installed, else v1; files are written as the host user.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
IMAGE ?= mgpu-env:latest
BASE_CPU_IMAGE ?= mgpu-env/base-cpu:bookworm
WHEELS_PYTHON ?= 3.12
COMPOSE_RUN := HOST_UID=$$(id -u) HOST_GID=$$(id -g) $(COMPOSE) run --rm

.PHONY: build
build: ## Build the GPU image (CUDA 12.5.1 + cuDNN 9.3 base; BASE_IMAGE=... to change)
	IMAGE=$(IMAGE) docker/build-image.sh $(BUILD_ARGS)

.PHONY: build-cpu
build-cpu: ## Build the image on a local Debian base (no registry, no GPU)
	docker/build-base-image.sh $(BASE_CPU_IMAGE)
	IMAGE=mgpu-env:cpu BASE_IMAGE=$(BASE_CPU_IMAGE) docker/build-image.sh $(BUILD_ARGS)

.PHONY: wheels
wheels: ## Download the locked wheels into docker/wheels/ for an offline build
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version $(WHEELS_PYTHON) \
		$(foreach p,manylinux2014 manylinux_2_17 manylinux_2_27 manylinux_2_28,--platform $(p)_x86_64) \
		--dest docker/wheels -r requirements.lock

runs data:
	mkdir -p $@

.PHONY: docker-train
docker-train: runs data ## Train in the container (docker compose run --rm train)
	$(COMPOSE_RUN) train

.PHONY: docker-doctor
docker-doctor: runs data ## Check the GPUs from inside the container
	$(COMPOSE_RUN) doctor

.PHONY: docker-bench
docker-bench: runs data ## Benchmark in the container
	$(COMPOSE_RUN) bench

.PHONY: tensorboard
tensorboard: runs data ## TensorBoard on runs/ at http://127.0.0.1:6006
	HOST_UID=$$(id -u) HOST_GID=$$(id -g) $(COMPOSE) up tensorboard

.PHONY: test-container
test-container: ## Build on a local CPU base and check doctor, train, stop/resume, compose
	docker/test-container.sh
