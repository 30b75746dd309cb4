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
