package main

// Issue 21's delete bars: how fast Delete answers, how soon everything the
// sandbox held on the host is gone (or back in a pool), and that a kill -9
// of the daemon during 50 concurrent deletes leaks nothing.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const (
	deleteBarMax    = 2 * time.Millisecond
	releaseBarMax   = time.Second
	releaseTimeout  = 10 * time.Second
	releasePoll     = time.Millisecond
	releaseDeepPoll = 50 * time.Millisecond // between two searches for what holds a network namespace
	crashSandboxes  = 50
	crashAfter      = crashSandboxes / 2     // answers before the kill
	crashKillLatest = 3 * time.Second        // kill by then even if fewer answered
	crashSettle     = 15 * time.Second       // for the restarted daemon to finish
	startWorkers    = 8                      // concurrent creates when starting many sandboxes
	startTimeout    = 30 * time.Second       // one create and its first exec
	crashDeleteWait = 100 * time.Millisecond // for deletes still in flight after the kill
	teardownQuiet   = 2 * time.Second        // no cgroup gone for this long: the teardowns are done
	teardownTimeout = 3 * time.Minute
)

// sandboxTrace is what a running sandbox holds on the host, recorded so
// that the harness can watch each part go after its delete.
type sandboxTrace struct {
	ID     string
	PID    int    // its guest (runtime.host_pid)
	Start  uint64 // the guest's start time, against pid reuse
	Cgroup string // runtime.cgroup, e.g. /parent/id
	PidNS  uint64 // the inode of its pid namespace: its processes' mark
	NetNS  uint64 // the inode of its network namespace
	Veth   int    // host ifindex of its veth; 0 if it has none
	Loop   string // the loop device of its disk, e.g. loop12; "" if none found
	runDir string
	volDir string
}

// released is which of a sandbox's parts have gone (or gone back to a
// pool); kept marks those still present but no longer the sandbox's.
type released struct {
	Proc, Cgroup, Veth, Disk, RunDir bool
	CgroupKept, VethKept, DiskKept   bool
}

func (x released) all() bool { return x.Proc && x.Cgroup && x.Veth && x.Disk && x.RunDir }

// missing names the parts not yet released.
func (x released) missing() []string {
	var m []string
	for _, p := range []struct {
		ok   bool
		name string
	}{{x.Proc, "guest process"}, {x.Cgroup, "cgroup"}, {x.Veth, "veth"}, {x.Disk, "disk (loop device, mount, image dir)"}, {x.RunDir, "run dir"}} {
		if !p.ok {
			m = append(m, p.name)
		}
	}
	return m
}

// disksDir is where the daemon's disk pool keeps its volumes.
func (r *rig) disksDir() string { return filepath.Join(r.storageDir(), "disks") }

// trace records a running sandbox's host parts.
func (r *rig) trace(ctx context.Context, id string) (sandboxTrace, error) {
	sb, err := r.client.Get(ctx, id)
	if err != nil {
		return sandboxTrace{}, fmt.Errorf("inspecting %s: %w", id, err)
	}
	if sb.Runtime == nil || sb.Runtime.HostPID == 0 {
		return sandboxTrace{}, fmt.Errorf("sandbox %s reports no host pid", id)
	}
	t := sandboxTrace{ID: id, PID: sb.Runtime.HostPID, Cgroup: sb.Runtime.Cgroup,
		runDir: filepath.Join(r.root, "run", "sandboxes", id), volDir: filepath.Join(r.disksDir(), "vol", id)}
	st, err := readProcStat(t.PID)
	if err != nil {
		return t, fmt.Errorf("reading the guest of %s: %w", id, err)
	}
	t.Start = st.Start
	if t.PidNS, err = nsInode(t.PID, "pid"); err != nil {
		return t, fmt.Errorf("reading the pid namespace of %s: %w", id, err)
	}
	if t.NetNS, err = nsInode(t.PID, "net"); err != nil {
		return t, fmt.Errorf("reading the network namespace of %s: %w", id, err)
	}
	if t.Veth, err = hostPeer(t.PID); err != nil {
		return t, fmt.Errorf("finding the veth of %s: %w", id, err)
	}
	for _, l := range loopsUnder(t.volDir) {
		t.Loop = filepath.Base(l[0])
	}
	return t, nil
}

