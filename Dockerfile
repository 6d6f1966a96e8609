# mgpu-env: TensorFlow 2.21 + MirroredStrategy, with the CUDA user space from pinned wheels.
#
# GPU build (default base):   make build
# CPU build (CI, no registry): make build-cpu   (the same Dockerfile on a local Debian base)
# Behind a TLS-intercepting proxy: add --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt
# Air-gapped: put wheels in docker/wheels/ (make wheels) and add --build-arg PIP_NO_INDEX=1
#
# No `# syntax=` line on purpose: it would pull the Dockerfile frontend from a
# registry, which air-gapped machines cannot reach; the engine's built-in
# BuildKit frontend (Docker >= 20.10) already supports RUN --mount.

# CUDA, cuDNN and NCCL come from the wheels TensorFlow's `and-cuda` extra names, pinned
# in requirements-cuda.lock at the versions TensorFlow 2.21 is built with (CUDA 12.5.1's
# components, cuDNN 9.3.0.75, NCCL 2.27.7; https://www.tensorflow.org/install/source#gpu
# and the wheel's METADATA), so the GPU image and the CPU test image carry the same files.
# The base only has to bring what the wheels cannot: the NVIDIA Container Toolkit's
# settings (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES and NVIDIA_REQUIRE_CUDA,
# which makes the toolkit refuse a driver too old for CUDA 12.5). NVIDIA's `base` flavour
# is that and libcudart only; for CUDA 12.5.1 on Ubuntu 24.04 NVIDIA publishes `base`,
# `runtime` and `devel` tags, no `cudnn` ones, and no runtime image there has NCCL
# (https://hub.docker.com/r/nvidia/cuda/tags?name=12.5.1-base-ubuntu24.04,
# https://gitlab.com/nvidia/container-images/cuda/-/blob/master/doc/supported-tags.md).
# Where the wheels' files are found: TensorFlow's libtensorflow_framework.so.2 (and
# libtensorflow_cc.so.2 for cuSOLVER) carries a RUNPATH `$ORIGIN/../nvidia/<pkg>/lib`
# (`readelf -d` on the 2.21 wheel), so its dlopen() finds site-packages/nvidia/*/lib with no
# LD_LIBRARY_PATH; XLA takes ptxas and nvvm/libdevice/libdevice.10.bc from
# site-packages/nvidia/cuda_nvcc, one of its CUDA roots (CandidateCudaRoots in
# https://github.com/openxla/xla/blob/main/xla/tsl/platform/default/cuda_root_path.cc).
# docker/check_cuda_stack.py checks both in the built image.
# Ubuntu 24.04's Python 3.12 is in TensorFlow 2.21's range (22.04's 3.10 is below the
# lock's numpy). These pins must agree with mgpu_env/hardware/compat.py and
# requirements-cuda.lock (tests/unit/test_dockerfile_pins.py).
ARG BASE_IMAGE=nvidia/cuda:12.5.1-base-ubuntu24.04

FROM ${BASE_IMAGE}

ARG PINNED_TENSORFLOW_VERSION=2.21.0
ARG PINNED_CUDA_VERSION=12.5.1
ARG PINNED_CUDNN_VERSION=9.3.0.75
ARG PINNED_NCCL_VERSION=2.27.7

LABEL org.opencontainers.image.title="mgpu-env" \
      org.opencontainers.image.description="Multi-GPU TensorFlow training with MirroredStrategy" \
      io.mgpu-env.tensorflow.version="${PINNED_TENSORFLOW_VERSION}" \
      io.mgpu-env.cuda.version="${PINNED_CUDA_VERSION}" \
      io.mgpu-env.cudnn.version="${PINNED_CUDNN_VERSION}" \
      io.mgpu-env.nccl.version="${PINNED_NCCL_VERSION}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# An NVIDIA base sets CUDA_VERSION, and its NVIDIA_REQUIRE_CUDA follows it: a base for
# another CUDA would make the container toolkit demand another driver than the wheels
# need. A base without it (the CPU stand-in) skips the check.
RUN if [ -n "${CUDA_VERSION:-}" ] && [ "${CUDA_VERSION}" != "${PINNED_CUDA_VERSION}" ]; then \
        echo "base image has CUDA ${CUDA_VERSION}, Dockerfile pins ${PINNED_CUDA_VERSION}" >&2; exit 1; \
    fi

# Python from the base's distribution (Ubuntu 24.04: 3.12; Debian 12: 3.11),
# skipped when the base already has it, so an internal base image with Python
# needs no apt mirror. Package versions come from the pinned base's release, so
# they are not pinned again here (DL3008).
# The proxy CA arrives as a BuildKit secret: used for this RUN, never stored.
# hadolint ignore=DL3008
RUN --mount=type=secret,id=ca \
    if python3 -c 'import ensurepip, venv' 2>/dev/null; then exit 0; fi; \
    apt_opts=(); \
    if [ -s /run/secrets/ca ]; then apt_opts=(-o Acquire::https::CAInfo=/run/secrets/ca); fi; \
    apt-get "${apt_opts[@]}" update \
    && DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends \
        python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

