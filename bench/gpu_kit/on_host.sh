#!/usr/bin/env bash
# On a lent GPU host, from the repository root (docs/GPU_HOST.md gives the calls in order):
#   bash bench/gpu_kit/on_host.sh collect        a call that carried some of .gpukit/: keep them
#   bash bench/gpu_kit/on_host.sh run [ARGS...]  the last call: check and unpack the kit, build
#                                                pillow-simd and export both models at once, then
#                                                `python -m bench host --provider cuda ARGS`
# The host's image provides Python 3.12 with torch (CUDA 13), its nvidia-* libraries, onnx and
# the other packages bench/gpu_kit/closure.py leaves out. Results go to $OUT (or bench/results/host):
# host.json, host.md, host.png and the logs, written after every phase, so a run stopped by
# BENCH_HOST_BUDGET_S (default 480 s) still returns what it measured.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
kit=${GPUKIT_HOME:-/tmp/gpukit}
root=$kit/root
out=${OUT:-$repo/bench/results/host}
py=${PYTHON:-python3}
mkdir -p "$kit" "$out"
say() { echo "gpu-kit $(date +%T): $*"; }

collect() {
  local f
  for f in .gpukit/part.* .gpukit/parts.sha256 .gpukit/zstandard-*.whl; do
    [ -e "$f" ] && cp -f "$f" "$kit/"
  done
  say "held: $(cd "$kit" && ls -m part.* 2>/dev/null)"
}

unpack() {
  [ -d "$root/site" ] && { say "kit already unpacked"; return 0; }
  (cd "$kit" && sha256sum --quiet -c parts.sha256) || { say "parts missing or damaged"; return 1; }
  mkdir -p "$root"
  if command -v zstd >/dev/null; then
    cat "$kit"/part.* | zstd -q -d --long=27 | tar -x -C "$root"
  else
    "$py" -m pip install -q --no-index --no-deps --target "$kit/zstd" "$kit"/zstandard-*.whl
    cat "$kit"/part.* | PYTHONPATH=$kit/zstd "$py" -c 'import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=1 << 28).copy_stream(sys.stdin.buffer, sys.stdout.buffer)' \
      | tar -x -C "$root"
  fi
  say "unpacked: $(du -sh "$root" | cut -f1)"
}

# The Python backend's interpreter: a venv of the host's own python3.12 (the stub links its
# libpython) holding numpy<2, tritonserver and, through a .pth file, onnxruntime-gpu.
triton_env() {
  local base env=$repo/.triton-env site
  base=$("$py" -c 'import sys; print(sys.base_prefix)')/bin/python3
  [ -x "$env/bin/python3" ] || "$base" -m venv --without-pip "$env" || return 1
  site=$("$env/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp -a "$root/triton-site/." "$site/"
  # a wheel unpacked as a zip keeps no mode bits: the server and the stubs must run
  chmod +x "$site"/pytriton/tritonserver/bin/* \
    "$site"/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
  echo "$root/ort" >"$site/gpukit-ort.pth"
  "$env/bin/python3" -c 'import numpy, onnxruntime; print("triton env: numpy", numpy.__version__,
      "onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())'
}

pillow_simd() {
  local src
  src=$(ls -d "$root"/src/pillow*simd* | head -1)
  CFLAGS="-mavx2" "$py" -m pip install -q --no-index --no-deps --no-build-isolation \
    --target "$root/simd" "$src" >"$out/pillow-simd.log" 2>&1 \
    && say "pillow-simd built" || say "pillow-simd did not build (stock Pillow; $out/pillow-simd.log)"
}

if [ "${1:-}" = collect ]; then collect; exit 0; fi
[ "${1:-}" = run ] || { echo "usage: $0 collect | run [bench host args]" >&2; exit 2; }
shift
started=$(date +%s)
collect
unpack || exit 1
nvidia=$("$py" -c 'import glob, os, nvidia
print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__
                       for p in glob.glob(os.path.join(d, "**", "lib*.so*"), recursive=True)})))')
export LD_LIBRARY_PATH=$nvidia${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$root/simd:$root/site:$root/ort:$repo
export CLIP_GATEWAY_CACHE=$kit/cache PYTHONUNBUFFERED=1 BENCH_HOST_WORK=$kit/work
triton_env || { say "no Triton environment"; exit 1; }
# Triton's Python backend and the gateway's regions live in /dev/shm (a batch of 128 is 19 MB
# per request, several in flight): a small one (a container's 64 MB) would fail the run
shm=$(df -m --output=size /dev/shm | tail -1)
if [ "${shm:-0}" -lt 4096 ]; then
  mount -o remount,size=16g /dev/shm && say "/dev/shm was ${shm} MB: remounted at 16 GB"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu --format=csv,noheader
say "setup $(( $(date +%s) - started )) s; building pillow-simd, then the gateway's preflight"
pillow_simd
# what every gateway does before it serves, with this kit's Pillow, in seconds rather than after
# the exports (the second lent machine lost three runs to a gateway start that raised KeyError);
# the decode speed it records is the one each gateway start then reuses
"$py" - <<'PY' || { say "a gateway would not start with this kit (above)"; exit 1; }
from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.__main__ import measured_decode_speed
from clip_gateway.imaging import paths
print("imaging:", paths.current())
print("decode speed:", measured_decode_speed(ServerSettings()))
PY
say "preflight done at $(( $(date +%s) - started )) s; exporting"
for model in ViT-B-32 ViT-B-16; do  # both at once: 16 cores, each export mostly one thread
  "$py" -m clip_gateway.export --model "$model" --random-init --print-dir \
    >"$out/export-$model.log" 2>&1 &
done
wait
say "exports done at $(( $(date +%s) - started )) s"
timeout --signal=INT "${BENCH_HOST_BUDGET_S:-480}" \
  "$py" -m bench host --provider cuda --out "$out" "$@" 2>&1 | tee "$out/bench-host.log" | grep -v '^\[torch.onnx\]'
code=${PIPESTATUS[0]}
# what triton/python/model.py said of its batch buffers (page-locked for the CUDA EP's DMA, or
# why not) and of how its CUDA context waits for the GPU (blocking sync, or why not)
grep -hoE "([a-z_]* batch buffer|CUDA context)[^\"]*" "$kit"/work/triton-*.log 2>/dev/null | sort | uniq -c | sed 's/^/model.py: /'
# which way each gateway process chose to put the client's squares into their batch rows, and
# the medians it chose by (pipeline/batching.py, RowWrites: measured per process, per CPU)
grep -hoE "JPEGs already the model's input: [^\"]*" "$kit"/work/gateway*.log 2>/dev/null | sed 's/^/gateway: /'
tar -czf "$out/logs.tar.gz" -C "$kit/work" . 2>/dev/null
say "bench host exited $code after $(( $(date +%s) - started )) s"
cat "$out/host.md" 2>/dev/null
exit "$code"