// hostPeer is the host-side ifindex of the veth whose peer is eth0 in
// pid's network namespace; 0 if it has no eth0 (a sandbox without
// network).
func hostPeer(pid int) (int, error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return 0, nil
		}
		return 0, err
	}
	return l.Attrs().ParentIndex, nil
}

// check looks at each part of the sandbox once.
//
// deep also looks for what holds the sandbox's network namespace (every
// process's namespaces and open files: milliseconds), which tells a
// pooled veth from one the kernel has yet to delete.
func (t sandboxTrace) check(disks string, deep bool) released {
	var x released
	st, err := readProcStat(t.PID)
	x.Proc = err != nil || st.Start != t.Start || st.State == 'Z'
	x.Cgroup, x.CgroupKept = cgroupReleased(t.Cgroup, t.PidNS)
	if t.Veth == 0 {
		x.Veth = true
	} else if _, err := netlink.LinkByIndex(t.Veth); err != nil {
		x.Veth = true
	} else if x.Proc && deep && netnsHeld(t.NetNS) {
		// Still there with its sandbox's guest gone and its namespace
		// held: the daemon keeps it (a pooled network slot). Not held,
		// the kernel is still destroying the namespace and the veth.
		x.Veth, x.VethKept = true, true
	}
	x.Disk, x.DiskKept = t.diskReleased(disks)
	_, err = os.Lstat(t.runDir)
	x.RunDir = errors.Is(err, os.ErrNotExist)
	return x
}

// cgroupReleased: every hierarchy's directory of cg is gone, or holds no
// process of the sandbox's pid namespace (kept: a recycled cgroup, empty
// or already another sandbox's).
func cgroupReleased(cg string, ns uint64) (gone, kept bool) {
	if cg == "" {
		return true, false
	}
	for _, dir := range cgroupPathDirs(cg) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				if n, err := nsInode(pid, "pid"); err == nil && n == ns {
					return false, false
				}
			}
		}
		kept = true
	}
	return true, kept
}

// nsInode is the inode of pid's namespace of kind ("pid", "net").
func nsInode(pid int, kind string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// netnsHeld reports whether network namespace ino is kept alive by a
// process in it, an open file or a bind mount (nsfs): a namespace no one
// holds is being destroyed by the kernel, with its veths.
func netnsHeld(ino uint64) bool {
	want := fmt.Sprintf("net:[%d]", ino)
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), want) {
		return true
	}
	pids, _ := allPIDs()
	for _, pid := range pids {
		if n, err := nsInode(pid, "net"); err == nil && n == ino {
			return true
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == want {
				return true
			}
		}
	}
	return false
}

// cgroupPathDirs lists the directories of cgroup path cg ("/parent/id") in
// every mounted hierarchy.
func cgroupPathDirs(cg string) []string {
	if cgroupV2Only() {
		return []string{filepath.Join("/sys/fs/cgroup", cg)}
	}
	hier, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, h := range hier {
		if h.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", h.Name(), cg))
		}
	}
	return out
}

