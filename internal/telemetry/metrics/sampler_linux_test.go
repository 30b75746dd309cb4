package metrics

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/cgrouptest"
)

// TestKnownWorkloads: a busy loop of 2 s of CPU reads as about 2
// CPU-seconds; a 300 MB allocation reads as about 300 MB.
func TestKnownWorkloads(t *testing.T) {
	m := cgrouptest.NewManager(t)
	g, err := m.Create("work", cgroup.Limits{MemoryBytes: 1 << 30, Pids: 64})
	if err != nil {
		t.Fatal(err)
	}
	s := newTestSampler(t)
	s.Register("work", &CgroupSource{Cgroup: openFiles(t, m, g), Net: new(NetCounters)})

	p := cgrouptest.Start(t, g, "/usr/bin/python3", "-c", `
import time
t = time.process_time()
while time.process_time() - t < 2:
    pass
print("spun", flush=True)
b = b"x" * (300 << 20)
print("allocated", flush=True)
time.sleep(120)
`)
	start := time.Now()
	s.Tick(start)
	readLine(t, p, "spun")
	spun := time.Now()
	s.Tick(spun)
	cur, _, _ := s.Current("work")
	if cur.CPUSeconds < 1.8 || cur.CPUSeconds > 2.4 {
		t.Errorf("after a 2 s busy loop: %.3f CPU-seconds, want about 2", cur.CPUSeconds)
	}
	// The loop spins for 2 s of its own CPU time, so the CPU-seconds do
	// not depend on what else the host runs; its share of a core does.
	if cur.CPUPercent < 10 || cur.CPUPercent > 110 {
		t.Errorf("during a busy loop: CPU %.1f%%, want up to 100", cur.CPUPercent)
	}
	spin, spinPct := cur.CPUSeconds, cur.CPUPercent
	readLine(t, p, "allocated")
	s.Tick(time.Now())
	cur, _, _ = s.Current("work")
	mb := float64(cur.MemoryBytes) / (1 << 20)
	// Memory is the working set (usage less inactive file cache), and
	// cgroup v1 charges in per-CPU batches: within 10% below, 15% above.
	if mb < 270 || mb > 345 {
		// It held the memory on stdin.read(), and cgrouptest.Start closes
		// stdin: the process was exiting when CI read 257.7 and 190.3 MB.
		t.Errorf("after allocating 300 MB: memory %.1f MB, want about 300 (peak %.1f MB, inactive file cache %.1f MB left out)",
			mb, float64(cur.MemoryPeakBytes)/(1<<20), float64(cur.MemoryReclaimableBytes)/(1<<20))
	}
	if cur.MemoryLimitBytes != 1<<30 || cur.PidsLimit != 64 || cur.Pids < 1 {
		t.Errorf("limits: memory %d, pids %d of %d", cur.MemoryLimitBytes, cur.Pids, cur.PidsLimit)
	}
	t.Logf("busy loop of 2 s of CPU: %.3f CPU-s at %.1f%%; allocation of 300 MB: %.1f MB (peak %.1f MB)",
		spin, spinPct, mb, float64(cur.MemoryPeakBytes)/(1<<20))
}

func readLine(t *testing.T, p *cgrouptest.Proc, want string) {
	t.Helper()
	line, err := p.Stdout.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != want {
		t.Fatalf("read %q, %v; want %q (stderr: %s)", line, err, want, p.Stderr)
	}
}

// statDisk makes the same system calls as disk.Volume.Usage (two stats and
// a statfs) on a directory.
type statDisk struct{ path string }

