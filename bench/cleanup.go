package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/network"
	"github.com/paddock-dev/paddock/internal/rundir"
	"github.com/paddock-dev/paddock/internal/storage/disk"
)

// cleanupReport says what the final sweep found and removed. Problems are
// leaks or failures: a clean run has none.
type cleanupReport struct {
	Done        bool
	Leftover    int // sandboxes still on the daemon at the end
	RuncLeft    []string
	Reaped      int // exited processes of the run reparented to the harness
	Problems    []string
	CgroupNames []string
	Log         daemonLogSummary
}

func (c *cleanupReport) problem(format string, args ...any) {
	c.Problems = append(c.Problems, fmt.Sprintf(format, args...))
}

// close removes every sandbox and container of the run, stops the daemon,
// checks that nothing of the run is left on the host and removes the
// private directories. keepLog keeps a copy of the daemon's log. Only the
// first call does anything.
func (r *rig) close(keepLog bool) cleanupReport {
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	if r.closed {
		return cleanupReport{}
	}
	r.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()

	rep := cleanupReport{Done: true, CgroupNames: []string{r.cgroupParent, r.cgroupParent + "-runc"}}
	r.closeBaseline(ctx, &rep)
	if r.daemon != nil {
		r.removeSandboxes(ctx, &rep)
		if err := r.daemon.stop(); err != nil {
			rep.problem("stopping the daemon: %v", err)
		}
	}
	if r.served {
		// The daemon leaves its storage filesystem mounted and its network
		// in place for sandboxes that outlive it; none of the run's may.
		if err := disk.Unmount(filepath.Join(r.root, "state", "storage")); err != nil {
			rep.problem("unmounting the daemon's storage: %v", err)
		}
		if err := rundir.Unmount(filepath.Join(r.root, "run")); err != nil {
			rep.problem("unmounting the daemon's run dir: %v", err)
		}
		if err := network.Uninstall(r.netName); err != nil {
			rep.problem("removing the daemon's network %s: %v", r.netName, err)
		}
	}
	if r.egress != nil {
		if err := r.egress.Close(); err != nil {
			rep.problem("removing the egress benchmark's network: %v", err)
		}
		for _, l := range r.egress.Leftovers() {
			rep.problem("%s left behind", l)
		}
	}
	if r.runc != nil {
		left, err := r.runc.cleanup(ctx)
		rep.RuncLeft = left
		if err != nil {
			rep.problem("removing runc containers: %v", err)
		}
	}
	time.Sleep(100 * time.Millisecond) // let killed processes exit
	rep.Reaped = reapOrphans(0)
	r.checkHost(&rep)
	if r.daemon != nil {
		r.keepLog(&rep, keepLog)
	}
	r.removeRoot(&rep)
	return rep
}

// removeSandboxes deletes whatever sandboxes the daemon still has. If the
// daemon died during the run, it is restarted on the same state first: it
// reconciles, and then it can delete them.
func (r *rig) removeSandboxes(ctx context.Context, rep *cleanupReport) {
	if !r.served {
		return
	}
	if !r.daemon.running() {
		rep.problem("the daemon had exited during the run (%v): restarted it to remove the sandboxes", r.daemon.waitErr)
		if err := r.daemon.start(ctx); err != nil {
			rep.problem("restarting the daemon for cleanup: %v", err)
			return
		}
	}
	ids := r.madeIDs()
	list, err := r.client.List(ctx, client.ListOptions{})
	if err != nil {
		rep.problem("listing sandboxes for cleanup: %v", err)
	}
	for _, sb := range list {
		if !slices.Contains(ids, sb.ID) {
			ids = append(ids, sb.ID)
		}
	}
	rep.Leftover = len(ids)
	for _, id := range ids {
		if err := r.remove(ctx, id); err != nil {
			rep.problem("%v", err)
		}
	}
	// The daemon may tear sandboxes down behind its answers: stopping it
	// before they are done would leave their parts for the next daemon.
	r.waitTeardowns(ctx, -1, teardownTimeout)
}

// checkHost looks for anything of the run left on the host after the
// daemon stopped, reports it, and removes it.
func (r *rig) checkHost(rep *cleanupReport) {
	// With the daemon stopped, a live child of this process (its
	// subreaper) is something the daemon or runc left running.
	for _, c := range childrenOf(os.Getpid()) {
		if c.State == 'Z' {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", c.PID))
		rep.problem("process %d (%s, %s) was left running; killing it", c.PID, c.Comm, exe)
		unix.Kill(c.PID, unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(c.PID, &ws, 0, nil)
	}
	for _, p := range processesInCgroups(rep.CgroupNames) {
		rep.problem("process %d (%s) still runs in cgroup %s; killing it", p.pid, p.comm, p.cgroup)
		unix.Kill(p.pid, unix.SIGKILL)
	}
	for _, m := range mountsUnder(r.root) {
		rep.problem("mount left at %s; unmounting it", m)
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			rep.problem("unmounting %s: %v", m, err)
		}
	}
	for _, l := range loopsUnder(r.root) {
		rep.problem("loop device %s still backs %s; detaching it", l[0], l[1])
		detachLoop(l[0])
	}
	for _, name := range rep.CgroupNames {
		for _, dir := range cgroupDirs(name) {
			removeCgroupTree(dir, rep)
		}
	}
}

type cgroupProc struct {
	pid    int
	comm   string
	cgroup string
}

// processesInCgroups finds processes whose cgroup path is under one of the
// named top-level cgroups.
func processesInCgroups(names []string) []cgroupProc {
	pids, _ := allPIDs()
	var out []cgroupProc
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 || !underCgroup(parts[2], names) {
				continue
			}
			st, _ := readProcStat(pid)
			out = append(out, cgroupProc{pid: pid, comm: st.Comm, cgroup: parts[2]})
			break
		}
	}
	return out
}

