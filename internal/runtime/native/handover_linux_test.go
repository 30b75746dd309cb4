package native

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/seccomp"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/wire"
)

// TestFastGuestHandover: the fast guest serves plain attached commands
// itself, one thread; a request it does not serve (the process list),
// made on another connection while a command streams, hands the sandbox
// over to the Go guest, and nothing is lost: the stream goes on to its
// output and exit, its connection is reused after the release, the list
// holds the finished command and the running one, a finished command's
// retained output replays from the start, and new commands run.
// fastSandbox starts a sandbox whose guest starts as the fast guest, and
// returns its guest's client and a reading of the guest's thread count.
func fastSandbox(t *testing.T) (*guestapi.Client, func() int) {
	t.Helper()
	return guestSandbox(t, fastGuest(t))
}

// guestSandbox starts a sandbox whose guest starts as the fast guest at
// path fast, or as the Go guest when fast is empty.
func guestSandbox(t *testing.T, fast string) (*guestapi.Client, func() int) {
	t.Helper()
	guest, pid := guestInstance(t, fast, true)
	return guest, func() int {
		t.Helper()
		return threadCount(t, pid)
	}
}

// guestInstance starts a sandbox as guestSandbox does and returns its
// guest's client and host pid. With split, its filter is loaded as the
// daemon loads it (a base in the forker, a tail in the guest); without,
// the guest loads it whole.
func guestInstance(t *testing.T, fast string, split bool) (*guestapi.Client, int) {
	t.Helper()
	d := nativeDeps(t, "paddock-handover")
	dir := t.TempDir()
	disks, err := disk.NewPool(disk.Config{Dir: filepath.Join(dir, "disks"), DefaultSize: 256 << 20, Logger: d.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { disks.Close() })
	cfg := Config{
		RunDir: dir, Cgroups: d.cgroups, Disks: disks, Seccomp: d.prog, Caps: seccomp.DockerDefaultCaps,
		IDs:         &testIDs{start: 3<<30 + uint32(200+rand.IntN(50))*64<<16, n: 4},
		GuestBinary: d.bin, FastGuest: fast, Logger: d.log,
	}
	if split {
		cfg.SeccompBase, cfg.SeccompTail = d.split.Base, d.split.Tail
	}
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := runtime.Spec{Image: d.img, ID: runtime.NewID(), Workdir: "/", Resources: api.Resources{CPUs: 1, MemoryBytes: 256 << 20, Pids: 128}}
	inst, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Remove(context.Background(), spec.ID) })
	if a, ok := inst.(runtime.Activating); ok {
		a.Activate()
		if err := a.StartErr(); err != nil {
			t.Fatal(err)
		}
	}
	guest := guestapi.NewClient(inst.Dial)
	t.Cleanup(guest.Close)
	return guest, inst.Info().HostPID
}

// threadCount reads how many threads process pid runs.
func threadCount(t *testing.T, pid int) int {
	t.Helper()
	return int(procStatusField(t, pid, "Threads"))
}

// readStream reads c's frames up to its exit (stdout, stderr, the
// status), or until stdout holds until.
func readStream(t *testing.T, c *guestapi.Conn, until string) (string, string, *api.ExitStatus) {
	t.Helper()
	var out, errs strings.Builder
	c.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		f, err := c.Frames.Read()
		if err != nil {
			t.Fatalf("reading the stream: %v (stdout %d bytes)", err, out.Len())
		}
		switch f.Type {
		case wire.Stdout:
			out.Write(f.Payload)
		case wire.Stderr:
			errs.Write(f.Payload)
		case wire.Exit:
			var st api.ExitStatus
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				t.Fatal(err)
			}
			return out.String(), errs.String(), &st
		}
		if until != "" && strings.Contains(out.String(), until) {
			return out.String(), errs.String(), nil
		}
	}
}

