package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// runscBin is gVisor's runsc for the gvisor runtime's tests: PADDOCK_RUNSC
// (make test sets it), else what make runsc built. The tests skip, saying
// so, only when there is none.
func runscBin(t *testing.T) string {
	t.Helper()
	p := findRunsc()
	if p == "" {
		t.Skip(noRunsc)
	}
	return p
}

const noRunsc = "runsc is not built: make runsc (make test builds it)"

// findRunsc is runscBin's runsc, or "" when there is none.
func findRunsc() string {
	if p := os.Getenv("PADDOCK_RUNSC"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	out, err := exec.Command("../scripts/runsc-bin.sh", "--print").Output()
	if err == nil {
		if p := strings.TrimSpace(string(out)); p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return ""
}

// tierDaemon starts a daemon for tests that run on both tiers: with
// gVisor when runsc is built. forTiers runs f once per tier, skipping
// gVisor's run, saying why, when there is no runsc.
func tierDaemon(t *testing.T, extra ...string) *Daemon {
	t.Helper()
	if p := findRunsc(); p != "" {
		extra = append([]string{"--runsc", p}, extra...)
	}
	return newDaemon(t, extra...)
}

func forTiers(t *testing.T, f func(t *testing.T, tier string)) {
	t.Helper()
	for _, tier := range []string{"native", "gvisor"} {
		t.Run(tier, func(t *testing.T) {
			if tier == "gvisor" && findRunsc() == "" {
				t.Skip(noRunsc)
			}
			f(t, tier)
		})
	}
}

// newGvisorDaemon starts a daemon whose gvisor runtime uses runsc.
func newGvisorDaemon(t *testing.T, extra ...string) *Daemon {
	t.Helper()
	return newDaemon(t, append([]string{"--runsc", runscBin(t), "--warm-guests", "0", "--blank-guests", "0"}, extra...)...)
}

// TestGvisorCore runs the core flows on a gvisor sandbox: the guest as
// PID 1 under gVisor's kernel, exec with input and with a terminal,
// files, a port, limits, the runtime named in version and inspect, a
// daemon's kill -9 and restart, a pause and resume, and a removal that
// leaves nothing behind (the harness checks mounts and cgroups).
func TestGvisorCore(t *testing.T) {
	d := newGvisorDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.Client()

	v, err := c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Runtime != "native" || v.Runtimes["gvisor"] == "" || v.Runtimes["native"] == "" {
		t.Fatalf("version: runtime %q, runtimes %v; want native by default and gvisor with its version", v.Runtime, v.Runtimes)
	}
	if out := d.MustCLI("version"); !strings.Contains(out, "runtime gvisor: "+v.Runtimes["gvisor"]) {
		t.Fatalf("paddock version does not name the gvisor runtime's version:\n%s", out)
	}

	sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor", Resources: api.Resources{MemoryBytes: 256 << 20, Pids: 200}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	sb = d.get(id)
	if sb.RuntimeName != "gvisor" || sb.Runtime == nil || sb.Runtime.Name != "gvisor" || sb.Runtime.Version != v.Runtimes["gvisor"] {
		t.Fatalf("inspect: runtime_name %q, runtime %+v; want gvisor and runsc's version", sb.RuntimeName, sb.Runtime)
	}

	// The sandbox's kernel is gVisor's, and the guest is its PID 1.
	if out := d.Sh(id, "dmesg 2>/dev/null | head -1; uname -r; cat /proc/1/cmdline | tr '\\0' ' '"); !strings.Contains(out, "gvisor") || !strings.Contains(out, "guest") {
		t.Fatalf("not under gVisor, or the guest is not PID 1:\n%s", out)
	}

	// Input, and a terminal.
	var out bytes.Buffer
	st, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "tr a-z A-Z; exit 3"}},
		client.ExecIO{Stdin: strings.NewReader("under gvisor\n"), Stdout: &out})
	if err != nil || st.ExitCode != 3 || out.String() != "UNDER GVISOR\n" {
		t.Fatalf("exec with input: %+v, %v, %q", st, err, out.String())
	}
	s, err := c.ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "tty; stty size"}, TTY: &api.TTY{Cols: 91, Rows: 17}}, true)
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	st, err = s.Wait(&out, io.Discard)
	s.Close()
	if err != nil || st.ExitCode != 0 || !strings.Contains(out.String(), "/dev/pts/") || !strings.Contains(out.String(), "17 91") {
		t.Fatalf("exec with a terminal: %+v, %v, %q", st, err, out.String())
	}

	// Files, both ways, and what the sandbox sees of them.
	data := bytes.Repeat([]byte("gvisor files "), 64<<10)
	if _, err := c.WriteFile(ctx, id, "/root/big", bytes.NewReader(data), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := d.Sh(id, "wc -c < /root/big"); strings.TrimSpace(got) != fmt.Sprint(len(data)) {
		t.Fatalf("the sandbox sees %q bytes, want %d", got, len(data))
	}
	d.Sh(id, "echo made inside > /root/inside")
	rc, err := c.ReadFile(ctx, id, "/root/inside")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "made inside\n" {
		t.Fatalf("read %q", got)
	}

	// A port: a server in the sandbox, reached from the host.
	d.Sh(id, "mkdir -p /srv/www && echo served > /srv/www/index.html && cd /srv/www && (python3 -m http.server 8000 >/dev/null 2>&1 &)")
	addr, err := c.ForwardPort(ctx, id, 8000)
	if err != nil {
		t.Fatal(err)
	}
	var body string
	if !waitFor(20*time.Second, 100*time.Millisecond, func() bool {
		resp, err := http.Get("http://" + addr + "/index.html")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == 200
	}) || body != "served\n" {
		t.Fatalf("port 8000 through %s: %q", addr, body)
	}

	// Limits are the cgroup's, which runsc's processes are in.
	if sb.Runtime.Cgroup == "" {
		t.Fatal("no cgroup reported")
	}
	lim, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", sb.Runtime.Cgroup, "memory.limit_in_bytes"))
	if err == nil && strings.TrimSpace(string(lim)) != fmt.Sprint(256<<20) {
		t.Fatalf("memory limit %s, want %d", lim, 256<<20)
	}
	procs, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", sb.Runtime.Cgroup, "cgroup.procs"))
	if !strings.Contains(string(procs), fmt.Sprint(sb.Runtime.HostPID)) {
		t.Fatalf("runsc's sandbox process %d is not in the sandbox's cgroup (%q)", sb.Runtime.HostPID, procs)
	}

	// A fork runs on its source's runtime, with its files.
	fr, err := c.Fork(ctx, id, api.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	fork := fr.Sandboxes[0].ID
	if sb := d.get(fork); sb.RuntimeName != "gvisor" {
		t.Fatalf("fork of a gvisor sandbox runs on %q", sb.RuntimeName)
	}
	if out := d.Sh(fork, "uname -r; cat /root/inside"); !strings.Contains(out, "gvisor") || !strings.Contains(out, "made inside") {
		t.Fatalf("fork: %q", out)
	}
	if err := c.Delete(ctx, fork, true); err != nil {
		t.Fatal(err)
	}

	// A daemon killed with -9 leaves the sandbox running; the next one
	// finds it, processes and all.
	d.Sh(id, "(sleep 1000 >/dev/null 2>&1 &)")
	d.Kill9()
	d.Start()
	if out := d.Sh(id, "pgrep -c sleep; cat /root/inside"); !strings.Contains(out, "1\n") || !strings.Contains(out, "made inside") {
		t.Fatalf("after a daemon restart: %q", out)
	}

	// Pause keeps the processes and the files (TestGvisorMemoryPause
	// has the detail); resume continues them on gVisor.
	if _, err := c.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out := d.Sh(id, "uname -r; cat /root/inside; echo sleeping $(pgrep -c sleep)"); !strings.Contains(out, "gvisor") || !strings.Contains(out, "made inside") || !strings.Contains(out, "sleeping 1") {
		t.Fatalf("after pause and resume: %q", out)
	}
	if err := c.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
}

// TestGvisorNativeSide runs a native and a gvisor sandbox on one daemon
// whose default is gvisor, and checks that a create naming a runtime the
// daemon lacks is refused with a clear error.
func TestGvisorNativeSide(t *testing.T) {
	d := newGvisorDaemon(t, "--default-runtime", "gvisor")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := d.Client()
	g := d.createCLI()
	n := d.createCLI("--runtime", "native")
	if sb := d.get(g); sb.RuntimeName != "gvisor" {
		t.Fatalf("default create ran on %q", sb.RuntimeName)
	}
	if out := d.Sh(g, "uname -r"); !strings.Contains(out, "gvisor") {
		t.Fatalf("default create is not under gVisor: %q", out)
	}
	if out := d.Sh(n, "uname -r"); strings.Contains(out, "gvisor") {
		t.Fatalf("native create is under gVisor: %q", out)
	}
	// A template names its runtime: its build and its sandboxes run on
	// it, unless a create names another.
	tpl, err := c.BuildTemplate(ctx, api.TemplateSpec{Name: "gv", Runtime: "native",
		Steps: []api.TemplateStep{{Run: "uname -r > /root/built-on"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Spec.Runtime != "native" {
		t.Fatalf("template runtime %q", tpl.Spec.Runtime)
	}
	fromTpl := d.createCLI("--from", "gv")
	if sb := d.get(fromTpl); sb.RuntimeName != "native" {
		t.Fatalf("a create from a native template ran on %q", sb.RuntimeName)
	}
	if out := d.Sh(fromTpl, "cat /root/built-on; uname -r"); strings.Contains(out, "gvisor") {
		t.Fatalf("native template's build or sandbox under gVisor: %q", out)
	}
	onGvisor := d.createCLI("--from", "gv", "--runtime", "gvisor")
	if out := d.Sh(onGvisor, "cat /root/built-on; uname -r"); !strings.HasSuffix(strings.TrimSpace(out), "gvisor") || strings.Count(out, "gvisor") != 1 {
		t.Fatalf("a gvisor create from the native template: %q", out)
	}
	_, err = c.Create(ctx, api.CreateRequest{Runtime: "firecracker"})
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "firecracker") {
		t.Fatalf("create with an unknown runtime: %v, want invalid naming it", err)
	}

	// A sandbox of several containers runs on native only: refused on
	// gvisor, named or the daemon's default, saying why, leaving nothing.
	spec := filepath.Join(d.Root, "sandbox.yaml")
	if err := os.WriteFile(spec, []byte(groupYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	before := d.MustCLI("ls", "-q")
	for _, args := range [][]string{{"-f", spec}, {"-f", spec, "--runtime", "gvisor"}} {
		r := d.CLI(append([]string{"create"}, args...)...)
		if r.Code == 0 || !strings.Contains(r.Stderr, "native runtime only, not gvisor") || !strings.Contains(r.Stderr, "network namespace") {
			t.Fatalf("create %q on gvisor: exit %d, %s; want refused naming the runtimes and why", args, r.Code, r.Stderr)
		}
	}
	if after := d.MustCLI("ls", "-q"); after != before {
		t.Fatalf("a refused group left a sandbox behind:\n%s", d.MustCLI("ls"))
	}
	if out := d.MustCLI("volume", "ls"); strings.Contains(out, "workspace") {
		t.Fatalf("a refused group left its shared volume:\n%s", out)
	}
	grp := d.createCLI("-f", spec, "--runtime", "native")
	if sb := d.get(grp); sb.RuntimeName != "native" || len(sb.Containers) != 3 {
		t.Fatalf("the group on native: runtime %q, %d containers", sb.RuntimeName, len(sb.Containers))
	}
	if out := d.groupExec(grp, "tools", "uname", "-r"); out.ExitCode != 0 || strings.Contains(out.Stdout, "gvisor") {
		t.Fatalf("a container of the native group: %v", out)
	}
	// Its shared volume and disks go with it, behind the answer.
	d.MustCLI("rm", "-f", grp)
	gone := func() bool {
		if strings.Contains(d.MustCLI("volume", "ls"), "workspace") {
			return false
		}
		loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, l := range loops {
			if b, err := os.ReadFile(l); err == nil && strings.HasPrefix(string(b), d.Root) && (strings.Contains(string(b), grp) || strings.Contains(string(b), "/trash/")) {
				return false
			}
		}
		return true
	}
	if !waitFor(30*time.Second, 100*time.Millisecond, gone) {
		t.Fatalf("the group's shared volume or disks outlived it:\n%s", d.MustCLI("volume", "ls"))
	}
}

// TestGvisorUnavailable: without runsc the daemon serves native
// sandboxes and refuses gvisor ones, saying why.
func TestGvisorUnavailable(t *testing.T) {
	d := newDaemon(t, "--runsc", "/nonexistent/runsc")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := d.Client().Create(ctx, api.CreateRequest{Runtime: "gvisor"})
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "gvisor") || !strings.Contains(err.Error(), "runsc") {
		t.Fatalf("create --runtime gvisor without runsc: %v, want unavailable naming gvisor and runsc", err)
	}
	d.createCLI() // native still works
}

// TestGvisorPool: a daemon keeping gvisor sandboxes ready hands one out
// to a gvisor create (its pool refills behind), with the limits the
// create asks for, and removes its ready ones when it stops.
func TestGvisorPool(t *testing.T) {
	d := newGvisorDaemon(t, "--gvisor-pool", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := d.Client()
	ready := func() int {
		p, err := c.Pools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p.Ready["gvisor:image:host"]
	}
	if !waitFor(time.Minute, 50*time.Millisecond, func() bool { return ready() == 1 }) {
		t.Fatalf("the gvisor pool has %d ready, want 1\n%s", ready(), d.Log())
	}
	sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor", Resources: api.Resources{MemoryBytes: 300 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's log reaches the test through a pipe: it may lag.
	if !waitFor(10*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(d.Log(), "sandbox="+sb.ID+" taken=") }) {
		t.Fatalf("create %s did not take the ready sandbox:\n%s", sb.ID, d.Log())
	}
	if out := d.Sh(sb.ID, "uname -r; hostname; cat /etc/hostname"); !strings.Contains(out, "gvisor") || strings.Count(out, sb.ID) != 2 {
		t.Fatalf("pooled sandbox: %q; want gVisor's kernel and its id for hostname, in /etc/hostname too", out)
	}
	underProfile(t, d, sb.ID)
	sb = d.get(sb.ID)
	lim, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", sb.Runtime.Cgroup, "memory.limit_in_bytes"))
	if err == nil && strings.TrimSpace(string(lim)) != fmt.Sprint(300<<20) {
		t.Fatalf("memory limit %s, want the create's %d", lim, 300<<20)
	}
	if !waitFor(time.Minute, 50*time.Millisecond, func() bool { return ready() == 1 }) {
		t.Fatalf("the gvisor pool did not refill")
	}
	// The harness's cleanup stops the daemon and finds nothing left of
	// the ready sandbox (mounts, cgroups).
}

// memoryServer is a Python HTTP server whose answers carry its pid and a
// count of the requests it served, kept in its memory.
const memoryServer = `import http.server, os
hits = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global hits
        hits += 1
        b = ("pid %d hits %d\n" % (os.getpid(), hits)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// startMemoryWork starts, in sandbox id, a counter writing increasing
// numbers to /root/count and memoryServer on port 8000, and returns the
// counter's pid once both run.
func startMemoryWork(t *testing.T, d *Daemon, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.Client().WriteFile(ctx, id, "/root/srv.py", strings.NewReader(memoryServer), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Sh(id, `echo kept > /root/marker
(nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /root/count.new; mv /root/count.new /root/count; sleep 0.05; done' >/dev/null 2>&1 &)
(nohup python3 /root/srv.py >/dev/null 2>&1 &)`)
	if !waitFor(30*time.Second, 100*time.Millisecond, func() bool {
		_, _, st := d.Exec(id, "sh", "-c", "test -s /root/count && python3 -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/')\"")
		return st.ExitCode == 0
	}) {
		t.Fatal("the counter or the server did not start")
	}
	return strings.TrimSpace(d.Sh(id, "pgrep -f 'i=[0]' | head -1"))
}

// readCount reads the counter sandbox id's counter wrote last.
func readCount(t *testing.T, d *Daemon, id string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(d.Sh(id, "cat /root/count"), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// askServer asks memoryServer in sandbox id through a forwarded port.
func askServer(t *testing.T, d *Daemon, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, err := d.Client().ForwardPort(ctx, id, 8000)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("asking the server in %s: %v", id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// pauseWithMemory pauses sandbox id and checks that the pause kept its
// memory and that its processes cannot run again: their sentry is gone
// or exiting (its exit, which frees their memory, and the removal of
// their cgroup end behind the answer: checkStopEnded).
func pauseWithMemory(t *testing.T, d *Daemon, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before := d.get(id)
	sb, err := d.Client().Pause(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StatePaused || sb.Paused == nil || !sb.Paused.Memory || sb.Paused.CheckpointBytes <= 0 {
		t.Fatalf("pause of a gvisor sandbox: state %s, paused %+v; want its memory kept", sb.State, sb.Paused)
	}
	if sb.Runtime != nil || !ending(before.Runtime.HostPID) {
		t.Fatalf("the paused sandbox's sentry (pid %d) runs on: %+v", before.Runtime.HostPID, sb.Runtime)
	}
}

// ending says process pid cannot run again: it is gone, a zombie,
// exiting, or a SIGKILL is pending for it.
func ending(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// After the command's ")": state, ppid, pgrp, session, tty_nr,
	// tpgid, flags.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	const pfExiting = 0x4
	if flags, err := strconv.ParseUint(f[6], 10, 64); f[0] == "Z" || f[0] == "X" || err == nil && flags&pfExiting != 0 {
		return true
	}
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if k != "SigPnd" && k != "ShdPnd" {
			continue
		}
		if set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && set&(1<<(9-1)) != 0 { // SIGKILL
			return true
		}
	}
	return false
}

// checkStopEnded checks that paused sandbox id's stop ended behind the
// pause's answer once its checkpoint is compressed: its processes gone
// with their cgroup (the kernel refuses to remove a cgroup that has
// any), its root unmounted, runsc's record of it deleted.
func checkStopEnded(t *testing.T, d *Daemon, id string) {
	t.Helper()
	if !waitFor(time.Minute, 50*time.Millisecond, func() bool { p := d.get(id).Paused; return p != nil && !p.Compressing }) {
		t.Fatal("the checkpoint was not compressed within a minute")
	}
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.Cgroup, id)) // v1
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", d.Cgroup, id)); err == nil {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", d.Cgroup, id)) // v2
	}
	if len(dirs) > 0 {
		t.Fatalf("the paused sandbox's cgroup is still there: %v", dirs)
	}
	rootfs := filepath.Join(d.RunDir, "sandboxes", id, "rootfs")
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mounts), " "+rootfs+" ") {
		t.Fatalf("the paused sandbox's root %s is still mounted (%v)", rootfs, err)
	}
	out, err := exec.Command(runscBin(t), "--root", filepath.Join(d.RunDir, "gvisor"), "list", "-quiet").CombinedOutput()
	if err != nil || slices.Contains(strings.Fields(string(out)), id) {
		t.Fatalf("runsc list (%v): %s; want no record of the paused sandbox", err, out)
	}
}

// checkCounting checks that sandbox id's counter (startMemoryWork, pid
// counter), at before when it was paused, continued from there after the
// resume and counts on; when names the resume in what it says.
func checkCounting(t *testing.T, d *Daemon, id, counter string, before int, when string) {
	t.Helper()
	after := readCount(t, d, id)
	if after < before {
		t.Fatalf("%s: the counter was at %d before the pause and at %d after the resume; want it to continue from there", when, before, after)
	}
	if !waitFor(10*time.Second, 100*time.Millisecond, func() bool { return readCount(t, d, id) > after }) {
		t.Fatalf("%s: the counter does not count after the resume", when)
	}
	if pid := strings.TrimSpace(d.Sh(id, "pgrep -f 'i=[0]' | head -1")); pid != counter {
		t.Fatalf("%s: the counter's pid is %s, was %s", when, pid, counter)
	}
}

// TestGvisorMemoryPause: a pause of a gvisor sandbox keeps its processes.
// A counter continues where it stopped, with its pid; a server keeps its
// listening socket and what it holds in memory; the pause survives a
// daemon restart. A native pause says it kept the files only.
func TestGvisorMemoryPause(t *testing.T) {
	d := newGvisorDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := d.Client()
	sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor", AutoResume: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	counter := startMemoryWork(t, d, id)
	var serverPID string
	var hits int
	if first := askServer(t, d, id); func() bool { _, err := fmt.Sscanf(first, "pid %s hits %d", &serverPID, &hits); return err != nil }() {
		t.Fatalf("server: %q", first)
	}

	for round, restart := range []bool{false, true} {
		before := readCount(t, d, id)
		pauseWithMemory(t, d, id)
		if !restart {
			checkStopEnded(t, d, id)
		}
		if restart {
			d.Kill9()
			d.Start()
			if sb := d.get(id); sb.State != api.StatePaused || sb.Paused == nil || !sb.Paused.Memory {
				t.Fatalf("after a daemon restart: state %s, paused %+v", sb.State, sb.Paused)
			}
		}
		time.Sleep(time.Second) // the counter would count 20 in this second
		if _, err := c.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		if sb := d.get(id); sb.Paused != nil || sb.State != api.StateRunning {
			t.Fatalf("after resume: state %s, paused %+v", sb.State, sb.Paused)
		}
		checkCounting(t, d, id, counter, before, fmt.Sprintf("round %d", round))
		// New commands get the new network slot's proxy.
		if out := strings.Fields(d.Sh(id, `echo $HTTP_PROXY; ip route | awk '/default/ {print $3}'`)); len(out) != 2 || !strings.Contains(out[0], "//"+out[1]+":") {
			t.Fatalf("round %d: HTTP_PROXY and the default gateway after the resume: %q", round, out)
		}
		want := fmt.Sprintf("pid %s hits %d", serverPID, hits+round+1)
		if got := askServer(t, d, id); got != want {
			t.Fatalf("round %d: the server answers %q, want %q (same process, memory kept)", round, got, want)
		}
		underProfile(t, d, id)
		if got := strings.Fields(d.Sh(id, `cat /etc/hostname; echo "$HOSTNAME"`)); len(got) != 2 || got[0] != id || got[1] != id {
			t.Fatalf("round %d: /etc/hostname and $HOSTNAME after the resume: %q", round, got)
		}
	}

	// A native sandbox's pause keeps its files only, and says so.
	n := d.createCLI("--runtime", "native")
	nsb, err := c.Pause(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if nsb.Paused == nil || nsb.Paused.Memory {
		t.Fatalf("native pause: paused %+v; want memory false", nsb.Paused)
	}
	if out := d.MustCLI("inspect", n); !strings.Contains(out, `"memory": false`) {
		t.Fatalf("inspect of a native paused sandbox does not say its memory was not kept:\n%s", out)
	}
}

// TestGvisorMemoryPauseFailures: a checkpoint that cannot be written (its
// disk is too small) leaves the sandbox running, saying why; a truncated
// checkpoint fails the resume with a clear error and keeps the files, and
// the next resume starts the sandbox from them.
func TestGvisorMemoryPauseFailures(t *testing.T) {
	d := newGvisorDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := d.Client()

	// 96 MiB of random bytes do not compress into a 64 MiB disk.
	small, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor", AutoResume: new(bool), Resources: api.Resources{DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	startMemoryWork(t, d, small.ID)
	d.Sh(small.ID, `(nohup python3 -c 'import os, time
b = os.urandom(96 << 20)
open("/root/held", "w").write("yes")
time.sleep(10000)' >/dev/null 2>&1 &)`)
	if !waitFor(time.Minute, 200*time.Millisecond, func() bool {
		_, _, st := d.Exec(small.ID, "test", "-e", "/root/held")
		return st.ExitCode == 0
	}) {
		t.Fatal("the memory holder did not start")
	}
	_, err = c.Pause(ctx, small.ID)
	if err == nil || !errors.Is(err, client.ErrConflict) || !strings.Contains(err.Error(), "runs on") {
		t.Fatalf("pause whose checkpoint does not fit: %v; want a conflict saying why and that it runs on", err)
	}
	t.Logf("the failed pause said: %v", err)
	if sb := d.get(small.ID); sb.State != api.StateRunning {
		t.Fatalf("after a failed pause: %s", sb.State)
	}
	if got := askServer(t, d, small.ID); !strings.HasSuffix(got, " hits 2") {
		t.Fatalf("after a failed pause the server answers %q", got)
	}
	if err := c.Delete(ctx, small.ID, true); err != nil {
		t.Fatal(err)
	}

	// A truncated checkpoint.
	sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor", AutoResume: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	startMemoryWork(t, d, sb.ID)
	pauseWithMemory(t, d, sb.ID)
	// The checkpoint is compressed behind the pause's answer.
	if !waitFor(time.Minute, 50*time.Millisecond, func() bool { p := d.get(sb.ID).Paused; return p != nil && !p.Compressing }) {
		t.Fatal("the checkpoint was not compressed within a minute")
	}
	img := filepath.Join(d.StateDir, "storage", "disks", "vol", sb.ID, "root", "checkpoint", "checkpoint.sqfs")
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	_, err = c.Resume(ctx, sb.ID)
	if err == nil || !strings.Contains(err.Error(), "checkpoint") || !strings.Contains(err.Error(), "files are kept") {
		t.Fatalf("resume from a truncated checkpoint: %v; want a clear error", err)
	}
	t.Logf("the failed resume said: %v", err)
	got := d.get(sb.ID)
	if got.State != api.StatePaused || got.Paused == nil || got.Paused.Memory || got.Paused.Lost == "" {
		t.Fatalf("after a failed resume: state %s, paused %+v; want paused, memory lost and why", got.State, got.Paused)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out := d.Sh(sb.ID, "cat /root/marker; pgrep -f 'i=[0]' || echo none"); !strings.Contains(out, "kept") || !strings.Contains(out, "none") {
		t.Fatalf("after the resume from the files: %q; want the files and no counter", out)
	}
}

// upgradedPaddock builds into dir a paddock binary whose guest differs
// from paddockBin's, as an upgrade's would: built without the embedded
// guest, its sandboxes run its own binary (a version string of its own
// makes it differ from any other such build).
func upgradedPaddock(dir string) (string, error) {
	out := filepath.Join(dir, "paddock")
	build := exec.Command("go", "build", "-tags", "netgo osusergo",
		"-ldflags", `-linkmode external -extldflags "-static" -X github.com/paddock-dev/paddock/internal/cli.Version=upgraded-`+randHex(4),
		"-o", out, "../cmd/paddock")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building a second paddock: %v\n%s", err, b)
	}
	return out, nil
}

// boundGuest is the host file gvisor sandbox id's bundle binds as its
// guest binary.
func boundGuest(t *testing.T, d *Daemon, id string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.RunDir, "sandboxes", id, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Mounts []struct{ Destination, Source string }
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Mounts {
		if m.Destination == "/dev/.paddock-guest" {
			return m.Source
		}
	}
	t.Fatalf("sandbox %s's bundle binds no guest binary", id)
	return ""
}

// TestGvisorMemoryPauseUpgrade: a sandbox paused with its memory by one
// daemon is resumed by an upgraded one whose guest binary differs, with
// the binary it was paused with: its processes run on. A checkpoint
// whose guest binary is gone (its copy lost, and the run dir's, as after
// a reboot) fails the resume, saying so, and keeps the files.
func TestGvisorMemoryPauseUpgrade(t *testing.T) {
	d := newGvisorDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// Built while the first daemon works.
	type build struct {
		bin string
		err error
	}
	upgraded := make(chan build, 1)
	binDir := t.TempDir()
	go func() {
		bin, err := upgradedPaddock(binDir)
		upgraded <- build{bin, err}
	}()
	c := d.Client()
	sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor", AutoResume: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	counter := startMemoryWork(t, d, id)
	serverPID, hits := serverState(t, askServer(t, d, id))
	guest := boundGuest(t, d, id)
	before := readCount(t, d, id)
	pauseWithMemory(t, d, id)
	checkStopEnded(t, d, id)

	b := <-upgraded
	if b.err != nil {
		t.Fatal(b.err)
	}
	d.Stop()
	d.Bin = b.bin
	d.Start()
	fresh := d.createCLI("--runtime", "gvisor")
	if now := boundGuest(t, d, fresh); filepath.Base(now) == filepath.Base(guest) {
		t.Fatalf("the upgraded daemon's guest binary is the old one (%s)", now)
	}
	if _, err := c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := boundGuest(t, d, id); filepath.Base(got) != filepath.Base(guest) {
		t.Fatalf("the resumed sandbox binds guest binary %s; want the one it was paused with, %s", got, guest)
	}
	checkCounting(t, d, id, counter, before, "after the upgrade")
	if got, want := askServer(t, d, id), fmt.Sprintf("pid %s hits %d", serverPID, hits+1); got != want {
		t.Fatalf("the server answers %q, want %q (same process, memory kept)", got, want)
	}

	// Its guest binary gone: the copy its checkpoint carries, and the
	// run dir's (a tmpfs after a reboot).
	pauseWithMemory(t, d, id)
	checkStopEnded(t, d, id)
	ck := filepath.Join(d.StateDir, "storage", "disks", "vol", id, "root", "checkpoint")
	for _, p := range []string{filepath.Join(ck, "guest"), filepath.Join(d.RunDir, "gvisor", "guests", filepath.Base(guest))} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.Resume(ctx, id)
	if err == nil || !strings.Contains(err.Error(), "guest binary") || !strings.Contains(err.Error(), "is gone") || !strings.Contains(err.Error(), "files are kept") {
		t.Fatalf("resume of a checkpoint whose guest binary is gone: %v; want a clear error", err)
	}
	t.Logf("the failed resume said: %v", err)
	got := d.get(id)
	if got.State != api.StatePaused || got.Paused == nil || got.Paused.Memory || got.Paused.Lost == "" {
		t.Fatalf("after a failed resume: state %s, paused %+v; want paused, memory lost and why", got.State, got.Paused)
	}
	if _, err := c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out := d.Sh(id, "cat /root/marker; pgrep -f 'i=[0]' || echo none"); !strings.Contains(out, "kept") || !strings.Contains(out, "none") {
		t.Fatalf("after the resume from the files: %q; want the files and no counter", out)
	}
}

// egressLoop, run in a sandbox, asks allowed.test each time a file
// /root/go.N appears and writes what it got to /root/egress.N: a name
// lookup, requests through the proxy it found in its environment at its
// start (HTTP_PROXY, HTTPS_PROXY: a CONNECT), and one that goes direct
// (redirected to the proxy by the network's rules).
const egressLoop = `
import os, socket, ssl, time, urllib.request
def once():
    out = []
    try:
        out.append("dns:ok:" + socket.gethostbyname("allowed.test"))
    except Exception as e:
        out.append("dns:fail:%r" % e)
    for name, opener, scheme in (("proxy", proxied, "http"), ("connect", proxied, "https"), ("direct", direct, "http")):
        try:
            out.append(name + ":ok:" + opener.open(scheme + "://allowed.test/" + name, timeout=10).read().decode().strip())
        except Exception as e:
            out.append(name + ":fail:%r" % e)
    return "\n".join(out) + "\n"
tls = ssl.create_default_context(cafile="/root/upstream-ca.pem")
proxied = urllib.request.build_opener(urllib.request.HTTPSHandler(context=tls))
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
n = 0
while True:
    if os.path.exists("/root/go.%d" % n):
        open("/root/egress.%d.new" % n, "w").write(once())
        os.rename("/root/egress.%d.new" % n, "/root/egress.%d" % n)
        n += 1
    time.sleep(0.05)
`

// askEgress has egressLoop in sandbox id ask once more (its round n) and
// checks that every way out worked.
func askEgress(t *testing.T, d *Daemon, id string, n int) {
	t.Helper()
	d.Sh(id, fmt.Sprintf("touch /root/go.%d", n))
	var out string
	if !waitFor(40*time.Second, 100*time.Millisecond, func() bool {
		r := d.sh(id, fmt.Sprintf("cat /root/egress.%d", n))
		out = r.Stdout
		return r.ExitCode == 0
	}) {
		t.Fatalf("round %d: the egress loop did not answer", n)
	}
	for _, want := range []string{"dns:ok:", "proxy:ok:hello from allowed.test GET /proxy",
		"connect:ok:hello from allowed.test GET /connect", "direct:ok:hello from allowed.test GET /direct"} {
		if !strings.Contains(out, want) {
			t.Fatalf("round %d: a process started before the pause, asked after it:\n%s\nwant %q", n, out, want)
		}
	}
}

// TestGvisorMemoryPauseNetwork: a memory resume starts the sandbox on
// another network slot (other addresses), and a daemon restart moves the
// proxy's listener; a process that started before the pause still gets
// out through the egress policy with what it holds (the proxy's address
// in HTTP_PROXY, the resolver's), and its server is reached through a
// forwarded port.
func TestGvisorMemoryPauseNetwork(t *testing.T) {
	u := newUpstream(t, egressNames)
	d := netDaemon(t, u, "--runsc", runscBin(t), "--warm-guests", "0", "--blank-guests", "0")
	if err := os.Chmod(d.Root, 0o711); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := d.Client()
	sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor", AutoResume: new(bool),
		Policy: &api.Policy{Allow: []api.PolicyRule{{Match: "allowed.test"}}}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	startMemoryWork(t, d, id)
	ca, err := os.ReadFile(u.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]string{"/root/egress.py": egressLoop, "/root/upstream-ca.pem": string(ca)} {
		if _, err := c.WriteFile(ctx, id, name, strings.NewReader(b), client.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	d.Sh(id, `(nohup python3 /root/egress.py >/root/egress.log 2>&1 &)`)
	askEgress(t, d, id, 0)
	gateway := func() string { return strings.TrimSpace(d.Sh(id, `ip route | awk '/default/ {print $3}'`)) }
	first := gateway()

	for round, restart := range []bool{false, true} {
		pauseWithMemory(t, d, id)
		if restart {
			d.Kill9()
			d.Start()
		}
		if _, err := c.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: the sandbox's gateway was %s, is %s", round, first, gateway())
		askEgress(t, d, id, round+1)
		if got := askServer(t, d, id); !strings.HasPrefix(got, "pid ") {
			t.Fatalf("round %d: the server through a forwarded port: %q", round, got)
		}
	}
	if r := d.sh(id, "cat /root/egress.log"); strings.TrimSpace(r.Stdout) != "" {
		t.Logf("the egress loop's log:\n%s", r.Stdout)
	}
}

// TestGvisorOOM: a gvisor sandbox that reaches its memory limit ends
// whole (its kernel is one host process), and says so: failed, with the
// OOM killer named as why; a sandbox resumed from a memory pause (a new
// sentry in a new cgroup) is watched as a fresh one.
func TestGvisorOOM(t *testing.T) {
	d := newGvisorDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := d.Client()
	for _, resumed := range []bool{false, true} {
		t.Run(map[bool]string{false: "fresh", true: "resumed"}[resumed], func(t *testing.T) {
			sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor", AutoResume: new(bool), Resources: api.Resources{MemoryBytes: 128 << 20}})
			if err != nil {
				t.Fatal(err)
			}
			id := sb.ID
			if resumed {
				d.Sh(id, "(sleep 1000 >/dev/null 2>&1 &)")
				pauseWithMemory(t, d, id)
				if _, err := c.Resume(ctx, id); err != nil {
					t.Fatal(err)
				}
				if out := d.Sh(id, "pgrep -c sleep"); strings.TrimSpace(out) != "1" {
					t.Fatalf("after the resume: %q sleeps, want the one from before", out)
				}
			}
			if r := d.py(id, "b = bytearray(48 << 20); print('ok', len(b))"); r.ExitCode != 0 || !strings.HasPrefix(r.Stdout, "ok") {
				t.Fatalf("control: 48 MiB under a 128 MiB limit: %v", r)
			}
			r := d.py(id, "b = bytearray(400 << 20); print('ok')")
			if r.ExitCode == 0 {
				t.Fatalf("allocating 400 MiB under a 128 MiB limit succeeded: %v", r)
			}
			var got *api.Sandbox
			if !waitFor(30*time.Second, 100*time.Millisecond, func() bool {
				got = d.get(id)
				return got.State == api.StateFailed
			}) {
				t.Fatalf("after the OOM kill: state %s, error %q; want failed", got.State, got.Error)
			}
			if !strings.Contains(got.Error, "OOM killer") {
				t.Fatalf("the failed sandbox says %q; want the OOM killer named", got.Error)
			}
			// The lifecycle event says why too. (The sampler's oom event
			// needs a sample between the kill and the cgroup's removal,
			// which the sandbox's end at once may leave no time for.)
			d.waitEvent(id, "lifecycle", func(e api.Event) bool {
				return e.Message == "failed" && strings.Contains(string(e.Data), "OOM killer")
			})
			if err := c.Delete(ctx, id, true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// serverState parses memoryServer's answer: its pid and hits.
// underProfile checks that new processes of sandbox id run under
// Docker's seccomp profile (TestEscapes has the full list): a restored
// gVisor kernel keeps the filter of the guest's threads.
func underProfile(t *testing.T, d *Daemon, id string) {
	t.Helper()
	r := d.run(id, "", "python3", "-c", pySyscall+fmt.Sprintf("print(sc(250, 0, 0, 0, 0), sc(272, %d))", 0x10000000))
	if got := strings.TrimSpace(r.Stdout); got != "EPERM EPERM" {
		t.Fatalf("%s: keyctl and unshare(CLONE_NEWUSER) answer %q, want EPERM from Docker's profile: %v", id, got, r)
	}
}

func serverState(t *testing.T, answer string) (pid string, hits int) {
	t.Helper()
	if _, err := fmt.Sscanf(answer, "pid %s hits %d", &pid, &hits); err != nil {
		t.Fatalf("server: %q", answer)
	}
	return pid, hits
}

// checkCopy checks that sandbox id runs copies of a memory snapshot's
// processes: the counter (with the source's pid, counting on from at
// least from), the server (same pid, its count of hits one up from
// hits), in its own network slot and with its own hostname.
func checkCopy(t *testing.T, d *Daemon, id, counter, serverPID string, from, hits int) {
	t.Helper()
	if n := readCount(t, d, id); n < from {
		t.Fatalf("%s: the counter is at %d, below the %d it had reached before the snapshot", id, n, from)
	}
	n := readCount(t, d, id)
	if !waitFor(10*time.Second, 100*time.Millisecond, func() bool { return readCount(t, d, id) > n }) {
		t.Fatalf("%s: the counter does not count", id)
	}
	if pid := strings.TrimSpace(d.Sh(id, "pgrep -f 'i=[0]' | head -1")); pid != counter {
		t.Fatalf("%s: the counter's pid is %q, want the snapshot's %s", id, pid, counter)
	}
	if got, want := askServer(t, d, id), fmt.Sprintf("pid %s hits %d", serverPID, hits+1); got != want {
		t.Fatalf("%s: the server answers %q, want %q (the snapshot's process, its memory kept)", id, got, want)
	}
	// Its own name, in the kernel, its files and new processes' HOSTNAME.
	if got := strings.Fields(d.Sh(id, `hostname; cat /etc/hostname; echo "$HOSTNAME"; grep -c "\b`+id+`$" /etc/hosts`)); len(got) != 4 || got[0] != id || got[1] != id || got[2] != id || got[3] != "1" {
		t.Fatalf("%s: hostname, /etc/hostname, $HOSTNAME and its /etc/hosts lines: %q", id, got)
	}
	underProfile(t, d, id)
	// New commands get the sandbox's own network slot: its proxy, and
	// the gateway knows its address as its own.
	if out := strings.Fields(d.Sh(id, `echo $HTTP_PROXY; ip route | awk '/default/ {print $3}'`)); len(out) != 2 || !strings.Contains(out[0], "//"+out[1]+":") {
		t.Fatalf("%s: HTTP_PROXY and the default gateway: %q", id, out)
	}
	if self := d.Sh(id, "curl -s -m 10 http://paddock.internal/v1/self"); !strings.Contains(self, `"sandbox": "`+id+`"`) {
		t.Fatalf("%s: its self view names another sandbox:\n%s", id, self)
	}
}

// TestGvisorRepeatedSnapshots: a sandbox whose processes are busy (a
// counter, an HTTP server) keeps running through many memory snapshots
// and forks, the same processes (pids, the server's count) in the same
// network slot, with the same port forward, and starts new programs
// after them; each snapshot's copy and each fork runs and answers too.
// On gVisor's systrap platform a kernel saved and resumed in place
// (runsc checkpoint --leave-running) again and again faulted its
// processes or lost them, a program run for the first time after
// several saves most often (SIGSEGV): the source now runs on from a
// kernel restored from the checkpoint (docs/ARCHITECTURE.md, "Two
// runtimes"). Between the saves, the checks run no new program in the
// source (a shell builtin, a file read through the guest, the server
// through the forward), as a program run after each save hid the fault.
func TestGvisorRepeatedSnapshots(t *testing.T) {
	d := newGvisorDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := d.Client()
	sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	counter := startMemoryWork(t, d, id)
	serverPID, hits := serverState(t, askServer(t, d, id))
	addr := d.Sh(id, "ip -4 -o addr show eth0")
	forward, err := c.ForwardPort(ctx, id, 8000)
	if err != nil {
		t.Fatal(err)
	}
	// count reads the counter's file through the guest (no new
	// program), again when the counter's rename raced the read.
	count := func(sid string) int {
		t.Helper()
		var err error
		for try := 0; try < 50; try++ {
			var rc io.ReadCloser
			if rc, err = c.ReadFile(ctx, sid, "/root/count"); err == nil {
				var n int
				_, err = fmt.Fscan(rc, &n)
				rc.Close()
				if err == nil {
					return n
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: reading the counter: %v", sid, err)
		return 0
	}
	// alive checks that sandbox sid's processes run on: a shell, the
	// counter counting, the server answering with its count one up. It
	// returns the server's count.
	alive := func(what, sid string, hits int) int {
		t.Helper()
		if r := d.sh(sid, "echo alive"); r.ExitCode != 0 || r.Stdout != "alive\n" {
			t.Fatalf("%s: a shell: %v", what, r)
		}
		n := count(sid)
		if !waitFor(10*time.Second, 50*time.Millisecond, func() bool { return count(sid) > n }) {
			t.Fatalf("%s: the counter stopped", what)
		}
		if got, want := askServer(t, d, sid), fmt.Sprintf("pid %s hits %d", serverPID, hits+1); got != want {
			t.Fatalf("%s: the server answers %q, want %q", what, got, want)
		}
		return hits + 1
	}
	// programs checks that new programs run in sandbox sid, and that its
	// counter is the source's process.
	programs := func(what, sid string) {
		t.Helper()
		if r := d.sh(sid, "cat /root/count >/dev/null && ls / >/dev/null && python3 -c 'print(6*7)'"); r.ExitCode != 0 || r.Stdout != "42\n" {
			t.Fatalf("%s: new programs: %v", what, r)
		}
		if pid := strings.TrimSpace(d.Sh(sid, "pgrep -f 'i=[0]' | head -1")); pid != counter {
			t.Fatalf("%s: the counter's pid is %q, want %s", what, pid, counter)
		}
	}
	const rounds = 12
	for i := 1; i <= rounds; i++ {
		var copyID, snap string
		copyHits := hits
		if i%2 == 1 {
			snap = strings.TrimSpace(d.MustCLI("snapshot", "--memory", id))
		} else {
			res, err := c.Fork(ctx, id, api.ForkRequest{Count: 1})
			if err != nil {
				t.Fatalf("fork %d: %v", i, err)
			}
			if res.Memory == nil || len(res.Sandboxes) != 1 {
				t.Fatalf("fork %d: memory %+v, %d sandboxes", i, res.Memory, len(res.Sandboxes))
			}
			copyID = res.Sandboxes[0].ID
		}
		hits = alive(fmt.Sprintf("the source after memory snapshot %d", i), id, hits)
		// The same slot and the same forward.
		if f, err := c.ForwardPort(ctx, id, 8000); err != nil || f != forward {
			t.Fatalf("the source's port forward after memory snapshot %d: %q, %v; was %q", i, f, err, forward)
		}
		if snap != "" {
			copyID = d.createCLI("--from", snap)
		}
		what := fmt.Sprintf("the copy of memory snapshot %d", i)
		alive(what, copyID, copyHits)
		programs(what, copyID)
		if err := c.Delete(ctx, copyID, true); err != nil {
			t.Fatal(err)
		}
		if snap != "" {
			d.MustCLI("snapshot", "rm", snap)
		}
	}
	programs(fmt.Sprintf("the source after %d memory snapshots", rounds), id)
	if got := d.Sh(id, "ip -4 -o addr show eth0"); got != addr {
		t.Fatalf("the source's address after %d memory snapshots: %q, was %q", rounds, got, addr)
	}
}

// TestGvisorMemorySnapshot: `snapshot --memory` of a running gvisor
// sandbox keeps it running and records the checkpoint with the
// snapshot; `create --from` it and `fork -n N` start copies with the
// processes running, each in its own network slot; a native sandbox's
// memory snapshot is refused naming its runtime; removing the snapshot
// removes its checkpoint.
func TestGvisorMemorySnapshot(t *testing.T) {
	d := newGvisorDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := d.Client()
	sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	counter := startMemoryWork(t, d, id)
	serverPID, hits := serverState(t, askServer(t, d, id))
	before := readCount(t, d, id)

	snap := strings.TrimSpace(d.MustCLI("snapshot", "--memory", id))
	// The source runs on, the same processes.
	if got := askServer(t, d, id); got != fmt.Sprintf("pid %s hits %d", serverPID, hits+1) {
		t.Fatalf("the source's server after the snapshot: %q", got)
	}
	after := readCount(t, d, id)
	if !waitFor(10*time.Second, 100*time.Millisecond, func() bool { return readCount(t, d, id) > after }) {
		t.Fatal("the source's counter stopped after the snapshot")
	}
	info, err := c.GetSnapshot(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	if info.Memory == nil || info.Memory.Runtime != "gvisor" || info.Memory.CheckpointBytes <= 0 {
		t.Fatalf("the snapshot does not record its memory: %+v", info.Memory)
	}
	if out := d.MustCLI("inspect", snap); !strings.Contains(out, `"checkpoint_bytes"`) {
		t.Fatalf("inspect of a memory snapshot:\n%s", out)
	}
	if out := d.MustCLI("snapshot", "ls"); !strings.Contains(out, "MEMORY") || strings.Contains(out, " - ") {
		t.Fatalf("snapshot ls does not show the snapshot's memory:\n%s", out)
	}
	ckpt := filepath.Join(d.StateDir, "storage", "snapshots", snap, "checkpoint")
	if _, err := os.Stat(filepath.Join(ckpt, "checkpoint.sqfs")); err != nil {
		t.Fatalf("the checkpoint is not kept with the snapshot: %v", err)
	}

	// The copy's server counted as the source's had when it was taken.
	copyID := d.createCLI("--from", snap)
	if got := d.get(copyID); got.RuntimeName != "gvisor" || got.From != snap {
		t.Fatalf("a sandbox made from the memory snapshot: runtime %q, from %q", got.RuntimeName, got.From)
	}
	checkCopy(t, d, copyID, counter, serverPID, before, hits)
	if a, b := d.Sh(copyID, "ip -4 -o addr show eth0"), d.Sh(id, "ip -4 -o addr show eth0"); a == b {
		t.Fatalf("the copy has the source's address: %s", a)
	}
	// Copies are copies: a file written in one is not in the source.
	d.Sh(copyID, "echo copy > /root/marker")
	if got := strings.TrimSpace(d.Sh(id, "cat /root/marker")); got != "kept" {
		t.Fatalf("the source's marker is %q after a copy wrote its own", got)
	}

	// A memory snapshot runs on its runtime only.
	if r := d.CLI("create", "--from", snap, "--runtime", "native"); r.Code == 0 || !strings.Contains(r.Stderr, "gvisor") {
		t.Fatalf("create --from a memory snapshot on native: exit %d, %s", r.Code, r.Stderr)
	}

	// fork: one checkpoint, three copies with the processes running.
	_, hits = serverState(t, askServer(t, d, id))
	before = readCount(t, d, id)
	res, err := c.Fork(ctx, id, api.ForkRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Memory == nil || len(res.Sandboxes) != 3 {
		t.Fatalf("fork of a gvisor sandbox: memory %+v, %d sandboxes", res.Memory, len(res.Sandboxes))
	}
	addrs := map[string]bool{}
	for _, f := range res.Sandboxes {
		checkCopy(t, d, f.ID, counter, serverPID, before, hits)
		addrs[d.Sh(f.ID, "ip -4 -o addr show eth0")] = true
	}
	if len(addrs) != 3 {
		t.Fatalf("the forks share addresses: %v", addrs)
	}
	// The source runs on, and the fork's checkpoint is gone with it.
	if got := askServer(t, d, id); !strings.HasPrefix(got, "pid "+serverPID+" ") {
		t.Fatalf("the source's server after the fork: %q", got)
	}
	// --memory=false forks the files only.
	files, err := c.Fork(ctx, id, api.ForkRequest{Memory: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	if files.Memory != nil {
		t.Fatalf("a fork without memory reports %+v", files.Memory)
	}
	if out := d.Sh(files.Sandboxes[0].ID, "cat /root/marker; pgrep -f 'i=[0]' || echo none"); !strings.Contains(out, "kept") || !strings.Contains(out, "none") {
		t.Fatalf("a files-only fork: %q; want the files and no counter", out)
	}

	// Native: refused, naming the runtime.
	n := d.createCLI("--runtime", "native")
	if r := d.CLI("snapshot", "--memory", n); r.Code == 0 || !strings.Contains(r.Stderr, "native") {
		t.Fatalf("snapshot --memory of a native sandbox: exit %d, %s", r.Code, r.Stderr)
	}
	if _, err := c.Fork(ctx, n, api.ForkRequest{Memory: new(true)}); err == nil || !strings.Contains(err.Error(), "native") {
		t.Fatalf("fork with memory of a native sandbox: %v", err)
	}

	// Removing the snapshot removes its checkpoint.
	d.MustCLI("snapshot", "rm", snap)
	if _, err := os.Stat(ckpt); !os.IsNotExist(err) {
		t.Fatalf("the removed snapshot's checkpoint is still there: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.StateDir, "storage", "snapshots")); len(entries) != 0 {
		t.Fatalf("snapshots left after the removal (forks keep none): %v", entries)
	}
}

// TestGvisorMemorySnapshotDamaged: a truncated or corrupt checkpoint in a
// memory snapshot fails the create with a clear error and leaves nothing
// of it (no sandbox, run dir, disk or cgroup): damage its sums find is
// refused before anything is made, damage they cannot see (sums written
// anew over it) fails runsc's restore and is undone; a snapshot whose
// checkpoint went is dropped when the daemon starts.
func TestGvisorMemorySnapshotDamaged(t *testing.T) {
	d := newGvisorDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := d.Client()
	// Each damaged snapshot is of a source of its own: each case starts
	// from a sandbox no earlier case touched (TestGvisorRepeatedSnapshots
	// takes one source again and again).
	var sources []string
	source := func() string {
		sb, err := c.Create(ctx, api.CreateRequest{Runtime: "gvisor"})
		if err != nil {
			t.Fatal(err)
		}
		startMemoryWork(t, d, sb.ID)
		sources = append(sources, sb.ID)
		return sb.ID
	}
	flip := func(img string) error {
		f, err := os.OpenFile(img, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		b := make([]byte, 4096)
		if _, err := f.ReadAt(b, fi.Size()/3); err != nil && err != io.EOF {
			return err
		}
		for i := range b {
			b[i] ^= 0x5a
		}
		_, err = f.WriteAt(b, fi.Size()/3)
		return err
	}
	// resum writes the sum of the checkpoint's file img anew, as the
	// daemon does.
	resum := func(img string) error {
		b, err := os.ReadFile(img)
		if err != nil {
			return err
		}
		path := filepath.Join(filepath.Dir(filepath.Dir(img)), "checkpoint.sums")
		old, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sums := map[string]json.RawMessage{}
		if err := json.Unmarshal(old, &sums); err != nil {
			return err
		}
		sums[filepath.Base(img)] = json.RawMessage(fmt.Sprintf(`{"size":%d,"crc32c":%d}`, len(b), crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))))
		out, err := json.Marshal(sums)
		if err != nil {
			return err
		}
		return os.WriteFile(path, out, 0o600)
	}
	damages := []struct {
		name   string
		damage func(img string) error
		want   []string
	}{
		{"truncated", func(img string) error {
			fi, err := os.Stat(img)
			if err != nil {
				return err
			}
			return os.Truncate(img, fi.Size()/2)
		}, []string{"memory checkpoint is damaged", "bytes, not"}},
		{"corrupt", flip, []string{"memory checkpoint is damaged", "checksum differs"}},
		{"corrupt unseen", func(img string) error {
			if err := flip(img); err != nil {
				return err
			}
			return resum(img)
		}, []string{"checkpoint cannot be restored", "nothing was created"}},
	}
	count := func(dir string) int {
		n := 0
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				n++
			}
		}
		return n
	}
	dirs := []string{
		filepath.Join(d.RunDir, "sandboxes"),
		filepath.Join(d.StateDir, "storage", "disks", "vol"),
		filepath.Join("/sys/fs/cgroup/memory", d.Cgroup),
	}
	for _, tc := range damages {
		snap := strings.TrimSpace(d.MustCLI("snapshot", "--memory", source()))
		if err := tc.damage(filepath.Join(d.StateDir, "storage", "snapshots", snap, "checkpoint", "checkpoint.sqfs")); err != nil {
			t.Fatal(err)
		}
		before := make([]int, len(dirs))
		for i, dir := range dirs {
			before[i] = count(dir)
		}
		r := d.CLI("create", "--from", snap)
		for _, want := range tc.want {
			if r.Code == 0 || !strings.Contains(r.Stderr, want) {
				t.Fatalf("create from a %s checkpoint: exit %d, %s; want it to say %q", tc.name, r.Code, r.Stderr, want)
			}
		}
		t.Logf("create from a %s checkpoint said: %s", tc.name, strings.TrimSpace(r.Stderr))
		if list, err := c.List(ctx, client.ListOptions{}); err != nil || len(list) != len(sources) {
			t.Fatalf("after a failed create from a %s checkpoint: %d sandboxes (%v)", tc.name, len(list), err)
		}
		for i, dir := range dirs {
			if n := count(dir); n != before[i] {
				t.Fatalf("a failed create from a %s checkpoint left %d entries in %s (there were %d)", tc.name, n, dir, before[i])
			}
		}
	}
	// The sources run on through all of it.
	for _, id := range sources {
		if got := askServer(t, d, id); !strings.HasPrefix(got, "pid ") {
			t.Fatalf("the server of source %s: %q", id, got)
		}
	}

	// A snapshot whose checkpoint is gone is dropped at the next start.
	snap := strings.TrimSpace(d.MustCLI("snapshot", "--memory", sources[0]))
	d.Stop()
	if err := os.RemoveAll(filepath.Join(d.StateDir, "storage", "snapshots", snap, "checkpoint")); err != nil {
		t.Fatal(err)
	}
	d.Start()
	if _, err := c.GetSnapshot(ctx, snap); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a memory snapshot without its checkpoint after a restart: %v; want it dropped", err)
	}
}

// TestE2BGvisorMemory drives a facade whose sandboxes run on gvisor with
// the unchanged npm SDK: a fork and a sandbox made from a snapshot carry
// the source's running server (scenario "memory").
func TestE2BGvisorMemory(t *testing.T) {
	dir := npmHarness(t)
	e := startE2BDaemon(t, "--runsc", runscBin(t), "--default-runtime", "gvisor", "--warm-guests", "0", "--blank-guests", "0")
	info := runScenario(t, e, dir, "memory")
	ctx := context.Background()
	for _, id := range info["sandbox"] {
		if _, err := e.Client().Get(ctx, id); err == nil {
			t.Errorf("sandbox %s outlived its scenario", id)
		}
	}
	if snaps, err := e.Client().Snapshots(ctx, ""); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots left: %v (%v)", snaps, err)
	}
}
