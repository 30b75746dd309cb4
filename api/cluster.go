package api

import "time"

// Node is one paddock node of a cluster: what `paddock serve --cluster`
// publishes as the status of its PaddockNode custom resource, what a
// gateway places and routes by, and an item of GET /v1/nodes.
type Node struct {
	// Name is the node's name, unique in the cluster (the machine's name by
	// default).
	Name string `json:"name"`
	// Tag is the node's short routing key: every sandbox id the node mints
	// starts with it, so a gateway routes a call by the id alone, with no
	// lookup. Lowercase letters and digits.
	Tag string `json:"tag"`
	// Address is the base URL of the node's data-plane listener, which
	// gateways call (https://host:port).
	Address string `json:"address"`
	// E2BAddress is the base URL of the node's E2B facade (paddock serve
	// --e2b-listen), to which a gateway routes E2B calls; empty when the
	// node serves none.
	E2BAddress string `json:"e2b_address,omitempty"`
	// Version is the paddock version the node runs.
	Version string `json:"version"`
	// Labels are the node's labels; a create may select nodes by them.
	Labels map[string]string `json:"labels,omitempty"`
	// State is NodeReady, NodeDraining or NodeLost.
	State string `json:"state"`
	// Capacity is what the node admits in all; Allocated what its
	// sandboxes hold now.
	Capacity  NodeResources `json:"capacity"`
	Allocated NodeResources `json:"allocated"`
	// Pools is the warm guests ready now, by pool ("image:NAME" or
	// "template:NAME").
	Pools map[string]int `json:"pools,omitempty"`
	// Heartbeat is when the node last renewed its Lease.
	Heartbeat time.Time `json:"heartbeat"`
}

// NodeResources is an amount of a node's resources.
type NodeResources struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Sandboxes   int     `json:"sandboxes"`
}

// Node states.
const (
	NodeReady    = "ready"    // renewing its Lease, taking creates
	NodeDraining = "draining" // serving its sandboxes, taking no creates
	NodeLost     = "lost"     // its Lease expired
)

// MaxNodeTag bounds a node's tag, so that a sandbox id (12 characters)
// keeps at least 8 random ones after it.
const MaxNodeTag = 4

// IsNodeTag reports whether tag can be a node's tag: 1 to MaxNodeTag
// lowercase letters and digits. The tags of a cluster's nodes are
// prefix-free (none starts another), so an id names one node.
func IsNodeTag(tag string) bool {
	if len(tag) == 0 || len(tag) > MaxNodeTag {
		return false
	}
	for i := 0; i < len(tag); i++ {
		if c := tag[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