// diskReleased: the volume's directory is gone and its loop device is
// detached or backs another file, one in the disk pool (kept: recycled)
// or another volume's (the device was freed and reused). A loop that backs
// a file in the pool's trash is still being torn down.
func (t sandboxTrace) diskReleased(disks string) (gone, kept bool) {
	if _, err := os.Lstat(t.volDir); !errors.Is(err, os.ErrNotExist) {
		return false, false
	}
	if t.Loop == "" {
		return true, false
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", t.Loop, "loop", "backing_file"))
	if err != nil {
		return true, false // detached
	}
	backing := strings.TrimSpace(string(b))
	switch {
	case strings.HasPrefix(backing, t.volDir+"/"), strings.HasPrefix(backing, filepath.Join(disks, "trash")+"/"):
		return false, false
	case strings.HasPrefix(backing, filepath.Join(disks, "pool")+"/"):
		return true, true
	}
	return true, false
}

// releaseSample is one delete: its answer and when each part went.
type releaseSample struct {
	Answer       time.Duration
	Proc, Cgroup time.Duration
	Veth, Disk   time.Duration
	RunDir, All  time.Duration
	Kept         released // parts kept for a pool
	Missing      []string // parts still held at releaseTimeout
	TimedOut     bool
	VethTraced   bool
	LoopTraced   bool
}

// watchRelease polls t's parts from t0 until all are released or
// releaseTimeout.
func (r *rig) watchRelease(ctx context.Context, t sandboxTrace, t0 time.Time, s *releaseSample) {
	disks := r.disksDir()
	var lastDeep time.Time
	at := func(d *time.Duration, ok bool, now time.Duration) {
		if ok && *d == 0 {
			*d = now
		}
	}
	for {
		deep := time.Since(lastDeep) >= releaseDeepPoll
		x := t.check(disks, deep)
		if deep && x.Proc {
			lastDeep = time.Now()
		}
		now := time.Since(t0)
		at(&s.Proc, x.Proc, now)
		at(&s.Cgroup, x.Cgroup, now)
		at(&s.Veth, x.Veth, now)
		at(&s.Disk, x.Disk, now)
		at(&s.RunDir, x.RunDir, now)
		if x.all() {
			s.All, s.Kept = now, x
			return
		}
		if now > releaseTimeout || ctx.Err() != nil {
			s.TimedOut, s.Missing = true, x.missing()
			return
		}
		time.Sleep(releasePoll)
	}
}

func deleteMethod(n int) []string {
	return []string{
		fmt.Sprintf("**Answer and release**: %d samples. Each waits until the default pool is full, creates a sandbox (default image), runs `true` in it, "+
			"records what it holds on the host, waits until the daemon is idle, then times `Delete` with force (call → answer). "+
			"From the same instant the harness polls every %s, until all are released or %s, each part:", n, releasePoll, releaseTimeout),
		"the guest process (`runtime.host_pid`, with its start time against pid reuse; a zombie counts as gone); its cgroup (`runtime.cgroup`) " +
			"in every hierarchy: gone, or kept with no process of the sandbox's pid namespace in it (counted as recycled); its veth (the host end, found before the delete through " +
			"eth0's peer index in the guest's network namespace): gone, or kept with the guest gone and its network namespace still held by a process, an open file " +
			"or a bind mount (a pooled network slot; looked for every 50 ms); its disk: the " +
			"directory `disks/vol/ID` gone and the loop device that backed it detached, or backing a file in `disks/pool/` again (recycled); its run " +
			"directory `run/sandboxes/ID` (and so its mounts) gone. Its uid range and nftables state are not visible from outside and are not checked.",
		fmt.Sprintf("**kill -9 during deletes**: with the pools full and the daemon idle, the harness counts what the daemon holds at rest with no sandbox "+
			"(processes in its cgroups, cgroups under its parent, loop devices and mounts under the run's directory, host links of its network, live "+
			"children of the harness other than the daemon). It starts %d sandboxes (default image and limits but %s disks: fifty 10 GiB disks and the pools' need ~10 GiB free on the host, "+
			"which this shared machine rarely has; %d creates at a time, each running `true` once), records each "+
			"one's parts as above, releases %d `Delete`s at once, and sends the daemon SIGKILL when the %dth answer arrives (or %s after the release): half, so that the kill falls among teardowns whether "+
			"the daemon tears down before it answers (the other half still in progress) or behind its answers (the first half's). "+
			"It restarts the daemon on the same directories, waits for its default pool to fill, and then, within %s: every sandbox whose delete was "+
			"answered must be gone from `List`; one whose delete never answered may still be listed, but only running (it must then run `true`, "+
			"and is deleted normally); one listed in any other state (stopped: its guest killed, the record kept) is a delete neither finished nor undone; every part of every deleted sandbox must be released as above; and the counts must be back at rest. Anything else is a leak "+
			"and fails the bar.", crashSandboxes, mib(densityDisk), startWorkers, crashSandboxes, crashAfter, crashKillLatest, crashSettle),
	}
}

// benchDelete measures Delete's answer, the release of a sandbox's parts,
// and a kill -9 during concurrent deletes.
func benchDelete(ctx context.Context, r *rig) *section {
	n := r.opts.n
	s := &section{Method: deleteMethod(n)}
	var samples []releaseSample
	err := r.deleteSamples(ctx, n, &samples)
	releaseTable(s, samples)
	b1 := bar{Issue: 21, What: "delete: the call answers (Delete with force, a running sandbox), median", Target: "≤ 2 ms", Value: noPeerValue, Verdict: notMeasured}
	b2 := bar{Issue: 21, What: "delete: every part of the sandbox (process, cgroup, veth, disk, run dir) gone or back in a pool, slowest sample", Target: "≤ 1 s", Value: noPeerValue, Verdict: notMeasured}
	b3 := bar{Issue: 21, What: fmt.Sprintf("kill -9 of the daemon during %d concurrent deletes, restarted: nothing leaks", crashSandboxes), Target: "no leak", Value: noPeerValue, Verdict: notMeasured}
	defer func() { s.Bars = []bar{b1, b2, b3} }()
	if len(samples) > 0 {
		var answers, alls []time.Duration
		timedOut := 0
		for _, x := range samples {
			answers = append(answers, x.Answer)
			if x.TimedOut {
				timedOut++
			} else {
				alls = append(alls, x.All)
			}
		}
		as, ls := summarize(answers), summarize(alls)
		b1.Value, b1.Verdict = fmt.Sprintf("%s (p90 %s, %d samples)", ms(as.Median), ms(as.P90), as.N), check(as.Median <= deleteBarMax)
		b2.Value = fmt.Sprintf("max %s, median %s", ms(ls.Max), ms(ls.Median))
		if timedOut > 0 {
			b2.Value = fmt.Sprintf("%d of %d samples still held parts after %s; %s", timedOut, len(samples), releaseTimeout, b2.Value)
		}
		b2.Verdict = check(timedOut == 0 && ls.Max <= releaseBarMax)
	}
	if err != nil {
		s.Err = err
		return s
	}
	var c crashRun
	err = r.crashDeletes(ctx, &c)
	crashReport(s, &c)
	if c.Done {
		b3.Value = c.summary()
		b3.Verdict = check(len(c.Leaks) == 0)
	}
	s.Err = err
	return s
}

func (r *rig) deleteSamples(ctx context.Context, n int, out *[]releaseSample) error {
	for i := range n {
		if err := r.waitFullPool(ctx, defaultPool); err != nil {
			return err
		}
		sb, err := r.create(ctx, api.CreateRequest{})
		if err != nil {
			return err
		}
		if err := r.exec(ctx, sb.ID, nil, "true"); err != nil {
			return errors.Join(err, r.removeAll([]string{sb.ID}))
		}
		t, err := r.trace(ctx, sb.ID)
		if err != nil {
			return errors.Join(err, r.removeAll([]string{sb.ID}))
		}
		r.idle(ctx)
		var x releaseSample
		t0 := time.Now()
		err = r.remove(ctx, sb.ID)
		x.Answer = time.Since(t0)
		if err != nil {
			return fmt.Errorf("sample %d: %w", i+1, err)
		}
		x.VethTraced, x.LoopTraced = t.Veth != 0, t.Loop != ""
		r.watchRelease(ctx, t, t0, &x)
		*out = append(*out, x)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

func releaseTable(s *section, samples []releaseSample) {
	if len(samples) == 0 {
		return
	}
	t := table{Header: []string{"from the Delete call until …", "n", "median", "p90", "max"}}
	type col struct {
		name string
		f    func(releaseSample) time.Duration
	}
	for _, c := range []col{
		{"Delete answered", func(x releaseSample) time.Duration { return x.Answer }},
		{"guest process gone", func(x releaseSample) time.Duration { return x.Proc }},
		{"cgroup gone (or emptied and kept)", func(x releaseSample) time.Duration { return x.Cgroup }},
		{"veth gone (or kept in a pooled slot)", func(x releaseSample) time.Duration { return x.Veth }},
		{"disk: image dir gone, loop detached (or back in the pool)", func(x releaseSample) time.Duration { return x.Disk }},
		{"run dir gone", func(x releaseSample) time.Duration { return x.RunDir }},
		{"every part released", func(x releaseSample) time.Duration { return x.All }},
	} {
		var d []time.Duration
		for _, x := range samples {
			if v := c.f(x); v > 0 || c.name == "Delete answered" {
				d = append(d, v)
			}
		}
		sm := summarize(d)
		t.add(c.name, fmt.Sprint(sm.N), ms(sm.Median), ms(sm.P90), ms(sm.Max))
	}
	s.Tables = append(s.Tables, t)
	var kept [3]int
	veths, loops := 0, 0
	for _, x := range samples {
		if x.Kept.CgroupKept {
			kept[0]++
		}
		if x.Kept.VethKept {
			kept[1]++
		}
		if x.Kept.DiskKept {
			kept[2]++
		}
		if x.VethTraced {
			veths++
		}
		if x.LoopTraced {
			loops++
		}
		if x.TimedOut {
			s.note("a sample still held %s %s after its delete", strings.Join(x.Missing, ", "), releaseTimeout)
		}
	}
	s.note("of %d samples, %d had a veth and %d a loop device the harness could trace; kept for reuse rather than removed: %d cgroups, %d veths, %d disks",
		len(samples), veths, loops, kept[0], kept[1], kept[2])
}

// holdings is what the daemon holds on the host, by kind.
type holdings map[string][]string

const (
	holdProcs   = "processes in its cgroups"
	holdCgroups = "cgroups under its parent"
	holdLoops   = "loop devices under the run's dir"
	holdMounts  = "mounts under the run's dir"
	holdLinks   = "host links of its network"
	holdOrphans = "live children of the harness besides the daemon"
)

var holdKinds = []string{holdProcs, holdCgroups, holdLoops, holdMounts, holdLinks, holdOrphans}

// holdings counts what the daemon holds now.
func (r *rig) holdings() holdings {
	h := holdings{}
	for _, p := range processesInCgroups([]string{r.cgroupParent}) {
		h[holdProcs] = append(h[holdProcs], fmt.Sprintf("%d (%s) in %s", p.pid, p.comm, p.cgroup))
	}
	h[holdCgroups] = append(h[holdCgroups], cgroupTree(r.cgroupParent)...)
	for _, l := range loopsUnder(r.root) {
		h[holdLoops] = append(h[holdLoops], l[0]+" → "+l[1])
	}
	h[holdMounts] = mountsUnder(r.root)
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, r.netName+"-") {
			h[holdLinks] = append(h[holdLinks], i.Name)
		}
	}
	reapOrphans(r.daemon.pid())
	for _, c := range childrenOf(os.Getpid()) {
		if c.PID != r.daemon.pid() && c.State != 'Z' {
			h[holdOrphans] = append(h[holdOrphans], fmt.Sprintf("%d (%s)", c.PID, c.Comm))
		}
	}
	return h
}

// beyond lists, for each kind, what h holds beyond the count in rest.
func (h holdings) beyond(rest holdings) []string {
	var out []string
	for _, k := range holdKinds {
		if extra := len(h[k]) - len(rest[k]); extra > 0 {
			var names []string
			for _, x := range h[k] {
				if !slices.Contains(rest[k], x) {
					names = append(names, x)
				}
			}
			out = append(out, fmt.Sprintf("%d more %s than at rest (%d): %s", extra, k, len(rest[k]), truncate(strings.Join(names, ", "), 300)))
		}
	}
	return out
}

func (h holdings) counts() string {
	var parts []string
	for _, k := range holdKinds {
		parts = append(parts, fmt.Sprintf("%d %s", len(h[k]), k))
	}
	return strings.Join(parts, ", ")
}

// cgroupTree lists the cgroup directories below top-level cgroup name in
// one hierarchy (memory on v1, the unified tree on v2), the parent
// excluded.
func cgroupTree(name string) []string {
	root := memoryCgroupDir("/" + name)
	var out []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != root {
			out = append(out, strings.TrimPrefix(p, root+"/"))
		}
		return nil
	})
	return out
}

