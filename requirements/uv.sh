#!/usr/bin/env bash
# `requirements/uv.sh UV VENV_PYTHON ARGS...`: `UV pip ARGS` into that Python's environment, from
# the package sources pip is configured with on this machine (`pip config list`: index, extra
# indexes, wheel directories, constraints, certificate bundle). uv reads neither pip.conf nor
# PIP_* variables, so each is handed to it under uv's own name; several indexes are weighed as
# pip weighs them (the best match across all, not the first index that has the name).
# The Makefile's installs run through it: one resolution, downloads and unpacking in parallel,
# and the same exact pins (every install is constrained by requirements/lock.txt).
set -euo pipefail
uv=$1 py=$2
shift 2
pip_config() {
  local line key value
  while IFS= read -r line; do
    key="${line%%=*}"; key="${key#*.}"; value="${line#*=}"; value="${value#\'}"; value="${value%\'}"
    case "$key" in
      index-url) export UV_DEFAULT_INDEX="$value" ;;
      extra-index-url) export UV_INDEX="${UV_INDEX:+$UV_INDEX }$value" ;;
      find-links) export UV_FIND_LINKS="${UV_FIND_LINKS:+$UV_FIND_LINKS,}${value// /,}" ;;
      constraint) export UV_CONSTRAINT="${UV_CONSTRAINT:+$UV_CONSTRAINT }$value" ;;
      cert) export SSL_CERT_FILE="$value" ;;
      no-index) [ "$value" = 1 ] || [ "$value" = true ] && export UV_NO_INDEX=1 ;;
    esac
  done < <("$py" -m pip config list 2>/dev/null | sed -E 's/^:env:\./global./' | grep '^global\.' | sort -u || true)
}
pip_config
export UV_INDEX_STRATEGY="${UV_INDEX_STRATEGY:-unsafe-best-match}"
# the uv cache and the venv may lie on different filesystems: copying is then what uv does
# anyway, without a warning on every install
export UV_LINK_MODE="${UV_LINK_MODE:-copy}"
exec "$uv" pip "$1" --python "$py" "${@:2}"
