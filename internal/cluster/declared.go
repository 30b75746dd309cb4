package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Kinds chooses the declarative objects a Watcher watches: each watcher
// asks only for what its RBAC lets it read.
type Kinds uint8

const (
	WatchTemplates Kinds = 1 << iota
	WatchPools
	WatchPresets
	WatchSandboxes
	// WatchSecrets watches the Secrets of SecretsNamespace.
	WatchSecrets
)

// Declared is the declarative objects as a Watcher last saw them, each
// list sorted by namespace and name. The objects are the watcher's: read
// them, do not change them.
type Declared struct {
	Templates []*SandboxTemplate
	Pools     []*SandboxWarmPool
	Presets   []*PolicyPreset
	Sandboxes []*Sandbox
	Secrets   []*corev1.Secret
}

// Watcher keeps the declarative objects of some kinds in informers'
// caches. An object the API server took passed its CRD's schema; what
// paddock checks beyond that is up to the reader, who reports it in the
// object's status.
type Watcher struct {
	infs    map[Kinds]cache.SharedIndexInformer
	changed chan struct{}
}

// Watch starts watching kinds until ctx ends. It does not wait for the
// first lists (a CRD not yet applied would hold the caller up): Synced
// says when they came.
func Watch(ctx context.Context, rc *rest.Config, kinds Kinds) (*Watcher, error) {
	pd, err := objectClient(rc)
	if err != nil {
		return nil, err
	}
	w := &Watcher{infs: map[Kinds]cache.SharedIndexInformer{}, changed: make(chan struct{}, 1)}
	add := func(k Kinds, c rest.Interface, resource, ns string, obj runtime.Object) {
		if kinds&k == 0 {
			return
		}
		inf := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(c, resource, ns, fields.Everything()), obj, 10*time.Minute, cache.Indexers{})
		w.infs[k] = inf
	}
	add(WatchTemplates, pd, TemplateResource, metav1.NamespaceAll, &SandboxTemplate{})
	add(WatchPools, pd, PoolResource, metav1.NamespaceAll, &SandboxWarmPool{})
	add(WatchPresets, pd, PresetResource, metav1.NamespaceAll, &PolicyPreset{})
	add(WatchSandboxes, pd, SandboxResource, metav1.NamespaceAll, &Sandbox{})
	if kinds&WatchSecrets != 0 {
		core, err := coreClient(rc)
		if err != nil {
			return nil, err
		}
		add(WatchSecrets, core, "secrets", SecretsNamespace, &corev1.Secret{})
	}
	poke := func() {
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	for _, inf := range w.infs {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
		go inf.Run(ctx.Done())
	}
	return w, nil
}

