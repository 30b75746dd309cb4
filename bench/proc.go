package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// procStatusBytes reads a "kB" field (VmRSS, ...) of /proc/<pid>/status.
func procStatusBytes(pid int, field string) (int64, error) {
	return kbField(fmt.Sprintf("/proc/%d/status", pid), field)
}

// memAvailable is the system's MemAvailable.
func memAvailable() (int64, error) { return kbField("/proc/meminfo", "MemAvailable") }

// procStatusCount reads a plain number field (Threads, ...) of
// /proc/<pid>/status.
func procStatusCount(pid int, field string) (int64, error) {
	return numField(fmt.Sprintf("/proc/%d/status", pid), field)
}

func kbField(path, field string) (int64, error) {
	n, err := numField(path, field)
	return n << 10, err
}

// numField reads field's number in a "Name: value [kB]" file.
func numField(path, field string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing %s in %s: %w", field, path, err)
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s has no %s", path, field)
}

// procStat is what the harness needs from /proc/<pid>/stat.
type procStat struct {
	PID   int
	Comm  string
	State byte
	PPID  int
	// Start is the process's start time in clock ticks since boot: a pid
	// with another start time is another process.
	Start uint64
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// comm is in parentheses and may itself hold spaces or parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	rest := strings.Fields(string(b[end+1:]))
	if len(rest) < 2 || len(rest[0]) != 1 {
		return procStat{}, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	ppid, err := strconv.Atoi(rest[1])
	if err != nil {
		return procStat{}, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
	}
	st := procStat{PID: pid, Comm: string(b[open+1 : end]), State: rest[0][0], PPID: ppid}
	if len(rest) > 19 {
		st.Start, _ = strconv.ParseUint(rest[19], 10, 64)
	}
	return st, nil
}

// allPIDs lists the processes in /proc.
func allPIDs() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// childrenOf returns the processes whose parent is ppid.
func childrenOf(ppid int) []procStat {
	pids, _ := allPIDs()
	var out []procStat
	for _, pid := range pids {
		st, err := readProcStat(pid)
		if err == nil && st.PPID == ppid {
			out = append(out, st)
		}
	}
	return out
}

// threadsCPU is the CPU time all of pid's threads have run, from
// schedstat (nanosecond resolution, unlike /proc/<pid>/stat's ticks).
func threadsCPU(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing schedstat of %d: %w", pid, err)
		}
		total += time.Duration(ns)
	}
	return total, nil
}

// uptimeTicks is the time since boot in clock ticks, the unit of a
// process's start time in /proc/<pid>/stat (USER_HZ, 100 on Linux).
func uptimeTicks() (uint64, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("parsing /proc/uptime: empty")
	}
	secs, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parsing /proc/uptime: %w", err)
	}
	return uint64(secs * 100), nil
}

// threadSwitches is the context switches of all pid's threads,
// voluntary and not.
func threadSwitches(pid int) (int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	total := 0
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok || k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches" {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, fmt.Errorf("parsing %s of %d: %w", k, pid, err)
			}
			total += n
		}
	}
	return total, nil
}

// helperChildren are pid's children that are not sandbox guests: tools
// such as mkfs.ext4 that the daemon runs in the background.
func helperChildren(pid int) []procStat {
	var out []procStat
	for _, c := range childrenOf(pid) {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", c.PID))
		if !strings.HasPrefix(exe, "/memfd:") && c.State != 'Z' {
			out = append(out, c)
		}
	}
	return out
}

// Quiescence thresholds: the daemon is idle when it and its children
// (guests, warm or in use, and helpers) used less than idleCPU over
// idleWindow and it runs no helper process.
const (
	idleWindow  = 10 * time.Millisecond
	idleCPU     = 200 * time.Microsecond
	idleTimeout = 2 * time.Second
)

// familyCPU is the CPU time of pid's threads and of its children's.
func familyCPU(pid int) (time.Duration, error) {
	total, err := threadsCPU(pid)
	if err != nil {
		return 0, err
	}
	for _, c := range childrenOf(pid) {
		if d, err := threadsCPU(c.PID); err == nil {
			total += d
		}
	}
	return total, nil
}

// waitIdle waits until the daemon has finished its background work (disk
// pool refills, warm guests, teardown), so that it does not land in the
// next timed region, which may be a peer's. It gives up quietly after
// idleTimeout.
func waitIdle(ctx context.Context, pid int) {
	deadline := time.Now().Add(idleTimeout)
	prev, err := familyCPU(pid)
	if err != nil {
		return
	}
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(idleWindow):
		}
		cur, err := familyCPU(pid)
		if err != nil {
			return
		}
		if cur-prev < idleCPU && len(helperChildren(pid)) == 0 {
			return
		}
		prev = cur
	}
}

// reapOrphans reaps zombie children of this process other than keep: as
// a child subreaper it inherits the guests and container processes whose
// parents exit.
func reapOrphans(keep int) int {
	n := 0
	for _, c := range childrenOf(os.Getpid()) {
		if c.PID == keep || c.State != 'Z' {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(c.PID, &ws, unix.WNOHANG, nil); err == nil && got == c.PID {
			n++
		}
	}
	return n
}

// cgroupV2Only reports whether /sys/fs/cgroup is a pure cgroup v2 mount.
func cgroupV2Only() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// memoryCgroupDir is the memory controller's directory of cgroup path cg
// (as reported by the daemon: "/parent/id").
func memoryCgroupDir(cg string) string {
	if cgroupV2Only() {
		return filepath.Join("/sys/fs/cgroup", cg)
	}
	return filepath.Join("/sys/fs/cgroup/memory", cg)
}

// cgroupMemory reads a cgroup's charged memory (usage_in_bytes on v1,
// memory.current on v2).
func cgroupMemory(cg string) (int64, error) {
	dir := memoryCgroupDir(cg)
	name := "memory.usage_in_bytes"
	if cgroupV2Only() {
		name = "memory.current"
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// cgroupProcs lists the processes in cgroup cg.
func cgroupProcs(cg string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(memoryCgroupDir(cg), "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
