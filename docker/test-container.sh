#!/usr/bin/env bash
# The whole container check, on a machine with a Docker engine and no GPU and
# no registry (CI): `make test-container` runs it, and tests/docker/test_container.py
# runs that where Docker is present.
#
#   1. a CPU base image (Debian rootfs, docker import), reused when it exists;
#   2. the project's Dockerfile built on it, with only BASE_IMAGE changed, so with the
#      GPU image's CUDA wheels (requirements-cuda.lock); in it, the CUDA stack
#      (check_cuda_stack) and `mgpu doctor --json` (check_doctor_stack);
#   3. compose: doctor, then train (DATASET=digits EPOCHS=1 VIRTUAL_DEVICES=2):
#      exit codes, log, metrics.json in the mounted runs folder, readable by
#      the host user;
#   4. `docker stop` in the middle of a training run, then a run that resumes;
#   5. the GPU compose file merges into a valid configuration.
# Plus: the image's user, entrypoint and build context, and TensorBoard on the
# loopback (once the lock pins tensorboard).
#
# Env: BASE_CPU_IMAGE (default mgpu-env/base-cpu:bookworm), TEST_IMAGE (default
# mgpu-env:cpu), TEST_UID/TEST_GID (the UID the containers run as when this
# runs as root; default 4242), TEST_TENSORBOARD_PORT (default 16006),
# KEEP_TMP=1 keeps the work folder.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=docker/lib.sh
. docker/lib.sh

BASE_CPU_IMAGE="${BASE_CPU_IMAGE:-mgpu-env/base-cpu:bookworm}"
TEST_IMAGE="${TEST_IMAGE:-mgpu-env:cpu}"
PROJECT="mgpu-test-$$"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mgpu-test-container.XXXXXX")"
STOP_CONTAINER="${PROJECT}-stopped-train"
COMPOSE=()
TENSORBOARD_PORT="${TEST_TENSORBOARD_PORT:-16006}"

step() { printf '\n== %s\n' "$*" >&2; }
elapsed() { printf '%ss' "$((SECONDS - $1))"; }

cleanup() {
    local code=$?
    docker rm -f "$STOP_CONTAINER" >/dev/null 2>&1 || true
    if [ "${#COMPOSE[@]}" -gt 0 ]; then
        compose down --volumes --remove-orphans >/dev/null 2>&1 || true
    fi
    if [ "${KEEP_TMP:-0}" = 1 ] || [ "$code" -ne 0 ]; then
        log "work folder kept: $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$code"
}
trap cleanup EXIT

# compose with this test's project name, files and settings only: an --env-file
# of our own, so a developer's .env cannot leak settings or COMPOSE_FILE in.
compose() {
    "${COMPOSE[@]}" --project-name "$PROJECT" --env-file "$WORK/compose.env" \
        -f docker-compose.yml "$@"
}

show_log() { log "--- $1 (last 40 lines)"; tail -n 40 "$1" >&2; }

fail_with_log() { show_log "$2"; die "$1"; }

# Ownership and readability, as the host user would see them.
check_host_readable() {
    local file="$1" owner
    owner="$(stat -c %u "$file")"
    [ "$owner" = "$HOST_UID" ] || die "$file is owned by UID $owner, not the host user's $HOST_UID"
    if [ "$(id -u)" -eq 0 ]; then
        setpriv --reuid="$HOST_UID" --regid="$HOST_GID" --clear-groups cat "$file" >/dev/null \
            || die "UID $HOST_UID cannot read $file"
    else
        [ -r "$file" ] || die "the host user cannot read $file"
    fi
}

json_field() {
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$1" "$2"
}