// Changed receives after any object changed (several changes may come as
// one).
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// Synced reports whether every watched kind has been listed.
func (w *Watcher) Synced() bool {
	for _, inf := range w.infs {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// Now returns the objects as last seen.
func (w *Watcher) Now() Declared {
	var d Declared
	list := func(k Kinds) []any {
		if inf := w.infs[k]; inf != nil {
			return inf.GetStore().List()
		}
		return nil
	}
	d.Templates = sorted(typed[SandboxTemplate](list(WatchTemplates)))
	d.Pools = sorted(typed[SandboxWarmPool](list(WatchPools)))
	d.Presets = sorted(typed[PolicyPreset](list(WatchPresets)))
	d.Sandboxes = sorted(typed[Sandbox](list(WatchSandboxes)))
	d.Secrets = sorted(typed[corev1.Secret](list(WatchSecrets)))
	return d
}

func sorted[T any, P interface {
	*T
	metav1.Object
}](objs []*T) []*T {
	sort.Slice(objs, func(i, j int) bool {
		a, b := P(objs[i]), P(objs[j])
		if a.GetNamespace() != b.GetNamespace() {
			return a.GetNamespace() < b.GetNamespace()
		}
		return a.GetName() < b.GetName()
	})
	return objs
}

// Objects writes the declarative objects' status and a Sandbox's
// finalizer.
type Objects struct {
	c *rest.RESTClient
}

// NewObjects returns a writer of the declarative objects.
func NewObjects(rc *rest.Config) (*Objects, error) {
	c, err := objectClient(rc)
	if err != nil {
		return nil, err
	}
	return &Objects{c: c}, nil
}

// UpdateTemplateStatus reads the template, lets mutate change it, and
// writes its status if mutate reports a change, again from a fresh read
// when another writer came first (every node writes its own entry).
func (o *Objects) UpdateTemplateStatus(ctx context.Context, name string, mutate func(*SandboxTemplate) bool) error {
	return update(ctx, o.c, TemplateResource, "SandboxTemplate", "", name, "status", mutate)
}

// UpdatePoolStatus is UpdateTemplateStatus for a warm pool.
func (o *Objects) UpdatePoolStatus(ctx context.Context, name string, mutate func(*SandboxWarmPool) bool) error {
	return update(ctx, o.c, PoolResource, "SandboxWarmPool", "", name, "status", mutate)
}

// UpdatePresetStatus is UpdateTemplateStatus for a policy preset.
func (o *Objects) UpdatePresetStatus(ctx context.Context, name string, mutate func(*PolicyPreset) bool) error {
	return update(ctx, o.c, PresetResource, "PolicyPreset", "", name, "status", mutate)
}

// UpdateSandboxStatus is UpdateTemplateStatus for a Sandbox.
func (o *Objects) UpdateSandboxStatus(ctx context.Context, ns, name string, mutate func(*Sandbox) bool) error {
	return update(ctx, o.c, SandboxResource, "Sandbox", ns, name, "status", mutate)
}

// SetSandboxFinalizers sets a Sandbox's finalizers, if it is still at
// resourceVersion. It patches the metadata alone: a write of the whole
// object would also write its spec as this client encodes it, and a
// field the user left out (resources: {}) would count as a change.
func (o *Objects) SetSandboxFinalizers(ctx context.Context, ns, name, resourceVersion string, finalizers []string) error {
	if finalizers == nil {
		finalizers = []string{}
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": finalizers, "resourceVersion": resourceVersion}})
	if err != nil {
		return err
	}
	err = o.c.Patch(types.MergePatchType).Namespace(ns).Resource(SandboxResource).Name(name).Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("writing Sandbox %s/%s's finalizers: %w", ns, name, err)
	}
	return nil
}

// update is a read, change and write of one object, retried on conflict.
func update[T any, P interface {
	*T
	runtime.Object
	metav1.Object
}](ctx context.Context, c *rest.RESTClient, resource, kind, ns, name, sub string, mutate func(P) bool) error {
	for range 8 {
		p := P(new(T))
		if err := in(c.Get(), ns).Resource(resource).Name(name).Do(ctx).Into(p); err != nil {
			return fmt.Errorf("reading %s %s: %w", kind, name, err)
		}
		if !mutate(p) {
			return nil
		}
		if a, err := meta.TypeAccessor(p); err == nil {
			a.SetAPIVersion(GroupVersion.String())
			a.SetKind(kind)
		}
		req := in(c.Put(), ns).Resource(resource).Name(name)
		if sub != "" {
			req = req.SubResource(sub)
		}
		err := req.Body(p).Do(ctx).Error()
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("writing %s %s: %w", kind, name, err)
		}
		return nil
	}
	return fmt.Errorf("writing %s %s: still conflicting after 8 tries", kind, name)
}

// in puts r in namespace ns, unless ns is "" (a cluster-wide object).
func in(r *rest.Request, ns string) *rest.Request {
	if ns == "" {
		return r
	}
	return r.Namespace(ns)
}

// SetCondition sets a condition of type typ in cs, and reports whether
// anything but its time changed. The time moves only when the status
// does.
func SetCondition(cs *[]metav1.Condition, typ string, ok bool, reason, msg string, gen int64) bool {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	for i := range *cs {
		c := &(*cs)[i]
		if c.Type != typ {
			continue
		}
		if c.Status == st && c.Reason == reason && c.Message == msg && c.ObservedGeneration == gen {
			return false
		}
		if c.Status != st {
			c.LastTransitionTime = metav1.Now()
		}
		c.Status, c.Reason, c.Message, c.ObservedGeneration = st, reason, msg, gen
		return true
	}
	*cs = append(*cs, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: metav1.Now()})
	return true
}

// objectClient is a REST client for the paddock.dev objects.
func objectClient(cfg *rest.Config) (*rest.RESTClient, error) {
	return restClient(cfg, GroupVersion, &PaddockNode{}, &PaddockNodeList{},
		&SandboxTemplate{}, &SandboxTemplateList{}, &SandboxWarmPool{}, &SandboxWarmPoolList{},
		&PolicyPreset{}, &PolicyPresetList{}, &Sandbox{}, &SandboxList{})
}

// coreClient is a REST client for core/v1 Secrets.
func coreClient(cfg *rest.Config) (*rest.RESTClient, error) {
	return restClient(cfg, corev1.SchemeGroupVersion, &corev1.Secret{}, &corev1.SecretList{})
}
