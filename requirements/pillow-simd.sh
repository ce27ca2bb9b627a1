#!/usr/bin/env bash
# pillow-simd in place of Pillow in a venv, in two steps the Makefile's install runs:
#   requirements/pillow-simd.sh build PYTHON VERSION CFLAGS WHEEL_DIR   (while the rest installs)
#   requirements/pillow-simd.sh install PYTHON VERSION WHEEL_DIR        (once it has)
# pillow-simd ships no wheels: its wheel is built against the system's libjpeg, zlib and libwebp
# headers. Missing ones are installed with apt-get where this install may (root, or passwordless
# sudo); otherwise it refuses, naming the packages, rather than leaving stock Pillow (under half
# the images/s per core, docs/PERFORMANCE.md) in place. The install ends by checking what the
# venv's PIL now is: the path the gateway reports when it starts.
set -euo pipefail
step=$1 py=$2 version=$3
if [ "$step" = install ]; then
  wheels=$4
  # (twice quiet: pip's "Skipping pillow-simd as it is not installed" is no news on a first
  # install)
  "$py" -m pip uninstall --quiet --quiet --yes pillow pillow-simd
  "$py" -m pip install --quiet --quiet --force-reinstall --no-deps --no-index \
    --find-links "$wheels" "pillow-simd==$version"
  "$py" -m clip_gateway imaging --require-simd >/dev/null
  exit 0
fi
[ "$step" = build ] || { echo "usage: $0 build|install ..." >&2; exit 2; }
cflags=$4 wheels=$5

# header, the Debian package that ships it
needs=("webp/decode.h libwebp-dev" "zlib.h zlib1g-dev" "jpeglib.h libjpeg-dev")
missing() {
  local out=() entry
  command -v cc >/dev/null || out+=(gcc libc6-dev)
  for entry in "${needs[@]}"; do
    set -- $entry
    # through the compiler's own search path (Debian puts some headers in multiarch dirs)
    # (a here-string, not a pipe: a compiler that stops reading early is no SIGPIPE failure)
    cc -E -x c - >/dev/null 2>&1 <<<"#include <stdio.h>
#include <$1>" || out+=("$2")
  done
  include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  [ -f "$include/Python.h" ] || out+=(python3-dev)
  echo "${out[@]}"
}

packages=$(missing)
if [ -n "$packages" ]; then
  apt=()
  if command -v apt-get >/dev/null; then
    apt_get=(env DEBIAN_FRONTEND=noninteractive apt-get)
    if [ "$(id -u)" = 0 ]; then apt=("${apt_get[@]}"); elif sudo -n true 2>/dev/null; then apt=(sudo -n "${apt_get[@]}"); fi
  fi
  if [ ${#apt[@]} -eq 0 ]; then
    cat >&2 <<EOF
error: pillow-simd (the fast image resize) builds against packages this machine lacks:
  $packages
Install them (Debian/Ubuntu: sudo apt-get install -y $packages) and run make again, or keep
stock Pillow, under half the preprocessing images/s per core, with PILLOW_SIMD=0.
EOF
    exit 1
  fi
  echo "clip-gateway: installing $packages (pillow-simd builds against them)"
  # apt's and debconf's chatter ("delaying package configuration, since apt-utils is not
  # installed") goes to a log that is shown only if the install fails
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  # shellcheck disable=SC2086
  "${apt[@]}" install -y -q --no-install-recommends $packages >"$log" 2>&1 \
    || { "${apt[@]}" update -q >>"$log" 2>&1 \
         && "${apt[@]}" install -y -q --no-install-recommends $packages >>"$log" 2>&1; } \
    || { cat "$log" >&2; exit 1; }
  still=$(missing)
  if [ -n "$still" ]; then
    echo "error: still missing after apt-get: $still (PILLOW_SIMD=0 keeps stock Pillow)" >&2
    exit 1
  fi
fi

# The wheel only, by a pip in a venv of its own: the venv it goes into is being installed
# meanwhile (setuptools and its .pth hook among what uv writes), and a build run by that venv's pip
# failed once on a first `make serve` with its output silenced. The output is kept and shown if
# the build fails.
build=$(mktemp -d)
trap 'rm -rf "$build" "${log:-}"' EXIT
"$py" -I -S -c 'import sys; print(sys._base_executable)' >"$build/python"
"$(cat "$build/python")" -m venv "$build/venv"
CC="cc $cflags" "$build/venv/bin/python" -m pip wheel --no-deps --no-cache-dir \
  --disable-pip-version-check --no-binary pillow-simd --wheel-dir "$wheels" \
  "pillow-simd==$version" >"$build/log" 2>&1 || {
  tail -n 60 "$build/log" >&2
  echo "error: building pillow-simd $version failed (the log's end above); PILLOW_SIMD=0" \
    "keeps stock Pillow" >&2
  exit 1
}