prepare() {
    find_compose
    log "compose: ${COMPOSE[*]}"
    if [ "$(id -u)" -eq 0 ]; then
        # As root, run the containers as an arbitrary non-root UID, as a host
        # user would: proves the image works for any UID, and that files come
        # back owned by (and readable for) that user.
        HOST_UID="${TEST_UID:-4242}"
        HOST_GID="${TEST_GID:-4242}"
    else
        HOST_UID="$(id -u)"
        HOST_GID="$(id -g)"
    fi
    mkdir -p "$WORK/runs" "$WORK/data"
    chmod 755 "$WORK"
    [ "$(id -u)" -eq 0 ] && chown "$HOST_UID:$HOST_GID" "$WORK/runs" "$WORK/data"
    cat >"$WORK/compose.env" <<EOF
MGPU_IMAGE=$TEST_IMAGE
BASE_IMAGE=$BASE_CPU_IMAGE
HOST_UID=$HOST_UID
HOST_GID=$HOST_GID
HOST_RUNS_DIR=$WORK/runs
HOST_DATA_DIR=$WORK/data
TENSORBOARD_PORT=$TENSORBOARD_PORT
DATASET=digits
VIRTUAL_DEVICES=2
TF_CPP_MIN_LOG_LEVEL=2
GPUS=none
EOF
    # GPUS=none: the CPU image on a host that has GPUs is the CPU on purpose (without it
    # the pre-flight stops a CPU-file container on a GPU host, as it should).
    # Settings from the caller's shell would override the env file; drop them.
    unset GPUS MIXED_PRECISION EPOCHS BATCH_SIZE LEARNING_RATE DATASET DATA_DIR OUTPUT_DIR \
        RUN_NAME VIRTUAL_DEVICES XLA CROSS_DEVICE_OPS SEED MGPU_DEBUG ENV_FILE COMPOSE_FILE \
        MGPU_IMAGE BASE_IMAGE HOST_RUNS_DIR HOST_DATA_DIR
}

build_images() {
    local start=$SECONDS
    step "1. CPU base image $BASE_CPU_IMAGE"
    docker/build-base-image.sh "$BASE_CPU_IMAGE"
    log "base image ready in $(elapsed "$start")"

    start=$SECONDS
    step "2. project image $TEST_IMAGE on $BASE_CPU_IMAGE"
    IMAGE="$TEST_IMAGE" BASE_IMAGE="$BASE_CPU_IMAGE" docker/build-image.sh >"$WORK/build.log" 2>&1 \
        || fail_with_log "docker build failed" "$WORK/build.log"
    log "image built in $(elapsed "$start"), $(docker image inspect -f '{{.Size}}' "$TEST_IMAGE") bytes"
}

check_image() {
    step "image: non-root user, exec-form mgpu entrypoint, build context"
    local entrypoint cmd uid
    entrypoint="$(docker image inspect -f '{{json .Config.Entrypoint}}' "$TEST_IMAGE")"
    cmd="$(docker image inspect -f '{{json .Config.Cmd}}' "$TEST_IMAGE")"
    [ "$entrypoint" = '["mgpu"]' ] || die "ENTRYPOINT is $entrypoint, expected [\"mgpu\"]"
    [ "$cmd" = '["train"]' ] || die "CMD is $cmd, expected [\"train\"]"
    uid="$(docker run --rm --entrypoint id "$TEST_IMAGE" -u)"
    [ "$uid" != 0 ] || die "the image runs as root"
    docker run --rm --entrypoint mgpu "$TEST_IMAGE" --help >/dev/null || die "mgpu --help fails in the image"

    # What .dockerignore lets into the context: built with the same ignore file.
    local probe="runs/.dockerignore-probe-$$" listing
    mkdir -p runs && touch "$probe"
    listing="$(printf 'FROM %s\nCOPY . /ctx\n' "$BASE_CPU_IMAGE" \
        | docker build -q -t "${PROJECT}-context" -f - . >/dev/null \
        && docker run --rm "${PROJECT}-context" find /ctx -maxdepth 2)"
    rm -f "$probe"
    docker rmi "${PROJECT}-context" >/dev/null 2>&1 || true
    if grep -E '^/ctx/(\.env|\.git|\.venv|runs|data|tests|\.cache)(/|$)' <<<"$listing"; then
        die ".dockerignore lets the paths above into the build context"
    fi
}

# The pins the image was built with, from its labels (the Dockerfile's PINNED_* args).
image_label() {
    docker image inspect -f "{{index .Config.Labels \"io.mgpu-env.$1.version\"}}" "$TEST_IMAGE"
}

