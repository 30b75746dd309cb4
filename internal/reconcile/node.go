package reconcile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Manager is what a node's reconciler asks of its sandbox manager.
type Manager interface {
	BuildTemplate(ctx context.Context, spec api.TemplateSpec) (api.Template, error)
	Template(ctx context.Context, name string) (api.Template, error)
	RemoveTemplate(ctx context.Context, name string) error
	SetPool(ctx context.Context, name string, size int) (api.Pool, error)
	Pools(ctx context.Context) api.Pools
}

// Secrets is the node's secret store, which its egress proxy injects
// from.
type Secrets interface {
	Create(name string, value []byte) error
	Get(name string) ([]byte, error)
	Delete(name string) error
}

// NodeConfig configures a node's reconciler.
type NodeConfig struct {
	// Name and Labels are the node's (its PaddockNode's).
	Name   string
	Labels map[string]string
	Kube   *rest.Config
	// Namespace holds the nodes' Leases (default cluster.DefaultNamespace).
	Namespace string
	Manager   Manager
	// Secrets, if set, receives the Secrets of cluster.SecretsNamespace.
	Secrets Secrets
	// StateDir keeps what the reconciler made (templates, pools,
	// secrets), so that after a restart it removes what went meanwhile
	// and nothing made through the node's own API.
	StateDir string
	Logger   *slog.Logger
}

// Resync is how often a node looks again with no change seen (warm pools
// fill with no event; a failed build is retried).
const Resync = 5 * time.Second

// retryBuild is how long a failed build waits before it is tried again.
const retryBuild = time.Minute

// Node reconciles one node.
type Node struct {
	cfg  NodeConfig
	log  *slog.Logger
	objs *cluster.Objects

	mu    sync.Mutex
	nodes []api.Node

	state  nodeState
	failed map[string]failure // template name → its last failed build
}

// nodeState is what the node made from the objects, kept in StateDir.
type nodeState struct {
	// Templates: name → fingerprint of the spec built.
	Templates map[string]string `json:"templates"`
	// Pools: pool name → size set.
	Pools map[string]int `json:"pools"`
	// Secrets: the names put (values are compared with the store's, never
	// kept here, not even hashed).
	Secrets map[string]bool `json:"secrets"`
}

type failure struct {
	fingerprint string
	at          time.Time
}

// stateFile, in StateDir.
const stateFile = "cluster-objects.json"

// RunNode reconciles the node until ctx ends. A malformed object, a
// failed build or an API server that does not answer is logged and
// reported in the object's status; the node serves on regardless.
func RunNode(ctx context.Context, cfg NodeConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	objs, err := cluster.NewObjects(cfg.Kube)
	if err != nil {
		return err
	}
	r := &Node{cfg: cfg, log: cfg.Logger, objs: objs, failed: map[string]failure{}}
	r.load()
	kinds := cluster.WatchTemplates | cluster.WatchPools | cluster.WatchPresets
	if cfg.Secrets != nil {
		kinds |= cluster.WatchSecrets
	}
	w, err := cluster.Watch(ctx, cfg.Kube, kinds)
	if err != nil {
		return err
	}
	nodesChanged := make(chan struct{}, 1)
	go func() {
		err := cluster.WatchNodes(ctx, cfg.Kube, cluster.WatchConfig{Namespace: cfg.Namespace, Logger: r.log}, func(ns []api.Node) {
			r.mu.Lock()
			r.nodes = ns
			r.mu.Unlock()
			select {
			case nodesChanged <- struct{}{}:
			default:
			}
		})
		if err != nil && ctx.Err() == nil {
			r.log.Error("watching the nodes; warm pools are not shared out", "err", err)
		}
	}()
	tick := time.NewTicker(Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.Changed():
		case <-nodesChanged:
		case <-tick.C:
		}
		if !w.Synced() {
			continue
		}
		r.reconcile(ctx, w.Now())
	}
}

func (r *Node) reconcile(ctx context.Context, d cluster.Declared) {
	r.mu.Lock()
	nodes := r.nodes
	r.mu.Unlock()
	r.templates(ctx, d, nodes)
	if nodes != nil {
		r.pools(ctx, d, nodes)
	}
	if r.cfg.Secrets != nil {
		r.secrets(d)
	}
	r.save()
}

