package autoscale

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/paddock-dev/paddock/api"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/events"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

const mb = 1 << 20

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// applied records what Apply was asked to do.
type applied struct {
	limits []cgroup.Limits
	err    error
}

func (ap *applied) apply(id string, l cgroup.Limits) error {
	if ap.err != nil {
		return ap.err
	}
	ap.limits = append(ap.limits, l)
	return nil
}

// tick is one synthetic sample, relative to the previous one.
type tick struct {
	mem, cache    int64   // bytes
	cpu           float64 // percent of a core wanted
	oom, failcnt  uint64  // cumulative
	stall         float64 // cumulative seconds
	limitInSample int64   // the kernel's memory limit, if not the autoscaler's
}

func run(a *Autoscaler, id string, step time.Duration, ticks []tick) {
	for i, tk := range ticks {
		lim, _ := a.Limits(id)
		if lim.CPUs > 0 {
			tk.cpu = min(tk.cpu, 100*lim.CPUs) // the quota caps the use
		}
		s := metrics.Sample{Sample: api.Sample{
			Time:             t0.Add(time.Duration(i) * step),
			MemoryBytes:      tk.mem,
			MemoryLimitBytes: lim.MemoryBytes,
			CPUPercent:       tk.cpu,
			OOMKills:         tk.oom,
		}, MemoryReclaimableBytes: tk.cache, MemoryFailcnt: tk.failcnt, MemoryStallSeconds: tk.stall}
		if tk.limitInSample != 0 {
			s.MemoryLimitBytes = tk.limitInSample
		}
		a.Observe(id, s)
	}
}

func repeat(n int, tk tick) []tick {
	out := make([]tick, n)
	for i := range out {
		out[i] = tk
	}
	return out
}

func TestMemoryDecisions(t *testing.T) {
	policy := Policy{IdleFor: 5 * time.Second}
	r := Range{MinMemoryBytes: 256 * mb, MaxMemoryBytes: 4096 * mb}
	tests := []struct {
		name  string
		start int64 // memory limit
		ticks []tick
		want  []int64 // memory limits applied, MiB
	}{
		{"quiet in the middle", 512 * mb, repeat(3, tick{mem: 300 * mb}), nil},
		{"near the limit grows ×1.5", 256 * mb, []tick{{mem: 100 * mb}, {mem: 230 * mb}}, []int64{384}},
		{"a ramp grows step by step", 256 * mb, []tick{
			{mem: 100 * mb}, {mem: 220 * mb}, {mem: 300 * mb}, {mem: 340 * mb}, {mem: 500 * mb}, {mem: 800 * mb},
		}, []int64{384, 576, 864, 1296}},
		{"a jump grows to the need", 256 * mb, []tick{{mem: 100 * mb}, {mem: 1000 * mb}}, []int64{1250}},
		{"capped at max", 3000 * mb, []tick{{mem: 100 * mb}, {mem: 2900 * mb}}, []int64{4096}},
		{"at max stays", 4096 * mb, repeat(3, tick{mem: 4000 * mb}), nil},
		{"cache is not pressure", 256 * mb, repeat(3, tick{mem: 250 * mb, cache: 150 * mb}), nil},
		{"an OOM kill grows", 512 * mb, []tick{{mem: 100 * mb}, {mem: 100 * mb, oom: 1}}, []int64{768}},
		{"PSI stall grows", 512 * mb, []tick{{mem: 300 * mb}, {mem: 300 * mb, stall: 0.1}}, []int64{768}},
		{"a small stall does not", 512 * mb, []tick{{mem: 300 * mb}, {mem: 300 * mb, stall: 0.01}}, nil},
		{"failcnt with a big working set grows", 512 * mb, []tick{{mem: 300 * mb}, {mem: 300 * mb, failcnt: 5}}, []int64{768}},
		{"failcnt from cache alone does not", 512 * mb, []tick{{mem: 500 * mb, cache: 400 * mb}, {mem: 500 * mb, cache: 400 * mb, failcnt: 5}}, nil},
		{"idle shrinks after IdleFor, by steps", 2048 * mb, repeat(13, tick{mem: 100 * mb}),
			// idle from tick 0; 5 s later 2048/1.5; 5 s after that /1.5 again.
			[]int64{1366, 911}},
		{"shrinks no lower than min", 300 * mb, repeat(7, tick{mem: 10 * mb}), []int64{256}},
		{"shrinks no lower than working set + headroom", 1024 * mb, repeat(7, tick{mem: 360 * mb}),
			// 360 + 25% = 450 < 512 (half of 1024), so idle; 1024/1.5 = 683.
			[]int64{683}},
		{"busy resets idleness", 2048 * mb, append(repeat(4, tick{mem: 100 * mb}), append(repeat(1, tick{mem: 1500 * mb}), repeat(4, tick{mem: 100 * mb})...)...), nil},
		{"brought into the range", 128 * mb, repeat(1, tick{mem: 50 * mb}), []int64{256}},
		{"unlimited is brought into the range", 0, repeat(1, tick{mem: 600 * mb}), []int64{750}},
		{"a limit changed by someone else is adopted", 512 * mb, []tick{{mem: 100 * mb}, {mem: 900 * mb, limitInSample: 1024 * mb}}, []int64{1536}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ap applied
			a := New(Config{Policy: policy, Apply: ap.apply})
			if err := a.Set("s", r, cgroup.Limits{MemoryBytes: tt.start, Pids: 100}); err != nil {
				t.Fatal(err)
			}
			run(a, "s", time.Second, tt.ticks)
			var got []int64
			for _, l := range ap.limits {
				got = append(got, l.MemoryBytes/mb)
				if l.Pids != 100 || l.CPUs != 0 {
					t.Errorf("the decision changed other limits: %+v", l)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("applied %v MiB, want %v", got, tt.want)
			}
		})
	}
}

