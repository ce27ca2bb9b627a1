#!/bin/bash
# Stand-in for NGC's /opt/nvidia/nvidia_entrypoint.sh: the real one prints the banner, sources
# /opt/nvidia/entrypoint.d/*.sh (GPU and driver checks, and CUDA forward compatibility on hosts
# with older drivers: it puts the compat libraries on LD_LIBRARY_PATH), then execs its arguments.
# This one does the same steps with nothing of CUDA to set up; the banner line lets
# `make image-test` check that the image's entrypoint runs through it.
echo "== NVIDIA entrypoint (stand-in: Triton ${TRITON_SERVER_VERSION:-?}, no CUDA) =="
for script in /opt/nvidia/entrypoint.d/*.sh; do
  # shellcheck disable=SC1090
  [ -f "$script" ] && source "$script"
done
if [ $# -eq 0 ]; then
  exec /bin/bash
fi
exec "$@"