// templates builds the templates this node needs and has not built as
// they are now, and removes those it built that went.
func (r *Node) templates(ctx context.Context, d cluster.Declared, nodes []api.Node) {
	want := map[string]bool{}
	for _, t := range d.Templates {
		if !hasLabels(r.cfg.Labels, t.Spec.NodeSelector) {
			continue
		}
		want[t.Name] = true
		r.template(ctx, t, d.Presets, nodes)
	}
	for name := range r.state.Templates {
		if want[name] {
			continue
		}
		if err := r.cfg.Manager.RemoveTemplate(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("removing a template whose SandboxTemplate went", "template", name, "err", err)
			continue
		}
		r.log.Info("template removed: its SandboxTemplate went or no longer selects the node", "template", name)
		delete(r.state.Templates, name)
		delete(r.failed, name)
		r.writeBuild(ctx, name, nil, nodes)
	}
}

func (r *Node) template(ctx context.Context, t *cluster.SandboxTemplate, presets []*cluster.PolicyPreset, nodes []api.Node) {
	spec := api.TemplateSpec{Name: t.Name, Image: t.Spec.Image, Steps: t.Spec.Steps, Resources: t.Spec.Resources, Runtime: t.Spec.Runtime}
	policy, err := ExpandPresets(t.Spec.Policy, presets)
	if err != nil {
		r.writeBuild(ctx, t.Name, &cluster.NodeBuild{State: cluster.BuildInvalid, Generation: t.Generation, Message: err.Error()}, nodes)
		return
	}
	spec.Policy = policy
	fp := fingerprint(spec)
	if r.state.Templates[t.Name] == fp {
		if _, err := r.cfg.Manager.Template(ctx, t.Name); err == nil {
			r.writeBuild(ctx, t.Name, &cluster.NodeBuild{State: cluster.BuildReady, Generation: t.Generation}, nodes)
			return
		}
	}
	if f, ok := r.failed[t.Name]; ok && f.fingerprint == fp && time.Since(f.at) < retryBuild {
		return
	}
	r.log.Info("building a template for its SandboxTemplate", "template", t.Name, "generation", t.Generation)
	start := time.Now()
	built, err := r.cfg.Manager.BuildTemplate(ctx, spec)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		st := cluster.BuildFailed
		if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrNotFound) {
			st = cluster.BuildInvalid
		}
		r.log.Warn("building a SandboxTemplate", "template", t.Name, "err", err)
		r.failed[t.Name] = failure{fingerprint: fp, at: time.Now()}
		r.writeBuild(ctx, t.Name, &cluster.NodeBuild{State: st, Generation: t.Generation, Message: err.Error()}, nodes)
		return
	}
	delete(r.failed, t.Name)
	r.state.Templates[t.Name] = fp
	r.save()
	r.writeBuild(ctx, t.Name, &cluster.NodeBuild{State: cluster.BuildReady, Generation: t.Generation,
		Snapshot: built.Snapshot, BuildMS: time.Since(start).Milliseconds()}, nodes)
}

// writeBuild puts the node's build (nil: none) in the template's status,
// and its conditions: Valid False while a node finds the spec invalid;
// Ready when every ready node it selects built it.
func (r *Node) writeBuild(ctx context.Context, name string, b *cluster.NodeBuild, nodes []api.Node) {
	err := r.objs.UpdateTemplateStatus(ctx, name, func(t *cluster.SandboxTemplate) bool {
		changed := false
		cur, had := t.Status.Nodes[r.cfg.Name]
		switch {
		case b == nil && had:
			delete(t.Status.Nodes, r.cfg.Name)
			changed = true
		case b != nil:
			nb := *b
			if had && cur.State == nb.State && cur.Generation == nb.Generation && cur.Message == nb.Message {
				nb.Snapshot, nb.BuildMS = cur.Snapshot, cur.BuildMS // a check, not a build: keep the build's
			}
			if !had || cur != nb {
				if t.Status.Nodes == nil {
					t.Status.Nodes = map[string]cluster.NodeBuild{}
				}
				t.Status.Nodes[r.cfg.Name] = nb
				changed = true
			}
		}
		invalid, ready, need := "", 0, 0
		for n, nb := range t.Status.Nodes {
			if nb.Generation == t.Generation && nb.State == cluster.BuildInvalid && invalid == "" {
				invalid = fmt.Sprintf("node %s: %s", n, nb.Message)
			}
		}
		for _, n := range nodes {
			if n.State != api.NodeReady || !hasLabels(n.Labels, t.Spec.NodeSelector) {
				continue
			}
			need++
			if nb, ok := t.Status.Nodes[n.Name]; ok && nb.Generation == t.Generation && nb.State == cluster.BuildReady {
				ready++
			}
		}
		if invalid != "" {
			changed = cluster.SetCondition(&t.Status.Conditions, cluster.ConditionValid, false, cluster.ReasonInvalid, invalid, t.Generation) || changed
		} else {
			changed = cluster.SetCondition(&t.Status.Conditions, cluster.ConditionValid, true, "Checked", "", t.Generation) || changed
		}
		msg := fmt.Sprintf("built on %d of the %d ready nodes it selects", ready, need)
		reason := "Built"
		if ready < need || need == 0 {
			reason = "Building"
		}
		changed = cluster.SetCondition(&t.Status.Conditions, cluster.ConditionReady, need > 0 && ready == need, reason, msg, t.Generation) || changed
		return changed
	})
	if err != nil && ctx.Err() == nil && !isGone(err) {
		r.log.Warn("writing a SandboxTemplate's status", "template", name, "err", err)
	}
}

