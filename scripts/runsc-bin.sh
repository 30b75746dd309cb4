#!/usr/bin/env bash
# runsc-bin builds gVisor's runsc, the gvisor runtime's sandbox, from the
# module proxy (pinned by tools/runsc/go.mod: gVisor tags no releases, so
# the pin is a pseudo-version of its go branch) into a cache keyed by that
# version, and does nothing when the cache already holds it. Without cgo:
# a cgo runsc cannot start (its chroot has no dynamic loader). The cold
# build takes about 3 minutes on 2 cores.
#
# With precompiled seccomp filters, as gVisor's Bazel build makes them:
# the module ships stubs that hold none, so a plain go build's runsc
# compiles its host filters at every start and restore.
# tools/runsc/seccompgen writes the Go files that hold them, and runsc is
# built with a go build -overlay that puts those files in the place of the
# stubs. go build replaces no file under the module cache, so both builds
# use a copy of the module (a replace in a copy of go.mod): the
# generator's with an overlay that exports two functions of gVisor's
# filter config packages, runsc's with the generated files only.
#
# And with fewer reads at a time of a restore's pages file: gVisor reads
# it with 128 (each a thread, all counted in GOMAXPROCS), which on a
# small host hold every core until the pages are loaded, while the
# restore's own work (the kernel's state, then the restored processes,
# whose pages are read first) waits: a resume of 512 MiB answered only
# once they were loaded. runsc's overlay adds tools/runsc/pagereads.go.in
# (half the cores) and a copy of pagesfile.go that takes its count from
# there (the build fails if that line is not found).
#
# The cache key's suffix names this form of the build: change it when
# the build changes, so caches rebuild.
#
# Usage: scripts/runsc-bin.sh [--print-dir | --print]
#   PADDOCK_RUNSC_CACHE  cache root (default /var/cache/paddock/runsc)
set -euo pipefail
cd "$(dirname "$0")/../tools/runsc"
. ../../scripts/gobin-cache.sh

version=$(modversion . gvisor.dev/gvisor)
cache=${PADDOCK_RUNSC_CACHE:-/var/cache/paddock/runsc}/$version-filters-reads
case "${1:-}" in
--print-dir) echo "$cache"; exit 0 ;;
--print) echo "$cache/runsc"; exit 0 ;;
esac
[[ -x $cache/runsc ]] && exit 0

gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
go mod download gvisor.dev/gvisor
mod=$gen/gvisor
cp -r "$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)" "$mod"
chmod -R u+w "$mod"
cp go.mod go.sum "$gen/"
go mod edit -replace "gvisor.dev/gvisor=$mod" "$gen/go.mod"
cat >"$gen/gen.json" <<JSON
{"Replace": {
	"$mod/runsc/boot/filter/config/paddock_seccompgen.go": "$PWD/seccompgen/sentry.go.in",
	"$mod/runsc/fsgofer/filter/config/paddock_seccompgen.go": "$PWD/seccompgen/gofer.go.in"
}}
JSON
pages=pkg/sentry/state/stateio/pagesfile.go
sed 's/return NewPagesFileFDReader(fd, pagesFileFDDefaultMaxIOBytes, pagesFileFDDefaultMaxParallel)/return NewPagesFileFDReader(fd, pagesFileFDDefaultMaxIOBytes, restoreReads())/' \
	"$mod/$pages" >"$gen/pagesfile.go"
if ! grep -q 'restoreReads()' "$gen/pagesfile.go"; then
	echo "$(basename "$0"): $pages has no default pages file reader to change" >&2
	exit 1
fi
cat >"$gen/runsc.json" <<JSON
{"Replace": {
	"$mod/runsc/boot/filter/filter_precompiled.go": "$gen/runsc_boot_filter_precompiled.go",
	"$mod/runsc/fsgofer/filter/filter_precompiled.go": "$gen/runsc_fsgofer_filter_precompiled.go",
	"$mod/$pages": "$gen/pagesfile.go",
	"$mod/pkg/sentry/state/stateio/paddock_pagereads.go": "$PWD/pagereads.go.in"
}}
JSON
start=$SECONDS
CGO_ENABLED=0 go build -trimpath -modfile "$gen/go.mod" -overlay "$gen/gen.json" -o "$gen/seccompgen" ./seccompgen
"$gen/seccompgen" -gvisor "$mod" -out "$gen"
echo "$(basename "$0"): seccomp filters precompiled in $((SECONDS - start)) s"
# runsc --version names the pin (a build from the module stamps none).
GOFLAGS="${GOFLAGS:-} -modfile=$gen/go.mod -overlay=$gen/runsc.json" \
	cachebuild . gvisor.dev/gvisor/runsc runsc "-X gvisor.dev/gvisor/runsc/version.version=$version"
