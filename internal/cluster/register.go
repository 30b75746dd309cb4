package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/paddock-dev/paddock/api"
)

// NodeConfig says who a node is.
type NodeConfig struct {
	// Name names its PaddockNode and its Lease (a Kubernetes object
	// name; CheckNodeName).
	Name string
	// Address is the base URL of its data-plane listener, which gateways
	// call (http:// or https://).
	Address string
	// E2BAddress is the base URL of its E2B facade, if it serves one.
	E2BAddress string
	// Labels are published for creates to select nodes by.
	Labels map[string]string
	// Version is the paddock version it runs.
	Version string
	// Namespace holds its Lease (default DefaultNamespace).
	Namespace string
	Logger    *slog.Logger
}

// Node is a node registered in the cluster: it knows its tag and, while
// Run runs, keeps its Lease renewed and its PaddockNode's status current.
type Node struct {
	cfg    NodeConfig
	rc     *rest.Config
	nodes  *rest.RESTClient
	leases *rest.RESTClient
	tag    string
	log    *slog.Logger
	// unclaimed: the tag came from Resume and the API server has not
	// confirmed it yet.
	unclaimed bool

	mu        sync.Mutex
	lease     *coordv1.Lease // as last written
	published *api.Node      // status as last written
}

// Register claims the node's tag: the one its PaddockNode already holds,
// or, for a node new to the cluster, the first of its candidate tags (a
// hash of its name) that no other node holds. It writes neither its Lease
// nor its status: Run does, once the node serves.
func Register(ctx context.Context, rc *rest.Config, cfg NodeConfig) (*Node, error) {
	n, err := newNode(rc, cfg)
	if err != nil {
		return nil, err
	}
	if n.tag, err = n.claimTag(ctx, ""); err != nil {
		return nil, err
	}
	return n, nil
}

// Resume is Register for a node that cannot reach the API server as it
// starts, but registered before with tag (which the caller kept): the
// node goes on minting ids with it, and Run claims it (recreating its
// PaddockNode if that went) before its first renewal.
func Resume(rc *rest.Config, cfg NodeConfig, tag string) (*Node, error) {
	if !ValidTag(tag) {
		return nil, fmt.Errorf("resuming node %s: malformed tag %q", cfg.Name, tag)
	}
	n, err := newNode(rc, cfg)
	if err != nil {
		return nil, err
	}
	n.tag, n.unclaimed = tag, true
	return n, nil
}

func newNode(rc *rest.Config, cfg NodeConfig) (*Node, error) {
	if err := CheckNodeName(cfg.Name); err != nil {
		return nil, err
	}
	if err := checkAddress(cfg.Address); err != nil {
		return nil, err
	}
	if cfg.E2BAddress != "" {
		if err := checkAddress(cfg.E2BAddress); err != nil {
			return nil, fmt.Errorf("E2B %w", err)
		}
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	nodes, err := nodeClient(rc)
	if err != nil {
		return nil, err
	}
	leases, err := leaseClient(rc)
	if err != nil {
		return nil, err
	}
	return &Node{cfg: cfg, rc: rc, nodes: nodes, leases: leases, log: cfg.Logger}, nil
}

// Tag is the node's routing tag: every sandbox id it mints starts with it.
func (n *Node) Tag() string { return n.tag }

// Name is the node's name (its PaddockNode's and its Lease's).
func (n *Node) Name() string { return n.cfg.Name }

// Labels are the labels the node publishes.
func (n *Node) Labels() map[string]string { return copyMap(n.cfg.Labels) }

// Config is the API server's configuration the node registered with.
func (n *Node) Config() *rest.Config { return n.rc }

func checkAddress(addr string) error {
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("node address %q: want the data-plane listener's base URL, http(s)://HOST:PORT", addr)
	}
	return nil
}