// pools keeps the node's share of every warm pool, and writes it to the
// pool's status.
func (r *Node) pools(ctx context.Context, d cluster.Declared, nodes []api.Node) {
	templates := map[string]*cluster.SandboxTemplate{}
	for _, t := range d.Templates {
		templates[t.Name] = t
	}
	want := map[string]int{}
	type share struct {
		pool    *cluster.SandboxWarmPool
		name    string
		target  int
		message string
	}
	var shares []share
	for _, p := range d.Pools {
		s := share{pool: p}
		var eligible []string
		switch {
		case p.Spec.TemplateRef != nil:
			s.name = "template:" + p.Spec.TemplateRef.Name
			t := templates[p.Spec.TemplateRef.Name]
			if t == nil {
				s.message = fmt.Sprintf("no SandboxTemplate %q", p.Spec.TemplateRef.Name)
				break
			}
			for _, n := range nodes {
				if b, ok := t.Status.Nodes[n.Name]; ok && b.State == cluster.BuildReady && b.Generation == t.Generation &&
					n.State == api.NodeReady && hasLabels(n.Labels, p.Spec.NodeSelector) {
					eligible = append(eligible, n.Name)
				}
			}
		default:
			s.name = "image:" + p.Spec.Image
			for _, n := range nodes {
				if n.State == api.NodeReady && hasLabels(n.Labels, p.Spec.NodeSelector) {
					eligible = append(eligible, n.Name)
				}
			}
		}
		s.target = Share(int(p.Spec.Replicas), eligible, p.Name, r.cfg.Name)
		want[s.name] += s.target
		shares = append(shares, s)
	}
	// Pools the node keeps for objects, and no more: those that went are
	// emptied.
	for name := range r.state.Pools {
		if _, ok := want[name]; !ok {
			want[name] = 0
		}
	}
	errs := map[string]string{}
	for name, size := range want {
		if have, ok := r.state.Pools[name]; ok && have == size {
			continue
		}
		if _, err := r.cfg.Manager.SetPool(ctx, name, size); err != nil {
			errs[name] = err.Error()
			if size == 0 && errors.Is(err, errdefs.ErrNotFound) {
				delete(r.state.Pools, name) // its template went, and the pool with it
			}
			continue
		}
		if size == 0 {
			delete(r.state.Pools, name)
		} else {
			r.state.Pools[name] = size
		}
	}
	ready := r.cfg.Manager.Pools(ctx).Ready
	present := map[string]bool{}
	for _, n := range nodes {
		present[n.Name] = true
	}
	for _, s := range shares {
		if s.message == "" {
			s.message = errs[s.name]
		}
		mine := cluster.NodeShare{Target: int32(s.target), Ready: int32(min(ready[s.name], s.target)), Message: s.message}
		p := s.pool
		err := r.objs.UpdatePoolStatus(ctx, p.Name, func(o *cluster.SandboxWarmPool) bool {
			st := &o.Status
			changed := false
			if cur, ok := st.Nodes[r.cfg.Name]; !ok || cur != mine {
				if st.Nodes == nil {
					st.Nodes = map[string]cluster.NodeShare{}
				}
				st.Nodes[r.cfg.Name] = mine
				changed = true
			}
			for n := range st.Nodes {
				if !present[n] { // its PaddockNode went
					delete(st.Nodes, n)
					changed = true
				}
			}
			var total, readyN int32
			for _, ns := range st.Nodes {
				total += ns.Target
				readyN += ns.Ready
			}
			if st.Replicas != total || st.ReadyReplicas != readyN {
				st.Replicas, st.ReadyReplicas = total, readyN
				changed = true
			}
			if s.message != "" && s.target == 0 && total == 0 {
				changed = cluster.SetCondition(&st.Conditions, cluster.ConditionReady, false, "Unplaced", s.message, o.Generation) || changed
			} else {
				msg := fmt.Sprintf("%d of %d ready", readyN, o.Spec.Replicas)
				full := readyN >= o.Spec.Replicas && total == o.Spec.Replicas
				reason := "Filling"
				if full {
					reason = "Full"
				}
				changed = cluster.SetCondition(&st.Conditions, cluster.ConditionReady, full, reason, msg, o.Generation) || changed
			}
			return changed
		})
		if err != nil && ctx.Err() == nil && !isGone(err) {
			r.log.Warn("writing a SandboxWarmPool's status", "pool", p.Name, "err", err)
		}
	}
}

