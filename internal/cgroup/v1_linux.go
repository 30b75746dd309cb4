package cgroup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

var (
	_ hierarchy = (*v1Hierarchy)(nil)
	_ driver    = (*v1Group)(nil)
)

// v1Hierarchy drives the v1 controllers in v1Controllers, each of which may
// be mounted on its own or co-mounted with others (cpu,cpuacct).
type v1Hierarchy struct {
	mounts map[string]string // controller → mount point
	memsw  bool              // memory.memsw.* exist: the kernel accounts swap
}

func newV1Hierarchy(mounts map[string]string) (*v1Hierarchy, error) {
	var missing []string
	for _, c := range v1Controllers {
		if mounts[c] == "" {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("finding cgroup mounts: %w: cgroup v1 controllers not mounted: %s",
			errdefs.ErrUnavailable, strings.Join(missing, ", "))
	}
	return &v1Hierarchy{mounts: mounts}, nil
}

func (h *v1Hierarchy) mode() Mode { return V1 }

func (h *v1Hierarchy) setup(rel string) error {
	g := h.group(rel).(*v1Group)
	for _, d := range g.all {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	h.memsw = exists(g.memory + "/memory.memsw.limit_in_bytes")
	return nil
}

func (h *v1Hierarchy) group(rel string) driver {
	g := &v1Group{
		cpu:     h.mounts["cpu"] + rel,
		cpuacct: h.mounts["cpuacct"] + rel,
		memory:  h.mounts["memory"] + rel,
		pids:    h.mounts["pids"] + rel,
		freezer: h.mounts["freezer"] + rel,
		memsw:   h.memsw,
	}
	g.all = make([]string, 0, len(v1Controllers))
	for _, d := range []string{g.cpu, g.cpuacct, g.memory, g.pids, g.freezer} {
		if !slices.Contains(g.all, d) {
			g.all = append(g.all, d)
		}
	}
	return g
}

// v1Group is a group's directory in each v1 controller's hierarchy.
type v1Group struct {
	cpu, cpuacct, memory, pids, freezer string
	all                                 []string // the distinct ones
	memsw                               bool
}

func (g *v1Group) dirs() []string { return g.all }

func (g *v1Group) controllerDir(c string) string {
	switch c {
	case "cpu":
		return g.cpu
	case "cpuacct":
		return g.cpuacct
	case "memory":
		return g.memory
	case "pids":
		return g.pids
	case "freezer":
		return g.freezer
	}
	return ""
}

func (g *v1Group) checkLimits(Limits) error { return nil }

func (g *v1Group) setLimits(l Limits, fresh bool) error {
	// Memory first: on a live group it is the limit that can fail.
	if !fresh || l.MemoryBytes != 0 {
		if err := g.setMemory(l.MemoryBytes); err != nil {
			return err
		}
	}
	if quota := l.cpuQuotaUS(); !fresh || quota != 0 {
		if err := writeFile(g.cpu+"/cpu.cfs_period_us", cpuPeriod); err != nil {
			return err
		}
		if err := writeFile(g.cpu+"/cpu.cfs_quota_us", formatV1(quota)); err != nil {
			return err
		}
	}
	if !fresh || l.Pids != 0 {
		if err := writeFile(g.pids+"/pids.max", formatV1PidsMax(l.Pids)); err != nil {
			return err
		}
	}
	return nil
}

// setMemory sets memory.limit_in_bytes and, where swap is accounted, the
// memory+swap limit to the same value, so the group cannot swap. The kernel
// keeps limit ≤ memsw limit at every step: lowering writes the memory
// limit first, raising the memsw limit first.
func (g *v1Group) setMemory(limit int64) error {
	v := formatV1(limit)
	mem := g.memory + "/memory.limit_in_bytes"
	memsw := g.memory + "/memory.memsw.limit_in_bytes"
	err := writeFile(mem, v)
	if err != nil && g.memsw && errors.Is(err, unix.EINVAL) {
		// Raising above the current memsw limit.
		if err := writeFile(memsw, v); err != nil {
			return err
		}
		return writeFile(mem, v)
	}
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%w: memory use could not be reclaimed below %d bytes: %w", errdefs.ErrConflict, limit, err)
		}
		return err
	}
	if g.memsw {
		if err := writeFile(memsw, v); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("%w: memory+swap use could not be reclaimed below %d bytes: %w", errdefs.ErrConflict, limit, err)
			}
			return err
		}
	}
	return nil
}

func (g *v1Group) stats() (Stats, error) {
	var (
		s Stats
		r statReader
	)
	// cpuacct.usage first: if the group is gone, that is the error to report.
	s.CPUUsageNanos = uint64(r.int(g.cpuacct + "/cpuacct.usage"))
	s.CPUThrottledNanos = r.keyed(g.cpu+"/cpu.stat", "throttled_time")
	s.MemoryCurrent = r.int(g.memory + "/memory.usage_in_bytes")
	s.MemoryPeak = r.int(g.memory + "/memory.max_usage_in_bytes")
	s.MemoryLimit = r.limit(g.memory + "/memory.limit_in_bytes")
	s.OOMKills = r.keyed(g.memory+"/memory.oom_control", "oom_kill")
	s.PidsCurrent = r.int(g.pids + "/pids.current")
	s.PidsLimit = r.limit(g.pids + "/pids.max")
	return s, r.err
}

// freeze follows runc: the freezer can sit in FREEZING while processes keep
// arriving (forks, writes to cgroup.procs), so it rewrites FROZEN on every
// try and now and then thaws to let the stragglers settle.
func (g *v1Group) freeze(ctx context.Context) error {
	state := g.freezer + "/freezer.state"
	tries := 0
	err := poll(ctx, func() (bool, error) {
		tries++
		if tries%50 == 0 {
			if err := writeFile(state, "THAWED"); err != nil {
				return false, err
			}
		}
		if err := writeFile(state, "FROZEN"); err != nil {
			return false, err
		}
		b, err := readFile(state)
		if err != nil {
			return false, err
		}
		return string(bytes.TrimSpace(b)) == "FROZEN", nil
	})
	if err != nil {
		_ = writeFile(state, "THAWED")
	}
	return err
}

func (g *v1Group) thaw() error {
	return writeFile(g.freezer+"/freezer.state", "THAWED")
}

func (g *v1Group) setBackground(on bool) error {
	v := v1SharesDefault
	if on {
		v = v1SharesBackground
	}
	return writeFile(g.cpu+"/cpu.shares", v)
}

func (g *v1Group) killAll() (bool, error) { return false, nil }

func (g *v1Group) oomEventsPath() (string, error) {
	return g.memory + "/memory.oom_control", nil
}

func (g *v1Group) dir() (string, error) {
	return "", fmt.Errorf("%w: cgroup v1 cannot start a process straight into a group", errdefs.ErrUnavailable)
}

// statReader reads a series of control files and keeps the first error.
type statReader struct{ err error }

func (r *statReader) int(path string) int64 {
	if r.err != nil {
		return 0
	}
	n, err := readInt(path)
	r.err = err
	return n
}

func (r *statReader) limit(path string) int64 {
	if r.err != nil {
		return 0
	}
	n, err := readLimit(path)
	r.err = err
	return n
}

func (r *statReader) keyed(path, key string) uint64 {
	if r.err != nil {
		return 0
	}
	n, err := readKeyed(path, key)
	r.err = err
	return n
}