# The CUDA user space the GPU image ships, checked without a GPU: every library TensorFlow
# opens for the GPU loads (ctypes) from the folder TensorFlow's search path names, cuDNN,
# NCCL and the CUDA runtime report the pinned versions, ptxas says the pinned CUDA
# release and libdevice.10.bc is where XLA looks (docker/check_cuda_stack.py, the script
# the build runs too). libcuda.so.1 is the driver's and is not expected here.
check_cuda_stack() {
    step "2b. CUDA stack in $TEST_IMAGE (libraries, versions, ptxas, libdevice)"
    local cuda cudnn nccl log="$WORK/cuda-stack.log" code=0 lib
    cuda="$(image_label cuda)"
    cudnn="$(image_label cudnn)"
    nccl="$(image_label nccl)"
    [ -n "$cuda" ] && [ -n "$cudnn" ] && [ -n "$nccl" ] \
        || die "$TEST_IMAGE has no io.mgpu-env.{cuda,cudnn,nccl}.version labels"
    docker run --rm --entrypoint python \
        -v "$PWD/docker/check_cuda_stack.py:/tmp/check_cuda_stack.py:ro" "$TEST_IMAGE" \
        /tmp/check_cuda_stack.py --cuda "$cuda" --cudnn "$cudnn" --nccl "$nccl" \
        >"$log" 2>&1 || code=$?
    [ "$code" -eq 0 ] || fail_with_log "the CUDA stack check exited $code" "$log"
    # The same facts, asserted here by name, so that a check dropped from the script
    # cannot pass unnoticed.
    for lib in cudart cublas cublasLt cufft cusparse cusolver curand cudnn nccl nvjitlink; do
        grep -q "^ok   $lib loads: /opt/venv/.*/site-packages/nvidia/" "$log" \
            || fail_with_log "$lib does not load from the venv's nvidia/ wheels" "$log"
    done
    grep -q "^ok   cudnn version: ${cudnn%.*} " "$log" || fail_with_log "cudnnGetVersion() is not ${cudnn%.*}" "$log"
    grep -q "^ok   nccl version: $nccl " "$log" || fail_with_log "ncclGetVersion() is not $nccl" "$log"
    grep -q "^ok   ptxas: .*/nvidia/cuda_nvcc/bin/ptxas: release ${cuda%.*}$" "$log" \
        || fail_with_log "ptxas --version is not release ${cuda%.*}" "$log"
    grep -q "^ok   libdevice: .*/nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc " "$log" \
        || fail_with_log "libdevice.10.bc is not where XLA looks" "$log"
    log "CUDA $cuda, cuDNN $cudnn, NCCL $nccl: $(grep -c '^ok ' "$log") checks ok"
}

# `mgpu doctor --json --no-tf` in the image: one JSON object on stdout, exit 0 or 1
# (1: no GPU here), never a traceback. Stricter assertions on the doctor's CUDA checks
# belong next to those checks.
check_doctor_stack() {
    step "2c. mgpu doctor --json --smoke in $TEST_IMAGE (VIRTUAL_DEVICES=2)"
    local out="$WORK/doctor.json" err="$WORK/doctor-json.err" code=0
    docker run --rm -e VIRTUAL_DEVICES=2 "$TEST_IMAGE" doctor --json --smoke \
        >"$out" 2>"$err" || code=$?
    # No GPU here: the driver lines warn (exit 0) or, at worst, error (1); a crash, a
    # settings error (2) or a missing command is a failure.
    case "$code" in
        0 | 1) ;;
        *) cat "$out" >>"$err"; fail_with_log "mgpu doctor --json --smoke exited $code" "$err" ;;
    esac
    if grep -q 'Traceback' "$out" "$err"; then
        cat "$out" >>"$err"
        fail_with_log "mgpu doctor --json --smoke printed a traceback" "$err"
    fi
    # The doctor finds the CUDA stack the way TensorFlow and XLA will (the checks ok, the
    # loaded cuDNN and NCCL at the image's pins), and the smoke job runs on 2 replicas.
    python3 - "$out" "$(image_label cudnn)" "$(image_label nccl)" <<'PY' >"$WORK/doctor-stack.txt" 2>>"$err" \
        || { cat "$out" >>"$err"; fail_with_log "mgpu doctor --json: the CUDA stack or the smoke job is not right" "$err"; }
