#!/usr/bin/env bash
# s3-bins builds the S3-compatible object store the archive tests run
# against: SeaweedFS's `weed` (Apache-2.0; MinIO's server is AGPL and is
# not used), from the module proxy, pinned by tools/s3/go.mod, into a cache
# keyed by its version. It does nothing when the cache already holds it.
#
# Usage: scripts/s3-bins.sh [--print-dir]
#   PADDOCK_S3_CACHE  cache root (default /var/cache/paddock/s3)
#
# Sourced (`. scripts/s3-bins.sh`), it defines s3_start and
# s3_stop for scripts that run a local object store (make cluster-up):
#   s3_start DIR PORT   starts `weed mini` on 127.0.0.1:PORT (S3) with its
#                       data in DIR, waits until it serves, and writes the
#                       store's settings to DIR/env (PADDOCK_ARCHIVE_*)
#   s3_stop DIR         stops it (the pid in DIR/weed.pid)
# PORT to PORT+7 are taken (master, volume, filer and their gRPC ports).

s3_tools=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools/s3" && pwd)

s3_version() { # the seaweedfs version tools/s3/go.mod pins
	awk '$1 == "github.com/seaweedfs/seaweedfs" && $2 ~ /^v/ { print $2; exit }' "$s3_tools/go.mod"
}

s3_dir() {
	echo "${PADDOCK_S3_CACHE:-/var/cache/paddock/s3}/seaweedfs-$(s3_version)"
}

s3_build() {
	local dir tmp start
	dir=$(s3_dir)
	[[ -x $dir/weed ]] && return 0
	mkdir -p "$dir"
	tmp=$(mktemp -d "$dir/.build.XXXXXX")
	# The binary goes into the cache only once it is whole.
	echo "s3-bins: building weed into $dir"
	start=$SECONDS
	if ! (cd "$s3_tools" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$tmp/weed" github.com/seaweedfs/seaweedfs/weed); then
		rm -rf "$tmp"
		return 1
	fi
	mv "$tmp/weed" "$dir/weed"
	rm -rf "$tmp"
	echo "s3-bins: weed built in $((SECONDS - start)) s"
}

s3_start() { # DIR PORT
	local dir=$1 port=$2 weed
	weed=$(s3_dir)/weed
	mkdir -p "$dir/data"
	cat >"$dir/s3.json" <<JSON
{"identities":[{"name":"paddock","credentials":[{"accessKey":"paddock","secretKey":"paddock-secret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
	"$weed" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
		-master.port=$((port + 1)) -master.port.grpc=$((port + 2)) -master.telemetry=false -master.volumeSizeLimitMB=1024 \
		-volume.port=$((port + 3)) -volume.port.grpc=$((port + 4)) -volume.max=0 \
		-filer -filer.port=$((port + 5)) -filer.port.grpc=$((port + 6)) \
		-s3 -s3.port="$port" -s3.port.grpc=$((port + 7)) -s3.port.iceberg=0 -s3.port.lance=0 \
		-s3.config="$dir/s3.json" -s3.localSocket="$dir/s3.sock" \
		>"$dir/weed.log" 2>&1 &
	echo $! >"$dir/weed.pid"
	for _ in $(seq 300); do
		if curl -s -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null; then
			cat >"$dir/env" <<ENV
PADDOCK_ARCHIVE_ENDPOINT=http://127.0.0.1:$port
PADDOCK_ARCHIVE_ACCESS_KEY=paddock
PADDOCK_ARCHIVE_SECRET_KEY=paddock-secret
ENV
			return 0
		fi
		sleep 0.1
	done
	echo "s3-bins: weed did not serve on 127.0.0.1:$port; see $dir/weed.log" >&2
	return 1
}

s3_stop() { # DIR
	local pid
	pid=$(cat "$1/weed.pid" 2>/dev/null) || return 0
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$1/weed.pid"
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
	return 0 # sourced: the functions only
fi
set -euo pipefail
if [[ "${1:-}" == --print-dir ]]; then
	s3_dir
	exit 0
fi
s3_build
