package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// Blank guests are guests started ahead of time but bound to no image,
// disk or network: a process waiting in its fresh namespaces and its own
// cgroup, on its own uid range. Forking one is most of what a sandbox
// built on the spot costs (10-20 ms here: the fork into a new user
// namespace, the exec, the Go runtime's start), and it does not depend on
// what the sandbox is made from, so every start that no warm pool serves
// (a template without a pool, a snapshot, a resume, a fork) takes one and
// only binds it: network and disk, then the root filesystem.
//
// They are not frozen: an idle guest blocks in recvmsg and costs no CPU,
// and a thaw would be on the waiting start's path.
//
// The network is wired by sandbox id, and wiring costs milliseconds (a veth
// pair, addresses, a route, the CA). A new sandbox takes the guest's id,
// so the guests kept for new sandboxes are wired ahead of time too; a
// sandbox started again keeps its own id, so the guests kept for those are
// not, and are wired when bound, while the disk is got. Without a network
// the one kind serves both.

// blankKind says which starts a blank guest is kept for.
type blankKind int

const (
	forNew     blankKind = iota // a new sandbox: network wired under the guest's id
	forRestart                  // a sandbox started again: no network yet
	blankKinds
)

// blankKinds are the kinds kept: without a network, only forNew.
func (r *Runtime) blankKinds() []blankKind {
	if r.cfg.Network == nil {
		return []blankKind{forNew}
	}
	return []blankKind{forNew, forRestart}
}

// kindFor is the kind of blank guest that can start spec.
func (r *Runtime) kindFor(spec runtime.Spec) blankKind {
	if spec.ID == "" || r.cfg.Network == nil {
		return forNew
	}
	return forRestart
}

// takeBlank returns a live blank guest of kind k, or nil.
func (r *Runtime) takeBlank(k blankKind) *guestProc {
	for {
		r.mu.Lock()
		var g *guestProc
		if len(r.blank[k]) > 0 {
			g, r.blank[k] = r.blank[k][0], r.blank[k][1:]
		}
		r.mu.Unlock()
		if g == nil {
			return nil
		}
		if !g.sb.exited() {
			return g
		}
		r.discard(g)
	}
}

// newBlank starts a blank guest of kind k for the refill (which raised
// blankBuilding[k]).
func (r *Runtime) newBlank(k blankKind) (retErr error) {
	id := r.newBuildingID()
	var g *guestProc
	defer func() {
		r.mu.Lock()
		delete(r.building, id)
		r.blankBuilding[k]--
		keep := retErr == nil && len(r.blank[k]) < r.cfg.BlankGuests && !r.closing
		if keep {
			r.blank[k] = append(r.blank[k], g)
		}
		r.mu.Unlock()
		if retErr == nil && !keep {
			r.discard(g)
		}
	}()
	g, undo, err := r.startGuest(id, 0, filepath.Join(r.blankDir, id), true, nil)
	if err != nil {
		return err
	}
	if k == forNew && r.cfg.Network != nil {
		if err := r.attachNetwork(g); err != nil {
			undo()
			r.cfg.Network.Forget(id)
			return err
		}
		g.wired = true
	}
	return nil
}

// adoptBlank makes blank guest g the start of sandbox spec.ID (a new id
// when the runtime picks it: g's own). A sandbox started again keeps its
// id, so g's cgroup is replaced by one of that name and g moved into it;
// its uid range becomes the sandbox's (Info reports it), which only a disk
// with canonical owners allows (canAdopt). The run dir takes its name.
func (r *Runtime) adoptBlank(g *guestProc, spec *runtime.Spec) error {
	if spec.ID == "" {
		spec.ID = g.sb.id
	}
	if spec.ID != g.sb.id {
		cg, err := r.cfg.Cgroups.Rename(g.sb.cg, spec.ID)
		if errors.Is(err, errdefs.ErrUnavailable) {
			cg, err = r.moveCgroup(g, spec.ID)
		}
		if err != nil {
			return err
		}
		g.sb.cg = cg
		g.sb.id = spec.ID
	}
	dir := r.dir(spec.ID)
	// A sandbox started again has its old run dir (its log).
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing old run dir: %w", err)
	}
	if err := os.Rename(g.dir, dir); err != nil {
		return fmt.Errorf("moving guest dir: %w", err)
	}
	g.dir = dir
	g.sb.socket = filepath.Join(dir, "guest.sock")
	g.warm = false
	// It waited at the forker's low priority; someone waits for it now.
	raisePriority(g.sb.st.PID, g.sb.cg)
	g.raised = true
	return nil
}

// moveCgroup moves g into a new cgroup named id, where groups cannot be
// renamed (v2).
func (r *Runtime) moveCgroup(g *guestProc, id string) (*cgroup.Group, error) {
	cg, err := r.cfg.Cgroups.Create(id, cgroup.Limits{})
	if err != nil {
		return nil, fmt.Errorf("creating cgroup: %w", err)
	}
	if err := cg.AddProc(g.sb.st.PID); err != nil {
		cg.Delete(context.Background())
		return nil, fmt.Errorf("moving guest into its cgroup: %w", err)
	}
	// Empty now, and removed off the start's path. Memory the guest was
	// charged for before the move stays with the old group and goes to
	// the parent with it: the guest's own start-up pages, not the
	// sandbox's.
	old, oldID := g.sb.cg, g.sb.id
	go func() {
		if err := old.Delete(context.Background()); err != nil {
			r.log.Warn("removing a blank guest's cgroup", "cgroup", oldID, "err", err)
		}
	}()
	return cg, nil
}

// canAdopt reports whether a blank guest, on a uid range of its own, can
// start spec: a sandbox started again keeps its files, which another range
// can own only through idmapped mounts of a disk with canonical owners.
func (r *Runtime) canAdopt(spec runtime.Spec) bool {
	if spec.ID == "" || spec.UIDBase == 0 {
		return true
	}
	if !r.Idmapped() {
		return false
	}
	v, err := r.cfg.Disks.Open(spec.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return true
	}
	if err != nil {
		return false
	}
	for _, d := range []string{"", "upper"} {
		fi, err := os.Lstat(filepath.Join(v.Path, d))
		if err != nil {
			return d == "upper" && errors.Is(err, os.ErrNotExist)
		}
		if fi.Sys().(*syscall.Stat_t).Uid != 0 {
			return false
		}
	}
	return true
}

// blankFor returns a blank guest that can start spec, or nil.
func (r *Runtime) blankFor(spec runtime.Spec) *guestProc {
	if spec.Join != nil || !r.canAdopt(spec) {
		return nil
	}
	return r.takeBlank(r.kindFor(spec))
}

// bindBlank makes blank guest g sandbox spec.ID (filling in the id when
// the runtime picks it). On failure g is gone, and so is whatever was
// made for the sandbox but a disk that existed before.
func (r *Runtime) bindBlank(ctx context.Context, g *guestProc, spec *runtime.Spec, mark func(string)) error {
	picked := spec.ID == ""
	if err := r.adoptBlank(g, spec); err != nil {
		r.discard(g)
		return err
	}
	mark("adopted")
	if err := r.bind(ctx, g, *spec, spec.ID, mark); err != nil {
		g.kill()
		if err := r.Stop(context.Background(), spec.ID); err != nil {
			r.log.Warn("removing a sandbox's cgroup", "sandbox", spec.ID, "err", err)
		}
		if picked && r.cfg.Network != nil {
			r.cfg.Network.Forget(spec.ID) // nothing of it was the caller's
		}
		r.cfg.IDs.Free(g.sb.st.UIDBase)
		return err
	}
	return nil
}
