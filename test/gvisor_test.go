package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	t.Skip("runsc is not built: make runsc (make test builds it)")
	return ""
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

	// Pause ends the processes and keeps the files; resume starts it on
	// gVisor again.
	if _, err := c.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out := d.Sh(id, "uname -r; cat /root/inside; pgrep -c sleep || true"); !strings.Contains(out, "gvisor") || !strings.Contains(out, "made inside") || !strings.Contains(out, "0") {
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
	if out := d.Sh(sb.ID, "uname -r; hostname"); !strings.Contains(out, "gvisor") || !strings.Contains(out, sb.ID) {
		t.Fatalf("pooled sandbox: %q", out)
	}
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
