package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/network"
	"github.com/paddock-dev/paddock/internal/rundir"
	"github.com/paddock-dev/paddock/internal/storage/disk"
)

var paddockBin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("skipping end-to-end tests: they need root")
		os.Exit(0)
	}
	// Guests of a daemon killed with SIGKILL are reparented to us rather
	// than to the host's init (which may not reap), so that cleanup can
	// reap them.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Println("setting child subreaper:", err)
		os.Exit(1)
	}
	paddockBin = os.Getenv("PADDOCK_BIN")
	if paddockBin == "" {
		dir, err := os.MkdirTemp("", "paddock-bin-")
		if err != nil {
			panic(err)
		}
		paddockBin = filepath.Join(dir, "paddock")
		build := exec.Command("go", "build", "-tags", "netgo osusergo",
			"-ldflags", `-linkmode external -extldflags "-static"`, "-o", paddockBin, "../cmd/paddock")
		build.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Printf("building paddock: %v\n%s", err, out)
			os.Exit(1)
		}
		sweepDead()
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	sweepDead()
	os.Exit(m.Run())
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// syncBuffer is a bytes.Buffer the daemon writes to while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Daemon is a paddock daemon started for one test.
type Daemon struct {
	t        *testing.T
	Root     string // holds state/ and run/
	StateDir string
	RunDir   string
	Sock     string
	Host     string
	Cgroup   string
	UIDStart uint32
	NetName  string // the daemon's nftables table and interface prefix
	// Bin, if set, is the paddock binary the next Start runs (an
	// upgrade); else the tests' paddockBin.
	Bin string
	// Env is added to the daemon's environment (the tests' own, which
	// a parallel test must not change).
	Env    []string
	args   []string
	cmd    *exec.Cmd
	log    *syncBuffer
	client *client.Client
	// orphans are guests whose daemon was killed: they are now our
	// children and must be reaped once their sandbox is gone.
	orphans []int
}

// StartDaemon starts a daemon with private directories and cgroup, and
// registers its cleanup: every sandbox is removed, the daemon stopped, and
// the test fails if any mount, cgroup or process of it is left behind.
func StartDaemon(t *testing.T, extra ...string) *Daemon {
	t.Helper()
	d := prepareDaemon(t, extra...)
	d.Start()
	return d
}

// prepareDaemon is StartDaemon without the start: for a test that sets up
// the daemon's directories first.
func prepareDaemon(t *testing.T, extra ...string) *Daemon {
	t.Helper()
	id := randHex(4)
	root, err := os.MkdirTemp("", "paddock-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{
		t:        t,
		Root:     root,
		StateDir: filepath.Join(root, "state"),
		RunDir:   filepath.Join(root, "run"),
		Sock:     filepath.Join(root, "paddock.sock"),
		Cgroup:   "paddock-test-" + id,
		UIDStart: nextUIDBlock(),
	}
	d.Host = "unix://" + d.Sock
	netName, netArgs := networkArgs()
	d.NetName = netName
	extra = append(netArgs, extra...)
	d.args = append([]string{"serve",
		"--state-dir", d.StateDir, "--run-dir", d.RunDir,
		"--listen", d.Host, "--cgroup-parent", d.Cgroup,
		"--uid-start", fmt.Sprint(d.UIDStart), "--disk-pool", "1",
		// Thin disks: allocated ones (the daemon's default) would take
		// 10 GiB of the host's disk for each warm guest and pooled disk
		// of every test daemon at once. TestDiskSpaceBacked runs with 1.
		"--disk-overcommit", "100",
		"--log-level", "debug"}, extra...)
	if err := recordOwner(filepath.Join(root, "owner.json"), owner{Args: d.args}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.cleanup)
	return d
}

// uidBlocks is how many blocks of uidBlockRanges ranges test daemons
// take their uids from, between 1<<29 and the cluster slots' 3<<30.
const (
	uidBlockRanges = 256
	uidBlocks      = (3<<30 - 1<<29) / (uidBlockRanges << 16)
)

// uidBlockNext counts the blocks handed out, from a point drawn from the
// clock (another run of these tests on the host starts elsewhere).
var uidBlockNext atomic.Uint32

func init() { uidBlockNext.Store(uint32(time.Now().UnixNano() % uidBlocks)) }

// nextUIDBlock is the first uid of the next test daemon's block. A daemon
// takes the lowest free ranges from its start, and under churn holds a
// few dozen at once (pools, sandboxes, ranges still being torn down):
// blocks of 256 keep each clear of the next daemon's. The count wraps
// after 160 daemons, long after the daemon that had the block is gone
// (tests run at most a few daemons at a time).
func nextUIDBlock() uint32 {
	return 1<<29 + (uidBlockNext.Add(1)%uidBlocks)*uidBlockRanges<<16
}

