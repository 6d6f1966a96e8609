#!/usr/bin/env bash
# Install lock files into the image's virtual environment with uv, every wheel checked
# against the lock's sha256 (--require-hashes): a changed or swapped wheel stops the build
# with uv's "hash mismatch" message. Run by the Dockerfile's RUN steps, not by hand.
#
# Usage: install-locks.sh UV_LOCK LOCK...
#   UV_LOCK  requirements-uv.lock: uv itself, pinned with hashes, installed with pip into
#            a throwaway folder (no uv binary stays in the image)
#   LOCK     requirements*.lock files to install into $VIRTUAL_ENV (created when missing)
# Env: VIRTUAL_ENV (required); WHEELS_DIR (default /tmp/wheels) is searched first;
#      PIP_INDEX_URL points pip and uv at another index; PIP_NO_INDEX=1 uses WHEELS_DIR
#      only (air-gapped); /run/secrets/ca, when present, is the CA bundle to trust.
set -Eeuo pipefail

log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

WHEELS_DIR="${WHEELS_DIR:-/tmp/wheels}"
UV_TOOL="$(mktemp -d /tmp/uv-tool.XXXXXX)"
trap 'rm -rf "$UV_TOOL"' EXIT

# The same index settings for pip (bootstrapping uv) and uv (everything else).
INDEX_ARGS=()
set_index_args() {
    INDEX_ARGS=(--find-links "$WHEELS_DIR")
    if [ -n "${PIP_INDEX_URL:-}" ]; then INDEX_ARGS+=(--index-url "$PIP_INDEX_URL"); fi
    case "${PIP_NO_INDEX:-}" in
        "" | 0) ;;
        1) INDEX_ARGS+=(--no-index) ;;
        *) die "PIP_NO_INDEX must be 1 or empty; got '${PIP_NO_INDEX}'" ;;
    esac
}

trust_build_ca() {
    if [ -s /run/secrets/ca ]; then
        # pip reads PIP_CERT; uv reads SSL_CERT_FILE (https://docs.astral.sh/uv/configuration/environment/).
        export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca
    fi
}

bootstrap_uv() {
    local uv_lock="$1"
    python3 -m venv "$UV_TOOL"
    "$UV_TOOL/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps \
        "${INDEX_ARGS[@]}" -r "$uv_lock" || die "could not install uv from $uv_lock"
    log "$("$UV_TOOL/bin/uv" --version)"
}

install_locks() {
    [ -x "$VIRTUAL_ENV/bin/python" ] || python3 -m venv "$VIRTUAL_ENV"
    local requirement_args=()
    for lock in "$@"; do requirement_args+=(-r "$lock"); done
    # `install`, not `sync`: the venv is fresh, and sync would remove the venv's own pip,
    # which the project's install step uses. --compile-bytecode: the image runs as a user
    # who cannot write __pycache__, so TensorFlow would otherwise compile on every start.
    # UV_LINK_MODE=copy: uv's cache is a cache mount on another filesystem (no hardlinks).
    UV_LINK_MODE=copy "$UV_TOOL/bin/uv" pip install --python "$VIRTUAL_ENV/bin/python" \
        --require-hashes --no-deps --compile-bytecode "${INDEX_ARGS[@]}" "${requirement_args[@]}"
}

main() {
    [ "$#" -ge 2 ] || die "usage: ${0##*/} UV_LOCK LOCK..."
    [ -n "${VIRTUAL_ENV:-}" ] || die "VIRTUAL_ENV is not set"
    local lock
    for lock in "$@"; do [ -f "$lock" ] || die "no lock file $lock"; done
    set_index_args
    trust_build_ca
    bootstrap_uv "$1"
    shift
    install_locks "$@"
}

main "$@"
