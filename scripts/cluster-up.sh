#!/usr/bin/env bash
# cluster-up starts a paddock cluster on this host (`make cluster-up`): a
# real etcd and kube-apiserver from the kube-bins cache, the CRDs and RBAC
# of deploy/, the cluster's mutual TLS (paddock cluster-tls), N nodes (`paddock serve --cluster`, each with its own state
# and run dirs, network, subnet, uid range and cgroup parent) and M
# gateways (`paddock gateway --cluster`). It waits until every gateway
# sees every node ready, then writes DIR/env, shell lines for a client:
#
#	. .cluster/env && paddock run -- echo hello
#
# Run again, it starts only what is not running (a node killed with -9
# comes back with its sandboxes). scripts/cluster-down.sh removes all of it.
#
# Settings (environment; kept in DIR/config at the first start, so that a
# restart and cluster-down use the same):
#	PADDOCK_CLUSTER_DIR       where everything lives (default .cluster in the checkout)
#	PADDOCK_BIN               the paddock binary (default bin/paddock)
#	PADDOCK_CLUSTER_NODES     nodes (default 3); PADDOCK_CLUSTER_GATEWAYS gateways (default 2)
#	PADDOCK_CLUSTER_NET       network name prefix: node i's is NET$i (default pc)
#	PADDOCK_CLUSTER_SUBNET    a /16 whose i-th /20 is node i's (default 10.236.0.0/16)
#	PADDOCK_CLUSTER_UID_START first node's --uid-start (default 2147483648)
#	PADDOCK_CLUSTER_UID_STEP  uids between nodes (default 16777216: 256 sandboxes)
#	PADDOCK_CLUSTER_CGROUP    cgroup parent prefix: node i's is CGROUP-node$i (default paddock-cluster)
#	PADDOCK_CLUSTER_NODE_FLAGS   more `paddock serve` flags for every node
#	PADDOCK_CLUSTER_NODE<i>_FLAGS  ... for node i alone (e.g. --admission-memory 4g)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${PADDOCK_CLUSTER_DIR:-$repo/.cluster}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
chmod 0711 "$dir" # sandbox uids traverse it to reach their nodes' image layers

if [[ ! -f $dir/config ]]; then
	{
		echo "bin=$(realpath "${PADDOCK_BIN:-$repo/bin/paddock}")"
		echo "kube_bin=${PADDOCK_KUBE_BIN:-$("$repo/scripts/kube-bins.sh" --print-dir)}"
		echo "nodes=${PADDOCK_CLUSTER_NODES:-3}"
		echo "gateways=${PADDOCK_CLUSTER_GATEWAYS:-2}"
		echo "net=${PADDOCK_CLUSTER_NET:-pc}"
		echo "subnet=${PADDOCK_CLUSTER_SUBNET:-10.236.0.0/16}"
		echo "uid_start=${PADDOCK_CLUSTER_UID_START:-2147483648}"
		echo "uid_step=${PADDOCK_CLUSTER_UID_STEP:-16777216}"
		echo "cgroup=${PADDOCK_CLUSTER_CGROUP:-paddock-cluster}"
	} >"$dir/config"
	for ((i = 1; i <= ${PADDOCK_CLUSTER_NODES:-3}; i++)); do
		v=PADDOCK_CLUSTER_NODE${i}_FLAGS
		printf 'node_flags_%d=%q\n' "$i" "${PADDOCK_CLUSTER_NODE_FLAGS:-} ${!v:-}" >>"$dir/config"
	done
fi
# shellcheck source=/dev/null
. "$dir/config"
kube=$dir/kube
mkdir -p "$kube"
[[ -x $bin ]] || { echo "cluster-up: no paddock binary at $bin (make build)" >&2; exit 1; }
[[ -x $kube_bin/kube-apiserver && -x $kube_bin/etcd ]] || { echo "cluster-up: no kube-apiserver/etcd in $kube_bin (make kube-bins)" >&2; exit 1; }

