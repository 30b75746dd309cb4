package autoscale

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/cgrouptest"
)

// BenchmarkUpdate measures cgroup.Group.Update on a live group with a
// process in it: the call that applies every autoscale decision and every
// `paddock update`.
func BenchmarkUpdate(b *testing.B) {
	m := cgrouptest.NewManager(b)
	g, err := m.Create("resize", cgroup.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 64})
	if err != nil {
		b.Fatal(err)
	}
	cgrouptest.Start(b, g, "/bin/sleep", "3600")
	for _, bc := range []struct {
		name string
		a, z cgroup.Limits
	}{
		{"memory", cgroup.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 64}, cgroup.Limits{CPUs: 1, MemoryBytes: 384 << 20, Pids: 64}},
		{"cpu", cgroup.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 64}, cgroup.Limits{CPUs: 1.5, MemoryBytes: 256 << 20, Pids: 64}},
		{"all", cgroup.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 64}, cgroup.Limits{CPUs: 2, MemoryBytes: 512 << 20, Pids: 128}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				l := bc.a
				if i%2 == 1 {
					l = bc.z
				}
				if err := g.Update(l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestResizeTakesEffect measures how long a resize takes to change what
// the sandbox's processes can do, from the moment Update is called:
//
//   - CPU: a busy loop held to 0.05 cores (5 ms of each 100 ms period)
//     reports, on CLOCK_MONOTONIC, each time it runs again after a gap.
//     Caught while throttled, the quota goes to 1 core; the latency is
//     from before Update to the loop's own report that it runs again.
//   - Memory (v1): a process allocating past a 100 MiB limit with the
//     OOM killer disabled for the group waits in the kernel; the limit
//     goes to 300 MiB; the latency is until the group's usage passes the
//     old limit (polled every 50 µs).
//
// The bar is 10 ms.
func TestResizeTakesEffect(t *testing.T) {
	m := cgrouptest.NewManager(t)

	t.Run("cpu", func(t *testing.T) {
		low := cgroup.Limits{CPUs: 0.05, MemoryBytes: 256 << 20, Pids: 64}
		high := cgroup.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 64}
		// Started at one core: python's own start-up at 0.05 cores on a
		// busy host (cold page cache, other packages' tests) can take
		// seconds, which is not what is measured here.
		g, err := m.Create("cpu", high)
		if err != nil {
			t.Fatal(err)
		}
		p := cgrouptest.Start(t, g, "/usr/bin/python3", "-c", `
import sys, time
m = time.monotonic
last = m()
sys.stdout.write("%.6f\n" % last)
sys.stdout.flush()
while True:
    t = m()
    if t - last > 0.002:
        sys.stdout.write("%.6f\n" % t)
        sys.stdout.flush()
    last = t
`)
		lines := make(chan float64, 1024)
		go func() {
			sc := bufio.NewScanner(p.Stdout)
			for sc.Scan() {
				if v, err := strconv.ParseFloat(sc.Text(), 64); err == nil {
					lines <- v
				}
			}
			close(lines)
		}()
		select {
		case _, ok := <-lines:
			if !ok {
				<-p.Done() // its stderr is complete
				t.Fatalf("the loop ended before it started: %s", p.Stderr)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the loop did not start in 60 s")
		}
		var lat, upd []time.Duration
		for trial := 0; trial < 20; trial++ {
			if err := g.Update(low); err != nil {
				t.Fatal(err)
			}
			// Wait for a resume, then 20 ms: the loop has used its 5 ms
			// and is throttled for the rest of the period.
			drain(lines)
			if _, ok := recv(t, lines); !ok {
				return
			}
			time.Sleep(20 * time.Millisecond)
			drain(lines)
			t0 := monotonic()
			start := time.Now()
			if err := g.Update(high); err != nil {
				t.Fatal(err)
			}
			upd = append(upd, time.Since(start))
			t1, ok := recv(t, lines)
			if !ok {
				return
			}
			if t1 < t0 {
				continue // a stale line
			}
			lat = append(lat, time.Duration((t1-t0)*1e9))
		}
		report(t, "cpu quota 0.05 → 1 core", lat, upd)
	})

	t.Run("memory", func(t *testing.T) {
		if m.Mode() != cgroup.V1 {
			t.Skip("needs v1's oom_kill_disable to hold a process at its limit")
		}
		var lat, upd []time.Duration
		for trial := 0; trial < 10; trial++ {
			name := "mem-" + strconv.Itoa(trial)
			g, err := m.Create(name, cgroup.Limits{MemoryBytes: 100 << 20, Pids: 64})
			if err != nil {
				t.Fatal(err)
			}
			oomControl := cgrouptest.ControlFile(g, m.Mode(), "memory.oom_control")
			usage := cgrouptest.ControlFile(g, m.Mode(), "memory.usage_in_bytes")
			if err := os.WriteFile(oomControl, []byte("1"), 0); err != nil {
				t.Fatal(err)
			}
			cgrouptest.Start(t, g, "/usr/bin/python3", "-c", `
chunks = []
while len(chunks) < 200:
    chunks.append(b"x" * (1 << 20))
import time
time.sleep(60)
`)
			// Held at the limit: under_oom.
			waitUntil(t, 10*time.Second, func() bool {
				b, _ := os.ReadFile(oomControl)
				return strings.Contains(string(b), "under_oom 1")
			})
			start := time.Now()
			if err := g.Update(cgroup.Limits{MemoryBytes: 300 << 20, Pids: 64}); err != nil {
				t.Fatal(err)
			}
			upd = append(upd, time.Since(start))
			for {
				b, err := os.ReadFile(usage)
				if err != nil {
					t.Fatal(err)
				}
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				if n > 100<<20 { // one more page charged
					break
				}
				if time.Since(start) > 5*time.Second {
					t.Fatal("usage did not pass the old limit in 5 s")
				}
				time.Sleep(50 * time.Microsecond)
			}
			lat = append(lat, time.Since(start))
		}
		report(t, "memory 100 → 300 MiB (held at the limit)", lat, upd)
	})
}

func drain(ch chan float64) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func recv(t *testing.T, ch chan float64) (float64, bool) {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatal("the loop ended")
		}
		return v, true
	case <-time.After(5 * time.Second):
		t.Fatal("the loop reported nothing for 5 s")
	}
	return 0, false
}

func monotonic() float64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

func waitUntil(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in %v", timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

func report(t *testing.T, what string, lat, upd []time.Duration) {
	t.Helper()
	if len(lat) < 5 {
		t.Fatalf("%s: only %d measurements", what, len(lat))
	}
	slices.Sort(lat)
	slices.Sort(upd)
	q := func(d []time.Duration, f float64) time.Duration { return d[int(f*float64(len(d)-1))] }
	t.Logf("%s: takes effect p50 %v, p90 %v, max %v (n=%d); Update call p50 %v, max %v",
		what, q(lat, 0.5), q(lat, 0.9), lat[len(lat)-1], len(lat), q(upd, 0.5), upd[len(upd)-1])
	if q(lat, 0.5) > 10*time.Millisecond {
		t.Errorf("%s: median %v is over the 10 ms bar", what, q(lat, 0.5))
	}
}
