package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat on Linux.
const userHZ = 100

// cpuUse is CPU time spent over a wall-clock interval, split by who spent it.
type cpuUse struct {
	Wall      time.Duration
	Daemon    time.Duration // the daemon process, all threads
	Sandboxes time.Duration // every process in the measured sandboxes' cgroups
	Guests    time.Duration // of which the sandboxes' guests (PID 1 inside)
	Harness   time.Duration // this process: the SDK client side
}

func (u cpuUse) String() string {
	return fmt.Sprintf("daemon %s, sandboxes %s (of which their guests %s), harness (SDK side) %s, over %s wall",
		seconds(u.Daemon), seconds(u.Sandboxes), seconds(u.Guests), seconds(u.Harness), seconds(u.Wall))
}

// cpuMeter measures cpuUse from its start to stop.
type cpuMeter struct {
	daemonPID int
	sandboxes []api.RuntimeInfo
	t0        time.Time
	start     cpuUse
}

func startCPU(daemonPID int, sandboxes []api.RuntimeInfo) *cpuMeter {
	m := &cpuMeter{daemonPID: daemonPID, sandboxes: sandboxes}
	m.start = m.read()
	m.t0 = time.Now()
	return m
}

func (m *cpuMeter) stop() cpuUse {
	wall := time.Since(m.t0)
	end := m.read()
	return cpuUse{
		Wall:      wall,
		Daemon:    end.Daemon - m.start.Daemon,
		Sandboxes: end.Sandboxes - m.start.Sandboxes,
		Guests:    end.Guests - m.start.Guests,
		Harness:   end.Harness - m.start.Harness,
	}
}

func (m *cpuMeter) read() cpuUse {
	var u cpuUse
	u.Daemon, _ = processCPU(m.daemonPID)
	for _, sb := range m.sandboxes {
		d, _ := cgroupCPU(sb.Cgroup)
		u.Sandboxes += d
		g, _ := processCPU(sb.HostPID)
		u.Guests += g
	}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		u.Harness = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return u
}

// processCPU is utime+stime of a process (all its threads).
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	end := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[end+1:]))
	// After comm: state is field 3 of stat, utime 14 and stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return time.Duration(ut+st) * time.Second / userHZ, nil
}

// statCPU is utime+stime and cutime+cstime (its reaped children's) of
// a process.
func statCPU(pid int) (own, reaped time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	end := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[end+1:]))
	// After comm: utime, stime, cutime and cstime are fields 14-17 of stat.
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	var v [4]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[11+i], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("parsing /proc/%d/stat", pid)
		}
	}
	return time.Duration(v[0]+v[1]) * time.Second / userHZ, time.Duration(v[2]+v[3]) * time.Second / userHZ, nil
}

// treeUse is the CPU a daemon's process tree has spent: the daemon's own
// threads, and every process under it (the guest forkers, the guests
// they forked, the sandboxes' processes) with the CPU of those they
// reaped, which the kernel adds to the reaper's.
type treeUse struct {
	Daemon, Helpers, Cgroups time.Duration
	// Host is every CPU's busy time (/proc/stat), Client this process's
	// (the harness's clients): what the host spent besides the two and
	// the daemon's tree is the kernel's own workers (loop devices,
	// journals, cgroup and namespace teardown, RCU) and interrupts.
	Host, Client time.Duration
}

// readTree reads treeUse of the daemon pid whose sandboxes' cgroups lie
// under parent. Counting the live processes as well as the reaped ones
// keeps what a pool's guests spent before the interval out of it, and
// what they spent within it in.
func readTree(pid int, parent string) treeUse {
	var u treeUse
	own, reaped, _ := statCPU(pid)
	u.Daemon = own
	u.Helpers = reaped
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], p)
		}
	}
	todo := children[pid]
	for len(todo) > 0 {
		p := todo[len(todo)-1]
		todo = append(todo[:len(todo)-1], children[p]...)
		if own, reaped, err := statCPU(p); err == nil {
			u.Helpers += own + reaped
		}
	}
	u.Cgroups, _ = cgroupCPU(parent)
	if busy, _, err := cpuTicks(); err == nil {
		u.Host = time.Duration(busy) * time.Second / userHZ
	}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		u.Client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return u
}

func (u treeUse) sub(v treeUse) treeUse {
	return treeUse{Daemon: u.Daemon - v.Daemon, Helpers: u.Helpers - v.Helpers, Cgroups: u.Cgroups - v.Cgroups,
		Host: u.Host - v.Host, Client: u.Client - v.Client}
}

// perCycle says what u cost per cycle of n.
func (u treeUse) perCycle(n int) string {
	if n == 0 {
		return "no cycle"
	}
	per := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(n)/1e6) }
	out := fmt.Sprintf("%s in all: daemon %s, the processes under it (forkers, guests, sandboxes) %s (the sandboxes' cgroups %s)",
		per(u.Daemon+u.Helpers), per(u.Daemon), per(u.Helpers), per(u.Cgroups))
	if u.Host > 0 {
		out += fmt.Sprintf("; the whole host %s: the harness's clients %s, the kernel's own workers and interrupts %s (loop devices, journals, cgroup and namespace teardown)",
			per(u.Host), per(u.Client), per(max(0, u.Host-u.Daemon-u.Helpers-u.Client)))
	}
	return out
}

// cgroupCPU is the CPU time charged to cgroup cg (cpuacct.usage on v1,
// cpu.stat usage_usec on v2).
func cgroupCPU(cg string) (time.Duration, error) {
	if cgroupV2Only() {
		v, err := kvField(filepath.Join("/sys/fs/cgroup", cg, "cpu.stat"), "usage_usec")
		return time.Duration(v) * time.Microsecond, err
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", cg, "cpuacct.usage"))
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns), err
}

// kvField reads "key value" lines (cpu.stat, memory.stat).
func kvField(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s has no %s", path, key)
}
