#!/usr/bin/env bash
# Build the mgpu-env image with BuildKit. `make build` and the container test
# both use this, so the CPU test build differs from the GPU build only in
# BASE_IMAGE.
#
# Usage: docker/build-image.sh [extra docker build args...]
# Env:   IMAGE        tag to build (default mgpu-env:latest)
#        BASE_IMAGE   base to build on (default: the Dockerfile's pinned CUDA image)
#        BUILD_CA_FILE  CA bundle for a TLS-intercepting proxy, given to the build
#                     as the BuildKit secret `ca` (never stored in a layer);
#                     default /etc/ssl/certs/ca-certificates.crt when it exists,
#                     empty to pass none.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=docker/lib.sh
. docker/lib.sh

IMAGE="${IMAGE:-mgpu-env:latest}"
BUILD_CA_FILE="${BUILD_CA_FILE-/etc/ssl/certs/ca-certificates.crt}"

main() {
    local docker_cli
    docker_cli="$(find_build_docker)" \
        || die "docker build needs BuildKit: install the buildx plugin (package docker-buildx-plugin or docker-buildx), or use a Docker CLI older than 23"
    local args=(--tag "$IMAGE" --build-arg "IMAGE_TAG=$IMAGE")
    [ -n "${BASE_IMAGE:-}" ] && args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
    if [ -n "$BUILD_CA_FILE" ] && [ -f "$BUILD_CA_FILE" ]; then
        args+=(--secret "id=ca,src=$BUILD_CA_FILE")
    fi
    log "building $IMAGE${BASE_IMAGE:+ on $BASE_IMAGE} with $docker_cli"
    DOCKER_BUILDKIT=1 "$docker_cli" build "${args[@]}" "$@" .
}

main "$@"
