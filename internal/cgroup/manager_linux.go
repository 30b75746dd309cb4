package cgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// hierarchy is the part of a Manager that differs between v1 and v2.
type hierarchy interface {
	mode() Mode
	// setup creates the parent group at rel (e.g. "/paddock") and readies it
	// to hold children.
	setup(rel string) error
	// group returns the driver of the group at rel; it touches nothing.
	group(rel string) driver
}

// driver is the part of a Group that differs between v1 and v2.
type driver interface {
	// dirs are the group's directories, one per hierarchy it lives in.
	dirs() []string
	// controllerDir is the directory of controller c's files (c one of
	// v1Controllers): on v2 the group's one directory.
	controllerDir(c string) string
	// checkLimits refuses limits the hierarchy cannot enforce.
	checkLimits(l Limits) error
	// setLimits writes l; fresh is true on a just-made group, whose control
	// files still hold the kernel's defaults (unlimited).
	setLimits(l Limits, fresh bool) error
	stats() (Stats, error)
	freeze(ctx context.Context) error
	thaw() error
	// killAll kills every process with the kernel's own group kill; ok is
	// false when the kernel has none (v1, v2 before 5.14).
	killAll() (ok bool, err error)
	oomEventsPath() (string, error)
	// setBackground sets the group's CPU weight to a nice-10 task's (on)
	// or back to the kernel's default, a nice-0 task's (off).
	setBackground(on bool) error
	// dir is the single directory a CLONE_INTO_CGROUP fd can name (v2 only).
	dir() (string, error)
}

// Manager owns a parent group under which each sandbox gets a child group
// named by the sandbox id. It is safe for concurrent use.
type Manager struct {
	h      hierarchy
	parent string // "/paddock": relative to the hierarchy roots
	log    *slog.Logger
}

// NewManager detects the host's cgroup mode, finds the hierarchies from
// /proc/self/mountinfo and creates parent in each hierarchy it uses. On v2 it
// enables the cpu, memory and pids controllers in cgroup.subtree_control of
// every group from the root down to parent; it moves no process.
//
// parent is a relative path such as "paddock" or "machine/paddock". A nil
// log discards.
func NewManager(parent string, log *slog.Logger) (*Manager, error) {
	if err := validateParent(parent); err != nil {
		return nil, err
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("finding cgroup mounts: %w", err)
	}
	mounts := parseMountinfo(mountinfo)
	var h hierarchy
	switch cgroups.Mode() {
	case cgroups.Legacy, cgroups.Hybrid:
		h, err = newV1Hierarchy(mounts.v1)
	case cgroups.Unified:
		if mounts.v2 == "" {
			return nil, fmt.Errorf("finding cgroup mounts: %w: no cgroup2 mount", errdefs.ErrUnavailable)
		}
		h = newV2Hierarchy(mounts.v2, true)
	default:
		return nil, fmt.Errorf("finding cgroup mounts: %w: no cgroup hierarchy mounted", errdefs.ErrUnavailable)
	}
	if err != nil {
		return nil, err
	}
	return newManager(parent, h, log)
}

// newManager is NewManager for a given hierarchy; tests use it to drive a
// v2 hierarchy on a hybrid host.
func newManager(parent string, h hierarchy, log *slog.Logger) (*Manager, error) {
	if err := validateParent(parent); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{h: h, parent: "/" + parent, log: log.With("cgroup_mode", h.mode().String())}
	if err := h.setup(m.parent); err != nil {
		return nil, fmt.Errorf("creating cgroup parent %s: %w", m.parent, err)
	}
	m.log.Debug("cgroup manager ready", "parent", m.parent, "dirs", h.group(m.parent).dirs())
	return m, nil
}

// Mode is the cgroup version m drives.
func (m *Manager) Mode() Mode { return m.h.mode() }