func underCgroup(path string, names []string) bool {
	for _, n := range names {
		if path == "/"+n || strings.HasPrefix(path, "/"+n+"/") {
			return true
		}
	}
	return false
}

// mountsUnder lists mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	return out
}

// loopsUnder lists loop devices (name, backing file) whose backing file is
// under dir.
func loopsUnder(dir string) [][2]string {
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out [][2]string
	for _, f := range devs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		backing := strings.TrimSpace(string(b))
		if strings.HasPrefix(backing, dir+"/") {
			name := filepath.Base(filepath.Dir(filepath.Dir(f)))
			out = append(out, [2]string{"/dev/" + name, backing})
		}
	}
	return out
}

func detachLoop(dev string) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
}

// cgroupDirs lists the directories of top-level cgroup name in every
// mounted hierarchy (v1 controllers, the unified tree, or pure v2).
func cgroupDirs(name string) []string {
	var out []string
	if cgroupV2Only() {
		if isDir(filepath.Join("/sys/fs/cgroup", name)) {
			out = append(out, filepath.Join("/sys/fs/cgroup", name))
		}
		return out
	}
	hier, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range hier {
		d := filepath.Join("/sys/fs/cgroup", h.Name(), name)
		if h.IsDir() && isDir(d) {
			out = append(out, d)
		}
	}
	return out
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// removeCgroupTree removes a cgroup and its children, reporting children
// as leaks: the daemon and runc must remove their own.
func removeCgroupTree(dir string, rep *cleanupReport) {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if dirs[i] != dir {
			rep.problem("cgroup left behind: %s", dirs[i])
		}
		if err := unix.Rmdir(dirs[i]); err != nil && err != unix.ENOENT {
			rep.problem("removing cgroup %s: %v", dirs[i], err)
		}
	}
}

// keepLog summarizes the daemon's log and keeps a copy of it when asked
// or when it holds warnings.
func (r *rig) keepLog(rep *cleanupReport, keep bool) {
	sum, err := summarizeLog(r.daemon.logPath)
	if err != nil {
		rep.problem("%v", err)
	}
	if keep || sum.Warnings+sum.Errors > 0 || len(rep.Problems) > 0 {
		dst := filepath.Join(os.TempDir(), fmt.Sprintf("paddock-bench-daemon-%s.log", time.Now().UTC().Format("20060102T150405")))
		if b, err := os.ReadFile(r.daemon.logPath); err == nil && os.WriteFile(dst, b, 0o644) == nil {
			sum.Path = dst
		}
	}
	rep.Log = sum
}

// removeRoot removes the private directory, unless a mount is still under
// it: removing files through a mount would reach outside the run.
func (r *rig) removeRoot(rep *cleanupReport) {
	if m := mountsUnder(r.root); len(m) > 0 {
		rep.problem("kept %s: %d mount(s) still under it (%s)", r.root, len(m), m[0])
		return
	}
	if err := os.RemoveAll(r.root); err != nil {
		rep.problem("removing %s: %v", r.root, err)
	}
}

func (c cleanupReport) write(b *strings.Builder) {
	b.WriteString("## Cleanup\n\n")
	if !c.Done {
		b.WriteString("The final sweep did not run.\n\n")
		return
	}
	if c.Leftover > 0 {
		fmt.Fprintf(b, "%d sandbox(es) were still on the daemon at the end and were removed.\n\n", c.Leftover)
	}
	if len(c.RuncLeft) > 0 {
		fmt.Fprintf(b, "runc containers still present at the end and removed: %s.\n\n", strings.Join(c.RuncLeft, ", "))
	}
	if c.Reaped > 0 {
		fmt.Fprintf(b, "At the end the harness reaped %d exited process(es) of the run that had been reparented to it "+
			"(detached runc containers, guests whose parent had exited).\n\n", c.Reaped)
	}
	if len(c.Problems) == 0 {
		fmt.Fprintf(b, "After the daemon stopped, nothing of the run was left: no process or cgroup under `%s`, "+
			"no mount or loop device under the run's directory, no runc container.\n\n", strings.Join(c.CgroupNames, "`, `"))
		return
	}
	b.WriteString("**The sweep found and removed leftovers:**\n\n")
	for _, p := range c.Problems {
		fmt.Fprintf(b, "- %s\n", cell(p))
	}
	b.WriteString("\n")
}
