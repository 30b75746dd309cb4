package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cluster"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Gateway is the gateway's API as the Sandbox controller calls it: the
// same placement and routing as a client's calls.
type Gateway interface {
	Create(ctx context.Context, req api.CreateRequest) (api.Sandbox, error)
	Get(ctx context.Context, id string) (api.Sandbox, error)
	Remove(ctx context.Context, id string) error
	// List lists the sandboxes of every node that answers.
	List(ctx context.Context) ([]api.Sandbox, error)
	// NodeOf names the node that made id.
	NodeOf(id string) string
	// Lost says the node that made id is lost (its Lease expired).
	Lost(id string) bool
}

// ObjectLabel, on a sandbox, is the UID of the Sandbox object it was made
// for: a sandbox whose object is gone is an orphan, removed by the
// controller's sweep (its node was lost when the object was deleted).
const ObjectLabel = "paddock.dev/sandbox-object"

// sweepEvery is how often the controller looks for orphans through the
// whole cluster; those it left itself are retried every Resync.
const sweepEvery = 5 * time.Minute

// ControllerConfig configures the gateways' controller.
type ControllerConfig struct {
	Kube *rest.Config
	// Namespace holds the controller's Lease (default
	// cluster.DefaultNamespace).
	Namespace string
	// Identity names this gateway in the Lease.
	Identity string
	Gateway  Gateway
	Logger   *slog.Logger
}

// retryCreate is how long a Sandbox whose create failed waits before the
// next try.
const retryCreate = 30 * time.Second

// RunController runs the gateways' controller until ctx ends, while this
// gateway holds the Lease cluster.ControllerLease: it keeps each
// Sandbox object's sandbox (created when missing, created anew when its
// node is lost or its spec changed, removed with the object) and checks
// the PolicyPresets (their Valid condition).
//
// It runs in a gateway, not on the nodes: only a gateway can place a
// sandbox anew when its node is gone, and the Lease makes one gateway of
// many act at a time.
func RunController(ctx context.Context, cfg ControllerConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = cluster.DefaultNamespace
	}
	objs, err := cluster.NewObjects(cfg.Kube)
	if err != nil {
		return err
	}
	return cluster.Lead(ctx, cfg.Kube, cfg.Namespace, cluster.ControllerLease, cfg.Identity, cfg.Logger, func(ctx context.Context) {
		w, err := cluster.Watch(ctx, cfg.Kube, cluster.WatchSandboxes|cluster.WatchPresets)
		if err != nil {
			cfg.Logger.Error("watching Sandboxes", "err", err)
			return
		}
		c := &controller{cfg: cfg, log: cfg.Logger, objs: objs, failed: map[string]time.Time{}, wrote: map[types.UID]cluster.SandboxStatus{},
			orphans: map[string]bool{}}
		tick := time.NewTicker(Resync)
		defer tick.Stop()
		var swept time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.Changed():
			case <-tick.C:
			}
			if w.Synced() {
				d := w.Now()
				c.presets(ctx, d.Presets)
				seen := map[types.UID]bool{}
				for _, s := range d.Sandboxes {
					seen[s.UID] = true
					c.sandbox(ctx, s)
				}
				for uid := range c.wrote {
					if !seen[uid] {
						delete(c.wrote, uid)
					}
				}
				c.removeOrphans(ctx)
				if time.Since(swept) >= sweepEvery {
					swept = time.Now()
					c.sweep(ctx, seen)
				}
			}
		}
	})
}

type controller struct {
	cfg  ControllerConfig
	log  *slog.Logger
	objs *cluster.Objects
	// failed: when a create last failed, by uid/generation.
	failed map[string]time.Time
	// wrote is the status this controller last wrote of each object: the
	// watch's copy may not show it yet, and it is the one writer.
	wrote map[types.UID]cluster.SandboxStatus
	// orphans are sandboxes of deleted objects left on lost nodes,
	// removed when their node answers again.
	orphans map[string]bool
}

// presets writes each PolicyPreset's Valid condition.
func (c *controller) presets(ctx context.Context, presets []*cluster.PolicyPreset) {
	for _, pp := range presets {
		perr := CheckPreset(pp)
		cur := conditionOf(pp.Status.Conditions, cluster.ConditionValid)
		if cur != nil && cur.ObservedGeneration == pp.Generation && (cur.Status == metav1.ConditionTrue) == (perr == nil) {
			continue
		}
		err := c.objs.UpdatePresetStatus(ctx, pp.Name, func(o *cluster.PolicyPreset) bool {
			if perr != nil {
				return cluster.SetCondition(&o.Status.Conditions, cluster.ConditionValid, false, cluster.ReasonInvalid, perr.Error(), o.Generation)
			}
			return cluster.SetCondition(&o.Status.Conditions, cluster.ConditionValid, true, "Checked", "", o.Generation)
		})
		if err != nil && ctx.Err() == nil && !isGone(err) {
			c.log.Warn("writing a PolicyPreset's status", "preset", pp.Name, "err", err)
		}
	}
}

// sandbox brings one Sandbox object's sandbox to its spec.
func (c *controller) sandbox(ctx context.Context, s *cluster.Sandbox) {
	log := c.log.With("sandbox_object", s.Namespace+"/"+s.Name)
	if s.DeletionTimestamp != nil {
		c.finish(ctx, s, log)
		return
	}
	if !slices.Contains(s.Finalizers, cluster.SandboxFinalizer) {
		fin := append(slices.Clone(s.Finalizers), cluster.SandboxFinalizer)
		if err := c.objs.SetSandboxFinalizers(ctx, s.Namespace, s.Name, s.ResourceVersion, fin); err != nil {
			// A conflict: the watch brings the newer object.
			if !isGone(err) && !apierrors.IsConflict(err) {
				log.Warn("adding the Sandbox's finalizer", "err", err)
			}
			return
		}
	}
	st := s.Status
	if w, ok := c.wrote[s.UID]; ok {
		st = w
	}
	st.Replaced = c.removeAll(ctx, st.Replaced, log)
	ready, reason, msg := false, "", ""
	if st.ID != "" {
		sb, err := c.cfg.Gateway.Get(ctx, st.ID)
		switch {
		case err == nil && st.ObservedGeneration != s.Generation:
			// The spec changed: a sandbox made from the new one replaces it.
			st.Replaced = append(st.Replaced, st.ID)
			st.ID, st.Node, st.State = "", "", ""
		case err == nil:
			st.State = string(sb.State)
			ready = sb.State == api.StateRunning || sb.State == api.StateFrozen || sb.State == api.StatePaused
			reason, msg = "Running", fmt.Sprintf("sandbox %s on node %s is %s", st.ID, st.Node, sb.State)
			if !ready {
				reason = "NotRunning"
			}
		case errors.Is(err, errdefs.ErrNotFound):
			log.Info("the Sandbox's sandbox is gone; making it anew", "id", st.ID)
			st.ID, st.Node, st.State = "", "", ""
		case errors.Is(err, errdefs.ErrUnavailable):
			log.Info("the Sandbox's node is lost; making its sandbox anew on another", "id", st.ID, "node", st.Node)
			st.Replaced = append(st.Replaced, st.ID)
			st.ID, st.Node, st.State = "", "", ""
		default:
			reason, msg = "Unknown", err.Error()
		}
	}
	if st.ID == "" {
		key := fmt.Sprintf("%s/%d", s.UID, s.Generation)
		if at, ok := c.failed[key]; ok && time.Since(at) < retryCreate {
			return
		}
		sb, err := c.cfg.Gateway.Create(ctx, createRequest(s))
		if err != nil {
			c.failed[key] = time.Now()
			reason, msg = "CreateFailed", err.Error()
			if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrNotFound) {
				reason = cluster.ReasonInvalid
			}
			log.Warn("creating the Sandbox's sandbox", "err", err)
		} else {
			delete(c.failed, key)
			st.ID, st.Node, st.State = sb.ID, c.cfg.Gateway.NodeOf(sb.ID), string(sb.State)
			ready, reason, msg = true, "Running", fmt.Sprintf("sandbox %s made on node %s", sb.ID, st.Node)
			log.Info("made the Sandbox's sandbox", "id", sb.ID, "node", st.Node)
		}
	}
	if st.ID != "" {
		st.ObservedGeneration = s.Generation
	}
	st.Conditions = nil
	c.wrote[s.UID] = st
	err := c.objs.UpdateSandboxStatus(ctx, s.Namespace, s.Name, func(o *cluster.Sandbox) bool {
		changed := o.Status.ID != st.ID || o.Status.Node != st.Node || o.Status.State != st.State ||
			o.Status.ObservedGeneration != st.ObservedGeneration || !slices.Equal(o.Status.Replaced, st.Replaced)
		o.Status.ID, o.Status.Node, o.Status.State, o.Status.ObservedGeneration, o.Status.Replaced = st.ID, st.Node, st.State, st.ObservedGeneration, st.Replaced
		if reason != "" {
			changed = cluster.SetCondition(&o.Status.Conditions, cluster.ConditionReady, ready, reason, msg, o.Generation) || changed
		}
		return changed
	})
	if err != nil && ctx.Err() == nil && !isGone(err) {
		log.Warn("writing the Sandbox's status", "err", err)
		delete(c.wrote, s.UID) // read it afresh
	}
}

// finish removes a deleted Sandbox's sandboxes, then its finalizer. A
// sandbox on a node that does not answer holds the object for a while;
// one on a lost node (its Lease expired) does not: the status says it is
// left there, the object goes, and the sandbox is removed as an orphan
// when its node comes back (removeOrphans, sweep).
func (c *controller) finish(ctx context.Context, s *cluster.Sandbox, log *slog.Logger) {
	if !slices.Contains(s.Finalizers, cluster.SandboxFinalizer) {
		return
	}
	st := s.Status
	if w, ok := c.wrote[s.UID]; ok {
		st = w
	}
	ids := st.Replaced
	if st.ID != "" {
		ids = append([]string{st.ID}, ids...)
	}
	if left := c.removeAll(ctx, ids, log); len(left) > 0 {
		var lost, waiting []string
		for _, id := range left {
			if c.cfg.Gateway.Lost(id) {
				lost = append(lost, fmt.Sprintf("%s on node %s", id, c.cfg.Gateway.NodeOf(id)))
			} else {
				waiting = append(waiting, id)
			}
		}
		reason, msg := "Deleting", fmt.Sprintf("waiting for the nodes of %v to answer to remove them", waiting)
		if len(waiting) == 0 {
			reason = "NodeLost"
			msg = fmt.Sprintf("deleted with sandboxes left on lost nodes (%s): they are removed when their node comes back", strings.Join(lost, ", "))
		}
		err := c.objs.UpdateSandboxStatus(ctx, s.Namespace, s.Name, func(o *cluster.Sandbox) bool {
			return cluster.SetCondition(&o.Status.Conditions, cluster.ConditionReady, false, reason, msg, o.Generation)
		})
		if err != nil && !isGone(err) {
			log.Warn("writing the Sandbox's status", "err", err)
		}
		if len(waiting) > 0 {
			return
		}
		for _, id := range left {
			c.orphans[id] = true
		}
		log.Info("the Sandbox is deleted, its status saying so", "status", msg)
	}
	i := slices.Index(s.Finalizers, cluster.SandboxFinalizer)
	fin := slices.Delete(slices.Clone(s.Finalizers), i, i+1)
	err := c.objs.SetSandboxFinalizers(ctx, s.Namespace, s.Name, s.ResourceVersion, fin)
	if err != nil && !isGone(err) && !apierrors.IsConflict(err) {
		log.Warn("removing the Sandbox's finalizer", "err", err)
		return
	}
	log.Info("removed the Sandbox's sandbox", "id", st.ID)
}

// removeAll removes the sandboxes ids and returns those it could not
// (their node is lost, or did not answer).
func (c *controller) removeAll(ctx context.Context, ids []string, log *slog.Logger) []string {
	var left []string
	for _, id := range ids {
		err := c.cfg.Gateway.Remove(ctx, id)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			log.Debug("removing a sandbox; trying again later", "id", id, "err", err)
			left = append(left, id)
		}
	}
	return left
}

// removeOrphans removes the sandboxes deleted objects left on lost
// nodes, those whose node answers again.
func (c *controller) removeOrphans(ctx context.Context) {
	for id := range c.orphans {
		if c.cfg.Gateway.Lost(id) {
			continue
		}
		err := c.cfg.Gateway.Remove(ctx, id)
		if err == nil || errors.Is(err, errdefs.ErrNotFound) {
			delete(c.orphans, id)
			c.log.Info("removed a deleted Sandbox's sandbox, its node back", "id", id, "node", c.cfg.Gateway.NodeOf(id))
		}
	}
}

// sweep finds the sandboxes made for objects that are gone (objects holds
// the UIDs there are): left on lost nodes by a controller that did not
// live to remove them.
func (c *controller) sweep(ctx context.Context, objects map[types.UID]bool) {
	all, err := c.cfg.Gateway.List(ctx)
	if err != nil {
		c.log.Warn("listing sandboxes for orphans", "err", err)
		return
	}
	for _, sb := range all {
		if uid, ok := sb.Labels[ObjectLabel]; ok && !objects[types.UID(uid)] && !c.orphans[sb.ID] {
			c.log.Info("a sandbox whose Sandbox object is gone: removing it", "id", sb.ID, "object_uid", uid)
			c.orphans[sb.ID] = true
		}
	}
	c.removeOrphans(ctx)
}

func createRequest(s *cluster.Sandbox) api.CreateRequest {
	req := api.CreateRequest{
		Labels:       map[string]string{ObjectLabel: string(s.UID)},
		Image:        s.Spec.Image,
		Env:          s.Spec.Env,
		Workdir:      s.Spec.Workdir,
		Resources:    s.Spec.Resources,
		Policy:       s.Spec.Policy,
		Runtime:      s.Spec.Runtime,
		NodeSelector: s.Spec.NodeSelector,
	}
	if s.Spec.TemplateRef != nil {
		req.From = s.Spec.TemplateRef.Name
	}
	return req
}

func conditionOf(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}