func TestCPUDecisions(t *testing.T) {
	policy := Policy{IdleFor: 5 * time.Second, CPUWindow: 2 * time.Second}
	r := Range{MinCPUs: 0.5, MaxCPUs: 4}
	tests := []struct {
		name  string
		start float64
		ticks []tick
		want  []float64
	}{
		{"steady half", 1, repeat(10, tick{cpu: 50}), nil},
		{"a short burst does not grow", 1, append(repeat(5, tick{cpu: 20}), tick{cpu: 100}, tick{cpu: 20}), nil},
		{"sustained use grows", 1, repeat(12, tick{cpu: 400}), []float64{1.5, 2.25, 3.38}},
		{"a single thread stops the growth", 1, repeat(12, tick{cpu: 100}), []float64{1.5}},
		{"idle shrinks", 2, repeat(8, tick{cpu: 5}), []float64{1.34}},
		{"capped at max", 3, repeat(8, tick{cpu: 300}), []float64{4}},
		{"unlimited is brought into the range", 0, repeat(2, tick{cpu: 5}), []float64{4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ap applied
			a := New(Config{Policy: policy, Apply: ap.apply})
			if err := a.Set("s", r, cgroup.Limits{CPUs: tt.start}); err != nil {
				t.Fatal(err)
			}
			run(a, "s", time.Second, tt.ticks)
			var got []float64
			for _, l := range ap.limits {
				got = append(got, l.CPUs)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("applied %v CPUs, want %v", got, tt.want)
			}
		})
	}
}