func TestFastGuestHandover(t *testing.T) {
	guest, threads := fastSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	read := func(c *guestapi.Conn, until string) (string, string, *api.ExitStatus) {
		t.Helper()
		return readStream(t, c, until)
	}
	path := []string{"PATH=/usr/bin:/bin"}
	// Who a command runs as: its home, its capabilities, its
	// descriptors, its cgroups, its session.
	who := []string{"sh", "-c", "echo $HOME; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp|SigBlk|SigIgn)' /proc/self/status; ls /proc/self/fd; cat /proc/self/cgroup; ps -o sid= -p $$"}
	_, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: who, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	fastWho, _, st := read(c, "")
	c.Release()
	if !strings.HasPrefix(fastWho, "/root\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nCapEff:") || !strings.Contains(fastWho, "\n0\n1\n2\n3\n") || st.ExitCode != 0 {
		t.Fatalf("a command of the fast guest: %q, %+v", fastWho, st)
	}
	first, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"echo", "hi"}, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, st := read(c, ""); out != "hi\n" || st.ExitCode != 0 {
		t.Fatalf("echo hi: %q, %+v", out, st)
	}
	c.Release()
	if n := threads(); n != 2 {
		t.Fatalf("the guest runs %d threads serving a plain command; the fast guest has two (its spawner)", n)
	}

	// Attaches are the fast guest's too: to a finished command from an
	// offset, and to a running one whose client left (as the daemon's
	// exec log follows it), from where that client stopped.
	c, err = guest.Attach(ctx, first, 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, st := read(c, ""); out != "i\n" || st.ExitCode != 0 {
		t.Fatalf("attaching to echo hi at offset 1: %q, %+v", out, st)
	}
	c.Release()
	left, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"sh", "-c", "echo a; sleep 0.3; echo b"}, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := read(c, "a\n"); out != "a\n" {
		t.Fatalf("first output %q", out)
	}
	c.Close()
	c, err = guest.Attach(ctx, left, 2)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, st := read(c, ""); out != "b\n" || st.ExitCode != 0 {
		t.Fatalf("following a command whose client left: %q, %+v", out, st)
	}
	c.Release()
	if n := threads(); n != 2 {
		t.Fatalf("the guest runs %d threads after attaches: the fast guest handed them over", n)
	}

	second, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"sh", "-c", "echo one; sleep 1; echo two >&2; exit 3"}, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, st := read(c, "one\n"); out != "one\n" || st != nil {
		t.Fatalf("first output %q, exit %+v", out, st)
	}
	// Another connection asks for what the fast guest does not serve.
	ps, err := guest.Processes(ctx)
	if err != nil {
		t.Fatalf("list (the handover): %v", err)
	}
	if n := threads(); n <= 2 {
		t.Fatalf("the guest runs %d threads after the list: no handover to the Go guest", n)
	}
	byPID := map[int]guestapi.ProcessInfo{}
	for _, p := range ps {
		byPID[p.PID] = p
	}
	if p := byPID[first]; p.Running || p.Exit == nil || p.Exit.ExitCode != 0 || p.OutputBytes != 3 || strings.Join(p.Cmd, " ") != "echo hi" {
		t.Errorf("the finished command after the handover: %+v", p)
	}
	if p := byPID[second]; !p.Running || p.OutputBytes != 4 || p.Cwd == "" || p.StartedAt.IsZero() {
		t.Errorf("the running command after the handover: %+v", p)
	}
	// The stream goes on from where the fast guest left it.
	if out, errs, st := read(c, ""); out != "" || errs != "two\n" || st.ExitCode != 3 {
		t.Fatalf("the stream after the handover: stdout %q, stderr %q, %+v", out, errs, st)
	}
	c.Release()
	if err := guest.Ping(ctx); err != nil {
		t.Fatalf("ping after the release: %v", err)
	}
	c, err = guest.Attach(ctx, first, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, st := read(c, ""); out != "hi\n" || st.ExitCode != 0 {
		t.Fatalf("replaying the finished command: %q, %+v", out, st)
	}
	c.Close()
	// The Go guest's commands run as the fast guest's did (a session of
	// their own: the sids differ, each its command's pid).
	_, c, err = guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: who, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	goWho, _, st := read(c, "")
	c.Close()
	trim := func(s string) string { return s[:strings.LastIndex(strings.TrimSuffix(s, "\n"), "\n")] }
	if trim(goWho) != trim(fastWho) || st.ExitCode != 0 {
		t.Fatalf("a command of the Go guest after the handover ran as\n%s\nand of the fast guest as\n%s", goWho, fastWho)
	}
}

