# clip-gateway: one container per GPU — Triton (onnxruntime backend, CUDA + TensorRT EPs) and the
# gateway, started and supervised by gateway/runtime/supervisor.py. Only the gateway port is
# published.
#
#   docker build -t clip-gateway:0.1.0 .                                   # pretrained weights
#   docker build -t clip-gateway:0.1.0 --build-arg CLIP_WEIGHTS=random .   # tests/benchmarks
#   docker build --build-arg CLIP_MODEL=ViT-B-16-SigLIP --build-arg CLIP_WEIGHTS=webli .
#   docker run --gpus '"device=0"' --shm-size=1g -p 8000:8000 \
#       -v clip-engines-gpu0:/var/cache/clip-gateway clip-gateway:0.1.0
#
# The model is baked in at build time (stage `export`): the image is then self-contained and
# every container starts from identical bytes, with no hub access or torch at run time. Only
# the TensorRT engines, which depend on the GPU, are built at first start into the volume.

# ---- stage 0: the sources both stages install (one list, in one place) ----
FROM scratch AS source
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/ requirements/
COPY gateway/ gateway/
COPY export/ export/
COPY triton/ triton/

# ---- stage 1: export OpenCLIP to ONNX (CPU torch; nothing of it reaches the final image) ----
FROM python:3.12-slim-bookworm AS export
ARG CLIP_MODEL=ViT-B-32
ARG CLIP_WEIGHTS=laion2b_s34b_b79k
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.9.1 torchvision==0.24.1
WORKDIR /src
COPY --from=source /src/ ./
RUN pip install "open_clip_torch>=3.3,<4" "onnx>=1.23" "onnxscript>=0.7" "onnxruntime>=1.23" \
      "tokenizers>=0.21,<1" . \
 && python -m export --model "$CLIP_MODEL" --weights "$CLIP_WEIGHTS" --cache-dir /build/cache \
      --print-dir > /build/dir \
 && mkdir -p /models && cp -r "$(cat /build/dir)" /models/export

# ---- stage 2: the runtime ----
FROM nvcr.io/nvidia/tritonserver:25.01-py3
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv python3-dev build-essential \
      libjpeg-dev zlib1g-dev libwebp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/clip-gateway
COPY --from=source /src/ ./
# Runtime dependencies only (no torch), then pillow-simd in Pillow's place (SIMD resize; AVX2
# is on every GPU server this image targets).
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install -c requirements/lock.txt ".[server]" \
 && /opt/venv/bin/pip uninstall -y pillow \
 && CC="cc -mavx2" /opt/venv/bin/pip install --no-deps --no-binary pillow-simd pillow-simd==12.1.1.post0 \
 && apt-get purge -y build-essential python3-dev && apt-get autoremove -y
COPY --from=export /models/export /models/export
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin clip \
 && mkdir -p /var/cache/clip-gateway/trt && chown -R clip:clip /var/cache/clip-gateway
ENV PATH=/opt/venv/bin:$PATH \
    GATEWAY_MODEL_DIR=/models/export \
    GATEWAY_TRITON_PROFILE=auto \
    GATEWAY_TRITON_TRT_CACHE_PATH=/var/cache/clip-gateway/trt \
    GATEWAY_PORT=8000
VOLUME ["/var/cache/clip-gateway"]
USER clip
EXPOSE 8000
# start-period: the first start builds TensorRT engines (minutes); /readyz tells when it is done.
HEALTHCHECK --interval=15s --timeout=3s --start-period=900s --retries=3 \
  CMD ["/opt/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["/opt/venv/bin/clip-gateway-entrypoint"]
