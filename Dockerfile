# clip-gateway: one container per GPU — Triton (onnxruntime backend: CUDA and TensorRT EPs, and
# its CPU EP when no GPU is found) and the gateway, started and supervised by
# clip_gateway/launcher/supervisor.py under tini. Only the gateway port is published.
#
#   docker build -t clip-gateway:0.1.0 .                                   # pretrained weights
#   docker build -t clip-gateway:0.1.0 --build-arg CLIP_WEIGHTS=random .   # tests/benchmarks
#   docker build --build-arg CLIP_MODEL=ViT-B-16-SigLIP --build-arg CLIP_WEIGHTS=webli .
#   docker run --gpus '"device=0"' --shm-size=1g -p 127.0.0.1:8000:8000 --stop-timeout 70 \
#       -v clip-engines:/var/cache/clip-gateway -v "$PWD/api-keys:/run/secrets/api_keys:ro" \
#       -e GATEWAY_API_KEYS_FILE=/run/secrets/api_keys clip-gateway:0.1.0
#
# The model is baked in at build time (stage `export`): every container starts from identical
# bytes, with no hub access or torch at run time. Only the TensorRT engines, which depend on the
# GPU, are built at first start, into the volume.
#
# Layers go from what changes least to what changes most, so an edit to the README or the
# gateway's code rebuilds neither the model export nor pillow-simd: each stage installs its
# dependencies before it copies a single source file, and copies only the sources it needs.
#
# Base images: the tags below are the ones tested; for reproducible builds pin them by digest
# (resolve with `docker buildx imagetools inspect <image>`; this repository's CI has no registry
# access to do it) and pass them in: --build-arg TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.01-py3@sha256:…
# Every difference between bases is a build argument whose default is the NGC / Docker Hub one;
# `make image` builds this file on Debian stand-ins with no registry (docs/CONTAINER.md).
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.01-py3
# Python 3.11: the version requirements/lock.txt is resolved for (`make lock`).
ARG EXPORT_IMAGE=python:3.11-slim-bookworm

# ---- stage 1: export OpenCLIP to ONNX (CPU torch; nothing of it reaches the final image) ----
FROM ${EXPORT_IMAGE} AS export
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Where torch comes from: the lock pins torch/torchvision (2.14.1/0.29.1); PyTorch's CPU index has
# those versions as +cpu builds (no CUDA libraries in this stage). A machine without that index
# passes another (`make image`: a local wheel index, mounted into the build).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
WORKDIR /src
# The export extra at the lock's versions, the ones the export was validated with.
COPY pyproject.toml ./
COPY requirements/lock.txt requirements/
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["export"]))' > /tmp/export.txt \
 && pip install --extra-index-url "$TORCH_INDEX_URL" -c requirements/lock.txt -r /tmp/export.txt
# exactly what `python -m clip_gateway.export` imports (clip_gateway/model/spec.py lists what decides its output;
# the `export` import contract in pyproject.toml keeps it to clip_gateway.model and clip_gateway.text)
COPY clip_gateway/export/ clip_gateway/export/
COPY clip_gateway/__init__.py clip_gateway/
COPY clip_gateway/model/ clip_gateway/model/
COPY clip_gateway/text/ clip_gateway/text/
ARG CLIP_MODEL=ViT-B-32
ARG CLIP_WEIGHTS=laion2b_s34b_b79k
# /build exists before the shell opens the redirect into it; the export is made private (0700,
# mkdtemp) and `cp`/`COPY --from` keep modes: the runtime's user (10001) must be able to read it.
RUN mkdir -p /build /models \
 && python -m clip_gateway.export --model "$CLIP_MODEL" --weights "$CLIP_WEIGHTS" --cache-dir /build/cache \
      --print-dir > /build/dir \
 && cp -r "$(cat /build/dir)" /models/export \
 && chmod -R u=rwX,go=rX /models/export

