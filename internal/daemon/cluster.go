package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/sandbox"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/internal/telemetry/hub"
)

// ClusterConfig makes the daemon a node of a paddock cluster, with the
// Kubernetes API as its engine (package cluster). The node still serves
// its sandboxes as a lone daemon does, from its own store; what it adds
// is a Lease and a PaddockNode, and a tag that starts every id it mints.
type ClusterConfig struct {
	// Enabled registers the node.
	Enabled bool
	// Kubeconfig is the API server's kubeconfig file; empty: $KUBECONFIG
	// or, in a pod, its service account.
	Kubeconfig string
	// Namespace holds the nodes' Leases (default cluster.DefaultNamespace).
	Namespace string
	// NodeName names the node (default: the host's name, lowercased).
	NodeName string
	// NodeAddress is the base URL of the listener gateways call,
	// http(s)://HOST:PORT (required).
	NodeAddress string
	// NodeE2BAddress is the base URL of its E2B facade (--e2b-listen) as
	// gateways reach it; empty: the node serves E2B calls through no
	// gateway.
	NodeE2BAddress string
	// NodeLabels are published for creates to select nodes by.
	NodeLabels map[string]string
	// TLSDir holds the cluster's trust files for a node (package
	// clustertls: ca.crt, node-ca.crt, node-ca.key; a mounted Secret).
	// With it every TCP listener (the API's and the E2B facade's) speaks
	// TLS with the certificate the node issues itself for the hosts of
	// NodeAddress and NodeE2BAddress (which must be https), and takes
	// only connections with a gateway's client certificate. It works
	// with or without Enabled (a node a gateway lists statically).
	TLSDir string
}

// nodeTLS loads the node's side of the cluster's mutual TLS (nil without
// TLSDir).
func nodeTLS(cc ClusterConfig, log *slog.Logger) (*clustertls.Node, error) {
	if cc.TLSDir == "" {
		return nil, nil
	}
	var hosts []string
	for _, a := range []struct{ flag, addr string }{{"--node-address", cc.NodeAddress}, {"--node-e2b-address", cc.NodeE2BAddress}} {
		if a.addr == "" {
			continue
		}
		u, err := url.Parse(a.addr)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" {
			return nil, fmt.Errorf("%s %q: with --cluster-tls gateways call the node at https://HOST:PORT", a.flag, a.addr)
		}
		hosts = append(hosts, u.Hostname())
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("--cluster-tls needs --node-address, the https URL gateways call the node at (its certificate names the host)")
	}
	return clustertls.LoadNode(cc.TLSDir, hosts, log)
}

// joinCluster registers the node and returns it (nil when not in a
// cluster). It must come before anything mints an id: the node's tag
// becomes the id prefix.
func joinCluster(ctx context.Context, cfg *Config, log *slog.Logger) (*cluster.Node, error) {
	cc := cfg.Cluster
	if !cc.Enabled {
		return nil, nil
	}
	if cc.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("naming the node (give --node-name): %w", err)
		}
		cc.NodeName = strings.ToLower(h)
	}
	if cc.NodeAddress == "" {
		return nil, fmt.Errorf("a cluster node needs --node-address, the URL gateways call it at")
	}
	rc, err := cluster.RESTConfig(cc.Kubeconfig)
	if err != nil {
		return nil, err
	}
	nc := cluster.NodeConfig{
		Name:       cc.NodeName,
		Address:    cc.NodeAddress,
		E2BAddress: cc.NodeE2BAddress,
		Labels:     cc.NodeLabels,
		Version:    cfg.Version,
		Namespace:  cc.Namespace,
		Logger:     log,
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// The tag is kept in the state dir too: a node that restarts while
	// the API server does not answer goes on serving its sandboxes and
	// minting ids with it, and registers once the API server answers.
	kept := filepath.Join(cfg.StateDir, nodeFile)
	node, err := cluster.Register(rctx, rc, nc)
	if err != nil {
		prev, rerr := readNodeRecord(kept)
		if rerr != nil || prev.Name != cc.NodeName {
			return nil, fmt.Errorf("joining the cluster: %w", err)
		}
		log.Error("the API server does not answer; serving as node "+prev.Name+" with its tag, registering when it answers", "tag", prev.Tag, "err", err)
		if node, err = cluster.Resume(rc, nc, prev.Tag); err != nil {
			return nil, err
		}
	}
	b, _ := json.Marshal(nodeRecord{Name: cc.NodeName, Tag: node.Tag()})
	if err := durable.WriteFile(kept, b, 0o600); err != nil {
		return nil, fmt.Errorf("keeping the node's tag: %w", err)
	}
	if cfg.IDPrefix != "" && cfg.IDPrefix != node.Tag() {
		return nil, fmt.Errorf("--id-prefix %q: node %s's tag in the cluster is %q", cfg.IDPrefix, cc.NodeName, node.Tag())
	}
	cfg.IDPrefix = node.Tag()
	cfg.Cluster.NodeName = cc.NodeName
	return node, nil
}

// nodeFile, in the state dir, keeps the node's name and tag.
const nodeFile = "cluster-node.json"

type nodeRecord struct {
	Name string `json:"name"`
	Tag  string `json:"tag"`
}

func readNodeRecord(path string) (nodeRecord, error) {
	var r nodeRecord
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

// nodeStatus is what a node publishes of itself: admission control's
// capacity and reservations, its disks' space, its sandboxes and its warm
// guests ready.
func nodeStatus(tel *hub.Hub, mgr *sandbox.Manager, disks *disk.Pool, log *slog.Logger) func() api.Node {
	return func() api.Node {
		limits, inUse := tel.Admission()
		n := api.Node{
			Capacity:  api.NodeResources{CPUs: limits.CPUs, MemoryBytes: limits.MemoryBytes},
			Allocated: api.NodeResources{CPUs: inUse.CPUs, MemoryBytes: inUse.MemoryBytes, Sandboxes: mgr.Len()},
			Pools:     mgr.Pools().List(context.Background()).Ready,
		}
		if sp, err := disks.Space(); err == nil {
			// As the disk pool admits: a disk fits while what is promised
			// to thin disks stays within the free space × the overcommit
			// (at 1, disks are allocated and only the free space counts).
			over := max(sp.Overcommit, 1)
			room := max(int64(float64(sp.Free)*over)-sp.Promised, 0)
			n.Capacity.DiskBytes = max(int64(float64(sp.Size)*over), room)
			n.Allocated.DiskBytes = n.Capacity.DiskBytes - room
		} else {
			log.Debug("reading the storage's space for the node's status", "err", err)
		}
		return n
	}
}
