#!/usr/bin/env bash
# `make image`: the repository's Dockerfile, built with podman on the Debian stand-in bases
# (deploy/image/bases.sh) and tagged clip-gateway:local. Only build arguments differ from an
# NGC build (docs/CONTAINER.md): the bases, the torch wheel index, the runtime's Debian package
# names, and the CPU backend (the Python backend + ONNX Runtime: no onnxruntime backend here).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$here/bases.sh"
tag="${IMAGE_TAG:-clip-gateway:local}"
# The export stage's torch index: the Dockerfile's default (PyTorch's +cpu builds) when it
# answers; else the index of this machine's pip configuration that serves torch (the build
# sees that configuration), so the export still gets the lock's torch version.
torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
if ! python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=10)' \
     "$torch_index" 2>/dev/null; then
  fallback=""
  for index in $(sed -n 's/^extra-index-url = //p; s/^index-url = //p' "$work/pip.conf"); do
    case "$index" in file://*) [ -d "${index#file://}/torch" ] && { fallback="$index"; break; } ;; esac
  done
  [ -n "$fallback" ] || { echo "image: $torch_index does not answer and no local index has torch" >&2; exit 1; }
  echo "image: $torch_index does not answer; torch from this machine's pip index $fallback"
  torch_index="$fallback"
fi
echo "image: building $tag from $root/Dockerfile"
started=$(date +%s)
args=(--format docker --network host --layers "${build_volumes[@]}"
  --build-arg TRITON_IMAGE=localhost/clip-gateway-base/tritonserver:standin
  --build-arg EXPORT_IMAGE=localhost/clip-gateway-base/python:3.11-standin
  --build-arg TORCH_INDEX_URL="$torch_index"
  --build-arg RUNTIME_PACKAGES="libjpeg62-turbo libwebp7 libwebpdemux2 libwebpmux3 zlib1g tini"
  --build-arg CPU_BACKEND=python
  --build-arg CLIP_MODEL="${CLIP_MODEL:-ViT-B-32}"
  --build-arg CLIP_WEIGHTS="${CLIP_WEIGHTS:-random}"
  -f "$root/Dockerfile")
podman build "${args[@]}" -t "$tag" "$root" > "$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; echo "image: build failed (log: $work/build.log)" >&2; exit 1; }
# the build stage too (every layer cached: seconds), for image-test's negative control: the
# compiler it finds there must not be in the runtime image
podman build "${args[@]}" --target venv -t "${BUILD_TAG:-clip-gateway-build:local}" "$root" \
  >> "$work/build.log" 2>&1
# and the export stage (cached: seconds), tagged so it stays as the next build's cache; what a
# rebuild superseded (the previous build's images, now untagged: ~12 GB with the export stage's
# torch) goes, so the store holds one build however many runs this machine sees
podman build "${args[@]}" --target export -t "${EXPORT_TAG:-clip-gateway-export:local}" "$root" \
  >> "$work/build.log" 2>&1
podman image prune -f >> "$work/build.log" 2>&1
echo "image: $tag built in $(( $(date +%s) - started )) s (log: $work/build.log)"