// claimTag returns the tag the node's PaddockNode holds, creating the
// PaddockNode with a free tag if there is none, or with want if given
// (the tag a resumed node already mints ids with; any other is an error).
func (n *Node) claimTag(ctx context.Context, want string) (string, error) {
	name := n.cfg.Name
	for attempt := 0; attempt < 100; {
		var pn PaddockNode
		err := n.nodes.Get().Resource(Resource).Name(name).Do(ctx).Into(&pn)
		if err == nil {
			if !ValidTag(pn.Spec.Tag) {
				return "", fmt.Errorf("PaddockNode %s holds the malformed tag %q; delete it to register the node anew", name, pn.Spec.Tag)
			}
			all, err := n.list(ctx)
			if err != nil {
				return "", err
			}
			if o := olderHolder(all, &pn); o != "" {
				return "", fmt.Errorf("%w: tag %q of node %s is node %s's too, which registered first; delete PaddockNode %s to give it another tag", errTagTaken, pn.Spec.Tag, name, o, name)
			}
			if want != "" && pn.Spec.Tag != want {
				return "", fmt.Errorf("%w: PaddockNode %s holds tag %q, but the node mints ids with %q", errTagTaken, name, pn.Spec.Tag, want)
			}
			return pn.Spec.Tag, nil
		}
		if !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("reading PaddockNode %s: %w", name, err)
		}
		all, err := n.list(ctx)
		if err != nil {
			return "", err
		}
		taken := map[string]bool{}
		for _, o := range all {
			taken[o.Spec.Tag] = true
		}
		for taken[tagFor(name, attempt)] {
			attempt++
		}
		tag := tagFor(name, attempt)
		if want != "" {
			if taken[want] {
				return "", fmt.Errorf("%w: the node mints ids with tag %q, which another node holds now", errTagTaken, want)
			}
			tag = want
		}
		pn = PaddockNode{
			TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: "PaddockNode"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       PaddockNodeSpec{Tag: tag},
		}
		var created PaddockNode
		err = n.nodes.Post().Resource(Resource).Body(&pn).Do(ctx).Into(&created)
		if apierrors.IsAlreadyExists(err) {
			continue // made meanwhile: read it
		}
		if err != nil {
			return "", fmt.Errorf("creating PaddockNode %s: %w", name, err)
		}
		// Another node registering at the same moment may have picked the
		// same tag: the one created first keeps it.
		if all, err = n.list(ctx); err != nil {
			return "", err
		}
		if o := olderHolder(all, &created); o != "" {
			n.log.Info("tag taken meanwhile; picking another", "tag", created.Spec.Tag, "holder", o)
			if err := n.deleteNode(ctx, created.UID); err != nil {
				return "", err
			}
			if want != "" {
				return "", fmt.Errorf("%w: node %s took tag %q first", errTagTaken, o, want)
			}
			attempt++
			continue
		}
		n.log.Info("registered in the cluster", "node", name, "tag", created.Spec.Tag)
		return created.Spec.Tag, nil
	}
	return "", fmt.Errorf("no free tag for node %s after 100 tries", name)
}

func (n *Node) list(ctx context.Context) ([]PaddockNode, error) {
	var l PaddockNodeList
	if err := n.nodes.Get().Resource(Resource).Do(ctx).Into(&l); err != nil {
		return nil, fmt.Errorf("listing PaddockNodes: %w", err)
	}
	return l.Items, nil
}

func (n *Node) deleteNode(ctx context.Context, uid types.UID) error {
	opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	err := n.nodes.Delete().Resource(Resource).Name(n.cfg.Name).Body(&opts).Do(ctx).Error()
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PaddockNode %s: %w", n.cfg.Name, err)
	}
	return nil
}

// olderHolder names a node of all other than pn that holds pn's tag and
// registered before it, or returns "".
func olderHolder(all []PaddockNode, pn *PaddockNode) string {
	for i := range all {
		o := &all[i]
		if o.Name != pn.Name && o.Spec.Tag == pn.Spec.Tag && registeredBefore(o, pn) {
			return o.Name
		}
	}
	return ""
}

// registeredBefore orders nodes by creation, then (creation times have
// whole seconds) by name.
func registeredBefore(a, b *PaddockNode) bool {
	ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	return a.Name < b.Name
}

// Run keeps the node's Lease renewed every RenewInterval and publishes
// its status (what status returns, with the node's name, tag, address,
// version and labels) when it changed, at most once per StatusInterval.
// A write that fails is logged and tried again at the next tick: the
// node serves its sandboxes whether or not the API server answers. When
// ctx ends, Run releases the Lease, so that gateways see the node gone at
// once rather than after LeaseDuration.
func (n *Node) Run(ctx context.Context, status func() api.Node) {
	if n.unclaimed && !n.claimResumed(ctx) {
		return
	}
	if err := n.renew(ctx); err != nil {
		n.log.Warn("renewing the node's Lease", "err", err)
	}
	if err := n.publish(ctx, status()); err != nil {
		n.log.Warn("publishing the node's status", "err", err)
	}
	renew := time.NewTicker(RenewInterval)
	defer renew.Stop()
	pub := time.NewTicker(StatusInterval)
	defer pub.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := n.release(rctx); err != nil {
				n.log.Warn("releasing the node's Lease; gateways see the node lost when it expires", "err", err)
			}
			cancel()
			return
		case <-renew.C:
			if err := n.renew(ctx); err != nil && ctx.Err() == nil {
				n.log.Warn("renewing the node's Lease", "err", err)
			}
		case <-pub.C:
			if err := n.publish(ctx, status()); err != nil && ctx.Err() == nil {
				n.log.Warn("publishing the node's status", "err", err)
			}
		}
	}
}

// claimResumed claims a resumed node's tag, trying again every
// RenewInterval while the API server does not answer. It reports false
// when ctx ended first or the tag is another node's: the node then serves
// its sandboxes without being in the cluster.
func (n *Node) claimResumed(ctx context.Context) bool {
	for {
		_, err := n.claimTag(ctx, n.tag)
		if err == nil {
			n.log.Info("registered in the cluster", "node", n.cfg.Name, "tag", n.tag)
			n.unclaimed = false
			return true
		}
		if errors.Is(err, errTagTaken) {
			n.log.Error("staying out of the cluster", "err", err)
			return false
		}
		n.log.Warn("registering in the cluster; trying again", "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(RenewInterval):
		}
	}
}