# ---- stage 2: the gateway's virtualenv, built with compilers that never reach the runtime ----
FROM ${TRITON_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv python3-dev build-essential \
      libjpeg-dev zlib1g-dev libwebp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/clip-gateway
# Dependencies first, from pyproject.toml alone (the client + [server] extra, pinned by the
# lock): this layer survives every source edit.
COPY pyproject.toml ./
COPY requirements/lock.txt requirements/
RUN python3 -m venv /opt/venv \
 && python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["server"]))' > /tmp/requirements.txt \
 && /opt/venv/bin/pip install -c requirements/lock.txt -r /tmp/requirements.txt \
 && /opt/venv/bin/pip uninstall -y pillow \
 && CC="cc -mavx2" /opt/venv/bin/pip install --no-deps --no-binary pillow-simd pillow-simd==12.1.1.post0
# pillow-simd: Pillow's API with SIMD resampling (AVX2 is on every GPU server this targets).
COPY README.md ./
COPY clip_gateway/ clip_gateway/
COPY triton/ triton/
RUN /opt/venv/bin/pip install --no-deps .

# ---- stage 3: the runtime ----
FROM ${TRITON_IMAGE}
ENV PYTHONUNBUFFERED=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Shared libraries pillow-simd was built against, and tini: the supervisor is not an init, so
# tini (PID 1) reaps whatever a crashed child leaves orphaned and passes signals on. Package names
# are the base's distribution's: Ubuntu 24.04 in NGC 25.01 (Debian: libjpeg62-turbo).
ARG RUNTIME_PACKAGES="libjpeg-turbo8 libwebp7 libwebpdemux2 libwebpmux3 zlib1g tini"
# word splitting of the package list is wanted
# hadolint ignore=SC2086
RUN apt-get update \
 && apt-get install -y --no-install-recommends ${RUNTIME_PACKAGES} \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*
COPY --from=venv /opt/venv /opt/venv
COPY --from=export /models/export /models/export
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin clip \
 && mkdir -p /var/cache/clip-gateway/trt && chown -R clip:clip /var/cache/clip-gateway
# GATEWAY_WORKERS=0: the worker plan comes from the CPUs the container may use (cgroup quota,
# clip_gateway/config/plan.py). CPU_BACKEND: without a GPU, `auto` serves the fastest CPU profile
# that passes the quality gate (docs/PROFILES.md "auto on a CPU host"); here that is the cpu
# profile, the only candidate: the baked export has no INT8 files, and the NGC image's
# onnxruntime backend (its Python backend has no ONNX Runtime) no OpenVINO. A base without that
# backend but with ONNX Runtime in the Python backend's interpreter passes `python`.
ARG CPU_BACKEND=onnxruntime
ENV PATH=/opt/venv/bin:$PATH \
    GATEWAY_MODEL_DIR=/models/export \
    GATEWAY_TRITON_PROFILE=auto \
    GATEWAY_TRITON_CPU_BACKEND=${CPU_BACKEND} \
    GATEWAY_WORKERS=0 \
    GATEWAY_TRITON_TRT_CACHE_PATH=/var/cache/clip-gateway/trt \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8000
VOLUME ["/var/cache/clip-gateway"]
USER 10001:10001
EXPOSE 8000
# /healthz answers once the supervisor has started the gateway, i.e. after Triton is READY (TensorRT
# engines built). start-period: GATEWAY_STARTUP_TIMEOUT_S (1800) + headroom, from
# clip_gateway/config/timings.py, so a first start's engine build never reads as unhealthy.
HEALTHCHECK --interval=15s --timeout=3s --start-period=1810s --retries=3 \
  CMD ["/opt/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
# NGC's entrypoint script runs first, as in every NGC image: it sets up CUDA forward
# compatibility (hosts with older drivers, e.g. R535/R545) before anything loads CUDA, then
# execs the supervisor under tini.
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/nvidia/nvidia_entrypoint.sh", "/opt/venv/bin/clip-gateway-entrypoint"]
