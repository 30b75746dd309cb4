#!/usr/bin/env bash
# cluster-down removes every trace of what scripts/cluster-up.sh started
# (`make cluster-down`): the gateways, each node with its sandboxes,
# cgroups, network, mounts and loop devices (`paddock serve --uninstall`
# with the node's own settings), the object store, kube-apiserver and
# etcd (each by the pid it recorded), then the directory. It says what it
# finds left behind and fails if anything is.
#	PADDOCK_CLUSTER_DIR  the cluster's directory (default .cluster in the checkout)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${PADDOCK_CLUSTER_DIR:-$repo/.cluster}
if [[ ! -f $dir/config ]]; then
	[[ -d $dir ]] && { echo "cluster-down: $dir has no config: not a cluster-up directory; left alone" >&2; exit 1; }
	echo "cluster-down: no cluster in $dir"
	exit 0
fi
dir=$(cd "$dir" && pwd)
# shellcheck source=/dev/null
. "$dir/config"
failed=0

# running PID: the process runs (a zombie, dead and not yet reaped by
# its parent, does not).
running() { kill -0 "$1" 2>/dev/null && [[ $(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) != Z ]]; }

# stop PIDFILE: SIGTERM to the process it names, SIGKILL after 15 s.
stop() {
	local pid
	[[ -f $1 ]] || return 0
	pid=$(cat "$1")
	if running "$pid"; then
		kill -TERM "$pid"
		for ((t = 0; t < 150; t++)); do
			running "$pid" || break
			sleep 0.1
		done
		running "$pid" && kill -KILL "$pid"
	fi
	rm -f "$1"
}

for ((g = 1; g <= gateways; g++)); do
	stop "$dir/gateway$g/pid"
done

for ((i = 1; i <= nodes; i++)); do
	nd=$dir/node$i
	[[ -d $nd ]] || continue
	# A node killed with -9 left its sandboxes running: --uninstall kills
	# them through its cgroup parent, whether or not the daemon runs.
	# The kernel lets go of a killed sandbox's disk (its loop device)
	# after its processes are gone: a first try can find it still held.
	for try in 1 2 3 4 5; do
		[[ -f $nd/state/paddock.db ]] || [[ -d $nd/run ]] || break
		"$bin" serve --uninstall --state-dir "$nd/state" --run-dir "$nd/run" \
			--cgroup-parent "$cgroup-node$i" --network-name "$net$i" >>"$nd/uninstall.log" 2>&1 && break
		if ((try == 5)); then
			echo "cluster-down: uninstalling node$i failed:" >&2
			tail -5 "$nd/uninstall.log" >&2
			failed=1
		fi
		sleep 2
	done
	stop "$nd/pid" # gone already after --uninstall; a daemon that never wrote its pid file
done

# OBJECT STORE HOOK: stops what object_store_up in cluster-up.sh started.
object_store_down() { stop "$dir/s3/pid"; }
object_store_down

stop "$dir/kube/apiserver.pid"
stop "$dir/kube/etcd.pid"

# What must be gone: mounts and loop devices under the directory, the
# nodes' cgroups, links and nftables tables.
left=()
while read -r m; do left+=("mount $m"); done < <(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo)
while read -r l; do left+=("loop device $l"); done < <(losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v d="$dir/" 'index($2, d) == 1 { print $1 }')
for ((i = 1; i <= nodes; i++)); do
	for c in /sys/fs/cgroup/*/"$cgroup-node$i" /sys/fs/cgroup/"$cgroup-node$i"; do
		[[ -d $c ]] && left+=("cgroup $c")
	done
	while read -r l; do [[ -n $l ]] && left+=("link $l"); done < <(ip -o link show 2>/dev/null | awk -F': ' -v p="$net$i" 'index($2, p) == 1 { sub(/@.*/, "", $2); print $2 }')
	nft list table inet "$net$i" >/dev/null 2>&1 && left+=("nftables table inet $net$i")
	while read -r n; do [[ -n $n ]] && left+=("netns $n"); done < <(ip netns list 2>/dev/null | awk -v p="$net$i" 'index($1, p) == 1 { print $1 }')
done
if ((${#left[@]} > 0)); then
	echo "cluster-down: left behind (the directory is kept):" >&2
	printf '  %s\n' "${left[@]}" >&2
	exit 1
fi
if ((failed)); then
	echo "cluster-down: a node's uninstall failed; $dir kept" >&2
	exit 1
fi
rm -rf "$dir"
echo "cluster-down: removed the cluster in $dir"
