# syntax=docker/dockerfile:1
#
# draftboard: one image for the dashboard (`draftboard ui`, the default), the eval worker
# (`draftboard worker`) and the MLflow tracking server (`mlflow server`, see docker-compose.yml).
# docs/DEPLOY.md explains the build arguments and the multi-machine set-up.
#
# Two stages:
# - build: the CUDA *devel* image (nvcc) builds causal-conv1d from source into /opt/venv.
# - final: a small CUDA base image plus python3-dev and gcc, which Triton needs at run time to
#   compile its kernel launchers (flash-linear-attention's kernels are Triton JIT). PyTorch
#   brings its own CUDA libraries (the nvidia-* wheels), so no CUDA toolkit is needed here.
#   For a devel image at run time (nvcc in the container), pass
#   --build-arg CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.3-cudnn-devel-ubuntu24.04.
#
# torch==2.13.0 from the package index is built for CUDA 13.0 (cuda-toolkit 13.0.3,
# nvidia-cuda-runtime 13.0.x), so the base images are CUDA 13.0.3; the host driver must
# support CUDA 13.0 (R580 or newer).

ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.3-cudnn-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.3-base-ubuntu24.04

# --------------------------------------------------------------------------- build stage
FROM ${CUDA_DEVEL_IMAGE} AS build

# GPU architectures for CUDA extensions that follow PyTorch's TORCH_CUDA_ARCH_LIST.
# causal-conv1d 1.7.0 passes its own -gencode list (sm_75 ... sm_121 with CUDA 13), which
# PyTorch then leaves alone: see docs/DEPLOY.md, "Other GPU architectures".
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0;10.0;12.0"
ARG CAUSAL_CONV1D_VERSION=1.7.0
# Parallel nvcc jobs (each runs 4 threads and can take several GB of memory).
ARG MAX_JOBS=4

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    CUDA_HOME=/usr/local/cuda

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Ubuntu's python3 (3.12), the same interpreter the final stage installs, so /opt/venv moves as is.
# apt packages are not version-pinned (hadolint DL3008): Ubuntu's archive drops superseded
# versions, so a pin breaks the next build; the base image tag fixes the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-dev python3-venv build-essential \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /src
COPY requirements.txt constraints.txt ./

# torch first and pinned (the same pin as constraints.txt and scripts/setup.sh): everything
# installed after it finds torch satisfied instead of pulling another build. The three pip
# steps stay separate layers, so a change of requirements does not download torch again and a
# causal-conv1d bump does not reinstall the requirements.
RUN pip install --no-cache-dir -c constraints.txt "torch==2.13.0"

# The runtime requirements at CI's exact versions (constraints.txt), plus what the image adds:
# psycopg2-binary (PostgreSQL for the MLflow store and the job queue), Flask-WTF/WTForms (the
# `basic-auth` app of `mlflow server`, i.e. mlflow's `auth` extra) and the build tools of the
# causal-conv1d build below (ninja, wheel; setuptools and packaging are already there).
# hadolint ignore=DL3059
RUN pip install --no-cache-dir -c constraints.txt -r requirements.txt \
        "psycopg2-binary==2.9.13" "Flask-WTF==1.3.0" "WTForms==3.3.2" "ninja==1.13.0" "wheel==0.48.0"

# causal-conv1d from source against this torch (its prebuilt wheels come from a download that
# CAUSAL_CONV1D_FORCE_BUILD skips), without build isolation so it compiles against the torch above.
# hadolint ignore=DL3059
RUN TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS}" \
        pip install --no-cache-dir -c constraints.txt --no-build-isolation --no-binary causal-conv1d \
        "causal-conv1d==${CAUSAL_CONV1D_VERSION}" \
    && python -c "import torch, causal_conv1d, causal_conv1d_cuda; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# --------------------------------------------------------------------------- final stage
FROM ${CUDA_RUNTIME_IMAGE}

ARG DRAFTBOARD_GIT_COMMIT=unknown

LABEL org.opencontainers.image.title="draftboard" \
      org.opencontainers.image.description="Experiment tracker, eval harness and dashboard for DFlash drafters" \
      org.opencontainers.image.revision="${DRAFTBOARD_GIT_COMMIT}"

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DRAFTBOARD_HOME=/data \
    TRITON_CACHE_DIR=/data/triton-cache \
    MLFLOW_DISABLE_TELEMETRY=true

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# python3 and python3-dev: the venv's interpreter and Python.h; gcc and libc6-dev: Triton
# compiles a small C launcher per kernel signature at run time.
# /data: DRAFTBOARD_HOME (store, caches, job logs); /artifacts: the MLflow server's artifact
# store in docker-compose.yml. Both belong to the app user (uid/gid 10001, numeric in USER below
# so that runtimes can verify it is not root) so fresh named volumes do too.
# apt packages unpinned as in the build stage (DL3008).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 draftboard \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin draftboard \
    && mkdir -p /data /artifacts \
    && chown draftboard:draftboard /data /artifacts

COPY --from=build /opt/venv /opt/venv

# The source tree: `draftboard ui` serves app.py and pages/ from it (an editable install).
WORKDIR /app
COPY . /app

# Every dependency, the gpu extra included, is already in /opt/venv, so this installs only the
# project itself (a missing causal-conv1d would fail here: no nvcc in this stage); `pip check`
# then confirms that the environment is consistent.
RUN pip install --no-cache-dir -c constraints.txt --no-build-isolation -e '.[gpu]' \
    && pip check \
    && python -m compileall -q /app \
    && draftboard --help > /dev/null

USER 10001:10001
WORKDIR /data
VOLUME ["/data"]

# 8501: the dashboard; 5000: `mlflow server` when the image runs it (docker-compose.yml).
EXPOSE 8501 5000

HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=5).read().strip() != b'ok')"]

# Reachable from outside the container, so the dashboard asks for a login: run the image with
# DRAFTBOARD_UI_PASSWORD set (or override the command with --readonly); without it, `ui` exits with
# one line naming the variable (docs/SECURITY.md).
ENTRYPOINT ["draftboard"]
CMD ["ui", "--address", "0.0.0.0", "--port", "8501", "--auth"]
