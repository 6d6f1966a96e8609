# mgpu-env: TensorFlow 2.21 + MirroredStrategy on a pinned CUDA/cuDNN runtime.
#
# GPU build (default base):   make build
# CPU build (CI, no registry): docker/build-base-image.sh && \
#     DOCKER_BUILDKIT=1 docker build --build-arg BASE_IMAGE=mgpu-env/base-cpu:bookworm .
# Behind a TLS-intercepting proxy: add --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt
# Air-gapped: put wheels in docker/wheels/ (make wheels) and add --build-arg PIP_NO_INDEX=1
#
# No `# syntax=` line on purpose: it would pull the Dockerfile frontend from a
# registry, which air-gapped machines cannot reach; the engine's built-in
# BuildKit frontend (Docker >= 20.10) already supports RUN --mount.

# The TensorFlow 2.21 GPU wheel is built and tested with CUDA 12.5 and cuDNN 9.3
# (https://www.tensorflow.org/install/source#gpu). NVIDIA's 12.5.1 cudnn runtime
# image for Ubuntu 24.04 installs libcudnn9-cuda-12=9.3.0.75-1
# (https://gitlab.com/nvidia/container-images/cuda/-/blob/master/dist/12.5.1/ubuntu2404/runtime/cudnn/Dockerfile);
# the ubuntu22.04 tags are not used because their Python 3.10 is below the
# lock's numpy (>= 3.11). Ubuntu 24.04 ships Python 3.12.
# These pins must agree with mgpu_env/hardware/compat.py (tests/test_dockerfile_pins.py).
ARG BASE_IMAGE=nvidia/cuda:12.5.1-cudnn-runtime-ubuntu24.04

FROM ${BASE_IMAGE}

ARG PINNED_TENSORFLOW_VERSION=2.21.0
ARG PINNED_CUDA_VERSION=12.5.1
ARG PINNED_CUDNN_VERSION=9.3.0.75

LABEL org.opencontainers.image.title="mgpu-env" \
      org.opencontainers.image.description="Multi-GPU TensorFlow training with MirroredStrategy" \
      io.mgpu-env.tensorflow.version="${PINNED_TENSORFLOW_VERSION}" \
      io.mgpu-env.cuda.version="${PINNED_CUDA_VERSION}" \
      io.mgpu-env.cudnn.version="${PINNED_CUDNN_VERSION}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Fail the build, rather than the first GPU run, when a CUDA base image does not
# carry the pinned CUDA/cuDNN. NVIDIA images set CUDA_VERSION and install
# libcudnn9-cuda-12; a base without them (the CPU stand-in) skips the check.
RUN if [ -n "${CUDA_VERSION:-}" ] && [ "${CUDA_VERSION}" != "${PINNED_CUDA_VERSION}" ]; then \
        echo "base image has CUDA ${CUDA_VERSION}, Dockerfile pins ${PINNED_CUDA_VERSION}" >&2; exit 1; \
    fi; \
    have_cudnn="$(dpkg-query -W -f='${Version}' libcudnn9-cuda-12 2>/dev/null || true)"; \
    if [ -n "${have_cudnn}" ] && [[ "${have_cudnn}" != "${PINNED_CUDNN_VERSION}"* ]]; then \
        echo "base image has cuDNN ${have_cudnn}, Dockerfile pins ${PINNED_CUDNN_VERSION}" >&2; exit 1; \
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

# Dependencies before code: this layer is rebuilt only when the lock changes.
# --no-deps installs exactly the lock and `pip check` proves it is complete.
# docker/wheels/ is searched first; with PIP_NO_INDEX=1 it is the only source
# (air-gapped). PIP_INDEX_URL can point at an internal mirror.
ARG PIP_INDEX_URL
ARG PIP_NO_INDEX
COPY requirements.lock /tmp/requirements.lock
RUN --mount=type=secret,id=ca \
    --mount=type=bind,source=docker/wheels,target=/tmp/wheels \
    --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    python3 -m venv "${VIRTUAL_ENV}" \
    && pip install --no-deps --find-links /tmp/wheels -r /tmp/requirements.lock \
    && pip check \
    && python -c "import tensorflow as tf; v = tf.__version__; assert v == '${PINNED_TENSORFLOW_VERSION}', v"

# The project itself, from a read-only view of the (allowlisted) build context:
# no copy of the source stays in the image, and a code change rebuilds only this.
RUN --mount=type=bind,target=/tmp/src,rw \
    pip install --no-cache-dir --no-deps --no-build-isolation /tmp/src

USER ${APP_USER}
# Runs land in /workspace/runs/ (OUTPUT_DIR's default is relative: runs/<name>);
# compose mounts the host's runs and data folders here.
WORKDIR /workspace

# Exec form: mgpu is PID 1's child (compose `init: true`) or PID 1 itself, and
# receives SIGTERM from `docker stop` directly, so it can checkpoint and exit.
ENTRYPOINT ["mgpu"]
CMD ["train"]
