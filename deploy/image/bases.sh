#!/usr/bin/env bash
# The stand-in base images for `make image` on a machine with no container registry:
# Debian bookworm from debootstrap (minbase), imported once, then the Triton and Python stand-ins
# built on it (layers cached: a second run takes seconds). Needs root, debootstrap and podman.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
debian=localhost/clip-gateway-base/debian:bookworm-minbase

if ! podman image exists "$debian"; then
  rootfs="$work/rootfs-bookworm"
  if [ ! -f "$rootfs/.complete" ]; then
    rm -rf "$rootfs"
    echo "image: debootstrap --variant=minbase bookworm (a few minutes)"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
      || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    touch "$rootfs/.complete"
  fi
  tar -C "$rootfs" --exclude=./.complete -c . | podman import --quiet - "$debian" >/dev/null
fi
# --network host: the builds fetch Debian and PyPI packages (no bridge to set up).
for base in tritonserver:standin python:3.11-standin nginx:standin; do
  echo "image: stand-in base localhost/clip-gateway-base/$base"
  podman build --format docker --network host "${build_volumes[@]}" \
    --build-arg DEBIAN_IMAGE="$debian" -t "localhost/clip-gateway-base/$base" \
    -f "$here/${base%%:*}-standin.Containerfile" "$here" > "$work/base-${base%%:*}.log" 2>&1 \
    || { tail -30 "$work/base-${base%%:*}.log" >&2; echo "image: $base failed" >&2; exit 1; }
done
