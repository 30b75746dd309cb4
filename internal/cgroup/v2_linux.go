package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

var (
	_ hierarchy = (*v2Hierarchy)(nil)
	_ driver    = (*v2Group)(nil)
)

// controllers is a set of the v2 controllers paddock uses.
type controllers uint8

const (
	ctrlCPU controllers = 1 << iota
	ctrlMemory
	ctrlPids

	allControllers = ctrlCPU | ctrlMemory | ctrlPids
)

var controllerNames = []struct {
	c    controllers
	name string
}{{ctrlCPU, "cpu"}, {ctrlMemory, "memory"}, {ctrlPids, "pids"}}

// parseControllers reads a cgroup.controllers or cgroup.subtree_control
// line, keeping only the controllers paddock uses.
func parseControllers(b []byte) controllers {
	var set controllers
	for _, f := range strings.Fields(string(b)) {
		for _, n := range controllerNames {
			if f == n.name {
				set |= n.c
			}
		}
	}
	return set
}

// enable is the cgroup.subtree_control write that enables set: "+cpu +pids".
func (set controllers) enable() string {
	var parts []string
	for _, n := range controllerNames {
		if set&n.c != 0 {
			parts = append(parts, "+"+n.name)
		}
	}
	return strings.Join(parts, " ")
}