func (d statDisk) Usage() (used, size int64, err error) {
	var a, b unix.Stat_t
	if err := unix.Stat(filepath.Dir(d.path), &a); err != nil {
		return 0, 0, err
	}
	if err := unix.Stat(d.path, &b); err != nil {
		return 0, 0, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.path, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

func openFiles(tb testing.TB, m *cgroup.Manager, g *cgroup.Group) *CgroupFiles {
	tb.Helper()
	f, err := OpenCgroupFiles(GroupDirs(m.Mode(), g))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	return f
}

// TestCgroupFilesMatchStats: the held-descriptor reader and cgroup.Group's
// Stats read the same numbers; the reader also sees failcnt rise when the
// group hits its limit, and reports a removed group as not found.
func TestCgroupFilesMatchStats(t *testing.T) {
	m := cgrouptest.NewManager(t)
	g, err := m.Create("files", cgroup.Limits{CPUs: 1, MemoryBytes: 64 << 20, Pids: 32})
	if err != nil {
		t.Fatal(err)
	}
	f := openFiles(t, m, g)
	// It sleeps holding the memory: its stdin is at EOF once Start
	// returns, so a read would let it exit under the measurement.
	p := cgrouptest.Start(t, g, "/usr/bin/python3", "-c", `
import time
b = b"x" * (40 << 20)
print("ready", flush=True)
time.sleep(120)
`)
	readLine(t, p, "ready")
	var r Reading
	if err := f.ReadCgroup(&r); err != nil {
		t.Fatal(err)
	}
	var w Reading
	if err := (GroupStats{g}).ReadCgroup(&w); err != nil {
		t.Fatal(err)
	}
	// CPU and memory move between the two reads; limits and pids do not.
	if r.MemoryLimitBytes != w.MemoryLimitBytes || r.PidsLimit != w.PidsLimit || r.Pids != w.Pids || r.OOMKills != w.OOMKills {
		t.Errorf("files %+v\nstats %+v", r, w)
	}
	if r.MemoryLimitBytes != 64<<20 || r.PidsLimit != 32 || r.Pids != 1 {
		t.Errorf("limits read as %d, %d; pids %d", r.MemoryLimitBytes, r.PidsLimit, r.Pids)
	}
	if d := r.MemoryBytes - w.MemoryBytes; d < -1<<20 || d > 1<<20 || r.MemoryBytes < 40<<20 {
		t.Errorf("memory %d (files) vs %d (stats)", r.MemoryBytes, w.MemoryBytes)
	}
	if r.CPUNanos == 0 || r.CPUNanos > w.CPUNanos {
		t.Errorf("cpu %d (files, read first) vs %d (stats)", r.CPUNanos, w.CPUNanos)
	}

	before := r.MemoryFailcnt
	if err := g.Update(cgroup.Limits{CPUs: 1, MemoryBytes: 200 << 20, Pids: 32}); err != nil {
		t.Fatal(err)
	}
	q := cgrouptest.Start(t, g, "/usr/bin/python3", "-c", `
import sys
try:
    b = b"x" * (400 << 20)
except MemoryError:
    pass
`)
	q.Wait(t, 30*time.Second)
	if err := f.ReadCgroup(&r); err != nil {
		t.Fatal(err)
	}
	// Not asserted: with swap accounted and memory+swap capped at the
	// memory limit (paddock's v1 setup), kernel 6.x trips the memsw
	// counter first and tracks no failcnt for it, so both stay 0.
	t.Logf("failcnt %d after hitting the limit (was %d)", r.MemoryFailcnt, before)
	if r.OOMKills == 0 {
		t.Errorf("no OOM kill counted after a 400 MB allocation under 200 MB")
	}

	_ = p.Cmd.Process.Kill()
	<-p.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.ReadCgroup(&r); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("reading a removed group = %v, want ErrNotFound", err)
	}
}

// BenchmarkSample200 samples 200 real cgroups, each with a process in it,
// with the disk and network reads a sandbox has, one tick per iteration.
// It reports the process CPU time (user+system, from getrusage, so GC and
// every other goroutine included) per tick, and that as a share of one
// core at one tick a second: the bar is 2%.
func BenchmarkSample200(b *testing.B) {
	b.Run("files", func(b *testing.B) { benchmarkSample(b, true) })
	b.Run("group-stats", func(b *testing.B) { benchmarkSample(b, false) })
}

func benchmarkSample(b *testing.B, files bool) {
	const n = 200
	m := cgrouptest.NewManager(b)
	s, err := NewSampler(Config{})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("sbx-%03d", i)
		g, err := m.Create(id, cgroup.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 64})
		if err != nil {
			b.Fatal(err)
		}
		cgrouptest.Start(b, g, "/bin/sleep", "3600")
		var cr CgroupReader = GroupStats{g}
		if files {
			cr = openFiles(b, m, g)
		}
		s.Register(id, &CgroupSource{Cgroup: cr, Disk: statDisk{dir}, Net: new(NetCounters)})
	}
	now := time.Now()
	s.Tick(now) // warm: first readings, rings allocated
	b.ReportAllocs()
	b.ResetTimer()
	before := cpuTime(b)
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Second)
		s.Tick(now)
	}
	cpu := cpuTime(b) - before
	b.StopTimer()
	if _, sampled := s.LastTick(); sampled != n {
		b.Fatalf("last tick sampled %d sandboxes, want %d", sampled, n)
	}
	perTick := cpu / time.Duration(b.N)
	b.ReportMetric(float64(perTick)/1e6, "cpu-ms/tick")
	b.ReportMetric(float64(perTick)/float64(time.Second)*100, "%core@1Hz")
	b.ReportMetric(float64(perTick)/n/1e3, "cpu-µs/sandbox")
}

func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
