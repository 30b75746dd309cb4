package test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestMemoryLimit: a memory hog is OOM-killed inside its sandbox, the exit
// status says so, and the sandbox, its guest, another sandbox and the
// daemon all keep working.
func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	bystander := d.Create(api.CreateRequest{})
	d.Sh(bystander, "sleep 300 >/dev/null 2>&1 & echo $! > /tmp/sleep.pid")
	hog := d.createCLI("--memory", "128m")
	guestPID := d.hostPID(hog)

	// Control: well under the cap, the same program runs.
	if r := d.py(hog, "b = bytearray(48 << 20); print('ok', len(b))"); r.ExitCode != 0 || r.OOMKilled || !strings.HasPrefix(r.Stdout, "ok") {
		t.Fatalf("allocating 48 MiB under a 128 MiB cap: %v", r)
	}

	// bytearray zero-fills, so every page is touched.
	r := d.py(hog, "b = bytearray(400 << 20); print('survived', len(b))")
	if !r.OOMKilled || r.ExitCode != 137 {
		t.Errorf("allocating 400 MiB under a 128 MiB cap: want oom_killed and exit 137, got %v", r)
	}
	if strings.Contains(r.Stdout, "survived") {
		t.Errorf("the hog survived: %q", r.Stdout)
	}

	// The CLI reports it too.
	cr := d.CLI("exec", hog, "--", "python3", "-c", "b = bytearray(400 << 20)")
	if cr.Code != 137 || !strings.Contains(cr.Stderr, "memory") {
		t.Errorf("CLI exec of the hog: exit %d stderr %q; want 137 and a line about the memory limit", cr.Code, cr.Stderr)
	}

	// Only the hog died: its guest, the other sandbox and its process,
	// and the daemon are fine.
	if !alive(guestPID) || d.hostPID(hog) != guestPID {
		t.Errorf("the hog's guest (host pid %d) did not survive the OOM kill", guestPID)
	}
	if sb := d.get(hog); sb.State != api.StateRunning {
		t.Errorf("hog sandbox state after the OOM kill: %q", sb.State)
	}
	if out := d.Sh(hog, "echo still here"); out != "still here\n" {
		t.Errorf("exec in the hog's sandbox afterwards: %q", out)
	}
	if out := d.Sh(bystander, `kill -0 "$(cat /tmp/sleep.pid)" && echo alive`); out != "alive\n" {
		t.Errorf("the other sandbox's process: %q", out)
	}
	if r := d.py(bystander, "b = bytearray(200 << 20); print(len(b))"); r.ExitCode != 0 || r.OOMKilled {
		t.Errorf("the other sandbox (default memory) allocating 200 MiB: %v", r)
	}
	if _, err := d.Client().Version(t.Context()); err != nil {
		t.Errorf("daemon after the OOM kill: %v", err)
	}
}

// forkProgram forks up to 200 children that each sleep 4 s, prints how
// many forks worked and the first error, then waits for them: a fork bomb
// that ends by itself.
const forkProgram = `
import os, sys, time
kids, failed, why = [], 0, ""
for i in range(200):
    try:
        pid = os.fork()
    except OSError as e:
        failed += 1
        why = why or e.strerror
        continue
    if pid == 0:
        time.sleep(4)
        os._exit(0)
    kids.append(pid)
print(len(kids), failed, why, sep="|", flush=True)
for pid in kids:
    os.waitpid(pid, 0)
print("reaped", flush=True)
`

