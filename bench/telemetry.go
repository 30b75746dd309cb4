package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/hub"
)

const (
	// metricsSandboxes is the issue's fleet size for the collection cost.
	metricsSandboxes = 200
	metricsTicks     = 30
	// metricsCostBar is the most of one core the collection may take.
	metricsCostBar = 0.02
	resizeBar      = 10 * time.Millisecond
)

// benchTelemetry measures issue 6's bars: what sampling 200 running
// sandboxes costs, and how long a resize takes to reach the cgroup.
func benchTelemetry(ctx context.Context, r *rig) *section {
	s := &section{Method: []string{
		fmt.Sprintf("Collection: %d real cgroups (memory, CPU and pids limits, one `sleep` each) registered with the daemon's telemetry hub "+
			"(sampler, OOM watch, a budget and an autoscale range on every one, as the daemon runs them), in this process. "+
			"Each of %d ticks reads every cgroup and runs the observers; the timed value is the CPU time of the ticking thread "+
			"(RUSAGE_THREAD), divided by the 1 s sampling interval: the share of one core. Disk usage (read every 10 s) is not included.", metricsSandboxes, metricsTicks),
		"Resize: a running sandbox through the daemon, its memory limit switched between 512 MiB and 768 MiB and its CPUs between 1 and 2 " +
			"with `POST /v1/sandboxes/{id}/update` (Go SDK); the timed region runs from the request until the new memory limit reads back " +
			"from the cgroup's control file.",
	}}
	t := table{Caption: "Telemetry", Header: []string{"what", "n", "median", "p90", "p99", "max"}}
	cost, tick, err := metricsCost(r)
	if err != nil {
		s.Err = fmt.Errorf("collection cost: %w", err)
	}
	costBar := bar{Issue: 6, What: fmt.Sprintf("metrics collection for %d running sandboxes, share of one core", metricsSandboxes),
		Target: "≤ 2%", Value: "not measured", Verdict: notMeasured}
	if tick.N > 0 {
		t.add("sampler tick CPU, "+strconv.Itoa(metricsSandboxes)+" sandboxes", strconv.Itoa(tick.N), ms(tick.Median), ms(tick.P90), ms(tick.P99), ms(tick.Max))
		costBar.Value = fmt.Sprintf("%.2f%% (%s CPU per 1 s tick, median)", cost*100, ms(tick.Median))
		costBar.Verdict = check(cost <= metricsCostBar)
	}
	resize, err := r.resizeLatency(ctx)
	if err != nil {
		s.Err = errors.Join(s.Err, fmt.Errorf("resize: %w", err))
	}
	resizeBarV := bar{Issue: 6, What: "a resize (memory and CPUs) takes effect, median (Go SDK)", Target: "≤ 10 ms", Value: "not measured", Verdict: notMeasured}
	if resize.N > 0 {
		t.add("resize: update → limit in the cgroup", strconv.Itoa(resize.N), ms(resize.Median), ms(resize.P90), ms(resize.P99), ms(resize.Max))
		resizeBarV.Value = fmt.Sprintf("%s (p99 %s)", ms(resize.Median), ms(resize.P99))
		resizeBarV.Verdict = check(resize.Median <= resizeBar)
	}
	s.Tables = append(s.Tables, t)
	s.Bars = []bar{costBar, resizeBarV}
	return s
}