// Share is node's part of a pool of replicas over the eligible nodes:
// an even split, the remainder going to the nodes that follow a point
// the pool's name picks, so that many small pools do not all land on the
// same node. Every node computes the same split from the same list.
func Share(replicas int, eligible []string, pool, node string) int {
	sorted := append([]string(nil), eligible...)
	sort.Strings(sorted)
	i := sort.SearchStrings(sorted, node)
	if replicas <= 0 || i == len(sorted) || sorted[i] != node {
		return 0
	}
	n := len(sorted)
	h := fnv.New32a()
	h.Write([]byte(pool))
	start := int(h.Sum32() % uint32(n))
	extra := replicas % n
	if (i-start+n)%n < extra {
		return replicas/n + 1
	}
	return replicas / n
}

// secrets puts every key of the Secrets of cluster.SecretsNamespace in
// the node's store under its name (the oldest Secret wins a name two
// hold), replaces those whose value changed and removes those that went.
// A secret made otherwise (the node's API) is never replaced nor removed.
func (r *Node) secrets(d cluster.Declared) {
	secs := append(d.Secrets[:0:0], d.Secrets...)
	sort.SliceStable(secs, func(i, j int) bool {
		return secs[i].CreationTimestamp.Before(&secs[j].CreationTimestamp)
	})
	want := map[string][]byte{}
	from := map[string]string{}
	for _, s := range secs {
		for k, v := range s.Data {
			if o, ok := from[k]; ok {
				r.log.Warn("two Secrets hold a key; the older wins", "key", k, "secret", s.Name, "older", o)
				continue
			}
			from[k], want[k] = s.Name, v
		}
	}
	for name, v := range want {
		cur, err := r.cfg.Secrets.Get(name)
		switch {
		case err == nil && bytes.Equal(cur, v):
			r.state.Secrets[name] = true
			continue
		case err == nil && !r.state.Secrets[name]:
			// Made through the node's API (or the daemon's own): it stays.
			r.log.Warn("a Kubernetes Secret's key names a secret the node holds already; keeping the node's", "secret", from[name], "key", name)
			continue
		}
		if err := r.cfg.Secrets.Delete(name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("replacing a secret from a Kubernetes Secret", "secret", from[name], "key", name, "err", err)
			continue
		}
		delete(r.state.Secrets, name)
		if err := r.cfg.Secrets.Create(name, v); err != nil {
			r.log.Warn("taking a key of a Kubernetes Secret as a secret", "secret", from[name], "key", name, "err", err)
			continue
		}
		r.state.Secrets[name] = true
		r.log.Info("secret set from a Kubernetes Secret", "secret", from[name], "key", name)
	}
	for name := range r.state.Secrets {
		if _, ok := want[name]; ok {
			continue
		}
		if err := r.cfg.Secrets.Delete(name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("removing a secret whose Kubernetes Secret went", "key", name, "err", err)
			continue
		}
		delete(r.state.Secrets, name)
		r.log.Info("secret removed: its Kubernetes Secret went", "key", name)
	}
}

func (r *Node) load() {
	r.state = nodeState{}
	if b, err := os.ReadFile(filepath.Join(r.cfg.StateDir, stateFile)); err == nil {
		if err := json.Unmarshal(b, &r.state); err != nil {
			r.log.Warn("reading what the node made from the cluster's objects; starting afresh", "err", err)
		}
	}
	if r.state.Templates == nil {
		r.state.Templates = map[string]string{}
	}
	if r.state.Pools == nil {
		r.state.Pools = map[string]int{}
	}
	if r.state.Secrets == nil {
		r.state.Secrets = map[string]bool{}
	}
}

func (r *Node) save() {
	b, _ := json.Marshal(r.state)
	if err := durable.WriteFile(filepath.Join(r.cfg.StateDir, stateFile), b, 0o600); err != nil {
		r.log.Warn("keeping what the node made from the cluster's objects", "err", err)
	}
}

func fingerprint(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

func hasLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// isGone: the object was deleted meanwhile.
func isGone(err error) bool { return apierrors.IsNotFound(err) }