// TestPidsLimit: a fork bomb under --pids 64 gets EAGAIN at the cap while
// other sandboxes and the host fork freely, and its sandbox is usable
// again once the bomb is over.
func TestPidsLimit(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	capped := d.createCLI("--pids", "64")
	bystander := d.Create(api.CreateRequest{})
	checkGuestThreadsApart(t, d.get(capped))

	pr, pw := io.Pipe()
	defer pr.Close() // so that the exec's writes fail if the test ends early
	type result struct {
		st  *api.ExitStatus
		err error
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		st, err := d.Client().Exec(ctx, capped, api.ExecRequest{Cmd: []string{"python3", "-c", forkProgram}}, client.ExecIO{Stdout: pw})
		pw.Close()
		done <- result{st, err}
	}()
	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		t.Fatalf("fork bomb printed nothing: %v", <-done)
	}
	f := strings.Split(sc.Text(), "|")
	if len(f) != 3 {
		t.Fatalf("fork bomb printed %q", sc.Text())
	}
	forked, _ := strconv.Atoi(f[0])
	failed, _ := strconv.Atoi(f[1])
	t.Logf("under --pids 64: %d forks worked, %d failed (%s)", forked, failed, f[2])
	if failed == 0 || forked >= 64 {
		t.Errorf("%d of 200 forks worked under --pids 64; want the cap to stop them", forked)
	}
	if forked < 16 {
		t.Errorf("only %d forks worked; the cap is far tighter than 64", forked)
	}
	if f[2] != "Resource temporarily unavailable" {
		t.Errorf("forks failed with %q, want EAGAIN (Resource temporarily unavailable)", f[2])
	}

	// While the bomb holds its sandbox at the cap, another sandbox and
	// the host fork freely.
	if r := d.py(bystander, strings.Replace(forkProgram, "time.sleep(4)", "time.sleep(0.5)", 1)); !strings.HasPrefix(r.Stdout, "200|0|") {
		t.Errorf("the other sandbox forking 200 children while the bomb runs: %v", r)
	}
	if out, err := exec.Command("sh", "-c", "for i in $(seq 50); do true & done; wait; echo ok").CombinedOutput(); err != nil || string(out) != "ok\n" {
		t.Errorf("host forks while the bomb runs: %v %q", err, out)
	}

	for sc.Scan() {
	}
	res := <-done
	if res.err != nil || res.st.ExitCode != 0 {
		t.Errorf("fork bomb: %+v %v", res.st, res.err)
	}
	// Its children are gone and the sandbox forks again.
	ok := waitFor(10*time.Second, 200*time.Millisecond, func() bool {
		r := d.sh(capped, "ls -d /proc/[0-9]* | wc -l")
		n, _ := strconv.Atoi(strings.TrimSpace(r.Stdout))
		return r.ExitCode == 0 && n < 10
	})
	if !ok {
		t.Errorf("capped sandbox not usable after the bomb: %v", d.sh(capped, "ps aux"))
	}
	again := strings.NewReplacer("range(200)", "range(20)", "time.sleep(4)", "time.sleep(0.1)").Replace(forkProgram)
	if r := d.py(capped, again); !strings.HasPrefix(r.Stdout, "20|0|") {
		t.Errorf("20 forks in the capped sandbox after the bomb: %v", r)
	}
}

// checkGuestThreadsApart: on cgroup v1 the guest's own threads are
// outside its sandbox's pids group, all but the one it forks the
// sandbox's processes from, and it keeps no spare threads for a full
// group.
func checkGuestThreadsApart(t *testing.T, sb *api.Sandbox) {
	t.Helper()
	if sb.Runtime == nil || sb.Runtime.HostPID == 0 {
		t.Fatalf("sandbox %s has no guest pid: %+v", sb.ID, sb.Runtime)
	}
	group := filepath.Join("/sys/fs/cgroup/pids", sb.Runtime.Cgroup)
	tasks, err := os.ReadFile(filepath.Join(group, "tasks"))
	if err != nil {
		t.Logf("no v1 pids group (%v): the guest keeps spare threads", err)
		return
	}
	threads, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", sb.Runtime.HostPID))
	if err != nil {
		t.Fatal(err)
	}
	in := 0
	for _, tid := range strings.Fields(string(tasks)) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%s", sb.Runtime.HostPID, tid)); err == nil {
			in++
		}
	}
	if in != 1 {
		t.Errorf("%d of the guest's %d threads are in its sandbox's pids group, want 1 (the spawner)", in, len(threads))
	}
	if len(threads) > 12 {
		t.Errorf("the guest has %d threads; without spares it needs about 8", len(threads))
	}
}

// TestDiskLimit: filling a sandbox's disk stops at its cap with ENOSPC,
// for /workspace and /tmp alike (one writable layer), while another
// sandbox writes freely; freeing space makes it writable again. On both
// tiers (under gVisor, writes reach the disk through its gofer).
func TestDiskLimit(t *testing.T) {
	t.Parallel()
	d := tierDaemon(t)
	forTiers(t, func(t *testing.T, tier string) { diskLimit(t, d, tier) })
}

func diskLimit(t *testing.T, d *Daemon, tier string) {
	id := d.createCLI("--disk", "64m", "--runtime", tier)
	bystander := d.Create(api.CreateRequest{Runtime: tier})

	r := d.sh(id, "dd if=/dev/zero of=/workspace/fill bs=1M count=200 conv=fsync; echo \"dd=$?\"; stat -c %s /workspace/fill")
	out := lines(r.Stdout)
	if r.ExitCode != 0 || len(out) != 2 {
		t.Fatalf("dd: %v", r)
	}
	if out[0] == "dd=0" {
		t.Errorf("writing 200 MiB under a 64 MiB cap succeeded")
	}
	if !strings.Contains(r.Stderr, "No space left on device") {
		t.Errorf("dd failed without ENOSPC: %q", r.Stderr)
	}
	size, _ := strconv.ParseInt(out[1], 10, 64)
	t.Logf("dd wrote %d MiB before ENOSPC", size>>20)
	if size >= 64<<20 {
		t.Errorf("/workspace/fill is %d bytes, not below the 64 MiB cap", size)
	}
	if size < 32<<20 {
		t.Errorf("/workspace/fill is only %d bytes; the cap is far tighter than 64 MiB", size)
	}

	r = d.sh(id, "dd if=/dev/zero of=/tmp/more bs=1M count=10 conv=fsync")
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "No space left on device") {
		t.Errorf("writing /tmp with /workspace full: want ENOSPC, got %v", r)
	}

	if r := d.sh(bystander, "dd if=/dev/zero of=/workspace/big bs=1M count=100 conv=fsync && stat -c %s /workspace/big && rm /workspace/big"); r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != strconv.Itoa(100<<20) {
		t.Errorf("the other sandbox writing 100 MiB: %v", r)
	}

	if r := d.sh(id, "rm /workspace/fill /tmp/more; dd if=/dev/zero of=/tmp/more bs=1M count=10 conv=fsync && echo ok"); r.ExitCode != 0 || r.Stdout != "ok\n" {
		t.Errorf("writing after freeing space: %v", r)
	}
}

