# mgpu-env: `make` lists the targets. `make train` and `make test` set everything up themselves.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

# uv writes the locks and installs them (https://docs.astral.sh/uv/pip/). It is pinned, and
# installed with the system Python's pip from requirements-uv.lock (--require-hashes) into a
# folder of its own, not into .venv: `uv pip sync` makes .venv exactly the locks, so uv
# there would remove itself. INSTALLER=pip installs the same locks with pip instead, for
# machines where uv cannot run (slower: docs/development.md, "Dependencies").
# The version is the lock's: `make locks UPGRADE=--upgrade-package=uv` moves it.
UV_VERSION := $(shell sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements-uv.lock)
TOOLS ?= .tools
UV := $(TOOLS)/uv-$(UV_VERSION)/bin/uv
INSTALLER ?= uv
# uv uses its own CA roots unless told; this makes it trust the system's, as pip does here
# (a TLS-intercepting proxy's CA is in the system bundle).
export UV_NATIVE_TLS ?= 1

# The CUDA wheels (requirements-cuda.lock, ~2.5 GB) go into .venv only where they can be
# used: by default when NVML sees a GPU (scripts/nvml_gpu_count.py, system Python, no
# venv needed); CUDA=1 installs them anyway, CUDA=0 never.
ifeq ($(origin CUDA),undefined)
CUDA := $(shell [ "$$($(PYTHON) scripts/nvml_gpu_count.py 2>/dev/null || echo 0)" -gt 0 ] 2>/dev/null && echo 1 || echo 0)
CUDA_HOW := $(if $(filter 1,$(CUDA)),NVML sees a GPU,no GPU seen by NVML); CUDA=0/1 to choose
else
CUDA_HOW := as set
endif
ifeq ($(filter 0 1,$(CUDA)),)
$(error CUDA must be 0 (no CUDA wheels) or 1 (install requirements-cuda.lock); got '$(CUDA)')
endif
ifeq ($(filter uv pip,$(INSTALLER)),)
$(error INSTALLER must be uv or pip; got '$(INSTALLER)')
endif
LOCKS := requirements-dev.lock $(if $(filter 1,$(CUDA)),requirements-cuda.lock)
# One stamp per set of locks: switching CUDA re-syncs .venv (and removes what is not locked).
STAMP := $(VENV)/.installed-$(if $(filter 1,$(CUDA)),cuda,cpu)

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@# Colour only on a terminal, and never with NO_COLOR (https://no-color.org): logs stay plain.
	@if [ -t 1 ] && [ -z "$${NO_COLOR:-}" ]; then on="$$(printf '\033[36m')"; off="$$(printf '\033[0m')"; fi; \
	awk -v on="$${on:-}" -v off="$${off:-}" 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %s%-16s%s %s\n", on, $$1, off, $$2}' $(MAKEFILE_LIST)

$(UV): requirements-uv.lock
	test -x $(TOOLS)/uv-$(UV_VERSION)/bin/python || $(PYTHON) -m venv $(TOOLS)/uv-$(UV_VERSION)
	$(TOOLS)/uv-$(UV_VERSION)/bin/python -m pip install --quiet --require-hashes --no-deps -r requirements-uv.lock
	touch $@

# Every install requires the locks' hashes: a changed or swapped wheel stops it. uv compiles
# the bytecode at install (--compile-bytecode; pip does by default): uv does not otherwise,
# and where PYTHONDONTWRITEBYTECODE is set no process writes it either, so every TensorFlow
# process (the suite starts hundreds, `make train` one) compiled TensorFlow again: its import
# took ~15 s of CPU instead of ~6 on 2 cores. The image does the same (docker/install-locks.sh).
$(STAMP): pyproject.toml requirements.lock $(LOCKS) $(if $(filter uv,$(INSTALLER)),$(UV))
	@echo "make: .venv from $(LOCKS) with $(INSTALLER) (CUDA=$(CUDA): $(CUDA_HOW))" >&2
	rm -f $(VENV)/.installed-*
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
ifeq ($(INSTALLER),uv)
	$(UV) pip sync --quiet --compile-bytecode --python $(BIN)/python --require-hashes $(LOCKS)
	$(UV) pip install --quiet --python $(BIN)/python --no-deps --no-build-isolation -e .
else
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps $(addprefix -r ,$(LOCKS))
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
endif
	touch $@

.PHONY: venv
venv: $(STAMP) ## Create .venv from the locks (CUDA=1/0: with/without the CUDA wheels)

# The locks: exact versions and sha256 hashes for Python 3.11 and 3.12 alike (--universal:
# the CPU test image and the host run 3.11, the GPU image 3.12). uv keeps every version
# already in a lock; `make locks UPGRADE=--upgrade` (or --upgrade-package NAME) moves them.
LOCK_FLAGS := --universal --python-version 3.11 --generate-hashes --quiet \
	--custom-compile-command "make locks" $(UPGRADE)

