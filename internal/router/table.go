package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// table is one version of the node table; it is replaced whole, never
// changed, so a request reads it without a lock.
type table struct {
	byTag  map[string]*node
	maxTag int
	nodes  []*node // by name
	// cands is what placement reads of each of nodes, in their order.
	cands []candidate
}

// candidate is what placement (pick) reads of one node, packed in one
// slice with what this gateway placed on it, so that a pick over a
// hundred nodes walks memory in order and looks nothing up by name: at
// 100 nodes, the map lookups and scattered records of a pick over
// []*node took ~13% of the gateway's CPU per create.
type candidate struct {
	n                   *node
	placed              *placedCount // rt.placed[n.Name]
	ready               bool
	capacity, allocated api.NodeResources
	// pools are the node's warm pools with guests ready: a few, read
	// in order faster than a map is hashed.
	pools []poolCount
}

type poolCount struct {
	pool string
	n    int
}

// owner finds the node whose tag starts id. Tags are prefix-free (SetNodes
// keeps them so), so at most one does.
func (t *table) owner(key, id string) (*node, error) {
	if !api.IsSandboxID(id) {
		if len(key) > 80 {
			key = key[:80] + "..."
		}
		return nil, errdefs.Invalid("id", "%q is not a sandbox or snapshot id (1 to 64 of a-z, 0-9 and '-')", key)
	}
	for l := 1; l <= t.maxTag && l <= len(id); l++ {
		if n := t.byTag[id[:l]]; n != nil {
			return n, nil
		}
	}
	return nil, errdefs.New(errdefs.ErrNotFound, "no node of this cluster made %q: no node's tag starts it (the tags: %s)", key, t.tags())
}

func (t *table) tags() string {
	if len(t.nodes) == 0 {
		return "none: the gateway knows no node"
	}
	tags := make([]string, 0, len(t.nodes))
	for _, n := range t.nodes {
		tags = append(tags, n.Tag)
	}
	return strings.Join(tags, ", ")
}

// SetNodes replaces the node table (a watch of the cluster's node records
// calls it on every change). A node whose record is unusable (a bad tag or
// address, a tag another node's starts or shares) is left out and logged:
// its sandboxes answer 404 until its record is fixed, the rest serve.
// What the gateway placed is forgotten (the nodes' Allocated now counts
// it), unless the table changed only in heartbeats: a Lease's renewal
// publishes no allocation, and forgetting then would place a burst of
// creates on allocations seconds old.
func (rt *Router) SetNodes(nodes []api.Node) {
	sorted := append([]api.Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	rt.mu.Lock()
	defer rt.mu.Unlock()
	t := &table{byTag: map[string]*node{}}
	kept := map[string]*node{}
	for _, an := range sorted {
		if err := rt.usable(t, an); err != nil {
			rt.log.Warn("node left out of the table", "node", an.Name, "err", err)
			continue
		}
		n := rt.nodes[an.Name]
		if n == nil || n.Address != an.Address || n.E2BAddress != an.E2BAddress {
			var err error
			if n, err = rt.newNode(an); err != nil {
				rt.log.Warn("node left out of the table", "node", an.Name, "err", err)
				continue
			}
		} else {
			n = n.with(an)
		}
		kept[an.Name] = n
		t.byTag[an.Tag] = n
		t.maxTag = max(t.maxTag, len(an.Tag))
		t.nodes = append(t.nodes, n)
	}
	for name, n := range rt.nodes {
		if kept[name] == nil || kept[name].proxy != n.proxy {
			n.close()
		}
	}
	beatsOnly := len(kept) == len(rt.nodes)
	for name, n := range kept {
		if old := rt.nodes[name]; beatsOnly && (old == nil || !sameButHeartbeat(old.Node, n.Node)) {
			beatsOnly = false
		}
	}
	rt.nodes = kept
	if !beatsOnly {
		rt.placed = map[string]*placedCount{}
	}
	t.cands = make([]candidate, len(t.nodes))
	for i, n := range t.nodes {
		pc := rt.placed[n.Name]
		if pc == nil {
			pc = &placedCount{pools: map[string]int{}}
			rt.placed[n.Name] = pc
		}
		t.cands[i] = candidate{n: n, placed: pc, ready: n.State == api.NodeReady, capacity: n.Capacity, allocated: n.Allocated}
		for pool, ready := range n.Pools {
			if ready > 0 {
				t.cands[i].pools = append(t.cands[i].pools, poolCount{pool, ready})
			}
		}
	}
	rt.table = t
}

// sameButHeartbeat says whether two records of a node differ in their
// heartbeat at most.
func sameButHeartbeat(a, b api.Node) bool {
	a.Heartbeat, b.Heartbeat = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

// usable checks a node's record against the table built so far.
func (rt *Router) usable(t *table, an api.Node) error {
	switch {
	case an.Name == "":
		return fmt.Errorf("%w: a node without a name", errdefs.ErrInvalid)
	case !api.IsNodeTag(an.Tag):
		return errdefs.Invalid("tag", "%q: want 1 to %d of a-z and 0-9", an.Tag, api.MaxNodeTag)
	}
	switch an.State {
	case api.NodeReady, api.NodeDraining, api.NodeLost:
	default:
		return errdefs.Invalid("state", "%q is not ready, draining or lost", an.State)
	}
	for _, o := range t.nodes {
		if o.Name == an.Name {
			return errdefs.Conflict("node %s is listed twice", an.Name)
		}
		if strings.HasPrefix(o.Tag, an.Tag) || strings.HasPrefix(an.Tag, o.Tag) {
			return errdefs.Conflict("tag %q and node %s's tag %q: one starts the other, so an id could name both", an.Tag, o.Name, o.Tag)
		}
	}
	u, err := url.Parse(an.Address)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return errdefs.Invalid("address", "%q is not http(s)://HOST:PORT", an.Address)
	}
	if rt.cfg.TLS != nil {
		// With the cluster's trust a node's answers (a vouch for an envd
		// caller among them) count only from a node that proved itself.
		for _, a := range []string{an.Address, an.E2BAddress} {
			if a != "" && !strings.HasPrefix(a, "https://") {
				return errdefs.Invalid("address", "%q is not https: this gateway calls nodes over the cluster's TLS only", a)
			}
		}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
