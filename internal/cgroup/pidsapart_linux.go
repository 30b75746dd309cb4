package cgroup

import (
	"fmt"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// A sandbox's pids limit is for the processes the sandbox runs, not for
// the threads of the guest that serves it. On v1 every controller's
// hierarchy places each thread on its own (the `tasks` file), so the two
// can be counted apart: the guest's process lives in the parent group of
// the pids hierarchy, where its forker started it (AddToParentPids),
// and the one thread it forks the sandbox's processes from joins the
// sandbox's group there (OpenPidsTasks), so that everything it forks
// starts in it. A guest at a full pids limit can still start the threads
// its runtime needs, and no longer keeps spare ones for that. v2 places
// a process's threads together for the pids controller (outside threaded
// subtrees, which the memory controller does not allow): these fail there
// with an error wrapping errdefs.ErrUnavailable.

// pidsApart is the v1 group's pids directory, or an error where its
// threads cannot be counted apart from the other controllers'.
func (g *Group) pidsApart() (*v1Group, error) {
	v1, ok := g.d.(*v1Group)
	if !ok {
		return nil, fmt.Errorf("%w: cgroup v2 counts a process's threads in one pids group", errdefs.ErrUnavailable)
	}
	for _, d := range []string{v1.cpu, v1.cpuacct, v1.memory, v1.freezer} {
		if d == v1.pids {
			return nil, fmt.Errorf("%w: the pids controller is co-mounted with another", errdefs.ErrUnavailable)
		}
	}
	return v1, nil
}

// AddToParentPids moves process pid into the manager's parent group in
// the pids hierarchy (v1): the guest forker, whose guests start there.
func (m *Manager) AddToParentPids(pid int) error {
	parent := m.h.group(m.parent)
	g := &Group{name: "", rel: m.parent, d: parent, log: m.log}
	v1, err := g.pidsApart()
	if err != nil {
		return err
	}
	if err := writeFile(v1.pids+"/cgroup.procs", strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("adding process %d to the pids group %s: %w", pid, m.parent, err)
	}
	return nil
}

// AddProcButPids moves process pid into the group in every hierarchy
// but pids (v1), where it stays where it is.
func (g *Group) AddProcButPids(pid int) error {
	v1, err := g.pidsApart()
	if err != nil {
		return err
	}
	dirs := slices.DeleteFunc(slices.Clone(v1.all), func(d string) bool { return d == v1.pids })
	return g.addProc(pid, dirs)
}

// OpenPidsTasks opens the group's v1 pids `tasks` file for writing. The
// kernel checks a write to it against the credentials of whoever opened
// it, so a process given this descriptor (a guest, whose host uid owns
// nothing in cgroupfs) can move a thread of its own into the group:
// writing "0" moves the writing thread.
func (g *Group) OpenPidsTasks() (*os.File, error) {
	v1, err := g.pidsApart()
	if err != nil {
		return nil, err
	}
	path := v1.pids + "/tasks"
	fd, err := openFile(path, unix.O_WRONLY)
	if err != nil {
		return nil, fmt.Errorf("opening the pids tasks of cgroup %s: %w", g.rel, g.missing(err))
	}
	return os.NewFile(uintptr(fd), path), nil
}