.PHONY: locks
locks: $(UV) ## Rewrite requirements*.lock from pyproject.toml and requirements-cuda.in
	$(UV) pip compile $(LOCK_FLAGS) pyproject.toml -o requirements.lock
	$(UV) pip compile $(LOCK_FLAGS) pyproject.toml --extra dev -c requirements.lock -o requirements-dev.lock
	$(UV) pip compile $(LOCK_FLAGS) requirements-cuda.in -o requirements-cuda.lock
	echo uv | $(UV) pip compile $(LOCK_FLAGS) - -o requirements-uv.lock

.PHONY: train
train: $(STAMP) ## Train the tutorial's model on every selected GPU (settings: .env, env vars)
	$(BIN)/mgpu train

.PHONY: doctor
doctor: $(STAMP) ## Check driver, CUDA, cuDNN, GPUs and TensorFlow; say how to fix problems
	$(BIN)/mgpu doctor

.PHONY: bench
bench: $(STAMP) ## Measure samples/s and scaling efficiency against replica count
	$(BIN)/mgpu bench

.PHONY: test
test: $(STAMP) ## Run the whole test suite, in parallel (container tests too when Docker is there)
	$(BIN)/pytest -n auto --dist loadgroup --durations=20 $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: $(STAMP) ## Run the tests that need neither Docker nor long training
	$(BIN)/pytest -n auto --dist loadgroup -m "not slow and not docker" $(PYTEST_ARGS)

.PHONY: lint
lint: $(STAMP) ## ruff, mypy and hadolint
	$(BIN)/ruff check mgpu_env entrypoint tests benchmarks examples docker scripts
	$(BIN)/mypy
	$(BIN)/mypy docker/check_cuda_stack.py scripts/nvml_gpu_count.py
	$(BIN)/hadolint Dockerfile

.PHONY: clean
clean: ## Remove the virtual environment, uv and caches (runs/ is kept)
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache

# --- Container (Dockerfile, docker-compose*.yml, docker/) -------------------------------
# Compose v2 where installed, else v1; files are written as the host user.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
IMAGE ?= mgpu-env:latest
# `make build-cpu`'s tag; the compose files run MGPU_IMAGE (default mgpu-env:latest).
CPU_IMAGE ?= mgpu-env:cpu
BASE_CPU_IMAGE ?= mgpu-env/base-cpu:bookworm
# The GPU image's Python (Ubuntu 24.04); 3.11 for the CPU test image (Debian bookworm).
WHEELS_PYTHON ?= 3.12
# auto: the GPU compose file where the host has NVIDIA GPUs and Docker's NVIDIA runtime
# (docker/compose-files.sh decides, says why, and stops on GPUs Docker cannot reach); 1/0.
DOCKER_GPUS ?= auto
COMPOSE_RUN = files="$$(DOCKER_GPUS=$(DOCKER_GPUS) docker/compose-files.sh)" && \
	COMPOSE_FILE="$$files" HOST_UID=$$(id -u) HOST_GID=$$(id -g) $(COMPOSE) run --rm

.PHONY: build
build: ## Build the GPU image (CUDA 12.5.1 + cuDNN 9.3 base; BASE_IMAGE=... to change)
	IMAGE=$(IMAGE) docker/build-image.sh $(BUILD_ARGS)

.PHONY: build-cpu
build-cpu: ## Build the image on a local Debian base (no registry, no GPU): run it with MGPU_IMAGE=mgpu-env:cpu
	docker/build-base-image.sh $(BASE_CPU_IMAGE)
	IMAGE=$(CPU_IMAGE) BASE_IMAGE=$(BASE_CPU_IMAGE) docker/build-image.sh $(BUILD_ARGS)

.PHONY: wheels
# python-hostlist ships only a source archive (locked by its hash): it is downloaded as
# one, with setuptools, which builds it (uv's build isolation, offline from this folder).
wheels: ## Download the locked wheels (uv, CUDA too) into docker/wheels/ for an offline build
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --no-binary=python-hostlist \
		--python-version $(WHEELS_PYTHON) \
		$(foreach p,manylinux2014 manylinux_2_17 manylinux_2_27 manylinux_2_28,--platform $(p)_x86_64) \
		--require-hashes --dest docker/wheels \
		-r requirements-uv.lock -r requirements-cuda.lock -r requirements.lock
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --dest docker/wheels setuptools

runs data:
	mkdir -p $@

.PHONY: docker-train
docker-train: runs data ## Train in the container, on the GPUs where Docker can reach them
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

# --- Documentation (docs/, mkdocs.yml; offline) -----------------------------------------
.PHONY: docs
docs: $(STAMP) ## Serve the documentation at http://127.0.0.1:8000 (MkDocs, Material theme)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

.PHONY: docs-build
docs-build: $(STAMP) ## Build the documentation into site/, failing on a broken link or anchor
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

.PHONY: test-container
test-container: ## Build on a local CPU base and check doctor, train, stop/resume, compose
	docker/test-container.sh