// cpuProgram busy-loops for 2 s and prints the CPU time it got per wall
// second.
const cpuProgram = `
import time
w0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - w0 < 2.0:
    pass
print((time.process_time() - c0) / (time.monotonic() - w0))
`

// TestCPULimit: a busy loop under --cpus 0.5 gets about half a core, where
// the same loop without a quota gets what a loop on the host gets. Each
// sandbox loop runs beside a host loop, so that both see the same load
// from elsewhere; when the host loop gets < 0.6 of a core the host is too
// busy to judge, and only the upper bound is checked. Not parallel: other
// tests' load would skew the measure.
func TestCPULimit(t *testing.T) {
	d := newDaemon(t)
	parse := func(what, out string) float64 {
		t.Helper()
		v, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if err != nil {
			t.Fatalf("%s: cpu measure printed %q", what, out)
		}
		return v
	}
	// measure runs the loop in sandbox id and on the host at once.
	measure := func(id string) (inside, host float64) {
		t.Helper()
		hostOut := make(chan string, 1)
		go func() {
			out, err := exec.Command("/usr/bin/python3", "-c", cpuProgram).Output()
			if err != nil {
				out = []byte(err.Error())
			}
			hostOut <- string(out)
		}()
		r := d.py(id, cpuProgram)
		if r.ExitCode != 0 {
			t.Fatalf("cpu measure: %v", r)
		}
		return parse(id, r.Stdout), parse("host", <-hostOut)
	}
	half := d.createCLI("--cpus", "0.5")
	whole := d.createCLI("--cpus", "2")

	got, host := measure(half)
	t.Logf("busy loop: %.2f of a core under --cpus 0.5 (%.2f on the host meanwhile)", got, host)
	if got > 0.7 {
		t.Errorf("busy loop under --cpus 0.5 got %.2f of a core, want 0.3..0.7", got)
	}
	if host >= 0.6 && got < 0.3 {
		t.Errorf("busy loop under --cpus 0.5 got %.2f of a core, want 0.3..0.7", got)
	}

	control, host := measure(whole)
	t.Logf("control: %.2f of a core under --cpus 2 (%.2f on the host meanwhile)", control, host)
	if host >= 0.6 && control < 0.75 && control < host-0.2 {
		t.Errorf("control: busy loop under --cpus 2 got %.2f of a core, a host loop %.2f", control, host)
	}
}

// TestLimitsValidatedAlike: limits the kernel would refuse (a pids cap
// above its ceiling) are refused with a 400 naming the field, by a create
// and by an update alike; a create used to answer 201 and leave a sandbox
// that then failed.
func TestLimitsValidatedAlike(t *testing.T) {
	d := StartDaemon(t, "--warm-guests", "0")
	for _, body := range []string{`{"resources":{"pids":99999999999}}`, `{"resources":{"pids":-1}}`} {
		a := d.do("POST", "/v1/sandboxes", body)
		if e := a.apiError(t); a.Status != 400 || !strings.Contains(e.Message, "resources.pids") {
			t.Errorf("create %s: %d %+v, want 400 naming resources.pids", body, a.Status, e)
		}
		if l, err := d.Client().List(context.Background(), client.ListOptions{}); err != nil || len(l) != 0 {
			t.Errorf("create %s left sandboxes %+v (%v)", body, l, err)
		}
	}
	id := d.Create(api.CreateRequest{})
	a := d.do("POST", "/v1/sandboxes/"+id+"/update", `{"resources":{"pids":99999999999}}`)
	if e := a.apiError(t); a.Status != 400 || !strings.Contains(e.Message, "resources.pids") {
		t.Errorf("update: %d %+v, want 400 naming resources.pids", a.Status, e)
	}
	if sb := d.get(id); sb.Resources.Pids != 4096 {
		t.Errorf("after a refused update the sandbox's pids cap is %d, want the default 4096", sb.Resources.Pids)
	}
}
