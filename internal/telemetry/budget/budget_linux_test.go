package budget

import (
	"context"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/cgrouptest"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

// TestCPUBudgetBusyLoop: a busy loop in a real cgroup, sampled every
// 100 ms, reaches a 1 CPU-second budget; the action (pause, carried out
// here as the daemon would: freezing the cgroup) stops it using CPU.
func TestCPUBudgetBusyLoop(t *testing.T) {
	m := cgrouptest.NewManager(t)
	g, err := m.Create("busy", cgroup.Limits{CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	files, err := metrics.OpenCgroupFiles(metrics.GroupDirs(m.Mode(), g))
	if err != nil {
		t.Fatal(err)
	}

	exceeded := make(chan Notice, 1)
	paused := make(chan error, 1)
	tr := New(Config{OnExceeded: func(id string, n Notice) {
		exceeded <- n
		go func() { // the action runs off the sampler's goroutine
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			paused <- g.Freeze(ctx)
		}()
	}})
	if err := tr.Set("busy", Spec{CPUSeconds: 1, Action: Pause}, time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	s, err := metrics.NewSampler(metrics.Config{Interval: 100 * time.Millisecond, Observers: []metrics.Observer{tr}})
	if err != nil {
		t.Fatal(err)
	}
	s.Register("busy", &metrics.CgroupSource{Cgroup: files})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		s.Close()
		g.Thaw()
	})

	start := time.Now()
	cgrouptest.Start(t, g, "/bin/sh", "-c", "while :; do :; done")
	var n Notice
	select {
	case n = <-exceeded:
	case <-time.After(10 * time.Second):
		t.Fatal("the CPU budget was not reached in 10 s")
	}
	took := time.Since(start)
	// One 100 ms tick of a core at most past the budget.
	if n.Budget != CPUSeconds || n.Action != Pause || n.Used < 1 || n.Used > 1.15 {
		t.Errorf("notice %+v: want cpu_seconds used in [1, 1.15], action pause", n)
	}
	if err := <-paused; err != nil {
		t.Fatalf("pausing: %v", err)
	}
	st1, _ := g.Stats()
	time.Sleep(300 * time.Millisecond)
	st2, _ := g.Stats()
	if st2.CPUUsageNanos != st1.CPUUsageNanos {
		t.Errorf("still using CPU after the pause: %d → %d ns", st1.CPUUsageNanos, st2.CPUUsageNanos)
	}
	t.Logf("budget of 1 CPU-s reached after %v of wall time at %.3f CPU-s", took.Round(time.Millisecond), n.Used)
}
