#!/usr/bin/env bash
# `make gpu-kit`: everything a lent GPU host lacks for `python -m bench host`, packed into call-sized
# parts under .gpukit/ (docs/GPU_HOST.md). Such a host (Ubuntu 24.04, Python 3.12, torch with CUDA
# 13, no network) is reached by calls that each carry at most 64 MiB with the working tree, so the
# kit is one zstd-compressed tar of three trees, split into parts of KIT_PART_MB:
#   site/         the gateway's and the exporter's pinned dependencies (bench/gpu_kit/closure.py:
#                 the lock's versions, less what the host's image has), cp312 wheels unpacked
#   triton-site/  the Python backend's interpreter: numpy<2 (the stub's), nvidia-pytriton's
#                 tritonserver with only the 3.12 stub
#   ort/          onnxruntime-gpu (CUDA 13 build) on its own: the Python backend and the bench's
#                 graph-alone ceiling both import it; it needs no particular numpy
#   src/          pillow-simd's source (no wheels exist): built there against the host's libjpeg
# Needs pip and zstd here; downloads from PyPI only.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
kit=${KIT_DIR:-.gpukit}
part_mb=${KIT_PART_MB:-56}
stage=$kit/stage
wheels=$kit/wheels
platforms=(--platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64
           --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
           --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
target=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --abi cp312
        --abi abi3 --abi none "${platforms[@]}")
pin() { grep -E "^$1==" requirements/lock.txt | head -1; }

started=$(date +%s)
rm -rf "$stage" "$wheels" "$kit"/part.*
mkdir -p "$stage"/{site,triton-site,ort,src} "$wheels"
echo "gpu-kit: resolving the host's closure of clip-gateway[server,export]"
"$py" bench/gpu_kit/closure.py requirements/lock.txt >"$kit/site.txt"
echo "gpu-kit: $(wc -l <"$kit/site.txt") pinned distributions for site/"
"$py" -m pip download --quiet --quiet "${target[@]}" -d "$wheels/site" -r "$kit/site.txt"
"$py" -m pip download --quiet --quiet "${target[@]}" -d "$wheels/triton" \
  numpy==1.26.4 "$(grep -E '^nvidia-pytriton==' requirements/triton-server.txt)" \
  "$(pin packaging)" "$(pin flatbuffers)"
"$py" -m pip download --quiet --quiet "${target[@]}" -d "$wheels/ort" \
  "onnxruntime-gpu==$(pin onnxruntime | cut -d= -f3)"
# the host may lack a zstd binary: Python's zstandard decompresses the parts there (beside them)
"$py" -m pip download --quiet --quiet "${target[@]}" -d "$kit" "zstandard==${ZSTANDARD_VERSION:-0.25.0}"
"$py" -m pip download --quiet --quiet --no-deps --no-binary=:all: -d "$wheels/src" \
  "pillow-simd==${PILLOW_SIMD_VERSION:-12.1.1.post0}"

unpack() {  # wheels of $1 into stage/$2 (a wheel is a zip of its installed tree)
  for whl in "$wheels/$1"/*.whl; do "$py" -m zipfile -e "$whl" "$stage/$2"; done
}
unpack site site
unpack triton triton-site
unpack ort ort
# what the host never runs: the other Pythons' stubs, the TensorRT EP (no TensorRT there),
# byte-code caches, test folders
find "$stage/triton-site/pytriton/tritonserver/python_backend_stubs" -mindepth 1 -maxdepth 1 \
  ! -name 3.12 -exec rm -rf {} +
rm -f "$stage"/ort/onnxruntime/capi/libonnxruntime_providers_tensorrt.so
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
tar -xzf "$wheels"/src/pillow*simd*.tar.gz -C "$stage/src"
rm -rf "$stage"/src/*/Tests "$stage"/src/*/docs
du -sh "$stage"/* | sed 's/^/gpu-kit: /'
echo "gpu-kit: compressing (zstd, 2 threads; a few minutes)"
tar -C "$stage" -cf - . | zstd -q -T0 -"${KIT_ZSTD_LEVEL:-12}" --long=27 \
  | split -b "${part_mb}M" -d -a 1 - "$kit/part."
rm -rf "$stage" "$wheels"
( cd "$kit" && sha256sum part.* >parts.sha256 )
ls -l "$kit"/part.* | awk '{printf "gpu-kit: %s %.1f MB\n", $NF, $5/1e6}'
echo "gpu-kit: ready in $(( $(date +%s) - started )) s: $(ls "$kit"/part.* | wc -l) parts (docs/GPU_HOST.md)"