// Create makes the group for sandbox name with limits l (a name "id/child"
// makes a group inside sandbox id's: a container's; on v2 such a group
// takes no limits of its own, its sandbox's group running processes). It fails with an
// error wrapping errdefs.ErrConflict if the group exists in any hierarchy,
// and leaves nothing behind on any failure.
func (m *Manager) Create(name string, l Limits) (*Group, error) {
	if err := validateNested(name); err != nil {
		return nil, err
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	g := m.group(name)
	if err := g.d.checkLimits(l); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", g.rel, err)
	}
	// On v2 the group of a sandbox holds its processes, so the kernel
	// lets it enable no controllers for a child: a container's group
	// inside it has no limit files (checkLimits sees the parent's set).
	bare := g.bare
	if bare && l != (Limits{}) {
		return nil, fmt.Errorf("creating cgroup %s: %w: a group inside a sandbox's takes no limits of its own on cgroup v2", g.rel, errdefs.ErrUnavailable)
	}
	dirs := g.d.dirs()
	made := 0
	ok := false
	defer func() {
		if !ok {
			for _, d := range dirs[:made] {
				_ = unix.Rmdir(d)
			}
		}
	}()
	for _, d := range dirs {
		if err := unix.Mkdir(d, 0o755); err != nil {
			if err == unix.EEXIST {
				return nil, fmt.Errorf("creating cgroup %s: %w", g.rel, errdefs.Conflict("cgroup %q exists", name))
			}
			return nil, fmt.Errorf("creating cgroup %s: %w", g.rel, &os.PathError{Op: "mkdir", Path: d, Err: err})
		}
		made++
	}
	// Nor the settings a fresh group gets (swap off, memory.oom.group):
	// it has none of the controllers' files.
	if bare {
		ok = true
		return g, nil
	}
	if err := g.d.setLimits(l, true); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", g.rel, err)
	}
	ok = true
	return g, nil
}

// Rename gives group g the name to, keeping its processes, limits and the
// memory charged to it. Only cgroup v1 can rename a group (v2 has no
// rename): elsewhere it fails with an error wrapping errdefs.ErrUnavailable
// and the caller moves the processes instead (AddProc), which costs an RCU
// grace period per hierarchy. It fails with errdefs.ErrConflict if to
// exists; on failure g keeps its name everywhere.
func (m *Manager) Rename(g *Group, to string) (*Group, error) {
	if err := validateName(to); err != nil {
		return nil, err
	}
	if m.h.mode() != V1 {
		return nil, fmt.Errorf("renaming cgroup %s: %w", g.rel, errdefs.New(errdefs.ErrUnavailable, "only cgroup v1 renames groups"))
	}
	ng := m.group(to)
	from, dst := g.d.dirs(), ng.d.dirs()
	for i := range from {
		// kernfs takes no rename flags, and refuses an existing target
		// itself (EEXIST).
		err := unix.Rename(from[i], dst[i])
		if err == nil {
			continue
		}
		for j := i - 1; j >= 0; j-- {
			_ = unix.Rename(dst[j], from[j])
		}
		if err == unix.EEXIST || err == unix.ENOTEMPTY {
			return nil, fmt.Errorf("renaming cgroup %s: %w", g.rel, errdefs.Conflict("cgroup %q exists", to))
		}
		return nil, fmt.Errorf("renaming cgroup %s: %w", g.rel, &os.PathError{Op: "rename", Path: from[i], Err: err})
	}
	return ng, nil
}

// Load returns the existing group of sandbox name, for the daemon's
// reconcile after a restart. A group that a crash left half-made (present in
// some hierarchies only) loads too, so that it can be deleted. It fails with
// an error wrapping errdefs.ErrNotFound if the group exists nowhere.
func (m *Manager) Load(name string) (*Group, error) {
	if err := validateNested(name); err != nil {
		return nil, err
	}
	g := m.group(name)
	for _, d := range g.d.dirs() {
		if exists(d) {
			return g, nil
		}
	}
	return nil, fmt.Errorf("loading cgroup %s: %w", g.rel, errdefs.NotFound("cgroup", name))
}

