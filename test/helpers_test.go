package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// newDaemon is StartDaemon with its root opened to other uids. StartDaemon
// makes the root with os.MkdirTemp (mode 0700), and a sandbox's guest, an
// unprivileged host uid, must be able to traverse the run dir to attach its
// layers; TestPrivateRoot covers what the daemon does under such a root.
func newDaemon(t *testing.T, extra ...string) *Daemon {
	t.Helper()
	d := StartDaemon(t, extra...)
	if err := os.Chmod(d.Root, 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

// createCLI creates a sandbox with the CLI and returns its id.
func (d *Daemon) createCLI(args ...string) string {
	d.t.Helper()
	out := d.MustCLI(append([]string{"create"}, args...)...)
	id := strings.TrimSpace(out)
	if id == "" || strings.ContainsAny(id, " \n\t") {
		d.t.Fatalf("create printed %q, want one id", out)
	}
	return id
}

// get returns a sandbox through the SDK, failing the test on an error.
func (d *Daemon) get(id string) *api.Sandbox {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := d.Client().Get(ctx, id)
	if err != nil {
		d.t.Fatalf("get %s: %v", id, err)
	}
	return sb
}

// hostPID returns the host pid of a running sandbox's guest.
func (d *Daemon) hostPID(id string) int {
	d.t.Helper()
	sb := d.get(id)
	if sb.Runtime == nil || sb.Runtime.HostPID <= 0 {
		d.t.Fatalf("sandbox %s reports no host pid: %+v", id, sb.Runtime)
	}
	return sb.Runtime.HostPID
}

// execResult is how an exec ended, with its output.
type execResult struct {
	Stdout, Stderr string
	*api.ExitStatus
}

func (r execResult) String() string {
	return fmt.Sprintf("exit %d signal %q oom %v error %q\nstdout: %s\nstderr: %s",
		r.ExitCode, r.Signal, r.OOMKilled, r.Error, r.Stdout, r.Stderr)
}

// run runs cmd in a sandbox through the SDK, with stdin when it is not
// empty, and returns how it ended; only a failure to run it fails the test.
func (d *Daemon) run(id, stdin string, cmd ...string) execResult {
	d.t.Helper()
	return runVia(d.t, d.Client(), id, stdin, cmd...)
}

// runVia runs cmd in sandbox id through cl (a gateway's client).
func runVia(t *testing.T, cl *client.Client, id, stdin string, cmd ...string) execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req := api.ExecRequest{Cmd: cmd}
	if stdin != "" {
		req.Stdin = &stdin
	}
	var out, errb bytes.Buffer
	st, err := cl.Exec(ctx, id, req, client.ExecIO{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", cmd, id, err)
	}
	return execResult{Stdout: out.String(), Stderr: errb.String(), ExitStatus: st}
}

// sh runs a shell script in a sandbox and returns how it ended.
func (d *Daemon) sh(id, script string) execResult {
	d.t.Helper()
	return d.run(id, "", "sh", "-c", script)
}

// py runs a python3 program in a sandbox and returns how it ended.
func (d *Daemon) py(id, program string, args ...string) execResult {
	d.t.Helper()
	return d.run(id, "", append([]string{"python3", "-c", program}, args...)...)
}

// httpClient returns a plain net/http client that dials the daemon's
// socket and never reuses a connection, so that one refused request
// cannot affect the next.
func (d *Daemon) httpClient() *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var nd net.Dialer
				return nd.DialContext(ctx, "unix", d.Sock)
			},
			DisableKeepAlives: true,
		},
	}
}

// httpAnswer is a raw HTTP answer of the daemon.
type httpAnswer struct {
	Status int
	Header http.Header
	Body   []byte
}

// apiError decodes the answer as an api.Error, failing the test unless it
// is one.
func (a httpAnswer) apiError(t *testing.T) api.Error {
	t.Helper()
	if ct := a.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type = %q, want application/json; body %q", ct, a.Body)
	}
	var e api.Error
	dec := json.NewDecoder(bytes.NewReader(a.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("body %q is not a JSON {code, message}: %v", a.Body, err)
	}
	if e.Code == "" || e.Message == "" {
		t.Errorf("error body %q lacks a code or a message", a.Body)
	}
	return e
}