# Ports, picked free at the first start (in one go: a process start can
# take seconds on a loaded host) and kept in DIR/ports.
if [[ ! -f $dir/ports ]]; then
	names="etcd etcd-peer apiserver"
	for ((i = 1; i <= nodes; i++)); do names+=" node$i node$i-e2b"; done
	for ((g = 1; g <= gateways; g++)); do names+=" gateway$g gateway$g-e2b"; done
	# shellcheck disable=SC2086 # the names are words
	python3 - $names >"$dir/ports.tmp" <<'EOF'
import socket, sys
socks = []
for name in sys.argv[1:]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
    print(name, s.getsockname()[1])
EOF
	mv "$dir/ports.tmp" "$dir/ports"
fi
# port NAME: the port kept for NAME.
port() { awk -v k="$1" '$1 == k { print $2 }' "$dir/ports"; }

# alive PIDFILE: the process it names runs (a zombie, killed and not yet
# reaped by its parent, does not).
alive() {
	local pid
	[[ -f $1 ]] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null &&
		[[ $(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

# spawn PIDFILE LOG CMD...: starts CMD in its own session, detached.
spawn() {
	local pidfile=$1 logf=$2
	shift 2
	setsid "$@" >>"$logf" 2>&1 </dev/null &
	echo $! >"$pidfile"
}

# wait_for WHAT SECONDS CMD...: polls CMD every 0.2 s for SECONDS.
wait_for() {
	local what=$1 deadline=$((SECONDS + $2))
	shift 2
	while ((SECONDS < deadline)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	echo "cluster-up: $what not ready after $limit s" >&2
	return 1
}

hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

# --- credentials, made once ---------------------------------------------------
if [[ ! -f $kube/tokens.csv ]]; then
	umask 077
	admin=$(hex 16) nodetok=$(hex 16) gwtok=$(hex 16)
	{
		echo "$admin,admin,admin,\"system:masters\""
		echo "$nodetok,system:serviceaccount:paddock:paddock-node,paddock-node,\"system:serviceaccounts,system:serviceaccounts:paddock\""
		echo "$gwtok,system:serviceaccount:paddock:paddock-gateway,paddock-gateway,\"system:serviceaccounts,system:serviceaccounts:paddock\""
	} >"$kube/tokens.csv.tmp"
	openssl ecparam -name prime256v1 -genkey -noout -out "$kube/sa.key" 2>/dev/null
	openssl ec -in "$kube/sa.key" -pubout -out "$kube/sa.pub" 2>/dev/null
	hex 32 >"$dir/node.token"
	hex 32 >"$dir/client.token"
	# Gateways and nodes speak mutual TLS: one directory holds both sides'
	# files here (in a real cluster, two Secrets; ca.key stays out).
	"$bin" cluster-tls "$dir/tls" >/dev/null
	mv "$kube/tokens.csv.tmp" "$kube/tokens.csv"
	umask 022
fi
token_of() { awk -F, -v u="$1" '$2 == u { print $1 }' "$kube/tokens.csv"; }

# --- etcd and kube-apiserver ----------------------------------------------------
etcd_port=$(port etcd) peer_port=$(port etcd-peer) api_port=$(port apiserver)
api=https://127.0.0.1:$api_port
if ! alive "$kube/etcd.pid"; then
	spawn "$kube/etcd.pid" "$kube/etcd.log" "$kube_bin/etcd" --name=paddock-cluster --data-dir="$kube/etcd" \
		--listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
		--listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
		--initial-cluster="paddock-cluster=http://127.0.0.1:$peer_port" --unsafe-no-fsync --log-level=warn
fi
if ! alive "$kube/apiserver.pid"; then
	spawn "$kube/apiserver.pid" "$kube/apiserver.log" "$kube_bin/kube-apiserver" \
		--etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
		--secure-port="$api_port" --cert-dir="$kube/certs" --token-auth-file="$kube/tokens.csv" \
		--authorization-mode=RBAC --service-account-issuer=https://kubernetes.default.svc \
		--service-account-key-file="$kube/sa.pub" --service-account-signing-key-file="$kube/sa.key" \
		--service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true --enable-priority-and-fairness=false
fi
admin_token=$(token_of admin)
kcurl() { curl -sS --cacert "$kube/certs/apiserver.crt" -H "Authorization: Bearer $admin_token" "$@"; }
ready() { [[ -f $kube/certs/apiserver.crt ]] && [[ $(kcurl "$api/readyz") == ok ]]; }
wait_for "kube-apiserver (see $kube/apiserver.log)" 90 ready

# kubeconfig USER FILE: a kubeconfig for one of the static tokens' users.
kubeconfig() {
	cat >"$2" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: '$api', certificate-authority: '$kube/certs/apiserver.crt'}}]
users: [{name: u, user: {token: '$(token_of "$1")'}}]
contexts: [{name: local, context: {cluster: local, user: u}}]
current-context: local
EOF
	chmod 0600 "$2"
}
kubeconfig admin "$kube/admin.kubeconfig"
kubeconfig system:serviceaccount:paddock:paddock-node "$kube/node.kubeconfig"
kubeconfig system:serviceaccount:paddock:paddock-gateway "$kube/gateway.kubeconfig"

# --- deploy/'s CRDs and RBAC ----------------------------------------------------
# apply FILE: creates each object of a YAML file (documents split by ---)
# through the API server's REST paths; one that exists already is kept.
apply() {
	local n=0
	awk -v out="$kube/doc" '/^---/ { n++; next } { print > (out "." n ".yaml") }' "$1"
	for f in "$kube"/doc.*.yaml; do
		n=$((n + 1))
		local av kind ns plural path code
		av=$(awk '/^apiVersion:/ { print $2; exit }' "$f")
		kind=$(awk '/^kind:/ { print $2; exit }' "$f")
		[[ -n $av && -n $kind ]] || { rm -f "$f"; continue; }
		ns=$(awk '/^metadata:/ { m = 1; next } m && /^[^ ]/ { m = 0 } m && /^  namespace:/ { print $2; exit }' "$f")
		plural=$(tr 'A-Z' 'a-z' <<<"$kind")
		case $plural in *y) plural=${plural%y}ies ;; *s) plural=${plural}es ;; *) plural=${plural}s ;; esac
		if [[ $av == */* ]]; then path=/apis/$av; else path=/api/$av; fi
		[[ -n $ns ]] && path=$path/namespaces/$ns
		code=$(kcurl -o "$kube/apply.out" -w '%{http_code}' -X POST -H 'Content-Type: application/yaml' --data-binary "@$f" "$api$path/$plural")
		rm -f "$f"
		case $code in
		201 | 409) ;;
		*) echo "cluster-up: $1, document $n ($kind): $code $(cat "$kube/apply.out")" >&2; return 1 ;;
		esac
	done
	rm -f "$kube/apply.out"
}
for f in "$repo"/deploy/crd-*.yaml "$repo/deploy/rbac.yaml"; do
	apply "$f"
done
# The CRDs serve once established.
crds_served() {
	kcurl "$api/apis/paddock.dev/v1alpha1" | grep -q '"paddocknodes"'
}
wait_for "the PaddockNode CRD" 30 crds_served

# --- object store ----------------------------------------------------------------
# OBJECT STORE HOOK. The S3-compatible store for archived paused sandboxes
# (issue 22) starts here, before the nodes: start it under $dir/s3 (pid
# file $dir/s3/pid, so that cluster-down stops it), append the flags every
# node needs to reach it to object_store_node_flags, and the lines clients
# need to object_store_env. object_store_down in cluster-down.sh undoes it.
object_store_node_flags=()
object_store_env=()
object_store_up() { :; }
object_store_up

# --- nodes -------------------------------------------------------------------------
base=${subnet%%/*}
IFS=. read -r o1 o2 _ _ <<<"$base"
node_token=$(cat "$dir/node.token")
for ((i = 1; i <= nodes; i++)); do
	nd=$dir/node$i
	mkdir -p "$nd"
	chmod 0711 "$nd"
	alive "$nd/pid" && continue
	p=$(port "node$i") e=$(port "node$i-e2b")
	flags_var=node_flags_$i
	# shellcheck disable=SC2086 # the flags are words
	spawn "$nd/pid" "$nd/node.log" "$bin" serve \
		--state-dir "$nd/state" --run-dir "$nd/run" \
		--listen "unix://$nd/paddock.sock" --listen "tcp://127.0.0.1:$p" --token-file "$dir/node.token" \
		--e2b-listen "tcp://127.0.0.1:$e" \
		--cluster --kubeconfig "$kube/node.kubeconfig" --node-name "node$i" --cluster-tls "$dir/tls" \
		--node-address "https://127.0.0.1:$p" --node-e2b-address "https://127.0.0.1:$e" \
		--network-name "$net$i" --network-subnet "$o1.$o2.$(((i - 1) * 16)).0/20" \
		--uid-start $((uid_start + (i - 1) * uid_step)) --cgroup-parent "$cgroup-node$i" \
		--disk-overcommit 100 --disk-pool 1 \
		"${object_store_node_flags[@]}" ${!flags_var}
done

# --- gateways ----------------------------------------------------------------------
for ((g = 1; g <= gateways; g++)); do
	gd=$dir/gateway$g
	mkdir -p "$gd"
	alive "$gd/pid" && continue
	spawn "$gd/pid" "$gd/gateway.log" "$bin" gateway --cluster --kubeconfig "$kube/gateway.kubeconfig" --cluster-tls "$dir/tls" \
		--listen "tcp://127.0.0.1:$(port "gateway$g")" --e2b-listen "tcp://127.0.0.1:$(port "gateway$g-e2b")" \
		--token-file "$dir/client.token" --node-token-file "$dir/node.token"
done

# --- wait until every gateway sees every node ready --------------------------------
client_token=$(cat "$dir/client.token")
all_ready() {
	local g n
	for ((g = 1; g <= gateways; g++)); do
		n=$(curl -sS -H "Authorization: Bearer $client_token" "http://127.0.0.1:$(port "gateway$g")/v1/nodes" | grep -o '"state":"ready"' | wc -l)
		[[ $n -eq $nodes ]] || return 1
	done
}
if ! wait_for "the cluster (every gateway seeing $nodes nodes ready)" 120 all_ready; then
	for ((i = 1; i <= nodes; i++)); do echo "--- node$i:"; tail -5 "$dir/node$i/node.log"; done >&2
	for ((g = 1; g <= gateways; g++)); do echo "--- gateway$g:"; tail -5 "$dir/gateway$g/gateway.log"; done >&2
	exit 1
fi

gw=127.0.0.1:$(port gateway1)
{
	echo "# paddock cluster in $dir: $nodes nodes, $gateways gateways (the first here; GATEWAY2_HOST the next)"
	echo "export PADDOCK_HOST=tcp://$gw"
	echo "export PADDOCK_TOKEN=$client_token"
	echo "export E2B_API_URL=http://127.0.0.1:$(port gateway1-e2b)"
	echo "export E2B_SANDBOX_URL=http://127.0.0.1:$(port gateway1-e2b)"
	echo "export E2B_API_KEY=$("$bin" e2b-key --token-file "$dir/client.token")"
	for ((g = 2; g <= gateways; g++)); do
		echo "export GATEWAY${g}_HOST=tcp://127.0.0.1:$(port "gateway$g")"
	done
	echo "export KUBECONFIG=$kube/admin.kubeconfig"
	for l in "${object_store_env[@]}"; do echo "$l"; done
} >"$dir/env.tmp"
chmod 0600 "$dir/env.tmp"
mv "$dir/env.tmp" "$dir/env"
echo "cluster-up: $nodes nodes and $gateways gateways serve; . $dir/env && paddock nodes"
