package runtime

import (
	"context"
	"fmt"
	"sort"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Owner is offered by tiers that can tell their sandboxes apart from
// other tiers' by id (the gvisor tier: by the bundle in its run dir).
type Owner interface {
	Owns(id string) bool
}

// Keeper is offered by tiers that make sandboxes ahead of time outside
// the base tier's pools: those are theirs, not leftovers.
type Keeper interface {
	Keeps(id string) bool
}

// poolReporter is what a tier beside the base one reports of its pools.
type poolReporter interface {
	PoolSizes() map[string]int
	PoolTargets() map[string]int
}

// Tiers is a Runtime that runs each sandbox on one of several tiers:
// a start on the tier its Spec.Runtime names (the default's when empty),
// anything else by id on the tier that owns it (Owner), the base tier
// otherwise. Its pools are the base tier's.
type Tiers struct {
	base   Runtime // native: every sandbox no other tier owns
	def    string  // the tier a start naming none goes to
	others map[string]Runtime
	// unavailable are tiers this daemon knows but could not start, and
	// why (gvisor without runsc).
	unavailable map[string]error
}

var (
	_ Runtime      = (*Tiers)(nil)
	_ Pools        = (*Tiers)(nil)
	_ Checkpointer = (*Tiers)(nil)
)

// NewTiers runs sandboxes on base and, when their spec names one, on
// others, each an Owner; a start that names no tier goes to the one named
// def ("" for base).
func NewTiers(base Runtime, def string, others ...Runtime) (*Tiers, error) {
	t := &Tiers{base: base, def: base.Name(), others: map[string]Runtime{}, unavailable: map[string]error{}}
	for _, o := range others {
		if _, ok := o.(Owner); !ok {
			return nil, fmt.Errorf("runtime %s cannot tell its sandboxes apart", o.Name())
		}
		t.others[o.Name()] = o
	}
	if def != "" {
		if _, err := t.Tier(def); err != nil {
			return nil, err
		}
		t.def = def
	}
	return t, nil
}

// Name implements Runtime: the default tier's.
func (t *Tiers) Name() string { return t.def }

// Names lists the tiers, the base first.
func (t *Tiers) Names() []string {
	names := []string{t.base.Name()}
	var more []string
	for n := range t.others {
		more = append(more, n)
	}
	sort.Strings(more)
	return append(names, more...)
}

// Tier returns the tier named name ("" for the default).
func (t *Tiers) Tier(name string) (Runtime, error) {
	if name == "" {
		name = t.def
	}
	if name == t.base.Name() {
		return t.base, nil
	}
	if r, ok := t.others[name]; ok {
		return r, nil
	}
	if err, ok := t.unavailable[name]; ok {
		return nil, fmt.Errorf("%w: the %s runtime is unavailable on this daemon: %v", errdefs.ErrUnavailable, name, err)
	}
	return nil, fmt.Errorf("%w: unknown runtime %q (this daemon has %v)", errdefs.ErrInvalid, name, t.Names())
}

// Unavailable records a tier this daemon could not start, and why: a
// start that asks for it is told so.
func (t *Tiers) Unavailable(name string, err error) { t.unavailable[name] = err }

// Versioned is offered by tiers with a version of their own.
type Versioned interface {
	Version() string
}

// Versions names each tier's version: its own, or else base's (the
// daemon's).
func (t *Tiers) Versions(base string) map[string]string {
	v := map[string]string{t.base.Name(): base}
	for n, r := range t.others {
		v[n] = base
		if vr, ok := r.(Versioned); ok {
			v[n] = vr.Version()
		}
	}
	return v
}

// of is the tier that owns sandbox id.
func (t *Tiers) of(id string) Runtime {
	for _, r := range t.others {
		if r.(Owner).Owns(id) {
			return r
		}
	}
	return t.base
}

// Start implements Runtime.
func (t *Tiers) Start(ctx context.Context, spec Spec) (Instance, error) {
	r, err := t.Tier(spec.Runtime)
	if err != nil {
		return nil, err
	}
	return r.Start(ctx, spec)
}

// Restore implements Runtime.
func (t *Tiers) Restore(ctx context.Context, id string, rs RestoreSpec) (Instance, error) {
	return t.of(id).Restore(ctx, id, rs)
}

// Stop implements Runtime.
func (t *Tiers) Stop(ctx context.Context, id string) error { return t.of(id).Stop(ctx, id) }

// Remove implements Runtime.
func (t *Tiers) Remove(ctx context.Context, id string) error { return t.of(id).Remove(ctx, id) }

// Snapshot implements Runtime.
func (t *Tiers) Snapshot(ctx context.Context, id, dst string, pause func() (func(), error)) (Capture, error) {
	return t.of(id).Snapshot(ctx, id, dst, pause)
}

// Checkpoint implements Checkpointer: by the tier that owns id, if it
// can; ErrNoCheckpoint otherwise.
func (t *Tiers) Checkpoint(ctx context.Context, id string) (Checkpoint, error) {
	if c, ok := t.of(id).(Checkpointer); ok {
		return c.Checkpoint(ctx, id)
	}
	return Checkpoint{}, ErrNoCheckpoint
}

// CheckpointTo implements Checkpointer, as Checkpoint does.
func (t *Tiers) CheckpointTo(ctx context.Context, id, dir string, during func() error) (Checkpoint, error) {
	if c, ok := t.of(id).(Checkpointer); ok {
		return c.CheckpointTo(ctx, id, dir, during)
	}
	return Checkpoint{}, ErrNoCheckpoint
}

// Squeeze implements Checkpointer, as Checkpoint does; the channel is
// closed at once if the tier keeps no memory.
func (t *Tiers) Squeeze(id string) <-chan int64 {
	if c, ok := t.of(id).(Checkpointer); ok {
		return c.Squeeze(id)
	}
	none := make(chan int64)
	close(none)
	return none
}

// DiskUsage implements Runtime.
func (t *Tiers) DiskUsage(id string) (int64, int64, error) { return t.of(id).DiskUsage(id) }

// Leftovers implements Runtime: every tier's.
func (t *Tiers) Leftovers() ([]string, error) {
	ids, err := t.base.Leftovers()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, id := range ids {
		seen[id] = true
	}
	for _, r := range t.others {
		more, err := r.Leftovers()
		if err != nil {
			return nil, err
		}
		for _, id := range more {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	kept := ids[:0]
	for _, id := range ids {
		if !t.keeps(id) {
			kept = append(kept, id)
		}
	}
	return kept, nil
}

// keeps reports whether a tier made id ahead of time.
func (t *Tiers) keeps(id string) bool {
	for _, r := range t.others {
		if k, ok := r.(Keeper); ok && k.Keeps(id) {
			return true
		}
	}
	return false
}

// Close implements Runtime.
func (t *Tiers) Close() error {
	err := t.base.Close()
	for _, r := range t.others {
		if cerr := r.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// CloseOthers closes the tiers beside the base one, for a caller that
// closes the base itself.
func (t *Tiers) CloseOthers() error {
	var err error
	for _, r := range t.others {
		if cerr := r.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// SetPool implements Pools: the base tier's pools.
func (t *Tiers) SetPool(name string, src PoolSource, size int) {
	if p, ok := t.base.(Pools); ok {
		p.SetPool(name, src, size)
	}
}

// HasPoolRoom implements PoolRoom: the base tier's bound (true without
// one).
func (t *Tiers) HasPoolRoom() bool {
	if r, ok := t.base.(PoolRoom); ok {
		return r.HasPoolRoom()
	}
	return true
}

// PoolSizes implements Pools: the base tier's pools and the other
// tiers' (named by them: "gvisor:image:host").
func (t *Tiers) PoolSizes() map[string]int {
	return t.pools(func(p poolReporter) map[string]int { return p.PoolSizes() })
}

// PoolTargets implements Pools.
func (t *Tiers) PoolTargets() map[string]int {
	return t.pools(func(p poolReporter) map[string]int { return p.PoolTargets() })
}

func (t *Tiers) pools(of func(poolReporter) map[string]int) map[string]int {
	m := map[string]int{}
	if p, ok := t.base.(poolReporter); ok {
		for k, v := range of(p) {
			m[k] = v
		}
	}
	for _, r := range t.others {
		if p, ok := r.(poolReporter); ok {
			for k, v := range of(p) {
				m[k] = v
			}
		}
	}
	return m
}
