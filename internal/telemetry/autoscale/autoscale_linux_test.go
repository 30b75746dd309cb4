package autoscale

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/telemetry/events"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/cgrouptest"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

// ramp allocates 100 MB, then 16 MB every 100 ms up to 1000 MB (about 6 s),
// says "done", frees it all and idles for 8 s.
const ramp = `
import time
chunks = [b"x" * (100 << 20)]
print("started", flush=True)
while len(chunks) * 16 < 1000 - 100 + 16:
    chunks.append(b"y" * (16 << 20))
    time.sleep(0.1)
print("done", flush=True)
del chunks
time.sleep(8)
`

// TestRampUnderAutoscale: a workload that ramps from 100 MB to 1 GB
// completes without an OOM kill while the autoscaler (fed by real samples
// every 100 ms) grows its limit from 256 MiB, and the limit shrinks back
// to the minimum once it idles. The same ramp under a fixed 256 MiB limit
// is OOM-killed.
func TestRampUnderAutoscale(t *testing.T) {
	m := cgrouptest.NewManager(t)

	t.Run("autoscaled", func(t *testing.T) {
		const min, max = 256 << 20, 2048 << 20
		g, err := m.Create("ramp", cgroup.Limits{MemoryBytes: min, Pids: 64})
		if err != nil {
			t.Fatal(err)
		}
		log, err := events.Open(events.Config{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		a := New(Config{
			Policy: Policy{IdleFor: 500 * time.Millisecond},
			Apply:  func(id string, l cgroup.Limits) error { return g.Update(l) },
			Events: log,
		})
		if err := a.Set("ramp", Range{MinMemoryBytes: min, MaxMemoryBytes: max}, cgroup.Limits{MemoryBytes: min, Pids: 64}); err != nil {
			t.Fatal(err)
		}
		sampler := startSampler(t, m, g, a)

		p := cgrouptest.Start(t, g, "/usr/bin/python3", "-c", ramp)
		expect(t, p, "started", 10*time.Second)
		start := time.Now()
		expect(t, p, "done", 30*time.Second)
		took := time.Since(start)
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.OOMKills != 0 {
			t.Fatalf("%d OOM kills under autoscale", st.OOMKills)
		}
		if st.MemoryLimit < 1000<<20 || st.MemoryLimit > max {
			t.Errorf("limit %d MiB after the ramp, want between 1000 and %d", st.MemoryLimit>>20, max>>20)
		}
		peak := st.MemoryPeak

		// Idle: back to the minimum, a step per IdleFor.
		deadline := time.Now().Add(7 * time.Second)
		for {
			st, err = g.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st.MemoryLimit == min || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if st.MemoryLimit != min {
			t.Errorf("limit %d MiB after idling, want back to %d", st.MemoryLimit>>20, min>>20)
		}
		select {
		case <-p.Done():
			t.Fatalf("the workload ended early: %v (stderr: %s)", p.Cmd.ProcessState, p.Stderr)
		default:
		}
		evs, err := log.List("ramp", events.Query{Types: []events.Type{events.Autoscale}})
		if err != nil {
			t.Fatal(err)
		}
		grows, shrinks := 0, 0
		for _, e := range evs {
			t.Logf("event %d: %s", e.Seq, e.Message)
			switch {
			case strings.Contains(e.Message, "not applied"):
				t.Errorf("a change failed: %s", e.Message)
			case strings.Contains(e.Message, "working set") && strings.Contains(e.Message, "under"):
				shrinks++
			default:
				grows++
			}
		}
		if grows < 3 || shrinks < 2 {
			t.Errorf("%d grow and %d shrink events, want several of each", grows, shrinks)
		}
		tick, n := sampler.LastTick()
		t.Logf("ramp of 900 MB in %v without OOM; peak %d MiB; last tick %v for %d sandbox", took.Round(time.Millisecond), peak>>20, tick, n)
	})

	t.Run("fixed-256M", func(t *testing.T) {
		g, err := m.Create("fixed", cgroup.Limits{MemoryBytes: 256 << 20, Pids: 64})
		if err != nil {
			t.Fatal(err)
		}
		p := cgrouptest.Start(t, g, "/usr/bin/python3", "-c", ramp)
		expect(t, p, "started", 10*time.Second)
		ws := p.Wait(t, 30*time.Second)
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL || st.OOMKills == 0 {
			t.Fatalf("under a fixed 256M limit: %v with %d OOM kills, want killed by the OOM killer", ws, st.OOMKills)
		}
		t.Logf("fixed 256M: killed by %s, %d OOM kill(s)", unix.SignalName(ws.Signal()), st.OOMKills)
	})
}

func startSampler(t *testing.T, m *cgroup.Manager, g *cgroup.Group, obs ...metrics.Observer) *metrics.Sampler {
	t.Helper()
	files, err := metrics.OpenCgroupFiles(metrics.GroupDirs(m.Mode(), g))
	if err != nil {
		t.Fatal(err)
	}
	s, err := metrics.NewSampler(metrics.Config{Interval: 100 * time.Millisecond, Observers: obs})
	if err != nil {
		t.Fatal(err)
	}
	s.Register(g.Name(), &metrics.CgroupSource{Cgroup: files})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		s.Close()
	})
	return s
}

func expect(t *testing.T, p *cgrouptest.Proc, want string, timeout time.Duration) {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		line, _ := p.Stdout.ReadString('\n')
		got <- strings.TrimSpace(line)
	}()
	select {
	case line := <-got:
		if line != want {
			t.Fatalf("read %q, want %q (exit %v, stderr: %s)", line, want, p.Cmd.ProcessState, p.Stderr)
		}
	case <-time.After(timeout):
		t.Fatalf("no %q after %v", want, timeout)
	}
}