import json, sys
data = json.load(open(sys.argv[1]))
cudnn_pin, nccl_pin = sys.argv[2], sys.argv[3]
status = {check["id"]: check["status"] for check in data["checks"]}
for name in ("cuda.libraries", "cuda.nccl", "cuda.ptxas", "cuda.libdevice"):
    assert status.get(name) == "ok", f"{name} is {status.get(name)}, not ok"
libraries = data["facts"]["cuda"]["libraries"]
cudnn = libraries["cudnn"]["value"]["version"]
nccl = libraries["nccl"]["value"]["version"]
assert cudnn_pin.startswith(cudnn), f"cuDNN loaded {cudnn}, pinned {cudnn_pin}"
assert nccl == nccl_pin, f"NCCL loaded {nccl}, pinned {nccl_pin}"
smoke = data["smoke"]
assert smoke["ok"], smoke
assert smoke["devices"] == ["CPU:0", "CPU:1"], smoke["devices"]
assert [s["name"] for s in smoke["steps"]] == ["setup", "copies", "all-reduce", "bandwidth", "xla", "matmul"]
print(f"cuda checks ok; cuDNN {cudnn}, NCCL {nccl}; smoke ok on {smoke['devices']}")
PY
    log "doctor --json --smoke exited $code: $(cat "$WORK/doctor-stack.txt")"
}

check_doctor_and_train() {
    local start=$SECONDS code=0
    step "3a. compose run --rm doctor"
    compose run --rm doctor >"$WORK/doctor.log" 2>&1 || code=$?
    log "doctor exited $code in $(elapsed "$start")"
    # No GPU here: the doctor may report that as an error (1), but a crash,
    # a settings error (2) or a missing command (126/127) is a failure.
    case "$code" in
        0 | 1) ;;
        *) fail_with_log "doctor exited $code" "$WORK/doctor.log" ;;
    esac
    grep -q 'Traceback' "$WORK/doctor.log" && fail_with_log "doctor printed a traceback" "$WORK/doctor.log"
    [ -s "$WORK/doctor.log" ] || die "doctor printed nothing"

    start=$SECONDS
    code=0
    step "3b. compose run --rm train (DATASET=digits EPOCHS=1 VIRTUAL_DEVICES=2)"
    compose run --rm -e EPOCHS=1 -e RUN_NAME=ci-train train >"$WORK/train.log" 2>&1 || code=$?
    log "train exited $code in $(elapsed "$start")"
    [ "$code" -eq 0 ] || fail_with_log "train exited $code" "$WORK/train.log"
    grep -q 'Traceback' "$WORK/train.log" && fail_with_log "train printed a traceback" "$WORK/train.log"
    local metrics="$WORK/runs/ci-train/metrics.json"
    [ -f "$metrics" ] || { find "$WORK/runs" >&2; fail_with_log "no $metrics" "$WORK/train.log"; }
    check_host_readable "$metrics"
    python3 -m json.tool "$metrics" >/dev/null || die "$metrics is not JSON"
    log "metrics.json: $(tr -d '\n' <"$metrics" | cut -c1-300)"
}

# Waits until the log of the detached run shows a finished epoch (Keras prints
# "Epoch N/M" at the start of epoch N), so a checkpoint exists to resume from.
wait_for_epoch() {
    local deadline=$((SECONDS + 600))
    while [ $SECONDS -lt $deadline ]; do
        docker logs "$STOP_CONTAINER" >"$WORK/stopped.log" 2>&1 || true
        grep -Eq 'Epoch ([3-9]|[1-9][0-9]+)/' "$WORK/stopped.log" && return 0
        [ "$(docker inspect -f '{{.State.Running}}' "$STOP_CONTAINER")" = true ] \
            || fail_with_log "the training run ended before it could be stopped" "$WORK/stopped.log"
        sleep 1
    done
    fail_with_log "no 'Epoch 3/' in the log within 600 s" "$WORK/stopped.log"
}