// Start starts (or restarts) the daemon process and waits until it serves.
func (d *Daemon) Start() {
	d.t.Helper()
	if err := d.start(); err != nil {
		d.t.Fatal(err)
	}
}

// start is Start that returns its error, for cleanup, which must go on.
func (d *Daemon) start() error {
	d.log = &syncBuffer{}
	bin := paddockBin
	if d.Bin != "" {
		bin = d.Bin
	}
	d.cmd = exec.Command(bin, d.args...)
	if len(d.Env) > 0 {
		d.cmd.Env = append(os.Environ(), d.Env...)
	}
	d.cmd.Stdout = d.log
	d.cmd.Stderr = d.log
	// Its own process group: a kill -9 of the daemon must not reach the
	// sandboxes, and the test's signals must not reach the daemon.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return err
	}
	c, err := client.New(d.Host)
	if err != nil {
		return err
	}
	d.client = c
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Version(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || d.cmd.ProcessState != nil {
			return fmt.Errorf("daemon did not come up: %v\n%s", err, d.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill9 kills the daemon with SIGKILL, as a crash would.
func (d *Daemon) Kill9() {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	list, _ := d.client.List(ctx, client.ListOptions{})
	cancel()
	var guests []int
	for _, sb := range list {
		if sb.Runtime != nil && sb.Runtime.HostPID > 0 {
			guests = append(guests, sb.Runtime.HostPID)
		}
		for _, c := range sb.Containers[min(1, len(sb.Containers)):] {
			if c.Runtime != nil && c.Runtime.HostPID > 0 {
				guests = append(guests, c.Runtime.HostPID)
			}
		}
	}
	d.killer(guests)()
}

// killer returns Kill9 as a function that kills at once: what it needs
// to reap afterwards (guests, which the caller names, the forker, warm
// guests) is gathered now.
func (d *Daemon) killer(guests []int) func() {
	d.t.Helper()
	d.orphans = append(d.orphans, guests...)
	// Its helper (the guest forker) and warm guests are reparented to us
	// too.
	d.orphans = append(d.orphans, childrenOf(d.cmd.Process.Pid)...)
	for _, ctrl := range []string{"memory", "unified", ""} {
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", ctrl, d.Cgroup, "*", "cgroup.procs"))
		for _, f := range dirs {
			b, _ := os.ReadFile(f)
			for _, l := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(l); err == nil {
					d.orphans = append(d.orphans, pid)
				}
			}
		}
	}
	return func() {
		d.cmd.Process.Kill()
		d.cmd.Wait()
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(e.Name()); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// reapOrphans reaps the processes of a killed daemon reparented to the
// test process, waiting a bounded time for each to exit. Only those: other
// children of the test process belong to exec.Cmds that wait for them.
func (d *Daemon) reapOrphans() {
	for _, pid := range d.orphans {
		for i := 0; i < 40; i++ {
			var ws unix.WaitStatus
			got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			if got == pid || err != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	d.orphans = nil
}

// Stop stops the daemon gracefully.
func (d *Daemon) Stop() {
	if d.cmd == nil || d.cmd.ProcessState != nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		d.cmd.Process.Kill()
		<-done
	}
}

// Client returns an SDK client of the daemon.
func (d *Daemon) Client() *client.Client { return d.client }

// Log returns what the daemon has logged so far.
func (d *Daemon) Log() string { return d.log.String() }

// Result is a CLI run's outcome.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// CLI runs the paddock binary as a client of this daemon.
func (d *Daemon) CLI(args ...string) Result {
	return d.CLIInput("", args...)
}

// CLIInput runs the CLI with stdin.
func (d *Daemon) CLIInput(stdin string, args ...string) Result {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, paddockBin, append([]string{"--host", d.Host}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		d.t.Fatalf("running paddock %v: %v", args, err)
	}
	return r
}

// MustCLI runs the CLI and fails the test on a non-zero exit.
func (d *Daemon) MustCLI(args ...string) string {
	d.t.Helper()
	r := d.CLI(args...)
	if r.Code != 0 {
		d.t.Fatalf("paddock %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// Create creates a sandbox through the SDK and returns its id.
func (d *Daemon) Create(req api.CreateRequest) string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := d.client.Create(ctx, req)
	if err != nil {
		d.t.Fatalf("create: %v\n%s", err, d.Log())
	}
	return sb.ID
}

// Exec runs a command through the SDK and returns its output and status.
func (d *Daemon) Exec(id string, cmd ...string) (stdout, stderr string, st *api.ExitStatus) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	st, err := d.client.Exec(ctx, id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil {
		d.t.Fatalf("exec %v: %v", cmd, err)
	}
	return out.String(), errb.String(), st
}

// Sh runs a shell script in the sandbox and fails the test unless it exits 0.
func (d *Daemon) Sh(id, script string) string {
	d.t.Helper()
	out, errs, st := d.Exec(id, "sh", "-c", script)
	if st.ExitCode != 0 || st.Error != "" {
		d.t.Fatalf("sh -c %q: exit %d (%s)\nstdout: %s\nstderr: %s", script, st.ExitCode, st.Error, out, errs)
	}
	return out
}

func (d *Daemon) cleanup() {
	t := d.t
	if d.cmd != nil && d.cmd.ProcessState != nil {
		// Killed or stopped and not started again (a test that failed
		// between a kill and a restart): start it, so that what it made
		// (disks on loop devices, mounts) is removed through it.
		if err := d.start(); err != nil {
			t.Errorf("cleanup: restarting the daemon: %v", err)
			d.Stop()
		}
	}
	if d.cmd != nil && d.cmd.ProcessState == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		list, err := d.client.List(ctx, client.ListOptions{})
		if err == nil {
			for _, sb := range list {
				// Not found: it went meanwhile (a timeout; a stub of an
				// archived sandbox another node took in).
				if err := d.client.Delete(ctx, sb.ID, true); err != nil && !errors.Is(err, client.ErrNotFound) {
					t.Errorf("cleanup: removing %s: %v", sb.ID, err)
				}
			}
		}
		// Templates hold snapshots: they go first.
		if tpls, err := d.client.Templates(ctx); err == nil {
			for _, tp := range tpls {
				if err := d.client.DeleteTemplate(ctx, tp.Name); err != nil {
					t.Errorf("cleanup: removing template %s: %v", tp.Name, err)
				}
			}
		}
		// Volumes and snapshots outlive sandboxes (and daemons): remove
		// them so that their filesystems are unmounted.
		if vols, err := d.client.Volumes(ctx); err == nil {
			for _, v := range vols {
				if err := d.client.DeleteVolume(ctx, v.Name); err != nil {
					t.Errorf("cleanup: removing volume %s: %v", v.Name, err)
				}
			}
		}
		if snaps, err := d.client.Snapshots(ctx, ""); err == nil {
			for _, s := range snaps {
				if err := d.client.DeleteSnapshot(ctx, s.ID); err != nil {
					t.Errorf("cleanup: removing snapshot %s: %v", s.ID, err)
				}
			}
		}
		cancel()
		d.Stop()
	}
	d.reapOrphans()
	// The storage filesystem stays mounted when a daemon exits (the
	// sandboxes' disks live on it); take it down now that nothing is on it.
	if err := disk.Unmount(filepath.Join(d.StateDir, "storage")); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	// So does the tmpfs the daemon mounted on its run dir (rundir.Mount).
	if err := rundir.Unmount(d.RunDir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	// Its network's rules and links stay when a daemon exits (sandboxes
	// may keep running); remove them.
	if err := network.Uninstall(d.NetName); err != nil {
		t.Errorf("cleanup: removing network %s: %v", d.NetName, err)
	}
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.log)
	}
	// Nothing of this daemon may be left on the host.
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, d.Root) {
			f := strings.Fields(line)
			if len(f) > 4 {
				t.Errorf("leftover mount: %s", f[4])
				syscall.Unmount(f[4], syscall.MNT_DETACH)
			}
		}
	}
	for _, ctrl := range []string{"cpu", "memory", "pids", "freezer", "cpuacct", "unified", ""} {
		dir := filepath.Join("/sys/fs/cgroup", ctrl, d.Cgroup)
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("leftover cgroup: %s/%s", dir, e.Name())
			}
		}
	}
	if t.Failed() {
		// What a failed test left (its guests, disks, links) must not
		// outlive it: the daemon's own uninstall removes it.
		args := append(append([]string{}, d.args...), "--uninstall")
		if out, err := exec.Command(paddockBin, args...).CombinedOutput(); err != nil {
			t.Logf("cleanup: uninstall: %v\n%s", err, out)
		}
		unmountUnder(d.Root)
	}
	for _, ctrl := range []string{"cpu", "memory", "pids", "freezer", "cpuacct", "unified", ""} {
		syscall.Rmdir(filepath.Join("/sys/fs/cgroup", ctrl, d.Cgroup))
	}
	os.RemoveAll(d.Root)
}

// ExecAs runs a command as a user of the sandbox.
func (d *Daemon) ExecAs(id, user string, cmd ...string) (stdout, stderr string, st *api.ExitStatus) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	st, err := d.client.Exec(ctx, id, api.ExecRequest{Cmd: cmd, User: user}, client.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil {
		d.t.Fatalf("exec %v as %s: %v", cmd, user, err)
	}
	return out.String(), errb.String(), st
}