// TestFastGuestSlowReader: a stream whose reader falls behind does not
// hold the fast guest (one thread) up, nor its process: the output is
// retained and sent as the reader's socket has room, the other
// connections are served meanwhile, and the stream, read later, has
// every byte and the exit; past the retention cap, a dropped frame says
// how much the cap took, as the Go guest's ring does. All on the fast
// guest: no handover.
func TestFastGuestSlowReader(t *testing.T) {
	guest, threads := fastSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := []string{"PATH=/usr/bin:/bin"}
	const size = 12 << 20
	_, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"sh", "-c", "head -c " + strconv.Itoa(size) + " /dev/zero; echo end; touch /tmp/done"}, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Nobody reads the stream; the process ends all the same, and other
	// connections are served meanwhile (a command of the fast guest's
	// looks for the file it leaves).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, probe, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"test", "-e", "/tmp/done"}, Env: path})
		if err != nil {
			t.Fatal(err)
		}
		_, _, st := readStream(t, probe, "")
		probe.Close()
		if st.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process of a stream nobody reads did not end")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := threads(); n != 2 {
		t.Fatalf("the guest runs %d threads with a stream behind: the fast guest handed over", n)
	}
	if err := guest.Ping(ctx); err != nil {
		t.Fatalf("ping while a stream is behind: %v", err)
	}
	out, _, st := readStream(t, c, "")
	if len(out) != size+4 || !strings.HasSuffix(out, "end\n") || strings.Trim(out[:size], "\x00") != "" || st.ExitCode != 0 {
		t.Fatalf("the stream read late: %d bytes (want %d), %+v", len(out), size+4, st)
	}
	c.Release()
	// A full retention (16 MiB) behind, the stream holds the process (flow
	// control, as the Go guest's ring gives an attached reader): nothing
	// is dropped, and it ends once read.
	const big = 24 << 20
	_, c, err = guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"sh", "-c", "head -c " + strconv.Itoa(big) + " /dev/zero; echo end; touch /tmp/done2"}, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(3 * time.Second) // time enough to write 24 MiB
	if out, _, _ := shIn(t, guest, "test -e /tmp/done2 && echo ended"); out != "" {
		t.Fatal("a process a full retention ahead of its stream's reader went on")
	}
	got, dropped := readCounting(t, c)
	if dropped != 0 || got != big+4 {
		t.Fatalf("a stream a full retention behind: %d bytes and %d dropped, want %d and none", got, dropped, big+4)
	}
	c.Release()
	// A process that ends while held leaves the rest in its pipe (grown
	// to 1 MiB here, as a process may; 1031 is F_SETPIPE_SZ): that is kept
	// past the cap for the reader too. 17.5 MiB: the cap, about 1 MiB in
	// the socket, half the pipe.
	const over = 17<<20 + 512<<10
	fill := fmt.Sprintf("import fcntl, sys; fcntl.fcntl(1, 1031, 1 << 20); sys.stdout.buffer.write(bytes(%d))", over)
	_, c, err = guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"python3", "-c", fill}, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(2 * time.Second)
	if got, dropped := readCounting(t, c); dropped != 0 || got != over {
		t.Fatalf("a stream whose process ended held: %d bytes and %d dropped, want %d and none", got, dropped, over)
	}
	c.Release()
	// Output nobody follows never waits: a stream whose client went, past
	// the cap; attached again from the start, a dropped frame says what
	// the cap took, then the rest.
	pid, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"sh", "-c", "head -c " + strconv.Itoa(big) + " /dev/zero; echo end; touch /tmp/done3"}, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	for i := 0; ; i++ {
		if out, _, _ := shIn(t, guest, "test -e /tmp/done3 && echo ended"); out == "ended\n" {
			break
		}
		if i == 300 {
			t.Fatal("a process whose stream's client went did not end")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // its exit reaped
	c, err = guest.Attach(ctx, pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, dropped = readCounting(t, c)
	c.Close()
	if dropped == 0 || got+dropped != big+4 {
		t.Fatalf("a stream past the cap: %d bytes and %d dropped, want %d in all and some dropped", got, dropped, big+4)
	}
	if n := threads(); n != 2 {
		t.Fatalf("the guest runs %d threads after streams past the cap: the fast guest handed over", n)
	}
	// A handover while a stream holds more than the cap (its process
	// ended held): the Go guest takes all of it. (A sandbox of its own:
	// a handover costs memory twice what the guest retains, and this one
	// retains four streams' worth by now.)
	guest, _ = fastSandbox(t)
	_, c, err = guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"python3", "-c", fill}, Env: path})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(2 * time.Second)
	if _, err := guest.Processes(ctx); err != nil {
		t.Fatalf("list (the handover): %v", err)
	}
	if got, dropped := readCounting(t, c); dropped != 0 || got != over {
		t.Fatalf("a held stream after a handover: %d bytes and %d dropped, want %d and none", got, dropped, over)
	}
}

