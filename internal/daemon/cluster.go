package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
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
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	node, err := cluster.Register(rctx, rc, cluster.NodeConfig{
		Name:       cc.NodeName,
		Address:    cc.NodeAddress,
		E2BAddress: cc.NodeE2BAddress,
		Labels:     cc.NodeLabels,
		Version:    cfg.Version,
		Namespace:  cc.Namespace,
		Logger:     log,
	})
	if err != nil {
		return nil, fmt.Errorf("joining the cluster: %w", err)
	}
	if cfg.IDPrefix != "" && cfg.IDPrefix != node.Tag() {
		return nil, fmt.Errorf("--id-prefix %q: node %s's tag in the cluster is %q", cfg.IDPrefix, cc.NodeName, node.Tag())
	}
	cfg.IDPrefix = node.Tag()
	return node, nil
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
			n.Capacity.DiskBytes = sp.Size
			n.Allocated.DiskBytes = sp.Size - sp.Free
		} else {
			log.Debug("reading the storage's space for the node's status", "err", err)
		}
		return n
	}
}
