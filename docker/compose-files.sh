#!/usr/bin/env bash
# Which compose files `make docker-*` use: prints the COMPOSE_FILE value on stdout and
# why on stderr. The GPU file (docker-compose.gpu.yml: the GPU reservation, /dev/shm and
# ulimits for NCCL) where the host has NVIDIA GPUs and Docker can hand them to a
# container; docker-compose.yml alone (CPU) where it has none. A host with GPUs that
# Docker cannot reach stops here, with the fix: training on its CPU by mistake is what
# this script exists to prevent.
#
# Env: DOCKER_GPUS=auto (default), 1 (the GPU file, no questions) or 0 (the CPU file);
# COMPOSE_FILE set in the environment is used as it is.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=docker/lib.sh
. docker/lib.sh

CPU_FILES="docker-compose.yml"
GPU_FILES="docker-compose.yml:docker-compose.gpu.yml"

# NVIDIA GPUs on this host, as the driver lists them (nvidia-smi comes with the driver).
host_gpus() {
    command -v nvidia-smi >/dev/null 2>&1 || { echo 0; return; }
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
}

# Docker can give a container GPUs: its NVIDIA runtime is registered (`nvidia-ctk
# runtime configure`), or the Container Toolkit's hook that `--gpus` calls is installed
# (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html).
docker_has_nvidia() {
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"nvidia"' && return 0
    command -v nvidia-container-runtime-hook >/dev/null 2>&1
}

pick() {
    if [ -n "${COMPOSE_FILE:-}" ]; then
        log "COMPOSE_FILE=$COMPOSE_FILE (as set in the environment)"
        echo "$COMPOSE_FILE"; return
    fi
    case "${DOCKER_GPUS:-auto}" in
        1) log "GPU compose file (DOCKER_GPUS=1)"; echo "$GPU_FILES"; return ;;
        0) log "CPU compose file (DOCKER_GPUS=0)"; echo "$CPU_FILES"; return ;;
        auto) ;;
        *) die "DOCKER_GPUS must be auto, 0 or 1; got '${DOCKER_GPUS}'" ;;
    esac
    local gpus
    gpus="$(host_gpus)"
    if [ "$gpus" -eq 0 ]; then
        log "CPU compose file: no NVIDIA GPU on this host (nvidia-smi -L)"
        echo "$CPU_FILES"
    elif docker_has_nvidia; then
        log "GPU compose file: $gpus NVIDIA GPU(s) and Docker's NVIDIA runtime"
        echo "$GPU_FILES"
    else
        die "this host has $gpus NVIDIA GPU(s), but Docker cannot give them to a container" \
            "(no nvidia runtime in \`docker info\`, no nvidia-container-runtime-hook)." \
            "Fix: install the NVIDIA Container Toolkit and run" \
            "\`sudo nvidia-ctk runtime configure --runtime=docker\`, then restart Docker;" \
            "or DOCKER_GPUS=0 to train on the CPU."
    fi
}

pick