// crashRun is what the kill -9 test saw.
type crashRun struct {
	Done          bool
	Rest, After   holdings
	Answered      int           // deletes answered before the kill
	KilledAfter   time.Duration // release → kill
	AnsweredLater int           // deletes answered OK after the kill was sent (raced it)
	Kept          int           // sandboxes listed after the restart (their delete never answered)
	Restart       time.Duration // kill → the restarted daemon answers
	Settled       time.Duration // restart → everything released and back at rest (or crashSettle)
	Leaks         []string
}

func (c *crashRun) summary() string {
	s := fmt.Sprintf("killed %s after the release, %d of %d deletes answered; %d running after the restart (delete unanswered), removed then",
		ms(c.KilledAfter), c.Answered, crashSandboxes, c.Kept)
	if len(c.Leaks) == 0 {
		return s + "; no leak, back at rest " + seconds(c.Settled) + " after the restart"
	}
	return fmt.Sprintf("%s; %d leak(s): %s", s, len(c.Leaks), truncate(c.Leaks[0], 200))
}

func crashReport(s *section, c *crashRun) {
	if c.Rest == nil {
		return
	}
	t := table{Header: []string{"kill -9 during concurrent deletes", "value"}}
	t.add("at rest before (pools full, no sandbox)", c.Rest.counts())
	if c.Done {
		t.add("deletes answered before the kill / after it was sent", fmt.Sprintf("%d / %d of %d (kill %s after the release)", c.Answered, c.AnsweredLater, crashSandboxes, ms(c.KilledAfter)))
		t.add("kill → restarted daemon answers", ms(c.Restart))
		t.add("sandboxes running after the restart, their delete unanswered (removed then)", fmt.Sprint(c.Kept))
		t.add("after the restart, settled", c.After.counts())
		t.add("leaks", fmt.Sprint(len(c.Leaks)))
	}
	s.Tables = append(s.Tables, t)
	for _, l := range c.Leaks {
		s.note("leak after the kill -9: %s", l)
	}
}

