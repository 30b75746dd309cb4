package cluster

import (
	"context"
	"log/slog"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// ControllerLease names the Lease whose holder, among the gateways, runs
// the Sandbox controller.
const ControllerLease = "paddock-sandbox-controller"

// Election timing: a leader renews every electRenew; another takes over
// when it has not seen a renewal for electDuration.
const (
	electDuration = 10 * time.Second
	electRenew    = 2 * time.Second
)

// Lead runs lead while this process (identity) holds the Lease name in
// namespace, and tries to take it whenever it is free or its holder has
// not renewed it for its duration (as this process's clock measures:
// another's clock is not trusted). lead's context ends when the Lease is
// lost (a renewal that fails for longer than electRenew allows) or ctx
// ends; then the Lease is released. Lead returns when ctx ends.
func Lead(ctx context.Context, rc *rest.Config, namespace, name, identity string, log *slog.Logger, lead func(context.Context)) error {
	c, err := leaseClient(rc)
	if err != nil {
		return err
	}
	e := &election{c: c, ns: namespace, name: name, id: identity, log: log}
	for ctx.Err() == nil {
		if e.tryAcquire(ctx) {
			log.Info("leading", "lease", name)
			e.lead(ctx, lead)
			log.Info("no longer leading", "lease", name)
		}
		select {
		case <-ctx.Done():
		case <-time.After(electRenew):
		}
	}
	return nil
}

type election struct {
	c            *rest.RESTClient
	ns, name, id string
	log          *slog.Logger
	lease        *coordv1.Lease
	seenVersion  string
	seenAt       time.Time
}

func (e *election) tryAcquire(ctx context.Context) bool {
	now := time.Now()
	var l coordv1.Lease
	err := e.c.Get().Namespace(e.ns).Resource("leases").Name(e.name).Do(ctx).Into(&l)
	if apierrors.IsNotFound(err) {
		l = coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: e.name, Namespace: e.ns}}
		e.mine(&l, now, true)
		var made coordv1.Lease
		if err := e.c.Post().Namespace(e.ns).Resource("leases").Body(&l).Do(ctx).Into(&made); err != nil {
			return false
		}
		e.lease = &made
		return true
	}
	if err != nil {
		e.log.Debug("reading the controller's Lease", "err", err)
		return false
	}
	if l.ResourceVersion != e.seenVersion {
		e.seenVersion, e.seenAt = l.ResourceVersion, now
	}
	held := l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	dur := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, int32(electDuration/time.Second))) * time.Second
	if held && *l.Spec.HolderIdentity != e.id && now.Sub(e.seenAt) < dur {
		return false
	}
	e.mine(&l, now, !held || *l.Spec.HolderIdentity != e.id)
	var out coordv1.Lease
	// The resource version makes this a compare-and-swap: of two that
	// try at once, one wins.
	if err := e.c.Put().Namespace(e.ns).Resource("leases").Name(e.name).Body(&l).Do(ctx).Into(&out); err != nil {
		return false
	}
	e.lease = &out
	return true
}

func (e *election) mine(l *coordv1.Lease, now time.Time, acquire bool) {
	t := metav1.NewMicroTime(now)
	l.APIVersion, l.Kind = coordv1.SchemeGroupVersion.String(), "Lease"
	l.Spec.HolderIdentity = ptr.To(e.id)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(electDuration / time.Second))
	l.Spec.RenewTime = &t
	if acquire {
		l.Spec.AcquireTime = &t
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
}

// lead runs fn until the Lease cannot be renewed, then releases it.
func (e *election) lead(ctx context.Context, fn func(context.Context)) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { fn(lctx); close(done) }()
	tick := time.NewTicker(electRenew)
	defer tick.Stop()
	renewed := time.Now()
	for lctx.Err() == nil {
		select {
		case <-lctx.Done():
		case <-tick.C:
			l := e.lease.DeepCopy()
			e.mine(l, time.Now(), false)
			var out coordv1.Lease
			err := e.c.Put().Namespace(e.ns).Resource("leases").Name(e.name).Body(l).Do(lctx).Into(&out)
			switch {
			case err == nil:
				e.lease, renewed = &out, time.Now()
			case apierrors.IsConflict(err) || time.Since(renewed) > electDuration-2*electRenew:
				// Another took it, or it may have expired in others' eyes.
				e.log.Warn("lost the controller's Lease", "err", err)
				cancel()
			}
		}
	}
	cancel()
	<-done
	if ctx.Err() != nil {
		// Release, so that another gateway takes over at once.
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		l := e.lease.DeepCopy()
		l.APIVersion, l.Kind = coordv1.SchemeGroupVersion.String(), "Lease"
		l.Spec.HolderIdentity = nil
		e.c.Put().Namespace(e.ns).Resource("leases").Name(e.name).Body(l).Do(rctx).Error()
		rcancel()
	}
}