# A fixed non-root user; compose may run as the host user's UID instead (see
# docker-compose.yml), so the writable paths are open to any UID (sticky, like /tmp).
# Ubuntu 24.04 images already have `ubuntu` at 1000:1000; it is replaced.
ARG APP_USER=mgpu
ARG APP_UID=1000
ARG APP_GID=1000
RUN if existing="$(getent passwd "${APP_UID}" | cut -d: -f1)" && [ -n "${existing}" ]; then userdel --remove "${existing}" 2>/dev/null || userdel "${existing}"; fi; \
    if existing="$(getent group "${APP_GID}" | cut -d: -f1)" && [ -n "${existing}" ]; then groupdel "${existing}"; fi; \
    groupadd --gid "${APP_GID}" "${APP_USER}" \
    && useradd --uid "${APP_UID}" --gid "${APP_GID}" --create-home --shell /bin/bash "${APP_USER}" \
    && install -d -m 1777 /workspace /workspace/runs /cache /cache/keras /cache/matplotlib

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KERAS_HOME=/cache/keras \
    MPLCONFIGDIR=/cache/matplotlib

# Dependencies before code, each lock in its own layer: the CUDA wheels (~2.8 GB) first,
# as they change least, so a requirements.lock update neither rebuilds nor re-ships them.
# docker/install-locks.sh installs with a pinned uv and --require-hashes (each step mounts
# only the files it uses, so editing another one keeps this cache); docker/wheels/
# is searched first, and with PIP_NO_INDEX=1 it is the only source (air-gapped);
# PIP_INDEX_URL can point at an internal mirror. uv's download cache is a BuildKit cache
# mount, kept between builds and never in a layer.
ARG PIP_INDEX_URL
ARG PIP_NO_INDEX
COPY requirements-uv.lock requirements-cuda.lock /tmp/locks/
RUN --mount=type=secret,id=ca \
    --mount=type=bind,source=docker/install-locks.sh,target=/tmp/install-locks.sh \
    --mount=type=bind,source=docker/wheels,target=/tmp/wheels \
    --mount=type=cache,target=/root/.cache/uv \
    --mount=type=cache,target=/root/.cache/pip \
    /tmp/install-locks.sh /tmp/locks/requirements-uv.lock /tmp/locks/requirements-cuda.lock

# Then the rest of the lock, and the build's proof that it is complete (`pip check`),
# that TensorFlow is the pinned one, and that the CUDA libraries load from
# where TensorFlow looks and report the pinned CUDA, cuDNN and NCCL (no GPU needed).
COPY requirements.lock /tmp/locks/
RUN --mount=type=secret,id=ca \
    --mount=type=bind,source=docker/install-locks.sh,target=/tmp/install-locks.sh \
    --mount=type=bind,source=docker/check_cuda_stack.py,target=/tmp/check_cuda_stack.py \
    --mount=type=bind,source=docker/wheels,target=/tmp/wheels \
    --mount=type=cache,target=/root/.cache/uv \
    --mount=type=cache,target=/root/.cache/pip \
    /tmp/install-locks.sh /tmp/locks/requirements-uv.lock /tmp/locks/requirements.lock \
    && pip check \
    && python -c "import tensorflow as tf; v = tf.__version__; assert v == '${PINNED_TENSORFLOW_VERSION}', v" \
    && python /tmp/check_cuda_stack.py --cuda "${PINNED_CUDA_VERSION}" \
        --cudnn "${PINNED_CUDNN_VERSION}" --nccl "${PINNED_NCCL_VERSION}"

# The project itself, from a read-only view of the (allowlisted) build context:
# no copy of the source stays in the image, and a code change rebuilds only this.
RUN --mount=type=bind,target=/tmp/src,rw \
    pip install --no-cache-dir --no-deps --no-build-isolation /tmp/src \
    && install -D -m 0644 /tmp/locks/requirements.lock /opt/mgpu/requirements.lock

# What `mgpu --version` and `mgpu doctor --report` say about the image: its tag, and the
# lock the installed packages are compared with.
ARG IMAGE_TAG=mgpu-env:latest
ENV MGPU_IMAGE_TAG=${IMAGE_TAG} \
    MGPU_LOCK_FILE=/opt/mgpu/requirements.lock
# What mgpu keeps between starts (a built-in model's memory estimate, a read-only data
# folder's counts) in /cache, compose's volume: it outlives each `docker compose run`.
ENV XDG_CACHE_HOME=/cache

USER ${APP_USER}
# Runs land in /workspace/runs/ (OUTPUT_DIR's default is relative: runs/<name>);
# compose mounts the host's runs and data folders here.
WORKDIR /workspace

# Exec form: mgpu is PID 1's child (compose `init: true`) or PID 1 itself, and
# receives SIGTERM from `docker stop` directly, so it can checkpoint and exit.
ENTRYPOINT ["mgpu"]
CMD ["train"]
