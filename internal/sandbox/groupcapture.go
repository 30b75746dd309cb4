package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// A snapshot or fork of a sandbox of several containers captures every
// container's disk in one freeze: each capture flushes its disk while the
// sandbox runs (as a single sandbox's does), then waits at a barrier; the
// last to arrive freezes the sandbox's cgroup, which holds its members',
// and all clone their disks at once; the last to finish thaws it. One
// capture that fails before the barrier fails the others before any
// freeze.

// groupCapture is the captures of a group: the first's, then each
// member's.
type groupCapture struct {
	caps []runtime.Capture
	// Frozen is how long the group's processes were frozen.
	Frozen time.Duration
}

// sum is the group's capture as one: the first's size, every disk's
// allocation, shared if all are, and the group's freeze.
func (g groupCapture) sum() runtime.Capture {
	if len(g.caps) == 0 {
		return runtime.Capture{}
	}
	c := g.caps[0]
	for _, o := range g.caps[1:] {
		c.Allocated += o.Allocated
		c.Shared = c.Shared && o.Shared
		c.Total = max(c.Total, o.Total)
	}
	c.Frozen = g.Frozen
	return c
}

// groupDisks says where a group's capture writes each disk: the first
// container's to first, each member's to member(name), each shared
// volume's to shared(name), and each named volume in volumes (those a
// fork with copy_volumes copies) to its file there.
type groupDisks struct {
	first   string
	member  func(name string) string
	shared  func(name string) string
	volumes map[string]string
}

