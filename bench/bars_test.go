package main

import (
	"strings"
	"testing"
	"time"
)

func TestDensityBars(t *testing.T) {
	ms := func(n int) []time.Duration {
		out := make([]time.Duration, 10)
		for i := range out {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	run := func(count int, rssGrowth, availDrop int64, many int, afterRSS int64) *densityRun {
		return &densityRun{
			Count:     count,
			Before:    memSnapshot{DaemonRSS: 20 << 20, Available: 10 << 30},
			With:      memSnapshot{DaemonRSS: 20<<20 + int64(count)*rssGrowth, Available: 10<<30 - int64(count)*availDrop},
			After:     memSnapshot{DaemonRSS: afterRSS},
			Sandboxes: make([]sandboxMemory, count),
			Running:   count,
			Sleeping:  count,
			RTTOne:    ms(4),
			RTTMany:   ms(many),
		}
	}
	for _, tc := range []struct {
		name string
		run  *densityRun
		want []verdict // issue 2's, then issue 21's five
	}{
		{"all pass", run(10, 50<<10, 2<<20, 4, 21<<20), []verdict{reported, pass, pass, pass, pass, pass}},
		{"all fail", run(10, 200<<10, 5<<20, 6, 30<<20), []verdict{reported, pass, fail, fail, fail, fail}},
		{"fewer than asked", func() *densityRun { d := run(10, 0, 0, 4, 20<<20); d.Sandboxes = d.Sandboxes[:5]; return d }(),
			[]verdict{notMeasured, notMeasured, notMeasured, notMeasured, notMeasured, notMeasured}},
		{"one not running", func() *densityRun { d := run(10, 0, 0, 4, 20<<20); d.Running--; return d }(),
			[]verdict{reported, fail, pass, pass, pass, pass}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bars := densityBars(tc.run)
			if len(bars) != len(tc.want) {
				t.Fatalf("got %d bars, want %d", len(bars), len(tc.want))
			}
			for i, b := range bars {
				if b.Verdict != tc.want[i] {
					t.Errorf("bar %q: %s (%s), want %s", b.What, b.Verdict, b.Value, tc.want[i])
				}
			}
		})
	}
}

func TestBurstBars(t *testing.T) {
	round := func(first time.Duration, errs int) *burstRound {
		b := &burstRound{Errors: errs}
		for range burstSize - errs {
			b.Samples = append(b.Samples, burstSample{First: first})
		}
		return b
	}
	for _, tc := range []struct {
		name   string
		rounds []*burstRound
		want   verdict
	}{
		{"fast", []*burstRound{round(10*time.Millisecond, 0), round(20*time.Millisecond, 0)}, pass},
		{"slow median", []*burstRound{round(40*time.Millisecond, 0)}, fail},
		{"an error", []*burstRound{round(10*time.Millisecond, 1)}, fail},
		{"none", nil, notMeasured},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := burstBars(tc.rounds, false)[0]; got.Verdict != tc.want {
				t.Errorf("%s (%s), want %s", got.Verdict, got.Value, tc.want)
			}
		})
	}
}

func TestProject(t *testing.T) {
	count := func(n int64) string { return "n" }
	before := []hostLimit{
		{Name: "fds", Used: 100, Available: 1000, Unit: count, Projected: true},
		{Name: "tasks", Used: 500, Available: 1000, Unit: count},
		{Name: "memory", Available: 1000, Unit: count, Projected: true},
	}
	after := []hostLimit{
		{Name: "fds", Used: 200, Available: 900, Unit: count, Projected: true}, // 10 each
		{Name: "tasks", Used: 900, Available: 600, Unit: count},                // 40 each, only watched
		{Name: "memory", Available: 990, Unit: count, Projected: true},         // 1 each
	}
	lines, problems := project(before, after, 10, 100)
	if len(lines) != 3 {
		t.Errorf("got %d lines, want 3: %q", len(lines), lines)
	}
	if len(problems) != 1 || !strings.HasPrefix(problems[0], "fds:") {
		t.Errorf("problems %q, want only fds (1000 needed, 900 left)", problems)
	}
}

func TestHoldingsBeyond(t *testing.T) {
	rest := holdings{holdProcs: {"1", "2"}, holdLinks: {"a"}}
	now := holdings{holdProcs: {"3", "4"}, holdLinks: {"a", "b"}, holdLoops: {"loop9"}}
	got := now.beyond(rest)
	if len(got) != 2 {
		t.Fatalf("got %q, want the extra link and loop device, not the replaced processes", got)
	}
	if !strings.Contains(got[0], "loop9") || !strings.HasSuffix(got[1], ": b") {
		t.Errorf("got %q", got)
	}
}
