# Shared helpers for the docker/ scripts; source it, do not run it.
# shellcheck shell=bash

log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# A docker CLI whose `docker build` uses BuildKit (RUN --mount, --secret).
# Docker CLI >= 23 builds through the buildx plugin and refuses
# DOCKER_BUILDKIT=1 without it; older CLIs (20.10, Debian's docker.io) talk to
# the engine's built-in BuildKit directly. Prints the CLI's path.
find_build_docker() {
    local candidate major
    for candidate in "${DOCKER:-docker}" /usr/bin/docker /usr/local/bin/docker; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" buildx version >/dev/null 2>&1; then
            command -v "$candidate"; return 0
        fi
        major="$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)"
        if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 23 ]; then
            command -v "$candidate"; return 0
        fi
    done
    return 1
}

# Compose v2 (`docker compose`) where installed, else v1 (`docker-compose`).
# Sets the COMPOSE array, which the sourcing script uses.
# shellcheck disable=SC2034
find_compose() {
    if docker compose version >/dev/null 2>&1; then
        COMPOSE=(docker compose)
    elif command -v docker-compose >/dev/null 2>&1; then
        COMPOSE=(docker-compose)
    else
        die "neither 'docker compose' nor 'docker-compose' is installed (https://docs.docker.com/compose/install/)"
    fi
}
