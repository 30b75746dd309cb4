package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/paddock-dev/paddock/api"
)

// WatchConfig configures WatchNodes and ListNodes.
type WatchConfig struct {
	// Namespace holds the nodes' Leases (default DefaultNamespace).
	Namespace string
	Logger    *slog.Logger
}

// WatchNodes watches the PaddockNodes and their Leases and calls fn with
// every node, sorted by name, each time one changes, and when a node's
// Lease expires (its State becomes api.NodeLost). The first call comes
// once both are listed. A record that is not a usable node (a malformed
// tag, address or name, a tag another node registered first) is left out
// with a log line. WatchNodes returns when ctx ends, or with an error if
// the first listing cannot complete.
func WatchNodes(ctx context.Context, rc *rest.Config, cfg WatchConfig, fn func([]api.Node)) error {
	cfg = cfg.withDefaults()
	nodes, leases, err := clients(rc, cfg.Namespace)
	if err != nil {
		return err
	}
	v := newView(cfg.Logger)
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	ni := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(nodes, Resource, metav1.NamespaceAll, fields.Everything()), &PaddockNode{}, 0, cache.Indexers{})
	li := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(leases, "leases", cfg.Namespace, fields.Everything()), &coordv1.Lease{}, 0, cache.Indexers{})
	for _, inf := range []cache.SharedIndexInformer{ni, li} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
		go inf.Run(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), ni.HasSynced, li.HasSynced) {
		return fmt.Errorf("listing PaddockNodes and Leases: %w", context.Cause(ctx))
	}
	// Expiry is a change nobody writes: look again every second.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last []api.Node
	first := true
	for {
		cur := v.nodes(typed[PaddockNode](ni.GetStore().List()), typed[coordv1.Lease](li.GetStore().List()), time.Now())
		if first || !reflect.DeepEqual(cur, last) {
			fn(cur)
			last, first = cur, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// ListNodes lists the nodes once, as WatchNodes would report them.
func ListNodes(ctx context.Context, rc *rest.Config, cfg WatchConfig) ([]api.Node, error) {
	cfg = cfg.withDefaults()
	nodes, leases, err := clients(rc, cfg.Namespace)
	if err != nil {
		return nil, err
	}
	var pl PaddockNodeList
	if err := nodes.Get().Resource(Resource).Do(ctx).Into(&pl); err != nil {
		return nil, fmt.Errorf("listing PaddockNodes: %w", err)
	}
	var ll coordv1.LeaseList
	if err := leases.Get().Namespace(cfg.Namespace).Resource("leases").Do(ctx).Into(&ll); err != nil {
		return nil, fmt.Errorf("listing Leases in %s: %w", cfg.Namespace, err)
	}
	pns := make([]*PaddockNode, len(pl.Items))
	for i := range pl.Items {
		pns[i] = &pl.Items[i]
	}
	ls := make([]*coordv1.Lease, len(ll.Items))
	for i := range ll.Items {
		ls[i] = &ll.Items[i]
	}
	return newView(cfg.Logger).nodes(pns, ls, time.Now()), nil
}

func (c WatchConfig) withDefaults() WatchConfig {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func clients(rc *rest.Config, namespace string) (nodes, leases rest.Interface, err error) {
	n, err := nodeClient(rc)
	if err != nil {
		return nil, nil, err
	}
	l, err := leaseClient(rc)
	if err != nil {
		return nil, nil, err
	}
	return n, l, nil
}

func typed[T any](objs []any) []*T {
	out := make([]*T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(*T); ok {
			out = append(out, t)
		}
	}
	return out
}

// view turns PaddockNodes and Leases into nodes. It remembers when it
// last saw each Lease renewed, by its own clock: a node's expiry is
// judged by how long the watcher has gone without seeing a renewal, so
// that a node's clock running behind or ahead does not make it look
// alive or lost.
type view struct {
	log *slog.Logger

	mu      sync.Mutex
	renewed map[string]renewal // by Lease name
	warned  map[string]string  // node name → resource version warned about
}

type renewal struct {
	version string    // the Lease's resource version
	seen    time.Time // when this watcher saw it
}

func newView(log *slog.Logger) *view {
	return &view{log: log, renewed: map[string]renewal{}, warned: map[string]string{}}
}

func (v *view) nodes(pns []*PaddockNode, leases []*coordv1.Lease, now time.Time) []api.Node {
	v.mu.Lock()
	defer v.mu.Unlock()
	byName := make(map[string]*coordv1.Lease, len(leases))
	for _, l := range leases {
		byName[l.Name] = l
	}
	for name := range v.renewed {
		if byName[name] == nil {
			delete(v.renewed, name)
		}
	}
	sort.Slice(pns, func(i, j int) bool { return registeredBefore(pns[i], pns[j]) })
	tags := map[string]string{}
	out := make([]api.Node, 0, len(pns))
	present := map[string]bool{}
	for _, pn := range pns {
		present[pn.Name] = true
		if pn.Status.Address == "" {
			continue // registered, not serving yet
		}
		if why := unusable(pn, tags); why != "" {
			if v.warned[pn.Name] != pn.ResourceVersion {
				v.warned[pn.Name] = pn.ResourceVersion
				v.log.Warn("ignoring PaddockNode", "node", pn.Name, "reason", why)
			}
			continue
		}
		delete(v.warned, pn.Name)
		tags[pn.Spec.Tag] = pn.Name
		n := copyNode(pn.Status)
		n.Name, n.Tag = pn.Name, pn.Spec.Tag
		n.Heartbeat = time.Time{}
		if l := byName[pn.Name]; l != nil && l.Spec.RenewTime != nil {
			n.Heartbeat = l.Spec.RenewTime.Time
		}
		switch {
		case !v.alive(byName[pn.Name], now):
			n.State = api.NodeLost
		case pn.Spec.Draining || n.State == api.NodeDraining:
			n.State = api.NodeDraining
		default:
			n.State = api.NodeReady
		}
		out = append(out, n)
	}
	for name := range v.warned {
		if !present[name] {
			delete(v.warned, name)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// alive says whether l is held and was renewed within its duration.
func (v *view) alive(l *coordv1.Lease, now time.Time) bool {
	if l == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != l.Name ||
		l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	r, ok := v.renewed[l.Name]
	if !ok || r.version != l.ResourceVersion {
		// First seen: trust the renew time if it is in the past (a Lease
		// left by a node dead for an hour is not alive); after that, the
		// time this watcher saw it change.
		seen := now
		if !ok && l.Spec.RenewTime.Time.Before(now) {
			seen = l.Spec.RenewTime.Time
		}
		r = renewal{version: l.ResourceVersion, seen: seen}
		v.renewed[l.Name] = r
	}
	d := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	return now.Sub(r.seen) < d
}

// unusable says why pn cannot be routed to, or returns "". tags holds
// the tags of the nodes registered before it.
func unusable(pn *PaddockNode, tags map[string]string) string {
	switch {
	case CheckNodeName(pn.Name) != nil:
		return "malformed name"
	case !ValidTag(pn.Spec.Tag):
		return fmt.Sprintf("malformed tag %q", pn.Spec.Tag)
	case tags[pn.Spec.Tag] != "":
		return fmt.Sprintf("tag %q is node %s's, which registered first", pn.Spec.Tag, tags[pn.Spec.Tag])
	case checkAddress(pn.Status.Address) != nil:
		return fmt.Sprintf("malformed address %q", pn.Status.Address)
	case pn.Status.E2BAddress != "" && checkAddress(pn.Status.E2BAddress) != nil:
		return fmt.Sprintf("malformed E2B address %q", pn.Status.E2BAddress)
	case pn.Status.Tag != "" && pn.Status.Tag != pn.Spec.Tag:
		return fmt.Sprintf("status tag %q is not its tag %q", pn.Status.Tag, pn.Spec.Tag)
	}
	return ""
}