// metricsCost registers metricsSandboxes real cgroups with a telemetry hub
// and measures the CPU time of its ticks.
func metricsCost(r *rig) (float64, summary, error) {
	b := make([]byte, 4)
	rand.Read(b)
	parent := "paddock-bench-metrics-" + hex.EncodeToString(b)
	cgm, err := cgroup.NewManager(parent, nil)
	if err != nil {
		return 0, summary{}, err
	}
	dir, err := os.MkdirTemp(r.root, "telemetry-")
	if err != nil {
		return 0, summary{}, err
	}
	// A capacity admission never refuses.
	h, err := hub.New(hub.Config{Dir: dir, Cgroups: cgm, Capacity: admission.Resources{CPUs: 1e4, MemoryBytes: 1 << 50}, Logger: r.log.With("component", "bench-telemetry")})
	if err != nil {
		return 0, summary{}, err
	}
	var groups []*cgroup.Group
	var sleepers []*exec.Cmd
	defer func() {
		for _, c := range sleepers {
			c.Process.Kill()
			c.Wait()
		}
		h.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, g := range groups {
			if err := g.Delete(ctx); err != nil {
				r.log.Warn("removing a bench cgroup", "err", err)
			}
		}
		if err := cgm.Remove(); err != nil {
			r.log.Warn("removing the bench cgroup parent", "err", err)
		}
	}()
	res := api.Resources{CPUs: 1, MemoryBytes: 256 << 20, Pids: 100}
	for i := 0; i < metricsSandboxes; i++ {
		id := fmt.Sprintf("bench%04d", i)
		g, err := cgm.Create(id, cgroup.Limits{CPUs: res.CPUs, MemoryBytes: res.MemoryBytes, Pids: res.Pids})
		if err != nil {
			return 0, summary{}, err
		}
		groups = append(groups, g)
		c := exec.Command("sleep", "600")
		if err := c.Start(); err != nil {
			return 0, summary{}, err
		}
		sleepers = append(sleepers, c)
		if err := g.AddProc(c.Process.Pid); err != nil {
			return 0, summary{}, err
		}
		h.Running(id, api.Sandbox{ID: id, State: api.StateRunning, Resources: res, CreatedAt: time.Now(),
			Budget:    &api.Budget{CPUSeconds: 1e6, WallSeconds: 1e6},
			Autoscale: &api.Autoscale{MinMemoryBytes: 128 << 20, MaxMemoryBytes: 1 << 30}})
	}
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	smp := h.Sampler()
	now := time.Now()
	for i := 0; i < 3; i++ { // warm-up: the first reads open the files
		now = now.Add(time.Second)
		smp.Tick(now)
	}
	var cpu []time.Duration
	for i := 0; i < metricsTicks; i++ {
		now = now.Add(time.Second)
		before := threadCPU()
		smp.Tick(now)
		cpu = append(cpu, threadCPU()-before)
		time.Sleep(50 * time.Millisecond)
	}
	if _, n := smp.LastTick(); n != metricsSandboxes {
		return 0, summary{}, fmt.Errorf("the last tick sampled %d sandboxes, want %d", n, metricsSandboxes)
	}
	st := summarize(cpu)
	return st.Median.Seconds() / time.Second.Seconds(), st, nil
}

func threadCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// resizeLatency switches a running sandbox's limits back and forth and
// times each until the cgroup holds the new memory limit.
func (r *rig) resizeLatency(ctx context.Context) (summary, error) {
	var samples []time.Duration
	err := r.withSandbox(ctx, api.CreateRequest{Resources: api.Resources{MemoryBytes: 512 << 20, CPUs: 1}}, func(id string) error {
		cg := r.runtimeOf(ctx, id).Cgroup
		if cg == "" {
			return fmt.Errorf("sandbox %s reports no cgroup", id)
		}
		file := filepath.Join(memoryCgroupDir(cg), "memory.limit_in_bytes")
		if cgroupV2Only() {
			file = filepath.Join(memoryCgroupDir(cg), "memory.max")
		}
		n := max(r.opts.n, 50)
		for i := 0; i < n+5; i++ {
			res := api.Resources{MemoryBytes: 768 << 20, CPUs: 2}
			if i%2 == 1 {
				res = api.Resources{MemoryBytes: 512 << 20, CPUs: 1}
			}
			t0 := time.Now()
			if _, err := r.client.Update(ctx, id, api.UpdateRequest{Resources: res}); err != nil {
				return err
			}
			for {
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				if strings.TrimSpace(string(b)) == strconv.FormatInt(res.MemoryBytes, 10) {
					break
				}
				if time.Since(t0) > 5*time.Second {
					return fmt.Errorf("memory limit %s after 5 s, want %d", b, res.MemoryBytes)
				}
			}
			if i >= 5 { // warm-up
				samples = append(samples, time.Since(t0))
			}
		}
		return nil
	})
	return summarize(samples), err
}