func (set controllers) String() string {
	var names []string
	for _, n := range controllerNames {
		if set&n.c != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// v2Hierarchy drives the unified hierarchy mounted at root.
type v2Hierarchy struct {
	root string
	// strict makes setup fail unless cpu, memory and pids can all be
	// enabled. Only tests turn it off, to drive a hybrid host's cgroup2
	// mount, which has no controllers.
	strict bool

	// Found by setup:
	ctrl    controllers // enabled for the parent's children
	swap    bool        // memory.swap.max exists (swap accounting is on)
	peak    bool        // memory.peak exists (5.19+)
	reclaim bool        // memory.reclaim exists (5.19+)
	oomGrp  bool        // memory.oom.group exists (4.19+)
	kill    bool        // cgroup.kill exists (5.14+)
	freezer bool        // cgroup.freeze exists (5.2+)
}

func newV2Hierarchy(root string, strict bool) *v2Hierarchy {
	return &v2Hierarchy{root: root, strict: strict}
}

func (h *v2Hierarchy) mode() Mode { return V2 }

// setup makes the parent and enables the controllers in the
// cgroup.subtree_control of each group from the root down to the parent,
// where they are not enabled already. The kernel refuses that (EBUSY) for
// a non-root group that has processes of its own: paddock's parents never
// do, and setup moves nothing.
func (h *v2Hierarchy) setup(rel string) error {
	parent := h.root + rel
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	dir := h.root
	rest := strings.TrimPrefix(rel, "/")
	for {
		b, err := readFile(dir + "/cgroup.controllers")
		if err != nil {
			return err
		}
		want := parseControllers(b)
		if h.strict && want != allControllers {
			return fmt.Errorf("%w: cgroup v2 controllers %s are not available in %s (only %q)",
				errdefs.ErrUnavailable, allControllers&^want, dir, strings.TrimSpace(string(b)))
		}
		b, err = readFile(dir + "/cgroup.subtree_control")
		if err != nil {
			return err
		}
		if missing := want &^ parseControllers(b); missing != 0 {
			if err := writeFile(dir+"/cgroup.subtree_control", missing.enable()); err != nil {
				return fmt.Errorf("enabling controllers %s: %w", missing, err)
			}
		}
		h.ctrl = want
		if rest == "" {
			break
		}
		elem, after, _ := strings.Cut(rest, "/")
		dir, rest = dir+"/"+elem, after
	}
	// The parent is not the root, so it has every file a child will have.
	h.swap = exists(parent + "/memory.swap.max")
	h.peak = exists(parent + "/memory.peak")
	h.reclaim = exists(parent + "/memory.reclaim")
	h.oomGrp = exists(parent + "/memory.oom.group")
	h.kill = exists(parent + "/cgroup.kill")
	h.freezer = exists(parent + "/cgroup.freeze")
	return nil
}

func (h *v2Hierarchy) group(rel string) driver {
	return &v2Group{h: h, path: h.root + rel}
}

// v2Group is a group's directory in the unified hierarchy.
type v2Group struct {
	h    *v2Hierarchy
	path string
}

func (g *v2Group) dirs() []string { return []string{g.path} }

func (g *v2Group) controllerDir(string) string { return g.path }

func (g *v2Group) checkLimits(l Limits) error {
	var need controllers
	if l.CPUs != 0 {
		need |= ctrlCPU
	}
	if l.MemoryBytes != 0 {
		need |= ctrlMemory
	}
	if l.Pids != 0 {
		need |= ctrlPids
	}
	if missing := need &^ g.h.ctrl; missing != 0 {
		return fmt.Errorf("%w: cgroup v2 controllers %s are not enabled", errdefs.ErrUnavailable, missing)
	}
	return nil
}

func (g *v2Group) setLimits(l Limits, fresh bool) error {
	ctrl := g.h.ctrl
	if ctrl&ctrlMemory != 0 {
		if !fresh || l.MemoryBytes != 0 {
			if err := g.setMemoryMax(l.MemoryBytes, fresh); err != nil {
				return err
			}
		}
		if fresh {
			if g.h.swap {
				if err := writeFile(g.path+"/memory.swap.max", "0"); err != nil {
					return err
				}
			}
			// An OOM kills the one biggest process, not the whole
			// sandbox (its guest PID 1 included).
			if g.h.oomGrp {
				if err := writeFile(g.path+"/memory.oom.group", "0"); err != nil {
					return err
				}
			}
		}
	}
	if ctrl&ctrlCPU != 0 && (!fresh || l.CPUs != 0) {
		if err := writeFile(g.path+"/cpu.max", formatCPUMax(l)); err != nil {
			return err
		}
	}
	if ctrl&ctrlPids != 0 && (!fresh || l.Pids != 0) {
		if err := writeFile(g.path+"/pids.max", formatV2(l.Pids)); err != nil {
			return err
		}
	}
	return nil
}

// setMemoryMax writes memory.max. Set below the group's usage, memory.max
// makes the kernel reclaim and, if that fails, OOM-kill inside the group.
// So a live group is first asked to reclaim the excess (memory.reclaim,
// 5.19+): if it cannot, the update fails and nothing is killed.
func (g *v2Group) setMemoryMax(limit int64, fresh bool) error {
	if !fresh && limit != 0 && g.h.reclaim {
		cur, err := readInt(g.path + "/memory.current")
		if err != nil {
			return err
		}
		if cur > limit {
			err := writeFile(g.path+"/memory.reclaim", strconv.FormatInt(cur-limit, 10))
			if errors.Is(err, unix.EAGAIN) {
				return fmt.Errorf("%w: memory use %d could not be reclaimed below %d bytes", errdefs.ErrConflict, cur, limit)
			}
			if err != nil {
				return err
			}
		}
	}
	return writeFile(g.path+"/memory.max", formatV2(limit))
}

func (g *v2Group) stats() (Stats, error) {
	var (
		s Stats
		r statReader
	)
	// cpu.stat exists with or without the cpu controller; if the group is
	// gone, its error is the one to report.
	b, err := readFile(g.path + "/cpu.stat")
	if err != nil {
		return s, err
	}
	usage, _, err := keyedUint(b, "usage_usec")
	if err != nil {
		return s, err
	}
	throttled, _, err := keyedUint(b, "throttled_usec")
	if err != nil {
		return s, err
	}
	s.CPUUsageNanos, s.CPUThrottledNanos = usage*1000, throttled*1000
	if g.h.ctrl&ctrlMemory != 0 {
		s.MemoryCurrent = r.int(g.path + "/memory.current")
		if g.h.peak {
			s.MemoryPeak = r.int(g.path + "/memory.peak")
		}
		s.MemoryLimit = r.limit(g.path + "/memory.max")
		s.OOMKills = r.keyed(g.path+"/memory.events", "oom_kill")
	}
	if g.h.ctrl&ctrlPids != 0 {
		s.PidsCurrent = r.int(g.path + "/pids.current")
		s.PidsLimit = r.limit(g.path + "/pids.max")
	}
	return s, r.err
}

func (g *v2Group) freeze(ctx context.Context) error {
	if !g.h.freezer {
		return fmt.Errorf("%w: no cgroup.freeze (kernel before 5.2)", errdefs.ErrUnavailable)
	}
	if err := writeFile(g.path+"/cgroup.freeze", "1"); err != nil {
		return err
	}
	err := poll(ctx, func() (bool, error) {
		b, err := readFile(g.path + "/cgroup.events")
		if err != nil {
			return false, err
		}
		frozen, _, err := keyedUint(b, "frozen")
		return frozen == 1, err
	})
	if err != nil {
		_ = writeFile(g.path+"/cgroup.freeze", "0")
	}
	return err
}

func (g *v2Group) setBackground(on bool) error {
	if g.h.ctrl&ctrlCPU == 0 {
		return nil
	}
	v := v2WeightDefault
	if on {
		v = v2WeightBackground
	}
	return writeFile(g.path+"/cpu.weight", v)
}

func (g *v2Group) thaw() error {
	if !g.h.freezer {
		return fmt.Errorf("%w: no cgroup.freeze (kernel before 5.2)", errdefs.ErrUnavailable)
	}
	return writeFile(g.path+"/cgroup.freeze", "0")
}

func (g *v2Group) killAll() (bool, error) {
	if !g.h.kill {
		return false, nil
	}
	return true, writeFile(g.path+"/cgroup.kill", "1")
}

func (g *v2Group) oomEventsPath() (string, error) {
	if g.h.ctrl&ctrlMemory == 0 {
		return "", fmt.Errorf("%w: the cgroup v2 memory controller is not enabled", errdefs.ErrUnavailable)
	}
	return g.path + "/memory.events", nil
}

func (g *v2Group) dir() (string, error) { return g.path, nil }
