// Package cgroup owns the per-sandbox cgroups: their creation, limits, stats,
// freezing, killing and removal, on cgroup v1 (legacy or hybrid) and cgroup v2
// (unified).
//
// A Manager owns one parent group (for example "paddock") in every hierarchy
// it uses; each sandbox gets a child group named by its id. On v1 only the
// controllers paddock needs are used (cpu, cpuacct, memory, pids, freezer):
// cpuset in particular would need cpus and mems copied into every new group.
//
// Create is on the sandbox start path, so it writes the control files with
// raw syscalls and does no discovery: mount points and optional features are
// found once, in NewManager.
package cgroup

import (
	"fmt"
	"math"
	"strings"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Mode is the cgroup version a Manager drives.
type Mode int

const (
	// V1 drives the v1 controllers, on legacy and on hybrid hosts alike (a
	// hybrid host's cgroup2 mount has no controllers worth using).
	V1 Mode = 1
	// V2 drives the unified hierarchy.
	V2 Mode = 2
)

func (m Mode) String() string {
	switch m {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// cpuPeriodUS is the CFS period every group uses. 100ms is the kernel's
// default; writing it explicitly keeps quota arithmetic in one place.
const cpuPeriodUS = 100000

// The CPU weights of SetBackground: the kernel's default (a nice-0
// task's) and a nice-10 task's, 110/1024 of it (sched_prio_to_weight),
// in v1's cpu.shares and v2's cpu.weight (whose default is 100).
const (
	v1SharesDefault    = "1024"
	v1SharesBackground = "110"
	v2WeightDefault    = "100"
	v2WeightBackground = "11"
)

// Limits are the resource caps of one group. A zero field means unlimited.
type Limits struct {
	// CPUs is the CPU quota in cores (0.5 = half a core per 100ms period).
	CPUs float64
	// MemoryBytes is the hard memory cap, at least 1 MiB. Swap is disabled
	// for the group where the kernel accounts it (v1 memsw, v2
	// memory.swap.max), so the cap cannot be dodged by swapping; the OOM
	// killer stays enabled.
	MemoryBytes int64
	// Pids caps the number of tasks (processes and threads).
	Pids int64
}

// Bounds the kernel or common sense puts on Limits.
const (
	minCPUs        = 0.01    // a quota of 1ms per 100ms period: the kernel's minimum
	maxCPUs        = 10000   // far above any host; keeps the quota arithmetic exact
	minMemoryBytes = 1 << 20 // smaller is almost surely a unit mistake (MB for bytes)
	maxPids        = 1 << 22 // PID_MAX_LIMIT on 64-bit kernels
)

// Validate reports the first field of l the kernel would refuse, as an
// error wrapping errdefs.ErrInvalid.
func (l Limits) Validate() error {
	if math.IsNaN(l.CPUs) || l.CPUs < 0 || (l.CPUs > 0 && l.CPUs < minCPUs) || l.CPUs > maxCPUs {
		return errdefs.Invalid("cpus", "must be 0 (unlimited) or between %v and %v, got %v", minCPUs, maxCPUs, l.CPUs)
	}
	if l.MemoryBytes < 0 || (l.MemoryBytes > 0 && l.MemoryBytes < minMemoryBytes) {
		return errdefs.Invalid("memory_bytes", "must be 0 (unlimited) or at least %d, got %d", minMemoryBytes, l.MemoryBytes)
	}
	if l.Pids < 0 || l.Pids > maxPids {
		return errdefs.Invalid("pids", "must be 0 (unlimited) or at most %d, got %d", maxPids, l.Pids)
	}
	return nil
}

// cpuQuotaUS is the CFS quota for l in microseconds per cpuPeriodUS, or 0
// when the CPU is unlimited.
func (l Limits) cpuQuotaUS() int64 {
	if l.CPUs == 0 {
		return 0
	}
	return int64(math.Round(l.CPUs * cpuPeriodUS))
}

// Stats is a snapshot of a group's resource use. Fields whose controller is
// not enabled (possible only on v2) are zero.
type Stats struct {
	CPUUsageNanos     uint64
	CPUThrottledNanos uint64
	MemoryCurrent     int64
	MemoryPeak        int64 // v1 memory.max_usage_in_bytes; v2 memory.peak (kernel 5.19+)
	MemoryLimit       int64 // 0 if unlimited
	PidsCurrent       int64
	PidsLimit         int64 // 0 if unlimited
	OOMKills          uint64
}

// maxNameLen bounds a group name, which is a sandbox id.
const maxNameLen = 64

// validateName checks that name is a sandbox id: 1 to 64 of [a-z0-9-]. That
// keeps it a single path element that no cgroup control file can collide
// with (they all contain a dot).
func validateName(name string) error {
	if len(name) == 0 || len(name) > maxNameLen {
		return errdefs.Invalid("name", "must be 1 to %d characters, got %d", maxNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return errdefs.Invalid("name", "must be made of [a-z0-9-], got %q", name)
		}
	}
	return nil
}

// validateNested checks a name Create and Load take: a sandbox id, or
// one below another ("id/child", a container's group inside its
// sandbox's), so that a sandbox's limits bound its containers and
// removing its group removes theirs.
func validateNested(name string) error {
	parent, child, nested := strings.Cut(name, "/")
	if err := validateName(parent); err != nil || !nested {
		return err
	}
	return validateName(child)
}

// validateParent checks that parent is a clean relative path of ordinary
// elements ("paddock", "paddock-test-1", "machine/paddock").
func validateParent(parent string) error {
	if parent == "" {
		return errdefs.Invalid("parent", "must not be empty")
	}
	elem := 0
	for i := 0; i <= len(parent); i++ {
		if i < len(parent) && parent[i] != '/' {
			c := parent[i]
			if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' && c != '.' {
				return errdefs.Invalid("parent", "must be a relative path of [A-Za-z0-9._-] elements, got %q", parent)
			}
			continue
		}
		e := parent[elem:i]
		if e == "" || e == "." || e == ".." || len(e) > 255 {
			return errdefs.Invalid("parent", "must be a clean relative path, got %q", parent)
		}
		elem = i + 1
	}
	return nil
}