// TestAdmissionAndFailures: a growth the host cannot admit is not applied
// and backs off; a failed Apply leaves the limits (and the reservation)
// as they were; every decision is an event.
func TestAdmissionAndFailures(t *testing.T) {
	adm, err := admission.New(admission.Config{Capacity: admission.Resources{CPUs: 2, MemoryBytes: 1024 * mb}})
	if err != nil {
		t.Fatal(err)
	}
	if err := adm.Reserve("other", admission.Resources{MemoryBytes: 512 * mb}); err != nil {
		t.Fatal(err)
	}
	if err := adm.Reserve("s", admission.Resources{MemoryBytes: 256 * mb}); err != nil {
		t.Fatal(err)
	}
	log, err := events.Open(events.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var ap applied
	a := New(Config{Policy: Policy{Backoff: 3 * time.Second}, Apply: ap.apply, Admission: adm, Events: log})
	a.Set("s", Range{MinMemoryBytes: 256 * mb, MaxMemoryBytes: 2048 * mb}, cgroup.Limits{MemoryBytes: 256 * mb})

	// 256 → 384 fits (768 of 1024); 384 → 576 does not (1088).
	run(a, "s", time.Second, []tick{{mem: 100 * mb}, {mem: 230 * mb}, {mem: 350 * mb}, {mem: 350 * mb}, {mem: 350 * mb}})
	if len(ap.limits) != 1 || ap.limits[0].MemoryBytes != 384*mb {
		t.Fatalf("applied %v, want only 384 MiB", ap.limits)
	}
	if u := adm.InUse(); u.MemoryBytes != 896*mb {
		t.Errorf("reserved %d MiB, want 896", u.MemoryBytes/mb)
	}
	evs, _ := log.List("s", events.Query{})
	// One applied, one refused (then 3 s of backoff: no more events).
	if len(evs) != 2 || !strings.Contains(evs[1].Message, "not applied") || !strings.Contains(evs[1].Message, "requested of 1.0 GiB") {
		for _, e := range evs {
			t.Logf("event: %s", e.Message)
		}
		t.Fatalf("%d events, want an applied and a refused one", len(evs))
	}
	var d Decision
	if err := json.Unmarshal(evs[0].Data, &d); err != nil || d.Memory != "grow" || d.To.MemoryBytes != 384*mb || d.From.MemoryBytes != 256*mb {
		t.Errorf("event data %s: %v", evs[0].Data, err)
	}
	t.Logf("applied: %s", evs[0].Message)
	t.Logf("refused: %s", evs[1].Message)

	// A failing Apply (the kernel could not reclaim) keeps everything.
	ap.err = fmt.Errorf("updating cgroup: %w", errdefs.Conflict("memory use could not be reclaimed"))
	adm.Release("other")
	a2 := New(Config{Apply: ap.apply, Admission: adm})
	a2.Set("s", Range{MinMemoryBytes: 256 * mb, MaxMemoryBytes: 2048 * mb}, cgroup.Limits{MemoryBytes: 384 * mb})
	run(a2, "s", time.Second, []tick{{mem: 100 * mb}, {mem: 380 * mb}})
	if lim, _ := a2.Limits("s"); lim.MemoryBytes != 384*mb {
		t.Errorf("limits after a failed apply: %d MiB", lim.MemoryBytes/mb)
	}
	if u := adm.InUse(); u.MemoryBytes != 384*mb {
		t.Errorf("reservation after a failed apply: %d MiB, want 384", u.MemoryBytes/mb)
	}
	if g, s, f := a2.Counts(); g != 0 || s != 0 || f != 1 {
		t.Errorf("Counts = %d, %d, %d", g, s, f)
	}
}

func TestRangeValidate(t *testing.T) {
	for _, tt := range []struct {
		r  Range
		ok bool
	}{
		{Range{MinMemoryBytes: 256 * mb, MaxMemoryBytes: 4096 * mb}, true},
		{Range{MinCPUs: 0.5, MaxCPUs: 2}, true},
		{Range{}, false},
		{Range{MinMemoryBytes: 512 * mb, MaxMemoryBytes: 256 * mb}, false},
		{Range{MinMemoryBytes: 1, MaxMemoryBytes: 256 * mb}, false},
		{Range{MinCPUs: 0, MaxCPUs: 2}, false},
	} {
		if err := tt.r.Validate(); (err == nil) != tt.ok || (err != nil && !errors.Is(err, errdefs.ErrInvalid)) {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tt.r, err, tt.ok)
		}
	}
}
