# Sourced by deploy/image/*.sh: the container settings, and what a build sees of this host.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="${IMAGE_WORK:-$root/build/image}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
mkdir -p "$work"

# pip inside a build sees this host's pip configuration (`pip config list`: certificate bundle,
# local indexes and wheel directories, constraints), mounted read-only at the same paths, so a
# machine behind a TLS-inspecting proxy or with a local wheel mirror builds as its pip installs.
# Mounts exist for RUN steps only: nothing of them lands in an image layer.
build_volumes=()
host_pip_config() {
  local conf="$work/pip.conf" line key value path
  local -A seen=()
  echo "[global]" > "$conf"
  while IFS= read -r line; do
    key="${line%%=*}"; key="${key#*.}"; value="${line#*=}"; value="${value#\'}"; value="${value%\'}"
    [ -n "${seen[$key]:-}" ] && continue
    seen[$key]=1
    if [ "$key" = cert ]; then
      # beside, not over, the image's own bundle (its ca-certificates package rewrites that)
      [ -f "$value" ] && build_volumes+=(--volume "$value:/etc/pip-host-ca.crt:ro")
      echo "cert = /etc/pip-host-ca.crt" >> "$conf"
      continue
    fi
    echo "$key = $value" >> "$conf"
    for path in $value; do
      path="${path#file://}"
      case "$path" in
        /*/simple) path="${path%/simple}" ;;
        /*) ;;
        *) continue ;;
      esac
      [ -e "$path" ] && build_volumes+=(--volume "$path:$path:ro")
    done
  done < <(python3 -m pip config list 2>/dev/null | sed -E 's/^:env:\./global./' | grep '^global\.' || true)
  build_volumes+=(--volume "$conf:/etc/pip.conf:ro")
}
host_pip_config