// do sends one request with net/http over the daemon's socket; path is
// sent with its escapes as given, and an empty body is no body.
func (d *Daemon) do(method, path, body string) httpAnswer {
	d.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://paddock"+path, rd)
	if err != nil {
		d.t.Fatalf("building %s %s: %v", method, path, err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := d.httpClient().Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		d.t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return httpAnswer{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// rawRequest writes request bytes as they are on a fresh connection and
// reads one answer, even when the daemon answers and hangs up before it
// has read all of them (an oversized body).
func (d *Daemon) rawRequest(request []byte) httpAnswer {
	d.t.Helper()
	conn, err := net.Dial("unix", d.Sock)
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	// The daemon may answer and close before it has read everything; keep
	// writing in the background and read the answer meanwhile.
	go conn.Write(request)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		d.t.Fatalf("reading the answer to %.80q: %v", request, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return httpAnswer{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// waitFor polls cond every interval until it holds or timeout passes, and
// reports whether it held.
func waitFor(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// alive reports whether a host process exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// procUID returns a host process's real uid.
func procUID(pid int) (uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Uid:" {
			n, err := strconv.ParseUint(f[1], 10, 32)
			return uint32(n), err
		}
	}
	return 0, fmt.Errorf("no Uid line in /proc/%d/status", pid)
}

// procCmdline returns a host process's argv joined by spaces.
func procCmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// pidsInUIDRange lists live host processes whose uid lies in the 65536-id
// range starting at base: the processes of the sandbox given that range.
func pidsInUIDRange(base uint32) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		uid, err := procUID(pid)
		if err == nil && uid >= base && uid-base < 65536 && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupDirs returns the directories a sandbox's cgroup path may have on
// the host: one per v1 controller, or the v2 one.
func cgroupDirs(cgroupPath string) []string {
	var dirs []string
	for _, ctrl := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "blkio", "devices", "cpuset", "unified", ""} {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", ctrl, cgroupPath))
	}
	return dirs
}

// traces lists what is left on the host of sandbox sb (as it was last
// seen running): mounts, cgroups, loop devices, directories and processes.
// Empty means the sandbox is gone. A removal answers before its teardown
// is done (within a second, usually tens of milliseconds): traces looks
// again for up to teardownWait before it reports any.
func (d *Daemon) traces(sb *api.Sandbox) []string {
	deadline := time.Now().Add(teardownWait)
	for {
		left := d.tracesOnce(sb)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// teardownWait is how long a test waits for a removed sandbox's traces to
// go: the bar is a second, and the machine is shared.
const teardownWait = 5 * time.Second

func (d *Daemon) tracesOnce(sb *api.Sandbox) []string {
	var left []string
	id := sb.ID
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.Contains(f[4], id) {
			left = append(left, "mount "+f[4])
		}
	}
	paths := cgroupDirs(filepath.Join(d.Cgroup, id))
	if sb.Runtime != nil && sb.Runtime.Cgroup != "" {
		paths = append(paths, cgroupDirs(sb.Runtime.Cgroup)...)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			left = append(left, "cgroup "+p)
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if b, err := os.ReadFile(l); err == nil && strings.Contains(string(b), id) {
			left = append(left, fmt.Sprintf("loop device %s backed by %s", l, strings.TrimSpace(string(b))))
		}
	}
	for _, root := range []string{d.RunDir, d.StateDir} {
		filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if e.IsDir() && p == filepath.Join(d.StateDir, "images") {
				return filepath.SkipDir
			}
			if strings.Contains(e.Name(), id) {
				left = append(left, "path "+p)
				if e.IsDir() {
					return filepath.SkipDir
				}
			}
			return nil
		})
	}
	if sb.Runtime != nil {
		if sb.Runtime.HostPID > 0 && alive(sb.Runtime.HostPID) {
			if uid, err := procUID(sb.Runtime.HostPID); err == nil && uid == sb.Runtime.UIDBase {
				left = append(left, fmt.Sprintf("guest process %d (%s)", sb.Runtime.HostPID, procCmdline(sb.Runtime.HostPID)))
			}
		}
		if sb.Runtime.UIDBase != 0 {
			// A freed uid range may go to a new warm guest at once, which
			// sits in the forker's cgroup for a moment before it is
			// recognisably warm: look again before calling it a leftover.
			var procs []string
			for i := 0; i < 20; i++ {
				procs = procs[:0]
				for _, pid := range pidsInUIDRange(sb.Runtime.UIDBase) {
					if pid != sb.Runtime.HostPID && !d.isWarm(pid) {
						procs = append(procs, describe(pid))
					}
				}
				if len(procs) == 0 {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			left = append(left, procs...)
		}
	}
	return left
}

// Warm guests are sandboxes-to-be the daemon makes ahead of time
// (--warm-guests, default 2) for creates to take: each already has its
// id, and a cgroup named by it, but its run dir is under run/warm/<id> and
// its disk is named warm-<id> until a create takes it. They belong to no
// sandbox yet.
const warmDiskName = "warm-"

// isWarmID reports whether id is one of the daemon's warm guests, or one
// of its blank guests (started ahead of time too, but bound to no image or
// disk: a cgroup named by the id and a run dir under run/blank/<id>).
func (d *Daemon) isWarmID(id string) bool {
	for _, dir := range []string{"warm", "blank"} {
		if _, err := os.Stat(filepath.Join(d.RunDir, dir, id)); err == nil {
			return true
		}
	}
	return false
}

// daemonTraces lists every sandbox-shaped thing under the daemon, whatever
// its id: run dirs, handed-out disks, mounts other than the ready disk pool
// and warm guests', child cgroups other than the warm one, and processes
// of the daemon's first uid ranges outside the warm cgroup. Empty means
// the daemon holds no sandbox.
func (d *Daemon) daemonTraces() []string {
	// A guest the daemon has just forked ahead of time sits in the
	// forker's cgroup for a moment before it is moved into its own, where
	// it is recognisably warm: look again before calling it a leftover.
	var left []string
	for deadline := time.Now().Add(teardownWait); ; {
		if left = d.daemonTracesOnce(); len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (d *Daemon) daemonTracesOnce() []string {
	var left []string
	storage := filepath.Join(d.StateDir, "storage")
	vol := filepath.Join(storage, "disks", "vol")
	for _, dir := range []string{filepath.Join(d.RunDir, "sandboxes"), vol} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if dir == vol && strings.HasPrefix(e.Name(), warmDiskName) {
				continue
			}
			left = append(left, "path "+filepath.Join(dir, e.Name()))
		}
	}
	pool := filepath.Join(storage, "disks", "pool") + "/"
	warmDisks := filepath.Join(vol, warmDiskName)
	warmRun := filepath.Join(d.RunDir, "warm") + "/"
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) <= 4 || !strings.HasPrefix(f[4], d.Root+"/") {
			continue
		}
		// The storage filesystem and the run dir's tmpfs are the
		// daemon's, not a sandbox's.
		if f[4] == storage || f[4] == d.RunDir || strings.HasPrefix(f[4], pool) || strings.HasPrefix(f[4], warmDisks) || strings.HasPrefix(f[4], warmRun) {
			continue
		}
		left = append(left, "mount "+f[4])
	}
	for _, dir := range cgroupDirs(d.Cgroup) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() && !d.isWarmID(e.Name()) {
				left = append(left, "cgroup "+filepath.Join(dir, e.Name()))
			}
		}
	}
	for i := range uint32(8) {
		for _, pid := range pidsInUIDRange(d.UIDStart + i*65536) {
			if !d.isWarm(pid) {
				left = append(left, describe(pid))
			}
		}
	}
	return left
}

// isWarm reports whether a host process belongs to one of the daemon's
// warm guests: its cgroup is named by a warm guest's id.
func (d *Daemon) isWarm(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	prefix := path.Join("/", d.Cgroup) + "/"
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-id:controllers:path
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && strings.HasPrefix(f[2], prefix) {
			if d.isWarmID(strings.TrimPrefix(f[2], prefix)) {
				return true
			}
		}
	}
	return false
}

// describe says what a host process is, for failure messages (and for
// tracesBesides, which looks for a sandbox's id in it): its argv, uid,
// parent and cgroups. On v1 a guest's own threads stay in the parent's
// pids group (its sandbox's processes alone count against the cap), so
// the memory hierarchy's path is the one that names its sandbox.
func describe(pid int) string {
	uid, _ := procUID(pid)
	ppid := ""
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "PPid:") {
				ppid = strings.TrimSpace(strings.TrimPrefix(l, "PPid:"))
			}
		}
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	var cgs []string
	for _, l := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && (strings.Contains(f[1], "pids") || strings.Contains(f[1], "memory") || f[1] == "") {
			cgs = append(cgs, f[1]+":"+f[2])
		}
	}
	return fmt.Sprintf("process %d (%q uid %d ppid %s cgroup %s)", pid, procCmdline(pid), uid, ppid, strings.Join(cgs, " "))
}

// startHostProcess starts a host process that the test kills at cleanup.
func startHostProcess(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// fileSHA256 returns the hex SHA-256 of a host file.
func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("hashing %s: %v", path, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// lines splits output into its non-empty lines.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}
