package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const (
	densitySettle = 2 * time.Second
	// densityDisk is each density sandbox's disk: the host's free space
	// times the bench's --disk-overcommit cannot promise a thousand disks
	// of the default 10 GiB (see densityMethod).
	densityDisk = 128 << 20
	// densityCPUs and densityMemory are each density sandbox's limits:
	// admission (CPU ×256 and memory ×16 of the host's, by default) would
	// refuse the thousandth sandbox of the default 2 CPUs and 1 GiB.
	densityCPUs   = 0.25
	densityMemory = 256 << 20
	// densityCalibrate sandboxes are started first; what they cost is
	// projected to the whole count and checked against the host's limits.
	densityCalibrate  = 50
	densityWatchEvery = 10 // starts between two checks of the host's limits
	densityRTTs       = 100
	densityRTTWarmup  = 20
	densityRSSWait    = 10 * time.Second // for the daemon's RSS to fall back after the removals
	// densityTimeout bounds the section: a thousand starts and removals
	// at today's few per second take minutes.
	densityTimeout = 12 * time.Minute

	densityMemMax    = 3 << 20
	densityRSSMax    = 100 << 10
	densityRTTRatio  = 1.2
	densityAfterFrac = 0.10
	// maxSandboxes is the daemon's cap on uid ranges in use.
	maxSandboxes = 4096
)

// kernelStack is a thread's kernel stack on x86-64 (THREAD_SIZE).
const kernelStack = 16 << 10

// densityCount is how many sandboxes the density section starts (issue
// 21: 1000); -density lowers it for development.
var densityCount = 1000

func densityRequest() api.CreateRequest {
	return api.CreateRequest{Resources: api.Resources{CPUs: densityCPUs, MemoryBytes: densityMemory, DiskBytes: densityDisk}}
}

// memSnapshot is the host's and the daemon's memory at one moment.
type memSnapshot struct {
	DaemonRSS int64
	// DaemonAnon and DaemonFile split DaemonRSS: anonymous memory (the Go
	// heap, stacks, the runtime's own) and file pages (the binary's code
	// and data that have run).
	DaemonAnon, DaemonFile int64
	Available              int64
	Kernel                 kernelMemory
}

func (r *rig) memSnapshot() (memSnapshot, error) {
	var m memSnapshot
	var err error
	if m.DaemonRSS, err = r.daemon.rss(); err != nil {
		return memSnapshot{}, fmt.Errorf("reading daemon RSS: %w", err)
	}
	m.DaemonAnon, _ = procStatusBytes(r.daemon.pid(), "RssAnon")
	m.DaemonFile, _ = procStatusBytes(r.daemon.pid(), "RssFile")
	if m.Available, err = memAvailable(); err != nil {
		return memSnapshot{}, fmt.Errorf("reading MemAvailable: %w", err)
	}
	m.Kernel, _ = readKernelMemory()
	return m, nil
}

// goHeap is the daemon's Go runtime memory, from its Prometheus
// exposition (the Go collector's go_memstats_*): what it holds live and
// what it keeps from the kernel without using it.
type goHeap struct {
	Inuse    int64 // heap spans in use
	Alloc    int64 // the objects in them (live, or garbage not yet swept)
	Retained int64 // heap idle and not returned to the kernel
	Stacks   int64
	// Runtime is the runtime's own memory beside the heap and stacks:
	// span structures, GC metadata, profiling buckets and the rest
	// (go_memstats_{mspan,mcache,gc,buck_hash,other}_sys_bytes). It is
	// sized by the most the heap ever held and never returned.
	Runtime    int64
	Goroutines int64
	OK         bool
}

func (r *rig) goHeap(ctx context.Context) goHeap {
	b, err := r.client.Prometheus(ctx)
	if err != nil {
		return goHeap{}
	}
	v := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(name, "go_") {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			v[name] = int64(f)
		}
	}
	idle, idleOK := v["go_memstats_heap_idle_bytes"]
	inuse, inuseOK := v["go_memstats_heap_inuse_bytes"]
	var rt int64
	for _, k := range []string{"mspan", "mcache", "gc", "buck_hash", "other"} {
		rt += v["go_memstats_"+k+"_sys_bytes"]
	}
	return goHeap{Inuse: inuse, Alloc: v["go_memstats_heap_alloc_bytes"], Retained: idle - v["go_memstats_heap_released_bytes"], Stacks: v["go_memstats_stack_inuse_bytes"],
		Runtime: rt, Goroutines: v["go_goroutines"], OK: idleOK && inuseOK}
}

func (g goHeap) String() string {
	if !g.OK {
		return noPeerValue
	}
	return fmt.Sprintf("%s / %s / %s / %d", mib(g.Inuse), mib(g.Retained), mib(g.Stacks), g.Goroutines)
}