// renew writes the Lease with this node as holder and now as renew time,
// making it if there is none. It updates the copy it last wrote, so a
// renewal is one request; another writer's change costs a read.
func (n *Node) renew(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := metav1.NewMicroTime(time.Now())
	if n.lease == nil {
		l, err := n.getLease(ctx)
		switch {
		case apierrors.IsNotFound(err):
			l = &coordv1.Lease{
				TypeMeta:   metav1.TypeMeta{APIVersion: coordv1.SchemeGroupVersion.String(), Kind: "Lease"},
				ObjectMeta: metav1.ObjectMeta{Name: n.cfg.Name, Namespace: n.cfg.Namespace},
				Spec: coordv1.LeaseSpec{
					HolderIdentity:       ptr.To(n.cfg.Name),
					LeaseDurationSeconds: ptr.To(int32(LeaseDuration / time.Second)),
					AcquireTime:          &now,
					RenewTime:            &now,
				},
			}
			var made coordv1.Lease
			if err := n.leaseReq(n.leases.Post(), "").Body(l).Do(ctx).Into(&made); err != nil {
				return fmt.Errorf("creating Lease %s/%s: %w", n.cfg.Namespace, n.cfg.Name, err)
			}
			n.lease = &made
			return nil
		case err != nil:
			return fmt.Errorf("reading Lease %s/%s: %w", n.cfg.Namespace, n.cfg.Name, err)
		}
		n.lease = l
	}
	l := n.lease.DeepCopy()
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != n.cfg.Name {
		l.Spec.HolderIdentity = ptr.To(n.cfg.Name)
		l.Spec.AcquireTime = &now
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
	l.Spec.LeaseDurationSeconds = ptr.To(int32(LeaseDuration / time.Second))
	l.Spec.RenewTime = &now
	if err := n.putLease(ctx, l); err != nil {
		n.lease = nil // read it afresh next time
		return fmt.Errorf("renewing Lease %s/%s: %w", n.cfg.Namespace, n.cfg.Name, err)
	}
	return nil
}

// release gives the Lease up (no holder): watchers see the node lost.
func (n *Node) release(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lease == nil {
		return nil
	}
	l := n.lease.DeepCopy()
	l.Spec.HolderIdentity = nil
	err := n.putLease(ctx, l)
	n.lease = nil
	return err
}

func (n *Node) leaseReq(r *rest.Request, name string) *rest.Request {
	r = r.Namespace(n.cfg.Namespace).Resource("leases")
	if name != "" {
		r = r.Name(name)
	}
	return r
}

func (n *Node) getLease(ctx context.Context) (*coordv1.Lease, error) {
	var l coordv1.Lease
	if err := n.leaseReq(n.leases.Get(), n.cfg.Name).Do(ctx).Into(&l); err != nil {
		return nil, err
	}
	return &l, nil
}

// putLease writes l and keeps what the API server answered. n.mu is held.
func (n *Node) putLease(ctx context.Context, l *coordv1.Lease) error {
	l.APIVersion, l.Kind = coordv1.SchemeGroupVersion.String(), "Lease"
	var out coordv1.Lease
	if err := n.leaseReq(n.leases.Put(), n.cfg.Name).Body(l).Do(ctx).Into(&out); err != nil {
		return err
	}
	n.lease = &out
	return nil
}

// publish writes the node's status if it differs from what it last wrote
// (the heartbeat aside: the Lease carries that).
func (n *Node) publish(ctx context.Context, s api.Node) error {
	s.Name, s.Tag, s.Address, s.E2BAddress, s.Version = n.cfg.Name, n.tag, n.cfg.Address, n.cfg.E2BAddress, n.cfg.Version
	s.Labels = copyMap(n.cfg.Labels)
	if s.State == "" {
		s.State = api.NodeReady
	}
	n.mu.Lock()
	if n.lease != nil && n.lease.Spec.RenewTime != nil {
		s.Heartbeat = n.lease.Spec.RenewTime.Time
	}
	if n.published != nil && sameStatus(*n.published, s) {
		n.mu.Unlock()
		return nil
	}
	n.mu.Unlock()
	// A JSON patch that adds /status replaces it whole, so that labels
	// and pools that went away go from the record too.
	body, err := json.Marshal([]jsonPatchOp{{Op: "add", Path: "/status", Value: s}})
	if err != nil {
		return err
	}
	err = n.nodes.Patch(types.JSONPatchType).Resource(Resource).Name(n.cfg.Name).SubResource("status").Body(body).Do(ctx).Error()
	if apierrors.IsNotFound(err) {
		return errors.New("PaddockNode " + n.cfg.Name + " was deleted: restart the node to register it anew (its tag may change)")
	}
	if err != nil {
		return fmt.Errorf("writing PaddockNode %s's status: %w", n.cfg.Name, err)
	}
	n.mu.Lock()
	n.published = &s
	n.mu.Unlock()
	return nil
}

// errTagTaken: the node cannot have the tag it needs; trying again will
// not help.
var errTagTaken = errors.New("tag taken")

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

func sameStatus(a, b api.Node) bool {
	a.Heartbeat, b.Heartbeat = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}