check_stop_and_resume() {
    local start=$SECONDS code epochs=30
    step "4. docker stop mid-run, then resume (EPOCHS=$epochs)"
    compose run -d --name "$STOP_CONTAINER" -e EPOCHS=$epochs -e RUN_NAME=ci-resume train >/dev/null
    wait_for_epoch
    log "stopping after $(elapsed "$start")"
    local stop_start=$SECONDS
    docker stop --time 60 "$STOP_CONTAINER" >/dev/null
    code="$(docker wait "$STOP_CONTAINER")"
    docker logs "$STOP_CONTAINER" >"$WORK/stopped.log" 2>&1
    log "stopped run exited $code, $(elapsed "$stop_start") after SIGTERM"
    # 137 is SIGKILL: the entrypoint did not finish within the grace period.
    [ "$code" != 137 ] || fail_with_log "SIGTERM did not stop training within 60 s" "$WORK/stopped.log"
    docker rm "$STOP_CONTAINER" >/dev/null

    start=$SECONDS
    code=0
    compose run --rm -e EPOCHS=$epochs -e RUN_NAME=ci-resume train >"$WORK/resume.log" 2>&1 || code=$?
    log "resumed run exited $code in $(elapsed "$start")"
    [ "$code" -eq 0 ] || fail_with_log "resumed train exited $code" "$WORK/resume.log"
    local metrics="$WORK/runs/ci-resume/metrics.json" resumed
    [ -f "$metrics" ] || fail_with_log "no $metrics" "$WORK/resume.log"
    check_host_readable "$metrics"
    resumed="$(json_field "$metrics" resumed_from_epoch)"
    if [[ "$resumed" =~ ^[0-9]+$ ]] && [ "$resumed" -gt 0 ]; then
        log "resumed_from_epoch=$resumed"
    elif grep -qi 'resum' "$WORK/resume.log"; then
        log "the log says it resumed: $(grep -i -m1 'resum' "$WORK/resume.log")"
    else
        fail_with_log "the second run did not resume (resumed_from_epoch=${resumed:-absent})" "$WORK/resume.log"
    fi
}

# TensorBoard answers on the loopback port only. Strict once the lock pins
# tensorboard (TensorFlow 2.21 no longer pulls it in); a warning until then.
check_tensorboard() {
    step "tensorboard on 127.0.0.1:$TENSORBOARD_PORT"
    if ! grep -qi '^tensorboard==' requirements.lock; then
        log "WARNING: tensorboard is not in requirements.lock, so the tensorboard service cannot start"
        return 0
    fi
    compose up -d tensorboard >"$WORK/tensorboard.log" 2>&1 \
        || fail_with_log "compose up tensorboard failed" "$WORK/tensorboard.log"
    local deadline=$((SECONDS + 120)) url="http://127.0.0.1:$TENSORBOARD_PORT/"
    until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then
            compose logs tensorboard >>"$WORK/tensorboard.log" 2>&1 || true
            fail_with_log "TensorBoard did not answer on $url within 120 s" "$WORK/tensorboard.log"
        fi
        sleep 2
    done
    local published
    published="$(compose port tensorboard 6006)"
    [[ "$published" == 127.0.0.1:* ]] || die "TensorBoard is published on $published, not the loopback"
    compose stop tensorboard >/dev/null 2>&1
}

check_gpu_config() {
    step "5. docker-compose.yml + docker-compose.gpu.yml config"
    compose -f docker-compose.gpu.yml config >"$WORK/gpu-config.yml" 2>"$WORK/gpu-config.err" \
        || fail_with_log "the GPU compose configuration is invalid" "$WORK/gpu-config.err"
    grep -q 'driver: nvidia' "$WORK/gpu-config.yml" || die "no nvidia device reservation in the merged config"
}

main() {
    local start=$SECONDS
    docker info >/dev/null 2>&1 || die "no Docker engine (docker info fails)"
    prepare
    build_images
    check_cuda_stack
    check_doctor_stack
    check_image
    check_gpu_config
    check_doctor_and_train
    check_stop_and_resume
    check_tensorboard
    step "container check passed in $(elapsed "$start")"
}

main "$@"