// readCounting reads c's stream to its exit and counts the output and the
// bytes dropped frames say went.
func readCounting(t *testing.T, c *guestapi.Conn) (got, dropped int64) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		f, err := c.Frames.Read()
		if err != nil {
			t.Fatalf("reading the stream: %v (%d bytes so far)", err, got)
		}
		switch f.Type {
		case wire.Stdout:
			got += int64(len(f.Payload))
		case wire.Dropped:
			var d struct {
				Bytes int64 `json:"bytes"`
			}
			json.Unmarshal(f.Payload, &d)
			dropped += d.Bytes
		case wire.Exit:
			return got, dropped
		}
	}
}

// TestFastGuestPrepare: the fast guest builds the sandbox the Go guest
// builds (root.c is buildRoot, enterRoot and identify again, in C): the
// same mounts in the same order with the same flags, the same /dev.
func TestFastGuestPrepare(t *testing.T) {
	// Mount points, their options, file system types and super options:
	// everything but ids, device numbers, the sources' host paths and
	// the host uids of the sandbox's range (each sandbox has its own).
	const script = `awk '{for (i = 7; $i != "-"; i++); o = $(i+3); gsub(/=[0-9][0-9][0-9][0-9][0-9][0-9]+/, "=ID", o); print $5, $6, $(i+1), o}' /proc/self/mountinfo; ls -l /dev | awk '{print $1, $NF}'`
	layout := func(fast string) string {
		guest, _ := guestSandbox(t, fast)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		out, errs, st := readStream(t, c, "")
		if st.ExitCode != 0 || errs != "" {
			t.Fatalf("reading the layout: %+v, %s", st, errs)
		}
		return out
	}
	fast, slow := layout(fastGuest(t)), layout("")
	if fast != slow {
		t.Errorf("the fast guest's sandbox:\n%s\nthe Go guest's:\n%s", fast, slow)
	}
	if !strings.Contains(slow, "/proc/acpi ") || !strings.Contains(slow, " overlay ") || !strings.Contains(slow, "/dev/pts ") {
		t.Errorf("the layout misses what it compares:\n%s", slow)
	}
}

// TestFastGuestFinishedOutputBounded: the fast guest keeps its finished
// processes' output within the Go guest's bound (guest.trimFinished:
// four times the per-process limit together), the oldest's going first,
// records kept; it hands the same over.
func TestFastGuestFinishedOutputBounded(t *testing.T) {
	guest, pid := guestInstance(t, fastGuest(t), true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const limit = 16 << 20 // the guest's default
	var pids []int
	for range 8 {
		p, c, err := guest.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"head", "-c", strconv.Itoa(limit), "/dev/zero"}, Env: []string{"PATH=/usr/bin:/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		if got, dropped := readCounting(t, c); got != limit || dropped != 0 {
			t.Fatalf("a run's stream: %d bytes, %d dropped", got, dropped)
		}
		c.Release()
		pids = append(pids, p)
	}
	// 64 MiB for the finished, 16 for the one running at a time, and the
	// heap's slack (eight outputs unbounded: 128 MiB).
	if rss := procStatusField(t, pid, "VmRSS"); rss > 96<<10 {
		t.Fatalf("the fast guest holds %d KiB after eight 16 MiB outputs: its finished processes' output is not bounded to 64 MiB", rss)
	}
	attachFrom0 := func(p int) (got, dropped int64) {
		c, err := guest.Attach(ctx, p, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return readCounting(t, c)
	}
	if got, dropped := attachFrom0(pids[0]); got != 0 || dropped != limit {
		t.Fatalf("the oldest, attached from the start: %d bytes and %d dropped", got, dropped)
	}
	if got, dropped := attachFrom0(pids[7]); got != limit || dropped != 0 {
		t.Fatalf("the newest, attached from the start: %d bytes and %d dropped", got, dropped)
	}
	if n := threadCount(t, pid); n != 2 {
		t.Fatalf("the guest runs %d threads: the fast guest handed over", n)
	}
	// The Go guest takes the same over.
	ps, err := guest.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var records int
	for _, p := range ps {
		if p.OutputBytes == limit && p.Exit != nil {
			records++
		}
	}
	if records != 8 {
		t.Fatalf("%d of 8 records after the handover: %+v", records, ps)
	}
	if got, dropped := attachFrom0(pids[0]); got != 0 || dropped != limit {
		t.Fatalf("the oldest after the handover: %d bytes and %d dropped", got, dropped)
	}
}

// procStatusField reads a number field of /proc/pid/status (kB for
// sizes).
func procStatusField(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
