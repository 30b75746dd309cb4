#!/usr/bin/env bash
# kube-bins builds the Kubernetes control plane that the cluster tests run
# against (kube-apiserver and etcd, from the module proxy: no kubelet, no
# images) into a cache keyed by their versions, and does nothing when the
# cache already holds them. The cold build takes about 6 minutes on 2 cores.
#
# Usage: scripts/kube-bins.sh [--print-dir]
#   PADDOCK_KUBE_CACHE  cache root (default /var/cache/paddock/kube)
set -euo pipefail
cd "$(dirname "$0")/../tools/kube"

version() { # the version a tools module requires of $2, read from its go.mod
	awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1/go.mod"
}
k8s=$(version apiserver k8s.io/kubernetes)
etcd=$(version etcd go.etcd.io/etcd/server/v3)
dir=${PADDOCK_KUBE_CACHE:-/var/cache/paddock/kube}/k8s-$k8s-etcd-$etcd
if [[ "${1:-}" == --print-dir ]]; then
	echo "$dir"
	exit 0
fi
if [[ -x $dir/kube-apiserver && -x $dir/etcd ]]; then
	exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Each binary goes into the cache only once it is whole, so a build that
# is interrupted leaves no half binary behind for the tests to run.
build() { # module package name
	[[ -x $dir/$3 ]] && return 0
	echo "kube-bins: building $3 into $dir"
	local start=$SECONDS
	(cd "$1" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$tmp/$3" "$2")
	mv "$tmp/$3" "$dir/$3"
	echo "kube-bins: $3 built in $((SECONDS - start)) s"
}
build etcd go.etcd.io/etcd/server/v3 etcd
build apiserver k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver
