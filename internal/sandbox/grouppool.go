package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// A group template (api.TemplateSpec.Containers) has a warm pool of
// whole groups: sandboxes made ahead from its containers, every command
// started and every readiness check passed, at a background CPU weight.
// They are ordinary sandboxes (a record, restored by a restarted daemon)
// owned by the pool (record.Pool) and hidden from List until a create
// from the template takes one: a hand-out sets what the create may set
// and records it, in a few ms. The pool answers to the runtime pools'
// name, size and reports ("template:NAME", the template's warm, `pool
// set`, GET /v1/pools): a runtime pool holds guests, and a group is
// several, with commands running, so its pool is the manager's.

// groupPools are the warm pools of group templates.
type groupPools struct {
	mu    sync.Mutex
	pools map[string]*groupPool // by template name
	wake  chan struct{}
	once  sync.Once
	// held stops the refill while a restarted daemon adopts the groups
	// the last one made (adoptGroups).
	held bool
}

// groupPool is one group template's pool.
type groupPool struct {
	tpl    api.Template
	digest string // of what its groups are made from (groupDigest)
	target int
	ready  []string // sandbox ids, oldest first
	// making counts groups being made for it; made is waited on by a
	// removal of the template, so that none outlives it.
	making int
	made   sync.WaitGroup
	// failures and retry back off a pool whose groups fail to come up.
	failures int
	retry    time.Time
}

// isGroup reports whether t is a group template.
func isGroup(t api.Template) bool { return len(t.Spec.Containers) > 0 }

// groupDigest names what a group template's groups are made from: a
// rebuild that changes it drops the groups made before.
func groupDigest(t api.Template) string {
	b, _ := json.Marshal([]any{t.Spec.Containers, t.Spec.SharedVolumes, t.Spec.Resources, t.Policy, t.Spec.Runtime})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// groupRequest is the create that makes one of t's groups.
func groupRequest(t api.Template) api.CreateRequest {
	return api.CreateRequest{
		Containers:    slices.Clone(t.Spec.Containers),
		SharedVolumes: slices.Clone(t.Spec.SharedVolumes),
		Resources:     t.Spec.Resources,
		Policy:        t.Policy,
		Runtime:       t.Spec.Runtime,
	}
}

// groupTemplate returns the group template named from, if it is one.
func (m *Manager) groupTemplate(from string) (api.Template, bool) {
	if m.cfg.Templates == nil {
		return api.Template{}, false
	}
	t, err := m.cfg.Templates.Get(from)
	if err != nil || !isGroup(t) {
		return api.Template{}, false
	}
	return t, true
}

// checkGroupCreate refuses what a create from group template t cannot
// have: anything its pooled groups were started with. It is checked
// whether or not a group is ready, so that a create's outcome does not
// depend on the pool.
func checkGroupCreate(req *api.CreateRequest, t api.Template) error {
	field := ""
	switch {
	case req.Image != "":
		field = "image"
	case len(req.Env) > 0:
		field = "env"
	case req.Workdir != "":
		field = "workdir"
	case len(req.Volumes) > 0:
		field = "volumes"
	case req.Resources != (api.Resources{}):
		field = "resources"
	case req.Runtime != "" && req.Runtime != t.Spec.Runtime && req.Runtime != "native":
		field = "runtime"
	case req.Policy != nil && len(req.Policy.Secrets) > 0:
		return errdefs.Invalid("policy.secrets", "template %s starts its containers ahead, so their environment cannot take the secrets' placeholders: bind the secrets in the template's policy", t.Name)
	}
	if field != "" {
		return errdefs.Invalid(field, "template %s is a group whose containers are started ahead: a create from it may set labels, timeout_seconds, on_timeout, auto_pause_seconds, auto_resume, budget, autoscale and policy; %s is the template's (rebuild it to change it)", t.Name, field)
	}
	return nil
}

// createFromGroup creates a sandbox from group template t: a ready group
// of its pool handed out, or, with none ready, one made now.
func (m *Manager) createFromGroup(ctx context.Context, req api.CreateRequest, t api.Template) (api.Sandbox, error) {
	if err := checkGroupCreate(&req, t); err != nil {
		return api.Sandbox{}, err
	}
	if err := m.validatePolicy(req.Policy); err != nil {
		return api.Sandbox{}, err
	}
	for {
		id := m.gp.take(t.Name)
		if id == "" {
			break
		}
		s, err := m.handOut(id, req, t)
		if err == nil {
			m.gp.poke()
			return s, nil
		}
		m.log.Warn("a pooled group could not be handed out; removing it", "template", t.Name, "sandbox", id, "err", err)
		m.discardPooled(id)
	}
	m.gp.poke()
	creq := groupRequest(t)
	creq.Labels, creq.TimeoutSeconds, creq.OnTimeout = req.Labels, req.TimeoutSeconds, req.OnTimeout
	creq.AutoPauseSeconds, creq.AutoResume, creq.Budget, creq.Autoscale = req.AutoPauseSeconds, req.AutoResume, req.Budget, req.Autoscale
	if req.Policy != nil {
		creq.Policy = req.Policy
	}
	return m.create(ctx, creq, source{from: t.Name})
}

// handOut makes pooled group id the caller's: what the create sets,
// applied to it as it runs, then recorded. Any error leaves it to be
// discarded.
func (m *Manager) handOut(id string, req api.CreateRequest, t api.Template) (api.Sandbox, error) {
	t0 := time.Now()
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.Pool != poolName(t.Name) || b.rec.State != api.StateRunning {
		return api.Sandbox{}, fmt.Errorf("it is %s (pool %q)", b.rec.State, b.rec.Pool)
	}
	for _, c := range b.rec.Containers {
		if c.State != api.StateRunning {
			return api.Sandbox{}, fmt.Errorf("container %s is %s: %s", c.Name, c.State, c.Error)
		}
	}
	now := time.Now().UTC()
	if req.Policy != nil {
		if _, err := m.cfg.Egress.SetPolicy(id, withGrants(req.Policy, nil, now)); err != nil {
			return api.Sandbox{}, fmt.Errorf("applying policy: %w", err)
		}
		b.rec.Policy = req.Policy
	}
	if bg, ok := b.inst.(runtime.Backgrounder); ok {
		if err := bg.SetBackground(false); err != nil {
			return api.Sandbox{}, err
		}
	}
	r := &b.rec
	r.Pool, r.PoolSpec = "", ""
	r.Labels, r.CreatedAt, r.OnTimeout = req.Labels, now, req.OnTimeout
	r.AutoPauseSeconds, r.AutoResume = req.AutoPauseSeconds, req.AutoResume == nil || *req.AutoResume
	r.Budget, r.Autoscale, r.From, r.Pooled = req.Budget, req.Autoscale, t.Name, true
	r.ExpiresAt = nil
	if req.TimeoutSeconds > 0 {
		exp := now.Add(time.Duration(req.TimeoutSeconds) * time.Second)
		r.ExpiresAt = &exp
	}
	// In the journal before the answer, as a create's record (create).
	if err := m.cfg.Store.PutQuick(bucket, id, b.rec); err != nil {
		return api.Sandbox{}, fmt.Errorf("recording sandbox: %w", err)
	}
	b.pooled.Store(false)
	b.touch()
	m.armTimer(b)
	view := b.viewLocked()
	b.shown.Store(&view)
	// Budgets and autoscale count from the hand-out.
	m.notify(b).Changed(view)
	m.notify(b).Event(id, "lifecycle", "created", map[string]any{"from": t.Name, "pooled": true})
	m.log.Info("sandbox created", "sandbox", id, "from", t.Name, "pooled", true, "ms", ms(time.Since(t0)))
	return view, nil
}

// discardPooled removes a group of a pool in the background.
func (m *Manager) discardPooled(id string) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		if err := m.Remove(context.Background(), id, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Warn("removing a pooled group", "sandbox", id, "err", err)
		}
	}()
}

// setGroupPool keeps size groups of template t ready (0: none; t not a
// group template: none). Groups made from another spec are removed. It
// returns once those it removed are gone, and, for a pool dropped,
// once no group is being made for it.
func (m *Manager) setGroupPool(name string, t api.Template, size int) {
	gp := &m.gp
	if !isGroup(t) {
		size = 0
	}
	if size > 0 {
		// The refill runs once some pool wants a group.
		gp.once.Do(func() {
			gp.mu.Lock()
			gp.wake = make(chan struct{}, 1)
			gp.mu.Unlock()
			m.wg.Add(1)
			go m.keepGroups()
		})
	}
	digest := groupDigest(t)
	var drop []string
	var dropped *groupPool
	gp.mu.Lock()
	p := gp.pools[name]
	switch {
	case size <= 0:
		if p != nil {
			drop, dropped = p.ready, p
			delete(gp.pools, name)
		}
	case p == nil:
		if gp.pools == nil {
			gp.pools = map[string]*groupPool{}
		}
		gp.pools[name] = &groupPool{tpl: t, digest: digest, target: size}
	default:
		if p.digest != digest {
			drop, p.ready = p.ready, nil
		}
		p.tpl, p.digest, p.target, p.failures, p.retry = t, digest, size, 0, time.Time{}
		if len(p.ready) > size {
			drop = append(drop, p.ready[size:]...)
			p.ready = p.ready[:size]
		}
	}
	gp.mu.Unlock()
	for _, id := range drop {
		if err := m.Remove(context.Background(), id, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Warn("removing a pooled group", "template", name, "sandbox", id, "err", err)
		}
	}
	if dropped != nil {
		dropped.made.Wait()
	}
	gp.poke()
}

func (gp *groupPools) poke() {
	gp.mu.Lock()
	wake := gp.wake
	gp.mu.Unlock()
	if wake == nil {
		return
	}
	select {
	case wake <- struct{}{}:
	default:
	}
}

// take hands out the oldest ready group of template name's pool, or "".
func (gp *groupPools) take(name string) string {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	p := gp.pools[name]
	if p == nil || len(p.ready) == 0 {
		return ""
	}
	id := p.ready[0]
	p.ready = p.ready[1:]
	return id
}

// sizes and targets report the group pools under their pool names.
func (gp *groupPools) report(into map[string]int, ready bool) map[string]int {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if into == nil && len(gp.pools) > 0 {
		into = map[string]int{}
	}
	for name, p := range gp.pools {
		if ready {
			into[poolName(name)] = len(p.ready)
		} else {
			into[poolName(name)] = p.target
		}
	}
	return into
}

// groupRetry bounds the back-off of a pool whose groups fail.
const groupRetry = time.Minute

// keepGroups refills the group pools, one group at a time (each is
// several guests and their services), the neediest pool first, while
// the host has the memory (runtime.PoolRoom) and admission lets it.
func (m *Manager) keepGroups() {
	defer m.wg.Done()
	gp := &m.gp
	gp.mu.Lock()
	wake := gp.wake
	gp.mu.Unlock()
	for {
		select {
		case <-m.closed:
			return
		case <-wake:
		case <-time.After(time.Second):
		}
		for {
			select {
			case <-m.closed:
				return
			default:
			}
			p := gp.neediest()
			if p == nil {
				break
			}
			if r, ok := m.cfg.Runtime.(runtime.PoolRoom); ok && !r.HasPoolRoom() {
				gp.unmake(p, false) // tried again in a second
				break
			}
			m.makeGroup(p)
		}
	}
}

// neediest picks the pool furthest below its target that is not backing
// off, and counts a group as being made for it; nil if none.
func (gp *groupPools) neediest() *groupPool {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	var best *groupPool
	if gp.held {
		return nil
	}
	now := time.Now()
	for _, p := range gp.pools {
		short := p.target - len(p.ready) - p.making
		if short <= 0 || now.Before(p.retry) {
			continue
		}
		if best == nil || short > best.target-len(best.ready)-best.making {
			best = p
		}
	}
	if best != nil {
		best.making++
		best.made.Add(1)
	}
	return best
}

// unmake counts a group for p as no longer being made; failed, it backs
// p off.
func (gp *groupPools) unmake(p *groupPool, failed bool) {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	p.making--
	p.made.Done()
	if failed {
		p.failures++
		p.retry = time.Now().Add(min(time.Second<<min(p.failures, 6), groupRetry))
	}
}

// makeGroup makes one group for p (counted in making by neediest) and
// adds it to p's ready, or removes it if p changed meanwhile.
func (m *Manager) makeGroup(p *groupPool) {
	gp := &m.gp
	gp.mu.Lock()
	t, digest := p.tpl, p.digest
	gp.mu.Unlock()
	name := poolName(t.Name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	go func() {
		select {
		case <-m.closed: // a daemon that stops does not wait for a readiness check
			cancel()
		case <-ctx.Done():
		}
	}()
	s, err := m.create(ctx, groupRequest(t), source{from: t.Name, pool: name, poolSpec: digest})
	if err != nil {
		m.log.Warn("making a group for a warm pool", "pool", name, "err", err)
		gp.unmake(p, true)
		return
	}
	gp.mu.Lock()
	keep := gp.pools[t.Name] == p && p.digest == digest && len(p.ready) < p.target
	if keep {
		p.ready = append(p.ready, s.ID)
		p.failures = 0
	}
	gp.mu.Unlock()
	if !keep {
		if err := m.Remove(context.Background(), s.ID, true); err != nil {
			m.log.Warn("removing a pooled group", "pool", name, "sandbox", s.ID, "err", err)
		}
	}
	gp.unmake(p, false)
	m.log.Debug("group made for a warm pool", "pool", name, "sandbox", s.ID, "kept", keep)
}

// adoptGroups, at start-up once the templates' pools are set, gives each
// pool back the groups a previous daemon made for it that came back
// running, and removes the others (of a template gone or rebuilt, or not
// all running).
func (m *Manager) adoptGroups(ctx context.Context) {
	for _, b := range m.allBoxes() {
		if !b.pooled.Load() {
			continue
		}
		b.mu.Lock()
		id, pool, spec, state := b.rec.ID, b.rec.Pool, b.rec.PoolSpec, b.rec.State
		running := state == api.StateRunning
		for _, c := range b.rec.Containers {
			running = running && c.State == api.StateRunning
		}
		b.mu.Unlock()
		if running && m.gp.adopt(pool, spec, id) {
			m.log.Info("pooled group adopted", "pool", pool, "sandbox", id)
			continue
		}
		m.log.Info("removing a pooled group no pool takes", "pool", pool, "sandbox", id, "state", state)
		if err := m.Remove(ctx, id, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Warn("removing a pooled group", "sandbox", id, "err", err)
		}
	}
	m.gp.poke()
}

// hold stops (on) or lets go (off) the refill.
func (gp *groupPools) hold(on bool) {
	gp.mu.Lock()
	gp.held = on
	gp.mu.Unlock()
	gp.poke()
}

// adopt adds group id, made from spec, to pool, if the pool wants it.
func (gp *groupPools) adopt(pool, spec, id string) bool {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	for name, p := range gp.pools {
		if poolName(name) == pool && p.digest == spec && len(p.ready) < p.target {
			p.ready = append(p.ready, id)
			return true
		}
	}
	return false
}
