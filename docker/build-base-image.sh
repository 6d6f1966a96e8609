#!/usr/bin/env bash
# Build a CPU stand-in for the CUDA base image: a minimal Debian bookworm
# rootfs made with mmdebstrap (or debootstrap) and loaded with `docker import`.
# Used where no registry can be reached (CI), so the project's Dockerfile can be
# built and run there with only `--build-arg BASE_IMAGE=<this tag>` changed.
#
# Usage: docker/build-base-image.sh [TAG]      (default: mgpu-env/base-cpu:bookworm)
# Env:   FORCE=1 rebuilds even when TAG exists; SUITE (default bookworm);
#        MIRROR (default: the tool's own default, deb.debian.org).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=docker/lib.sh
. docker/lib.sh

TAG="${1:-${BASE_CPU_IMAGE:-mgpu-env/base-cpu:bookworm}}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-}"
# The CUDA images ship ca-certificates; the stand-in does too so later
# `apt-get`/`pip` calls over https behave the same on both.
PACKAGES="ca-certificates"

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

ensure_bootstrap_tool() {
    if command -v mmdebstrap >/dev/null 2>&1 || command -v debootstrap >/dev/null 2>&1; then
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || die "need mmdebstrap or debootstrap: sudo apt-get install -y mmdebstrap"
    command -v apt-get >/dev/null 2>&1 || die "need mmdebstrap or debootstrap, and no apt-get to install it"
    log "installing mmdebstrap with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mmdebstrap >&2 \
        || { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mmdebstrap >&2; }
}

# Docker import drops the usual image config; restore what a Debian image has.
import_changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
                --change 'ENV LANG=C.UTF-8'
                --change 'CMD ["bash"]')

build_with_mmdebstrap() {
    local mirror_args=()
    [ -n "$MIRROR" ] && mirror_args=("$MIRROR")
    # --variant=minbase: essential + apt, like the docker-library debian images.
    mmdebstrap --variant=minbase --include="$PACKAGES" \
        --components=main --format=tar \
        "$SUITE" - "${mirror_args[@]}" \
        | docker import "${import_changes[@]}" - "$TAG" >/dev/null
}

build_with_debootstrap() {
    local root
    root="$(mktemp -d)"
    trap 'rm -rf "$root"' RETURN
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" ${MIRROR:+"$MIRROR"} >&2
    tar -C "$root" -c . | docker import "${import_changes[@]}" - "$TAG" >/dev/null
}

main() {
    if image_exists "$TAG" && [ "${FORCE:-0}" != 1 ]; then
        log "$TAG exists; skipping (FORCE=1 rebuilds)"
        return 0
    fi
    ensure_bootstrap_tool
    log "building $TAG from Debian $SUITE"
    if command -v mmdebstrap >/dev/null 2>&1; then
        build_with_mmdebstrap
    else
        [ "$(id -u)" -eq 0 ] || die "debootstrap needs root; install mmdebstrap instead"
        build_with_debootstrap
    fi
    log "built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG") bytes)"
}

main "$@"
