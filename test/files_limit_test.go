package test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
)

// fileHogProgram forks processes that each open /dev/null until they
// cannot (EMFILE at their descriptor limit, or their sandbox's memory
// limit), hold what they opened, and report it; it prints the total and
// the error that stopped it.
const fileHogProgram = `
import errno, os, time
total = 0
why = "EMFILE"
for i in range(1000):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        n, err = 0, "none"
        try:
            while True:
                os.open("/dev/null", os.O_RDONLY)
                n += 1
        except OSError as e:
            err = errno.errorcode.get(e.errno, str(e.errno))
        try:
            os.write(w, ("%d %s\n" % (n, err)).encode())
        except OSError:
            pass
        time.sleep(600)
        os._exit(0)
    os.close(w)
    got = os.read(r, 100).decode().split()
    os.close(r)
    if len(got) != 2:
        why = "killed"
        break
    total += int(got[0])
    if got[1] != "EMFILE":
        why = got[1]
        break
print(total, why, flush=True)
`

// TestSandboxFilesBounded: one sandbox opening every file it may (many
// processes, each up to its descriptor limit) is stopped by its own
// memory limit, which open files are charged to, not by the host's file
// table: a neighbour sandbox keeps opening files and running commands,
// and a new sandbox can still be made. With the host's fs.file-max in
// place, the hog reached it (~2.4 million files on a 24 GiB host) and
// every other guest got ENFILE. Native only: under gVisor a sandbox's
// open files are objects of its sentry, never entries of the host's file
// table, which is what this guards; the sentry's memory, which they
// take, is bounded by the sandbox's limit (TestGvisorOOM). Run under
// gVisor, the hog's processes each open a million files through the
// sentry before any limit is met: minutes.
func TestSandboxFilesBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a sandbox's memory with open files (about 100 s)")
	}
	d := StartDaemon(t)
	const hogMemory = 768 << 20
	hog := d.Create(api.CreateRequest{Resources: api.Resources{MemoryBytes: hogMemory}})
	neighbour := d.Create(api.CreateRequest{})

	res := d.run(hog, "", "python3", "-c", fileHogProgram)
	t.Logf("the hog: %s", strings.TrimSpace(res.Stdout))
	if f := strings.Fields(res.Stdout); len(f) == 2 {
		n, _ := strconv.Atoi(f[0])
		// A struct file costs some 200 bytes of the sandbox's memory.
		if n > hogMemory/128 {
			t.Errorf("the hog holds %d files, more than its %d MiB of memory pays for", n, hogMemory>>20)
		}
	} else {
		// Its guest may be what the memory cgroup's OOM killer picks: the
		// hog's sandbox breaking itself is its own business.
		t.Logf("the hog ended without a count: %s", res)
	}
	if b, err := os.ReadFile("/proc/sys/fs/file-nr"); err == nil {
		t.Logf("host files in use, free, max: %s", strings.TrimSpace(string(b)))
	}

	out := d.run(neighbour, "", "python3", "-c", `import os; fs = [os.open("/dev/null", os.O_RDONLY) for _ in range(1000)]; print(len(fs))`)
	if out.ExitCode != 0 || strings.TrimSpace(out.Stdout) != "1000" {
		t.Errorf("the neighbour could not open 1000 files while the hog held its own: %s", out)
	}
	fresh := d.Create(api.CreateRequest{})
	if out := d.run(fresh, "", "sh", "-c", "echo ok"); out.Stdout != "ok\n" {
		t.Errorf("a sandbox made while the hog held its files: %s", out)
	}
}

// aioHogProgram forks a process that takes up to argv[2] AIO contexts of
// argv[1] events (io_setup) and holds them; it prints how many it got and
// why it stopped.
const aioHogProgram = `
import ctypes, os, sys, time
nr = {"x86_64": 206, "aarch64": 0}[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
if os.fork() == 0:
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    got, err = 0, 0
    while got < int(sys.argv[2]):
        ctx = ctypes.c_ulong(0)
        if libc.syscall(nr, int(sys.argv[1]), ctypes.byref(ctx)) != 0:
            err = ctypes.get_errno()
            break
        got += 1
    os.write(w, ("%d %s\n" % (got, os.strerror(err) if err else "none")).encode())
    time.sleep(600)
    os._exit(0)
os.close(w)
print(os.read(r, 100).decode().strip(), flush=True)
`

// TestSandboxAIOBounded: AIO contexts are bounded by a sandbox's memory
// limit (an AIO ring is charged to it), not by the host's fs.aio-max-nr
// (65536 events by default): a sandbox holding 256 contexts of 1024
// events (some 16 MiB of rings) leaves its neighbour able to take one.
// Before the daemon lifted that cap, 64 such contexts took it all and the
// neighbour's io_setup failed with EAGAIN. On both tiers (under gVisor
// the rings are the sentry's).
func TestSandboxAIOBounded(t *testing.T) {
	extra := []string{"--warm-guests", "0"}
	if p := findRunsc(); p != "" {
		extra = append(extra, "--runsc", p)
	}
	d := StartDaemon(t, extra...)
	forTiers(t, func(t *testing.T, tier string) { aioBounded(t, d, tier) })
}

func aioBounded(t *testing.T, d *Daemon, tier string) {
	hog := d.Create(api.CreateRequest{Runtime: tier, Resources: api.Resources{MemoryBytes: 128 << 20}})
	neighbour := d.Create(api.CreateRequest{Runtime: tier})
	res := d.run(hog, "", "python3", "-c", aioHogProgram, "1024", "256")
	t.Logf("the hog's AIO contexts of 1024 events: %s", strings.TrimSpace(res.Stdout))
	if f := strings.Fields(res.Stdout); len(f) < 2 {
		t.Fatalf("the hog: %s", res)
	} else if n, _ := strconv.Atoi(f[0]); n != 256 {
		t.Errorf("the hog got %d of 256 contexts", n)
	}
	out := d.run(neighbour, "", "python3", "-c", aioHogProgram, "128", "1")
	if f := strings.Fields(out.Stdout); len(f) < 1 || f[0] != "1" {
		t.Errorf("the neighbour could not take an AIO context while the hog held its own: %s", out)
	}
}
