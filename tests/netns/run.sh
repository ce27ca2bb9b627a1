#!/bin/sh
# Runs tests/netns in the namespace `unshare -n -m` made: a private mount of the hosts file
# (names the tests resolve), loopback up, nothing else. Usage: unshare -n -m -- sh run.sh HOSTS PYTHON [pytest args]
set -eu
hosts=$1 python=$2
shift 2
mount --make-rprivate /
mount --bind "$hosts" /etc/hosts
ip link set lo up
exec env CLIP_GATEWAY_NETNS=1 "$python" -m pytest -p no:cacheprovider -p no:randomly tests/netns "$@"
