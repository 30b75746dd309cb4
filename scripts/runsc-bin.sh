#!/usr/bin/env bash
# runsc-bin builds gVisor's runsc, the gvisor runtime's sandbox, from the
# module proxy (pinned by tools/runsc/go.mod: gVisor tags no releases, so
# the pin is a pseudo-version of its go branch) into a cache keyed by that
# version, and does nothing when the cache already holds it. Without cgo:
# a cgo runsc cannot start (its chroot has no dynamic loader). The cold
# build takes about 3 minutes on 2 cores.
#
# Usage: scripts/runsc-bin.sh [--print-dir | --print]
#   PADDOCK_RUNSC_CACHE  cache root (default /var/cache/paddock/runsc)
set -euo pipefail
cd "$(dirname "$0")/../tools/runsc"
. ../../scripts/gobin-cache.sh

version=$(modversion . gvisor.dev/gvisor)
cache=${PADDOCK_RUNSC_CACHE:-/var/cache/paddock/runsc}/$version
case "${1:-}" in
--print-dir) echo "$cache"; exit 0 ;;
--print) echo "$cache/runsc"; exit 0 ;;
esac
# runsc --version names the pin (a build from the module stamps none).
cachebuild . gvisor.dev/gvisor/runsc runsc "-X gvisor.dev/gvisor/runsc/version.version=$version"