// List returns the sorted names of the child groups that exist in any
// hierarchy, to find the ones no sandbox owns.
func (m *Manager) List() ([]string, error) {
	var names []string
	for _, d := range m.h.group(m.parent).dirs() {
		subs, err := subdirs(d)
		if err != nil {
			return nil, fmt.Errorf("listing cgroups: %w", err)
		}
		for _, s := range subs {
			if validateName(s) == nil {
				names = append(names, s)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Remove removes the parent group from every hierarchy. It fails with an
// error wrapping errdefs.ErrConflict while child groups exist. Directories
// above the parent that NewManager made are left alone.
func (m *Manager) Remove() error {
	for _, d := range m.h.group(m.parent).dirs() {
		if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
			perr := error(&os.PathError{Op: "rmdir", Path: d, Err: err})
			if err == unix.EBUSY {
				perr = fmt.Errorf("%w: it still has groups: %w", errdefs.ErrConflict, perr)
			}
			return fmt.Errorf("removing cgroup parent %s: %w", m.parent, perr)
		}
	}
	return nil
}

func (m *Manager) group(name string) *Group {
	rel := m.parent + "/" + name
	_, _, nested := strings.Cut(name, "/")
	g := &Group{name: name, rel: rel, d: m.h.group(rel), log: m.log, bare: nested && m.h.mode() == V2}
	if g.bare {
		g.sandbox = m.h.group(m.parent + "/" + strings.SplitN(name, "/", 2)[0])
	}
	return g
}

// Group is one sandbox's cgroup. Its methods are safe for concurrent use,
// but Freeze, Thaw and Kill act on one kernel state: callers that mix them
// on one group must order them.
type Group struct {
	name string
	rel  string
	d    driver
	log  *slog.Logger
	// bare is a container's group inside its sandbox's on v2: it has no
	// controller files (see Create); sandbox is that sandbox's group.
	bare    bool
	sandbox driver
}

// missing turns "no such file" from one of the group's control files into
// the category it means: the group is gone.
func (g *Group) missing(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return errdefs.NotFound("cgroup", g.name)
	}
	return err
}

// Name is the sandbox id the group is named by.
func (g *Group) Name() string { return g.name }

// Path is the group's path relative to the hierarchy roots, e.g.
// "/paddock/<name>".
func (g *Group) Path() string { return g.rel }

// Dirs are the group's directories, one per hierarchy it lives in, for
// reading its control files (tests check limits and freezing there).
func (g *Group) Dirs() []string { return g.d.dirs() }

// ControllerDir is the directory that holds controller c's control files
// for the group ("cpu", "cpuacct", "memory", "pids" or "freezer"): on v1
// that controller's hierarchy, on v2 the group's one directory.
func (g *Group) ControllerDir(c string) string { return g.d.controllerDir(c) }

// AddProc moves the process pid into the group in every hierarchy. It fails
// with an error wrapping errdefs.ErrNotFound if there is no such process.
func (g *Group) AddProc(pid int) error {
	return g.addProc(pid, g.d.dirs())
}

// addProc moves process pid into the group's directories dirs.
func (g *Group) addProc(pid int, dirs []string) error {
	if pid <= 0 {
		return errdefs.Invalid("pid", "must be positive, got %d", pid)
	}
	p := strconv.Itoa(pid)
	for _, d := range dirs {
		if err := writeFile(d+"/cgroup.procs", p); err != nil {
			if errors.Is(err, unix.ESRCH) {
				err = errdefs.NotFound("process", p)
			}
			return fmt.Errorf("adding process %d to cgroup %s: %w", pid, g.rel, g.missing(err))
		}
	}
	return nil
}

// OpenDirFD opens the group's directory O_PATH|O_DIRECTORY, for starting a
// process straight into the group with clone3 CLONE_INTO_CGROUP
// (syscall.SysProcAttr UseCgroupFD and CgroupFD, kernel 5.7+). v1 has no
// such thing: there it fails with an error wrapping errdefs.ErrUnavailable.
func (g *Group) OpenDirFD() (*os.File, error) {
	dir, err := g.d.dir()
	if err != nil {
		return nil, fmt.Errorf("opening cgroup %s: %w", g.rel, err)
	}
	fd, err := openFile(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil, fmt.Errorf("opening cgroup %s: %w", g.rel, g.missing(err))
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// OpenOOMEvents opens the file whose contents hold "oom_kill N", the number
// of processes the OOM killer killed in the group: v2 memory.events
// (pollable for changes), v1 memory.oom_control. Parse it with
// ParseOOMKills after reading from offset 0.
//
// A bare group (a container's on v2) has no memory.events: what can
// OOM-kill its processes is its sandbox's limit, so it opens its
// sandbox's, which counts the kills of the whole subtree.
func (g *Group) OpenOOMEvents() (*os.File, error) {
	d := g.d
	if g.bare {
		d = g.sandbox
	}
	path, err := d.oomEventsPath()
	if err != nil {
		return nil, fmt.Errorf("opening oom events of cgroup %s: %w", g.rel, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening oom events of cgroup %s: %w", g.rel, g.missing(err))
	}
	return f, nil
}

// Update changes the limits of a live group; they take effect at once.
// Memory goes first: lowering it below the group's usage makes the kernel
// reclaim, and if it cannot free enough, Update fails with an error wrapping
// errdefs.ErrConflict before it changes any other limit. Updates are
// otherwise not atomic: if a later limit fails, the earlier ones stay.
func (g *Group) Update(l Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if g.bare {
		// No limit files: none of its own is all it can have (a
		// restarted daemon sets a container's again, as none).
		if l != (Limits{}) {
			return fmt.Errorf("updating cgroup %s: %w: a group inside a sandbox's takes no limits of its own on cgroup v2", g.rel, errdefs.ErrUnavailable)
		}
		return nil
	}
	if err := g.d.checkLimits(l); err != nil {
		return fmt.Errorf("updating cgroup %s: %w", g.rel, err)
	}
	if err := g.d.setLimits(l, false); err != nil {
		return fmt.Errorf("updating cgroup %s: %w", g.rel, g.missing(err))
	}
	return nil
}

// SetBackground gives the group the CPU weight of a nice-10 task (on) or
// the kernel's default, a nice-0 task's (off). A process's nice value
// only weighs against the processes of its own group: the scheduler
// first shares the CPU between groups by their weight, so a group's
// weight is what makes work in it yield to other groups. Where the CPU
// controller is not enabled (v2) it does nothing.
func (g *Group) SetBackground(on bool) error {
	if g.bare {
		return nil // no cpu.weight: it shares its sandbox's
	}
	if err := g.d.setBackground(on); err != nil {
		return fmt.Errorf("setting the CPU weight of cgroup %s: %w", g.rel, g.missing(err))
	}
	return nil
}

// Stats reads the group's resource use.
func (g *Group) Stats() (Stats, error) {
	s, err := g.d.stats()
	if err != nil {
		return Stats{}, fmt.Errorf("reading stats of cgroup %s: %w", g.rel, g.missing(err))
	}
	return s, nil
}

// Freeze stops every process in the group and returns once the kernel
// reports the group frozen. If ctx ends first, the group is thawed again and
// ctx's error returned.
func (g *Group) Freeze(ctx context.Context) error {
	if err := g.d.freeze(ctx); err != nil {
		return fmt.Errorf("freezing cgroup %s: %w", g.rel, g.missing(err))
	}
	return nil
}

// Thaw lets a frozen group run again.
func (g *Group) Thaw() error {
	if err := g.d.thaw(); err != nil {
		return fmt.Errorf("thawing cgroup %s: %w", g.rel, g.missing(err))
	}
	return nil
}

// Pids lists the processes in the group and in any groups below it, sorted.
func (g *Group) Pids() ([]int, error) {
	var pids []int
	for _, d := range g.d.dirs() {
		var err error
		if pids, err = readProcs(d, pids); err != nil {
			return nil, fmt.Errorf("listing processes of cgroup %s: %w", g.rel, err)
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

// Bounds on the signal-by-signal kill.
const (
	killTimeout       = 5 * time.Second
	killFreezeTimeout = 100 * time.Millisecond
	killExitWait      = 50 * time.Millisecond
)

// Kill sends SIGKILL to every process in the group and the groups below it,
// in a way no fork can escape. With v2's cgroup.kill (kernel 5.14+) the
// kernel does that in one write and Kill returns at once; the processes may
// still be exiting, which Delete waits out. Otherwise Kill freezes the
// group, signals each process, thaws it and repeats until the group is
// empty, for at most 5 seconds. Killing a missing group is not an error.
func (g *Group) Kill() error {
	ok, err := g.d.killAll()
	if errors.Is(err, unix.ENOENT) {
		return nil // no group, no processes
	}
	if err != nil {
		return fmt.Errorf("killing cgroup %s: %w", g.rel, err)
	}
	if ok {
		return nil
	}
	if err := g.killEach(); err != nil {
		return fmt.Errorf("killing cgroup %s: %w", g.rel, err)
	}
	return nil
}

// killEach is Kill for kernels without cgroup.kill. Freezing first means a
// process cannot fork between being listed and being signalled; a frozen
// v1 task only dies once thawed, hence the thaw before waiting. An empty
// group is not frozen at all: a removed sandbox's group is empty by the
// time its teardown gets here (its guest, the pid namespace's init, died,
// and the kernel killed and reaped the namespace's other processes
// before that death was reported), and on v1 the first freeze and the
// last thaw on the host patch the kernel's code (the freezer's static
// key), which under churn cost more CPU than the rest of the teardown.
func (g *Group) killEach() error {
	if pids, err := g.Pids(); err == nil && len(pids) == 0 {
		return nil
	}
	deadline := time.Now().Add(killTimeout)
	for round := 1; ; round++ {
		fctx, cancel := context.WithTimeout(context.Background(), killFreezeTimeout)
		ferr := g.d.freeze(fctx)
		cancel()
		if ferr != nil {
			// A task in uninterruptible sleep can hold a group in FREEZING;
			// signalling without the freeze still kills all but new forks,
			// which the next round catches.
			g.log.Debug("killing cgroup without freezing it", "path", g.rel, "round", round, "err", ferr)
		}
		pids, err := g.Pids()
		if err == nil {
			for _, pid := range pids {
				if kerr := unix.Kill(pid, unix.SIGKILL); kerr != nil && kerr != unix.ESRCH {
					err = fmt.Errorf("signalling process %d: %w", pid, kerr)
					break
				}
			}
		}
		if ferr == nil {
			if terr := g.d.thaw(); terr != nil && !errors.Is(terr, unix.ENOENT) && err == nil {
				err = terr
			}
		}
		if err != nil || len(pids) == 0 {
			return err
		}
		wctx, cancel := context.WithTimeout(context.Background(), killExitWait)
		var left []int
		_ = poll(wctx, func() (bool, error) {
			left, err = g.Pids()
			return len(left) == 0, err
		})
		cancel()
		if err != nil || len(left) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes still in the group after %d rounds of SIGKILL: %v", len(left), round, left)
		}
	}
}

// DeleteIfEmpty removes the group, and any groups below it, from every
// hierarchy if no process is left in them, and reports whether it did:
// for a group whose processes have most likely ended, it costs the
// removals alone, where Kill first lists every hierarchy's processes
// (on v1 five reads of cgroup.procs, a sixth of a removed sandbox's
// teardown under churn: issue 21). A group with processes left stays,
// perhaps without the hierarchies that held none of them, for Kill and
// Delete; a missing group is removed already.
func (g *Group) DeleteIfEmpty() (bool, error) {
	busy, err := g.remove()
	if err != nil {
		return false, fmt.Errorf("deleting cgroup %s: %w", g.rel, err)
	}
	return busy == nil, nil
}

// Delete removes the group, and any groups below it, from every hierarchy.
// While processes are still exiting the kernel refuses (EBUSY); Delete
// retries until ctx ends. Deleting a missing group is not an error.
func (g *Group) Delete(ctx context.Context) error {
	var busy error
	err := poll(ctx, func() (bool, error) {
		var err error
		busy, err = g.remove()
		return busy == nil, err
	})
	if err != nil {
		if busy != nil && err == ctx.Err() {
			err = fmt.Errorf("%w: %w", err, busy)
		}
		return fmt.Errorf("deleting cgroup %s: %w", g.rel, err)
	}
	return nil
}

// remove removes the group's directory in each hierarchy, in order, up to
// the first the kernel refuses because processes are left in it (busy,
// the refusal); those removed before stay removed, and a missing one
// counts as removed.
func (g *Group) remove() (busy, err error) {
	for _, d := range g.d.dirs() {
		err := removeTree(d)
		if errors.Is(err, unix.EBUSY) {
			return err, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, nil
}