// sandboxMemory is what one running sandbox costs the host.
type sandboxMemory struct {
	GuestRSS int64 // the guest (PID 1 inside), as the host sees it
	GuestPSS int64 // the same with shared pages split among sharers
	ProcsRSS int64 // every process in the sandbox's cgroup
	// ProcsPSSAnon, ProcsPSSFile and ProcsPSSShmem split the PSS of
	// every process in its cgroup (smaps_rollup's Pss_Anon, Pss_File,
	// Pss_Shmem).
	ProcsPSSAnon, ProcsPSSFile, ProcsPSSShmem int64
	Procs                                     int
	Threads                                   int   // tasks of those processes (each takes a pid and a kernel stack)
	PageTables                                int64 // VmPTE of those processes
	CgroupMem                                 int64 // the sandbox's memory cgroup charge (-1 if unreadable)
}

// densityRun is what the density benchmark measured.
type densityRun struct {
	Count               int // sandboxes asked for
	Before, With, After memSnapshot
	HeapBefore          goHeap
	HeapWith, HeapAfter goHeap
	AfterWait           time.Duration // removal → the After reading
	Starts, Removes     []time.Duration
	StartTotal          time.Duration
	RemoveTotal         time.Duration
	TeardownWait        time.Duration // last delete answered → every sandbox cgroup gone
	Sandboxes           []sandboxMemory
	Sleeping            int // sandboxes whose sleep was running
	Running             int // sandboxes List reported running
	RTTOne, RTTMany     []time.Duration
	Projection          []string // the host limits checked before the bulk start
	// The daemon's CPU over densityIdleWindow, as a share of one core:
	// at rest before the first start, and with every sandbox idle.
	IdleCPUBefore, IdleCPUWith float64
}

// densityIdleWindow is how long the daemon's CPU is read while nothing
// but its own upkeep (sampling, self views, pools) runs.
const densityIdleWindow = 5 * time.Second

// idleCPU is the daemon's CPU over densityIdleWindow as a share of one
// core, or -1 if it could not be read.
func (r *rig) idleCPU(ctx context.Context) float64 {
	pid := r.daemon.pid()
	c0, err := processCPU(pid)
	t0 := time.Now()
	if err != nil {
		return -1
	}
	select {
	case <-ctx.Done():
		return -1
	case <-time.After(densityIdleWindow):
	}
	c1, err := processCPU(pid)
	if err != nil {
		return -1
	}
	return float64(c1-c0) / float64(time.Since(t0))
}

// benchDensity starts densityCount sandboxes, each with `sleep 3600`
// started through ExecStream and its stream closed (the process keeps
// running), measures what they cost the host and an exec round trip into
// one of them, and removes them.
func benchDensity(ctx context.Context, r *rig) *section {
	s := &section{Method: densityMethod()}
	d := densityRun{Count: densityCount}
	s.Err = r.density(ctx, &d)
	densityTable(s, &d)
	s.Bars = densityBars(&d)
	return s
}

func (r *rig) density(ctx context.Context, d *densityRun) error {
	req := densityRequest()
	if err := r.densityWarmUp(ctx, req); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := r.waitFullPool(ctx, defaultPool); err != nil {
		return err
	}
	var err error
	if d.Before, err = r.memSnapshot(); err != nil {
		return err
	}
	d.HeapBefore = r.goHeap(ctx)
	r.dumpMemory(ctx, "before")
	d.IdleCPUBefore = r.idleCPU(ctx)
	restCgroups := len(cgroupTree(r.cgroupParent))
	if d.Count > maxSandboxes {
		return fmt.Errorf("%d sandboxes asked for; the daemon gives out at most %d uid ranges", d.Count, maxSandboxes)
	}
	var (
		mu  sync.Mutex
		ids []string
	)
	// What the timed removal below did not get to.
	defer func() { r.removeConcurrently(ids, startWorkers) }()
	var started atomic.Int64
	start := func(ctx context.Context, n int) error {
		t0 := time.Now()
		made, err := r.startMany(ctx, n, startWorkers, func(ctx context.Context) (string, error) {
			if started.Add(1)%densityWatchEvery == 0 {
				if err := r.withinLimits(ctx, ids[0]); err != nil {
					return "", fmt.Errorf("after %d sandboxes: %w", started.Load(), err)
				}
			}
			t1 := time.Now()
			id, err := r.startSleeper(ctx, req)
			took := time.Since(t1)
			if err == nil {
				mu.Lock()
				d.Starts = append(d.Starts, took)
				mu.Unlock()
			}
			return id, err
		})
		d.StartTotal += time.Since(t0)
		ids = append(ids, made...)
		return err
	}

	// The round trip with one sandbox, in the first of them.
	if err := start(ctx, 1); err != nil {
		return err
	}
	r.idle(ctx)
	if d.RTTOne, err = r.rtts(ctx, ids[0]); err != nil {
		return err
	}
	// A few more, whose cost is projected to the whole count and checked
	// against the host's limits before the rest start.
	cal := min(densityCalibrate, d.Count) - 1
	h0, err := r.hostLimits(ctx, ids[0])
	if err != nil {
		return err
	}
	if err := start(ctx, cal); err != nil {
		return err
	}
	r.idle(ctx)
	h1, err := r.hostLimits(ctx, ids[0])
	if err != nil {
		return err
	}
	var problems []string
	d.Projection, problems = project(h0, h1, cal, d.Count-len(ids))
	if len(problems) > 0 {
		err := fmt.Errorf("%d sandboxes would not fit this host (projected from the first %d): %s", d.Count, len(ids), strings.Join(problems, "; "))
		// What the sandboxes made so far cost is still worth a table.
		with, merr := r.memSnapshot()
		if merr == nil {
			d.With = with
			d.Running, merr = r.countRunning(ctx, ids)
		}
		if merr == nil {
			merr = r.measureSandboxes(ctx, ids, d)
		}
		return errors.Join(err, merr)
	}
	if err := start(ctx, d.Count-len(ids)); err != nil {
		return err
	}
	r.log.Info("density: sandboxes running", "count", len(ids), "took", d.StartTotal.Round(time.Millisecond))

	time.Sleep(densitySettle)
	r.idle(ctx)
	if d.With, err = r.memSnapshot(); err != nil {
		return err
	}
	d.HeapWith = r.goHeap(ctx)
	r.dumpMemory(ctx, "with")
	if d.Running, err = r.countRunning(ctx, ids); err != nil {
		return err
	}
	if err := r.measureSandboxes(ctx, ids, d); err != nil {
		return err
	}
	r.idle(ctx)
	d.IdleCPUWith = r.idleCPU(ctx)
	if d.RTTMany, err = r.rtts(ctx, ids[0]); err != nil {
		return err
	}
	if err := r.timedRemove(ids, d); err != nil {
		return err
	}
	ids = nil
	t0 := time.Now()
	if left := r.waitTeardowns(ctx, restCgroups, teardownTimeout); left > restCgroups {
		return fmt.Errorf("%d sandbox cgroups still there %s after the last delete answered (%d at rest)", left-restCgroups, teardownTimeout, restCgroups)
	}
	d.TeardownWait = time.Since(t0)
	return r.rssAfter(ctx, d)
}

// densityWarmUp takes one sandbox through what each of the run's goes
// through (a sleeper started, an exec round trip, its record and metrics
// read, its removal) before the first reading, so that one-time costs
// are not in the numbers: code run for the first time (the daemon's
// binary pages, 1-2 MiB of its RSS when only a create and a removal came
// first) and tables built on first use.
func (r *rig) densityWarmUp(ctx context.Context, req api.CreateRequest) error {
	id, err := r.startSleeper(ctx, req)
	if id == "" {
		return err
	}
	if err == nil {
		_, err = r.execTrue(ctx, id)
	}
	if err == nil {
		_, err = r.client.Get(ctx, id)
	}
	if err == nil {
		_, err = r.hostLimits(ctx, id)
	}
	return errors.Join(err, r.removeAll([]string{id}))
}

// rtts takes densityRTTs exec round trips of `true` in a sandbox, after
// warm-ups.
func (r *rig) rtts(ctx context.Context, id string) ([]time.Duration, error) {
	var out []time.Duration
	for i := range densityRTTWarmup + densityRTTs {
		d, err := r.execTrue(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("exec round trip %d: %w", i+1, err)
		}
		if i >= densityRTTWarmup {
			out = append(out, d)
		}
	}
	return out, nil
}

// countRunning counts the sandboxes of ids that List reports running.
func (r *rig) countRunning(ctx context.Context, ids []string) (int, error) {
	list, err := r.client.List(ctx, client.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("listing sandboxes: %w", err)
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	n := 0
	for _, sb := range list {
		if want[sb.ID] && sb.State == api.StateRunning {
			n++
		}
	}
	return n, nil
}

// rssAfter reads the daemon's RSS after the removals: at densitySettle,
// then again until it is within densityAfterFrac of its start or
// densityRSSWait has passed (the Go runtime returns freed pages over
// time).
func (r *rig) rssAfter(ctx context.Context, d *densityRun) error {
	t0 := time.Now()
	time.Sleep(densitySettle)
	for {
		r.idle(ctx)
		var err error
		if d.After, err = r.memSnapshot(); err != nil {
			return err
		}
		d.AfterWait = time.Since(t0)
		d.HeapAfter = r.goHeap(ctx)
		if float64(d.After.DaemonRSS) <= float64(d.Before.DaemonRSS)*(1+densityAfterFrac) || d.AfterWait > densityRSSWait || ctx.Err() != nil {
			r.dumpMemory(ctx, "after")
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// startSleeper creates a sandbox and starts `sleep 3600` in it without
// waiting for it: the stream is closed once the process runs.
func (r *rig) startSleeper(ctx context.Context, req api.CreateRequest) (string, error) {
	sb, err := r.create(ctx, req)
	if err != nil {
		return "", err
	}
	st, err := r.client.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "3600"}}, false)
	if err != nil {
		return sb.ID, fmt.Errorf("starting sleep in %s: %w", sb.ID, err)
	}
	st.Close()
	return sb.ID, nil
}

// hostLimit is one of the host's limits a thousand sandboxes may reach:
// what is used now and what is available.
type hostLimit struct {
	Name      string
	Used      int64
	Available int64 // beyond Used, less a margin for the rest of the host
	Unit      func(int64) string
	// Projected: a projection that exceeds Available fails the run before
	// the bulk start. The host's tasks are only watched during it: other
	// work and kernel workers (loop devices') move them too much to
	// project from a few sandboxes.
	Projected bool
}

// hostLimits reads the limits the density run may reach: the daemon's
// open files against its RLIMIT_NOFILE, the host's tasks against pid_max,
// MemAvailable, and the free space below the daemon's storage.
func (r *rig) hostLimits(ctx context.Context, id string) ([]hostLimit, error) {
	pid := r.daemon.pid()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, fmt.Errorf("counting the daemon's open files: %w", err)
	}
	nofile, err := softLimit(pid, "Max open files")
	if err != nil {
		return nil, err
	}
	tasks, err := hostTasks()
	if err != nil {
		return nil, err
	}
	pidMax, err := readInt("/proc/sys/kernel/pid_max")
	if err != nil {
		return nil, err
	}
	avail, err := memAvailable()
	if err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(r.root, &st); err != nil {
		return nil, fmt.Errorf("reading the host's free space: %w", err)
	}
	free := int64(st.Bavail) * st.Bsize
	count := func(n int64) string { return fmt.Sprint(n) }
	m, err := r.client.Metrics(ctx, id, client.MetricsOptions{Since: time.Now()})
	if err != nil || m.Storage == nil {
		return nil, fmt.Errorf("reading the daemon's storage admission (metrics of %s): %v", id, err)
	}
	st2 := m.Storage
	admit := int64(float64(st2.FreeBytes)*st2.Overcommit) - st2.PromisedBytes
	// Margins: what the rest of the host (other work, the bench) needs.
	return []hostLimit{
		{"disk capacity the daemon admits (free space × overcommit − promised)", 0, admit - 4*densityDisk, mib, true},
		{"the daemon's open files (RLIMIT_NOFILE)", int64(len(fds)), nofile - int64(len(fds)) - 256, count, true},
		{"tasks on the host (kernel.pid_max)", tasks, pidMax - tasks - 1024, count, false},
		{"MemAvailable", 0, avail - 1<<30, mib, true},
		{"free space below the daemon's storage", 0, free - 1<<30, mib, true},
	}, nil
}

// withinLimits fails once a host limit is down to its margin.
func (r *rig) withinLimits(ctx context.Context, id string) error {
	h, err := r.hostLimits(ctx, id)
	if err != nil {
		return err
	}
	for _, l := range h {
		if l.Available < 0 {
			return fmt.Errorf("this host's limit is reached: %s, %s in use", l.Name, l.Unit(l.Used))
		}
	}
	return nil
}

// project scales what cal sandboxes cost (between before and after) to
// more sandboxes, and says which limit they would exceed.
func project(before, after []hostLimit, cal, more int) (lines, problems []string) {
	for i, a := range after {
		b := before[i]
		// Available is the limit less what is used (or a level read
		// directly): what it lost is what they took.
		per := b.Available - a.Available
		if cal <= 0 || per <= 0 {
			continue
		}
		per /= int64(cal)
		need := per * int64(more)
		lines = append(lines, fmt.Sprintf("%s: %s per sandbox, %s for %d more, %s left", a.Name, a.Unit(per), a.Unit(need), more, a.Unit(a.Available)))
		if need > a.Available && a.Projected {
			problems = append(problems, fmt.Sprintf("%s: %d more need about %s, %s left", a.Name, more, a.Unit(need), a.Unit(a.Available)))
		}
	}
	return lines, problems
}

// softLimit reads a soft limit of /proc/<pid>/limits.
func softLimit(pid int, name string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if f[0] == "unlimited" {
					return math.MaxInt64 / 2, nil
				}
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/limits has no %q", pid, name)
}

// hostTasks counts the threads on the host (each takes a pid).
func hostTasks() (int64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0, fmt.Errorf("parsing /proc/loadavg")
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, fmt.Errorf("parsing /proc/loadavg")
	}
	return strconv.ParseInt(total, 10, 64)
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func (r *rig) measureSandboxes(ctx context.Context, ids []string, d *densityRun) error {
	for _, id := range ids {
		sb, err := r.client.Get(ctx, id)
		if err != nil {
			return fmt.Errorf("inspecting %s: %w", id, err)
		}
		if sb.Runtime == nil || sb.Runtime.HostPID == 0 {
			return fmt.Errorf("sandbox %s reports no host pid", id)
		}
		m := sandboxMemory{CgroupMem: -1}
		if m.GuestRSS, err = procStatusBytes(sb.Runtime.HostPID, "VmRSS"); err != nil {
			return fmt.Errorf("reading guest RSS of %s: %w", id, err)
		}
		m.GuestPSS, _ = kbField(fmt.Sprintf("/proc/%d/smaps_rollup", sb.Runtime.HostPID), "Pss")
		if mem, err := cgroupMemory(sb.Runtime.Cgroup); err == nil {
			m.CgroupMem = mem
		}
		pids, _ := cgroupProcs(sb.Runtime.Cgroup)
		for _, pid := range pids {
			rss, err := procStatusBytes(pid, "VmRSS")
			if err == nil {
				m.ProcsRSS += rss
				m.Procs++
			}
			rollup := fmt.Sprintf("/proc/%d/smaps_rollup", pid)
			if n, err := kbField(rollup, "Pss_Anon"); err == nil {
				m.ProcsPSSAnon += n
			}
			if n, err := kbField(rollup, "Pss_File"); err == nil {
				m.ProcsPSSFile += n
			}
			if n, err := kbField(rollup, "Pss_Shmem"); err == nil {
				m.ProcsPSSShmem += n
			}
			if pte, err := procStatusBytes(pid, "VmPTE"); err == nil {
				m.PageTables += pte
			}
			if n, err := kbField(fmt.Sprintf("/proc/%d/status", pid), "Threads"); err == nil {
				m.Threads += int(n >> 10) // kbField reads a count as kB
			}
			if st, err := readProcStat(pid); err == nil && st.Comm == "sleep" {
				d.Sleeping++
			}
		}
		d.Sandboxes = append(d.Sandboxes, m)
	}
	return nil
}

// timedRemove deletes the sandboxes, startWorkers at a time, timing each
// delete and the whole.
func (r *rig) timedRemove(ids []string, d *densityRun) error {
	var mu sync.Mutex
	t0 := time.Now()
	_, err := r.startMany(context.Background(), len(ids), startWorkers, func(ctx context.Context) (string, error) {
		mu.Lock()
		id := ids[0]
		ids = ids[1:]
		mu.Unlock()
		t1 := time.Now()
		err := r.remove(ctx, id)
		took := time.Since(t1)
		mu.Lock()
		d.Removes = append(d.Removes, took)
		mu.Unlock()
		return "", err
	})
	d.RemoveTotal = time.Since(t0)
	return err
}

func densityMethod() []string {
	return []string{
		fmt.Sprintf("After one warm-up sandbox (started, its sleep started, an exec, its record and metrics read, removed: what each of the run's goes through), %d sandboxes are started, %d creates at a time (as fast as the daemon serves them). "+
			"Each start is `Create` then `ExecStream(sleep 3600)`, whose stream is closed as soon as the process runs; "+
			"the clock of a start runs around both calls, the total from the first to the last.", densityCount, startWorkers),
		fmt.Sprintf("Each sandbox asks for %.2g CPU, %s of memory and a %s disk instead of the defaults (2 CPUs, 1 GiB, 10 GiB): with the daemon's "+
			"default admission (CPU limits up to 256× the host's CPUs, memory limits up to 16× its memory) the 257th sandbox of 2 CPUs would be "+
			"refused, and the host's free disk space (a few GiB on this shared machine) times the bench's `--disk-overcommit %d` cannot promise a thousand 10 GiB disks. "+
			"An idle agent's sandbox needs neither; the limits cap a sandbox, they do not reserve anything. Disks of a size other than the "+
			"default are not served by the default pool's ready disks and warm guests: each is made and bound when it is asked for.",
			densityCPUs, mib(densityMemory), mib(densityDisk), diskOvercommit),
		fmt.Sprintf("Before the bulk start, the first %d sandboxes' cost in the daemon's open files (against its RLIMIT_NOFILE), MemAvailable and the free "+
			"space below the storage is projected to the whole count, and the section fails with that message instead of running into a limit; "+
			"those limits and the host's tasks (against kernel.pid_max) are checked again every %d starts. The uid ranges are capped at %d by the daemon.",
			densityCalibrate, densityWatchEvery, maxSandboxes),
		fmt.Sprintf("Memory is read %s after the last start, once the daemon is idle: the daemon's VmRSS "+
			"(/proc/PID/status; also split into RssAnon and RssFile, the pages of its binary) and its Go runtime's heap in use, idle heap not returned to the kernel, stacks and goroutines "+
			"(`go_memstats_*` and `go_goroutines` of its `/metrics`), the host's MemAvailable (/proc/meminfo) against the same readings before the first start, "+
			"and for each sandbox the VmRSS and PSS of its guest (host pid from `Get`: `runtime.host_pid`), the VmRSS of "+
			"every process in its cgroup with their page tables (VmPTE), threads (each a 16 KiB kernel stack) and PSS split into anonymous, file and shmem pages (smaps_rollup), and its memory cgroup's charge; "+
			"the host's /proc/meminfo fields and /proc/slabinfo caches before and with them say where the MemAvailable drop went. `List` is checked to report every sandbox running.", densitySettle),
		"MemAvailable also moves with unrelated activity on the host and with the page cache of the sandboxes' disk images: " +
			"read it as an estimate. RSS counts shared pages in every process that maps them; PSS splits them.",
		fmt.Sprintf("**exec round trip**: %d SDK round trips of `true` (after %d warm-ups) in the first sandbox, once while it is the only one "+
			"the harness made (the pools full) and again with all of them running.", densityRTTs, densityRTTWarmup),
		fmt.Sprintf("**daemon CPU while idle**: its utime+stime (/proc/PID/stat) over %s, once at rest before the first start and once with every sandbox "+
			"idle (before the second round trips): what sampling, self views and pools cost it with nothing asked of it.", densityIdleWindow),
		fmt.Sprintf("Then the sandboxes are removed, %d deletes at a time (`Delete` with force), each timed; the harness waits until the "+
			"daemon's cgroups are back to their number before the first start (a delete may answer first and tear down behind), and reads the "+
			"daemon's RSS %s later, and again every half second until it is within %.0f%% of its start or %s have passed.",
			startWorkers, densitySettle, densityAfterFrac*100, densityRSSWait),
	}
}

func densityTable(s *section, d *densityRun) {
	t := table{Header: []string{"measure", "value"}}
	if len(d.Starts) > 0 {
		sm := summarize(d.Starts)
		t.add(fmt.Sprintf("start %d sandboxes, %d at a time", len(d.Starts), startWorkers),
			fmt.Sprintf("%s total; per sandbox median %s, p90 %s, max %s", seconds(d.StartTotal), ms(sm.Median), ms(sm.P90), ms(sm.Max)))
	}
	if len(d.Sandboxes) > 0 {
		n := int64(len(d.Sandboxes))
		t.add("sandboxes `List` reported running / whose `sleep` was running when measured", fmt.Sprintf("%d / %d of %d", d.Running, d.Sleeping, n))
		t.add("daemon RSS: before / with them / after removing them", fmt.Sprintf("%s / %s / %s (read %s after the removals)", mib(d.Before.DaemonRSS), mib(d.With.DaemonRSS), afterRSS(d), seconds(d.AfterWait)))
		t.add("… of it anonymous / file pages (its binary): before / with them / after", fmt.Sprintf("%s / %s, %s / %s, %s / %s",
			mib(d.Before.DaemonAnon), mib(d.Before.DaemonFile), mib(d.With.DaemonAnon), mib(d.With.DaemonFile), mib(d.After.DaemonAnon), mib(d.After.DaemonFile)))
		t.add("daemon RSS growth per sandbox", mib((d.With.DaemonRSS-d.Before.DaemonRSS)/n))
		if d.HeapBefore.OK {
			t.add("daemon Go heap in use / idle heap not returned to the kernel / stacks / goroutines: before", d.HeapBefore.String())
			t.add("… with them", d.HeapWith.String())
			t.add("… after removing them", d.HeapAfter.String())
			t.add("daemon Go heap objects (live, or garbage not yet swept) / the runtime's own memory beside heap and stacks (span structures, GC metadata, profiling buckets): before / with them / after",
				fmt.Sprintf("%s / %s, %s / %s, %s / %s", mib(d.HeapBefore.Alloc), mib(d.HeapBefore.Runtime), mib(d.HeapWith.Alloc), mib(d.HeapWith.Runtime), mib(d.HeapAfter.Alloc), mib(d.HeapAfter.Runtime)))
			w, b := d.HeapWith, d.HeapBefore
			t.add("… growth per sandbox: heap in use / stacks / goroutines", fmt.Sprintf("%s / %s / %.1f",
				mib((w.Inuse-b.Inuse)/n), mib((w.Stacks-b.Stacks)/n), float64(w.Goroutines-b.Goroutines)/float64(n)))
		}
		t.add("host MemAvailable drop ÷ sandboxes", mib((d.Before.Available-d.With.Available)/n))
		var guest, pss, procs, cg, pte, pssAnon, pssFile, pssShmem int64
		var nproc, ncg, threads int
		for _, m := range d.Sandboxes {
			threads += m.Threads
			pte += m.PageTables
			guest += m.GuestRSS
			pss += m.GuestPSS
			procs += m.ProcsRSS
			nproc += m.Procs
			pssAnon += m.ProcsPSSAnon
			pssFile += m.ProcsPSSFile
			pssShmem += m.ProcsPSSShmem
			if m.CgroupMem >= 0 {
				cg += m.CgroupMem
				ncg++
			}
		}
		t.add("guest (PID 1) RSS: sum / per sandbox", fmt.Sprintf("%s / %s", mib(guest), mib(guest/n)))
		t.add("guest PSS per sandbox", mib(pss/n))
		t.add("RSS of every process in a sandbox (guest + sleep) per sandbox", fmt.Sprintf("%s (%.1f processes, %.1f threads each)", mib(procs/n), float64(nproc)/float64(n), float64(threads)/float64(n)))
		t.add("PSS of every process in a sandbox, per sandbox: anonymous / file / shmem", fmt.Sprintf("%s / %s / %s", kib(pssAnon/n), kib(pssFile/n), kib(pssShmem/n)))
		if ncg > 0 {
			t.add("memory cgroup charge per sandbox", mib(cg/int64(ncg)))
		}
		if mi, slabs := kmemBreakdown(d.Before.Kernel, d.With.Kernel, n); mi != "" {
			t.add("host /proc/meminfo change per sandbox", mi)
			if slabs != "" {
				t.add("slab caches' growth per sandbox (/proc/slabinfo), largest first", slabs)
			}
		}
		t.add("page tables (VmPTE) of its processes, per sandbox", mib(pte/n))
		t.add(fmt.Sprintf("kernel stacks of its threads (%d KiB each), per sandbox", kernelStack>>10), mib(int64(threads)*kernelStack/n))
	}
	if len(d.RTTOne) > 0 {
		one := summarize(d.RTTOne)
		t.add("exec round trip of `true`, one sandbox: median (p90)", fmt.Sprintf("%s (%s)", ms(one.Median), ms(one.P90)))
		if len(d.RTTMany) > 0 {
			many := summarize(d.RTTMany)
			t.add(fmt.Sprintf("the same with %d running: median (p90), ÷ one", len(d.Sandboxes)), fmt.Sprintf("%s (%s), %s", ms(many.Median), ms(many.P90), ratio(many.Median, one.Median)))
		}
	}
	if d.IdleCPUWith > 0 && d.IdleCPUBefore >= 0 {
		t.add(fmt.Sprintf("daemon CPU while idle, over %s: at rest before / with them (share of one core)", densityIdleWindow),
			fmt.Sprintf("%.1f%% / %.1f%%", 100*d.IdleCPUBefore, 100*d.IdleCPUWith))
	}
	if len(d.Removes) > 0 {
		sm := summarize(d.Removes)
		t.add(fmt.Sprintf("remove %d sandboxes, %d at a time", len(d.Removes), startWorkers),
			fmt.Sprintf("%s total; per sandbox median %s, p90 %s, max %s", seconds(d.RemoveTotal), ms(sm.Median), ms(sm.P90), ms(sm.Max)))
		t.add("last delete answered → every sandbox's cgroup gone (the teardown behind the answers)", seconds(d.TeardownWait))
	}
	s.Tables = append(s.Tables, t)
	if len(d.Projection) > 0 {
		s.note("projected from the first %d sandboxes before the rest started: %s", densityCalibrate, strings.Join(d.Projection, "; "))
	}
	if len(d.Sandboxes) > 0 && d.Sleeping < len(d.Sandboxes) {
		s.note("only %d of %d sandboxes still ran their `sleep` when measured: closing an exec stream may have ended the process", d.Sleeping, len(d.Sandboxes))
	}
	if d.After.DaemonRSS > 0 && float64(d.After.DaemonRSS) > float64(d.Before.DaemonRSS)*(1+densityAfterFrac) {
		s.note("after all sandboxes were removed the daemon's RSS stayed %s above its start (%s before, %s after)%s",
			mib(d.After.DaemonRSS-d.Before.DaemonRSS), mib(d.Before.DaemonRSS), mib(d.After.DaemonRSS), heapVerdict(d))
	}
}

// heapVerdict says where the RSS that stayed is, as far as the Go
// runtime's numbers tell.
func heapVerdict(d *densityRun) string {
	b, a := d.HeapBefore, d.HeapAfter
	if !b.OK || !a.OK {
		return ": a leak, or memory the Go runtime has not yet returned"
	}
	return fmt.Sprintf(". Of it, the Go heap in use grew by %s (its objects by %s; the rest is free room in spans that objects still in them keep) "+
		"and the idle heap the runtime keeps from the kernel by %s; the runtime's own memory beside heap and stacks by %s (sized by the peak, never returned); goroutines %d → %d "+
		"(live objects that stay are a leak; idle heap is the runtime's, returned by its scavenger over minutes)",
		mib(a.Inuse-b.Inuse), mib(a.Alloc-b.Alloc), mib(a.Retained-b.Retained), mib(a.Runtime-b.Runtime), b.Goroutines, a.Goroutines)
}

func afterRSS(d *densityRun) string {
	if d.After.DaemonRSS == 0 {
		return noPeerValue
	}
	return mib(d.After.DaemonRSS)
}

func densityBars(d *densityRun) []bar {
	b := bar{Issue: 2, What: fmt.Sprintf("%d sandboxes running sleep: daemon RSS and per-sandbox host memory", d.Count),
		Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	what := fmt.Sprintf("%d idle sandboxes (each running sleep): ", d.Count)
	running := bar{Issue: 21, What: what + "all running", Target: fmt.Sprintf("%d of %d", d.Count, d.Count), Value: noPeerValue, Verdict: notMeasured}
	avail := bar{Issue: 21, What: what + "host MemAvailable drop per sandbox", Target: "≤ 3 MiB", Value: noPeerValue, Verdict: notMeasured}
	rss := bar{Issue: 21, What: what + "daemon RSS growth per sandbox", Target: "≤ 100 KiB", Value: noPeerValue, Verdict: notMeasured}
	rtt := bar{Issue: 21, What: what + "exec round trip of `true` into one of them, median, ÷ with one sandbox", Target: "≤ 1.2×", Value: noPeerValue, Verdict: notMeasured}
	after := bar{Issue: 21, What: what + "daemon RSS after removing them, vs its start", Target: "within 10%", Value: noPeerValue, Verdict: notMeasured}
	n := int64(len(d.Sandboxes))
	if n != int64(d.Count) || n == 0 {
		return []bar{b, running, avail, rss, rtt, after}
	}
	drop, growth := (d.Before.Available-d.With.Available)/n, (d.With.DaemonRSS-d.Before.DaemonRSS)/n
	b.Value = fmt.Sprintf("daemon RSS %s → %s; per sandbox %s (MemAvailable drop), guest RSS %s",
		mib(d.Before.DaemonRSS), mib(d.With.DaemonRSS), mib(drop), mib(sumGuestRSS(d)/n))
	b.Verdict = reported
	running.Value = fmt.Sprintf("%d running per List, %d with their sleep", d.Running, d.Sleeping)
	running.Verdict = check(d.Running == d.Count && d.Sleeping == d.Count)
	avail.Value, avail.Verdict = mib(drop), check(drop <= densityMemMax)
	rss.Value = fmt.Sprintf("%s (%s → %s)", mib(growth), mib(d.Before.DaemonRSS), mib(d.With.DaemonRSS))
	rss.Verdict = check(growth <= densityRSSMax)
	if len(d.RTTOne) > 0 && len(d.RTTMany) > 0 {
		one, many := summarize(d.RTTOne).Median, summarize(d.RTTMany).Median
		rtt.Value = fmt.Sprintf("%s vs %s (%s)", ms(many), ms(one), ratio(many, one))
		rtt.Verdict = check(float64(many) <= densityRTTRatio*float64(one))
	}
	if d.After.DaemonRSS > 0 {
		after.Value = fmt.Sprintf("%s after vs %s at the start (%+.0f%%, read %s after the removals)", mib(d.After.DaemonRSS), mib(d.Before.DaemonRSS),
			100*(float64(d.After.DaemonRSS)/float64(d.Before.DaemonRSS)-1), seconds(d.AfterWait))
		after.Verdict = check(float64(d.After.DaemonRSS) <= float64(d.Before.DaemonRSS)*(1+densityAfterFrac))
	}
	return []bar{b, running, avail, rss, rtt, after}
}

func sumGuestRSS(d *densityRun) int64 {
	var s int64
	for _, m := range d.Sandboxes {
		s += m.GuestRSS
	}
	return s
}