// startMany calls start n times, workers at a time, each with its own
// deadline, and returns the ids of the sandboxes it made (also on error).
// The first failure stops the rest.
func (r *rig) startMany(ctx context.Context, n, workers int, start func(ctx context.Context) (string, error)) ([]string, error) {
	var (
		mu   sync.Mutex
		ids  []string
		errs []error
		next atomic.Int64
		wg   sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				octx, ocancel := context.WithTimeout(ctx, startTimeout)
				id, err := start(octx)
				ocancel()
				mu.Lock()
				if id != "" {
					ids = append(ids, id)
				}
				if err != nil {
					errs = append(errs, err)
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return ids, fmt.Errorf("starting %d sandboxes (%d made): %w", n, len(ids), errs[0])
	}
	return ids, ctx.Err()
}

// waitTeardowns waits until the daemon's sandboxes' cgroups number at
// most limit, or, with limit < 0, until their number has not changed for
// teardownQuiet; at most timeout. A delete that answers at once tears the
// sandbox down behind its answer, out of sight of List; its cgroup goes
// last but one. It returns how many are left.
func (r *rig) waitTeardowns(ctx context.Context, limit int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	n, since := len(cgroupTree(r.cgroupParent)), time.Now()
	for {
		if (limit >= 0 && n <= limit) || (limit < 0 && time.Since(since) >= teardownQuiet) || time.Now().After(deadline) || ctx.Err() != nil {
			return n
		}
		time.Sleep(200 * time.Millisecond)
		if m := len(cgroupTree(r.cgroupParent)); m != n {
			n, since = m, time.Now()
		}
	}
}

// smallDisk asks for the default image and limits with a disk of
// densityDisk.
func smallDisk() api.CreateRequest {
	return api.CreateRequest{Resources: api.Resources{DiskBytes: densityDisk}}
}

func (r *rig) crashDeletes(ctx context.Context, c *crashRun) error {
	if err := r.waitFullPool(ctx, defaultPool); err != nil {
		return err
	}
	c.Rest = r.holdings()
	ids, err := r.startMany(ctx, crashSandboxes, startWorkers, func(ctx context.Context) (string, error) {
		sb, err := r.create(ctx, smallDisk())
		if err != nil {
			return "", err
		}
		return sb.ID, r.exec(ctx, sb.ID, nil, "true")
	})
	if err != nil {
		return errors.Join(err, r.removeConcurrently(ids, startWorkers))
	}
	traces := make([]sandboxTrace, len(ids))
	for i, id := range ids {
		if traces[i], err = r.trace(ctx, id); err != nil {
			return errors.Join(err, r.removeConcurrently(ids, startWorkers))
		}
	}
	r.idle(ctx)

	acked := r.deleteAndKill(ids, c)
	r.client.Close() // its kept connections went with the daemon
	t0 := time.Now()
	if err := r.daemon.start(ctx); err != nil {
		return fmt.Errorf("restarting the daemon after the kill: %w", err)
	}
	c.Restart = time.Since(t0)
	t0 = time.Now()
	err = r.settleAfterCrash(ctx, traces, acked, c)
	c.Settled = time.Since(t0)
	c.Done = true
	return err
}

// deleteAndKill releases a Delete of every id at once and kills the
// daemon with SIGKILL at the crashAfter-th answer (or crashKillLatest). It
// returns which deletes were answered before the kill.
func (r *rig) deleteAndKill(ids []string, c *crashRun) map[string]bool {
	var (
		mu       sync.Mutex
		acked    = map[string]bool{}
		answered atomic.Int32
		killOnce sync.Once
		killed   atomic.Bool
		wg       sync.WaitGroup
		release  = make(chan struct{})
		t0       time.Time
	)
	kill := func() {
		killOnce.Do(func() {
			killed.Store(true)
			c.KilledAfter = time.Since(t0)
			r.daemon.kill()
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			err := r.client.Delete(ctx, id, true)
			if err != nil {
				return
			}
			r.untrack(id)
			mu.Lock()
			if killed.Load() {
				c.AnsweredLater++
			} else {
				acked[id] = true
			}
			mu.Unlock()
			if answered.Add(1) == crashAfter {
				kill()
			}
		}()
	}
	t0 = time.Now()
	close(release)
	timer := time.AfterFunc(crashKillLatest, kill)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(crashKillLatest + crashDeleteWait):
	}
	timer.Stop()
	kill() // every delete answered before the 5th? then now
	cancel()
	wg.Wait()
	c.Answered = len(acked)
	return acked
}

// settleAfterCrash checks the restarted daemon: what it still lists, what
// the deleted sandboxes still hold, and what it holds beyond rest.
func (r *rig) settleAfterCrash(ctx context.Context, traces []sandboxTrace, acked map[string]bool, c *crashRun) error {
	if err := r.waitFullPool(ctx, defaultPool); err != nil {
		return err
	}
	deadline := time.Now().Add(crashSettle)
	ours := map[string]bool{}
	for _, t := range traces {
		ours[t.ID] = true
	}
	// Sandboxes still listed: one whose delete was answered may only be on
	// its way out; one whose delete was not may stay, but then whole and
	// running, or be on its way out.
	var running, stuck []string
	for {
		list, err := r.client.List(ctx, client.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing after the restart: %w", err)
		}
		listed := map[string]bool{}
		var back, leaving []string
		running, stuck = running[:0], stuck[:0]
		for _, sb := range list {
			if !ours[sb.ID] {
				continue
			}
			listed[sb.ID] = true
			switch {
			case acked[sb.ID]:
				back = append(back, fmt.Sprintf("%s (%s)", sb.ID, sb.State))
				stuck = append(stuck, sb.ID)
			case sb.State == api.StateRunning:
				running = append(running, sb.ID)
			default:
				leaving = append(leaving, fmt.Sprintf("%s (%s)", sb.ID, sb.State))
				stuck = append(stuck, sb.ID)
			}
		}
		if len(back)+len(leaving) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			for id := range ours {
				if !listed[id] {
					r.untrack(id)
				}
			}
			if len(back) > 0 {
				c.Leaks = append(c.Leaks, fmt.Sprintf("%d sandbox(es) whose delete was answered are still listed %s after the restart: %s",
					len(back), crashSettle, truncate(strings.Join(back, ", "), 300)))
			}
			if len(leaving) > 0 {
				c.Leaks = append(c.Leaks, fmt.Sprintf("%d sandbox(es) whose delete was cut short are still listed %s after the restart, not running: "+
					"the delete was neither finished nor undone: %s", len(leaving), crashSettle, truncate(strings.Join(leaving, ", "), 300)))
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.Kept = len(running)
	for _, id := range running {
		if err := r.exec(ctx, id, nil, "true"); err != nil {
			c.Leaks = append(c.Leaks, fmt.Sprintf("sandbox %s, running after the restart, does not run `true`: %v", id, err))
		}
	}
	// The leaks are removed too, so that the run goes on from rest.
	if err := r.removeConcurrently(append(running, stuck...), startWorkers); err != nil {
		c.Leaks = append(c.Leaks, fmt.Sprintf("removing the sandboxes still listed after the restart: %v", err))
	}
	// Wait for the parts to go and the holdings to be back at rest.
	for {
		var held []string
		for _, t := range traces {
			if x := t.check(r.disksDir(), true); !x.all() {
				held = append(held, fmt.Sprintf("%s: %s", t.ID, strings.Join(x.missing(), ", ")))
			}
		}
		r.idle(ctx)
		c.After = r.holdings()
		extra := c.After.beyond(c.Rest)
		if len(held) == 0 && len(extra) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if len(held) > 0 {
				c.Leaks = append(c.Leaks, fmt.Sprintf("%d deleted sandbox(es) still hold parts %s after the restart: %s", len(held), crashSettle, truncate(strings.Join(held, "; "), 400)))
			}
			c.Leaks = append(c.Leaks, extra...)
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
}