// captureGroupLocked copies every disk of b (see groupDisks) in one
// freeze while b runs; a frozen, paused or stopped group, whose
// processes do not run, is copied as it is. b.mu is held.
func (m *Manager) captureGroupLocked(ctx context.Context, b *box, to groupDisks) (groupCapture, error) {
	mv, err := next(b, actSnapshot)
	if err != nil {
		return groupCapture{}, err
	}
	if b.rec.ArchivedDisk != nil {
		return groupCapture{}, errdefs.Conflict("sandbox %s is archived: resume it first", b.rec.ID)
	}
	live := mv.step == stepLive
	if live && b.inst == nil {
		return groupCapture{}, errdefs.Conflict("sandbox %s has no guest to capture", b.rec.ID)
	}
	ids, dsts := []string{b.rec.ID}, []string{to.first}
	for i, c := range b.rec.Containers[1:] {
		if live && (c.State != api.StateRunning || i >= len(b.members) || b.members[i] == nil) {
			return groupCapture{}, errdefs.Conflict("container %s of sandbox %s is not running (%s): a capture needs every container", c.Name, b.rec.ID, c.Error)
		}
		ids = append(ids, runtime.ContainerID(b.rec.ID, c.Name))
		dsts = append(dsts, to.member(c.Name))
	}
	// The shared volumes' copies wait at the same barrier: what one
	// container wrote to them just before is in the snapshot with its disk.
	nDisks := len(ids)
	for _, v := range b.rec.SharedVolumes {
		ids = append(ids, v.Volume)
		dsts = append(dsts, to.shared(v.Name))
	}
	for _, name := range slices.Sorted(maps.Keys(to.volumes)) {
		ids = append(ids, name)
		dsts = append(dsts, to.volumes[name])
	}
	// Not live, nothing runs: each copy goes as it is, without a pause.
	pause := func(*bool) func() (func(), error) { return nil }
	var g *groupFreeze
	if live {
		inst := b.inst
		g = &groupFreeze{
			n:      len(ids),
			all:    make(chan struct{}),
			freeze: func() error { return inst.Freeze(ctx) },
			thaw: func() {
				if err := inst.Thaw(); err != nil {
					m.log.Error("thawing a sandbox after a snapshot", "sandbox", b.rec.ID, "err", err)
				}
			},
		}
		pause = g.pause
	}
	out := groupCapture{caps: make([]runtime.Capture, nDisks)}
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			arrived := false
			if i < nDisks {
				out.caps[i], errs[i] = m.cfg.Runtime.Snapshot(ctx, ids[i], dsts[i], pause(&arrived))
			} else {
				errs[i] = m.cfg.Volumes.Capture(ctx, ids[i], dsts[i], pause(&arrived))
			}
			if errs[i] != nil && !arrived && g != nil {
				g.fail(errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, d := range dsts {
			os.Remove(d)
		}
		return groupCapture{}, fmt.Errorf("capturing %s: %w", b.rec.ID, err)
	}
	if g != nil {
		out.Frozen = g.window
		m.log.Debug("group captured", "sandbox", b.rec.ID, "frozen", g.window, "freezing", g.froze, "disks", len(ids))
	}
	return out, nil
}

// namedVolumes are the named volumes of r's nodeMounts, by name: those
// a fork shares with its source unless it copies them.
func (r *record) namedVolumes() []string {
	var names []string
	for _, v := range r.nodeMounts() {
		if v.Name != "" && !slices.Contains(names, v.Name) {
			names = append(names, v.Name)
		}
	}
	slices.Sort(names)
	return names
}

// nodeMounts are what r's containers mount that stays on this node: its
// mounts but its shared volumes (named volumes and directory snapshots).
func (r *record) nodeMounts() []api.VolumeMount {
	shared := map[string]bool{}
	for _, v := range r.SharedVolumes {
		shared[v.Volume] = true
	}
	var out []api.VolumeMount
	add := func(vols []api.VolumeMount) {
		for _, v := range vols {
			if v.Name == "" || !shared[v.Name] {
				out = append(out, v)
			}
		}
	}
	add(r.Volumes)
	for _, mr := range r.Members {
		add(mr.Volumes)
	}
	return out
}

// groupFreeze is the barrier of a group's captures (see above).
type groupFreeze struct {
	n      int
	freeze func() error
	thaw   func()

	mu      sync.Mutex
	arrived int
	resumed int
	all     chan struct{} // closed once all arrived (and froze) or one failed first
	err     error         // why no capture may go on; set before all closes
	at      time.Time
	froze   time.Duration // of window, what the freeze took
	window  time.Duration
}

// pause is one capture's pause: it waits for the others, and the last to
// arrive freezes the group.
func (g *groupFreeze) pause(arrived *bool) func() (func(), error) {
	return func() (func(), error) {
		*arrived = true
		g.mu.Lock()
		g.arrived++
		if g.arrived == g.n && g.err == nil {
			g.at = time.Now()
			err := g.freeze()
			g.froze = time.Since(g.at)
			if err != nil {
				g.thaw() // whatever froze
				g.err = fmt.Errorf("freezing: %w", err)
			}
			close(g.all)
		}
		g.mu.Unlock()
		<-g.all
		if g.err != nil {
			return nil, g.err
		}
		return g.resume, nil
	}
}

// resume ends one capture's pause; the last thaws the group.
func (g *groupFreeze) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resumed++; g.resumed == g.n {
		g.thaw()
		g.window = time.Since(g.at)
	}
}

// fail is a capture that ended before its pause: the others go no
// further.
func (g *groupFreeze) fail(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.err = fmt.Errorf("another container's capture failed: %w", err)
		close(g.all)
	}
}

// containerSpecs are b's containers as a create makes them again (a
// snapshot's, a fork's), each naming its exact image.
func (b *box) containerSpecs() ([]api.Container, []api.SharedVolume) {
	cs := make([]api.Container, len(b.rec.Containers))
	for i, c := range b.rec.Containers {
		cs[i] = c.Container
		cs[i].Image = imageRef(api.Sandbox{Image: c.Image, ImageID: c.ImageID})
	}
	shared := make([]api.SharedVolume, len(b.rec.SharedVolumes))
	for i, v := range b.rec.SharedVolumes {
		shared[i] = api.SharedVolume{Name: v.Name, SizeBytes: v.SizeBytes}
	}
	return cs, shared
}
