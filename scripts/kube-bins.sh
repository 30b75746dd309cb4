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
. ../../scripts/gobin-cache.sh

k8s=$(modversion apiserver k8s.io/kubernetes)
etcd=$(modversion etcd go.etcd.io/etcd/server/v3)
cache=${PADDOCK_KUBE_CACHE:-/var/cache/paddock/kube}/k8s-$k8s-etcd-$etcd
if [[ "${1:-}" == --print-dir ]]; then
	echo "$cache"
	exit 0
fi
cachebuild etcd go.etcd.io/etcd/server/v3 etcd
cachebuild apiserver k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver
