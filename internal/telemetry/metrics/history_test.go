package metrics

import (
	"errors"
	"github.com/paddock-dev/paddock/api"
	"math"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestPointSize(t *testing.T) {
	if got := unsafe.Sizeof(point{}); got != 88 {
		t.Errorf("point is %d bytes, want 88", got)
	}
}

// ringTimes returns the times of the points r keeps, oldest first.
func ringTimes(r *ring, from, to int64) []int64 {
	var ts []int64
	for _, s := range r.appendRange(nil, from, to) {
		ts = append(ts, s.Time.UnixNano())
	}
	return ts
}

func TestRing(t *testing.T) {
	tests := []struct {
		max, pushes int
		want        []int64 // t of the points kept, oldest first
	}{
		{max: 3, pushes: 0, want: nil},
		{max: 3, pushes: 2, want: []int64{0, 1}},
		{max: 3, pushes: 3, want: []int64{0, 1, 2}},
		{max: 3, pushes: 7, want: []int64{4, 5, 6}},
		{max: 40, pushes: 100, want: span(60, 100)},
		{max: 100, pushes: 1000, want: span(900, 1000)},
		{max: 128, pushes: 128, want: span(0, 128)},
		{max: 128, pushes: 129, want: span(1, 129)},
		{max: 128, pushes: 192, want: span(64, 192)},
		{max: 128, pushes: 193, want: span(65, 193)},
	}
	for _, tt := range tests {
		r := ring{max: tt.max}
		for i := 0; i < tt.pushes; i++ {
			r.push(point{t: int64(i), memKiB: uint32(i % 3)})
		}
		if held := r.n; held < r.len() || held >= tt.max+chunkPoints {
			t.Errorf("max %d: %d points held", tt.max, held)
		}
		if got := ringTimes(&r, math.MinInt64, math.MaxInt64); !equal(got, tt.want) {
			t.Errorf("max %d after %d pushes: %v, want %v", tt.max, tt.pushes, got, tt.want)
		}
		if r.len() != len(tt.want) {
			t.Errorf("max %d after %d pushes: len %d, want %d", tt.max, tt.pushes, r.len(), len(tt.want))
		}
		if len(tt.want) > 0 && r.oldest() != tt.want[0] {
			t.Errorf("max %d after %d pushes: oldest %d, want %d", tt.max, tt.pushes, r.oldest(), tt.want[0])
		}
		for _, x := range tt.want {
			if got := ringTimes(&r, x, x+1); len(got) != 1 || got[0] != x {
				t.Errorf("range [%d, %d] found %v", x, x, got)
			}
		}
	}
}

func span(from, to int64) []int64 {
	var w []int64
	for i := from; i < to; i++ {
		w = append(w, i)
	}
	return w
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestValidateTiers(t *testing.T) {
	s, m, h := time.Second, time.Minute, time.Hour
	tests := []struct {
		name  string
		tiers []Tier
		ok    bool
	}{
		{"defaults", DefaultTiers, true},
		{"one tier", []Tier{{s, m}}, true},
		{"none", nil, false},
		{"first resolution is not the interval", []Tier{{2 * s, m}}, false},
		{"span below resolution", []Tier{{s, 0}}, false},
		{"coarser tier not coarser", []Tier{{s, h}, {s, 2 * h}}, false},
		{"finer tier forgets before the fold", []Tier{{s, 30 * s}, {m, h}}, false},
		{"too many points", []Tier{{s, 400 * h}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateTiers(tt.tiers, s)
			if (err == nil) != tt.ok {
				t.Fatalf("validateTiers = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}

// TestHistoryTiers feeds 3 hours of 1 s samples into 1 s/15 min, 1 min/1 h
// and 15 min/24 h tiers and checks what each time range is answered from.
func TestHistoryTiers(t *testing.T) {
	tiers := []Tier{{time.Second, 15 * time.Minute}, {time.Minute, time.Hour}, {15 * time.Minute, 24 * time.Hour}}
	h := newHistory(tiers)
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	const n = 3 * 3600
	for i := 0; i < n; i++ {
		r := Reading{
			CPUNanos:    uint64(i) * 5e8, // half a core
			MemoryBytes: int64(100+i%60) << 20,
			Pids:        int64(i % 7),
		}
		pct := 50.0
		if i%60 == 30 {
			pct = 110 // one busy second a minute
		}
		dt := 1.0
		if i == 0 {
			dt = 0
		}
		h.add(toPoint(time.Unix(0, base+int64(i)*1e9), &r, pct), dt)
	}
	all := h.query(nil, base, math.MaxInt64)
	// 900 at 1 s; 60-15 = 45 at 1 min before that (one hour kept, the last
	// 15 minutes answered at 1 s); 15-min points before that.
	var fine, minute, quarter int
	var prev int64
	for i, s := range all {
		ts := s.Time.UnixNano()
		if i > 0 && ts <= prev {
			t.Fatalf("sample %d at %v is not after %v", i, s.Time, time.Unix(0, prev))
		}
		if i > 0 {
			switch gap := time.Duration(ts - prev); {
			case gap == time.Second:
				fine++
			case gap == time.Minute:
				minute++
			case gap == 15*time.Minute:
				quarter++
			}
		}
		prev = ts
	}
	// 899 between the 1 s samples, and one more from the last 1 min point
	// (the last second of its minute) to the oldest 1 s sample.
	if fine != 900 {
		t.Errorf("%d samples 1 s apart, want 900", fine)
	}
	if minute < 40 || minute > 46 {
		t.Errorf("%d samples 1 min apart, want about 45", minute)
	}
	if quarter < 4 || quarter > 8 {
		t.Errorf("%d samples 15 min apart, want about 6", quarter)
	}
	last := all[len(all)-1]
	if got := last.Time.UnixNano(); got != base+(n-1)*1e9 {
		t.Errorf("last sample at %v, want the last one added", last.Time)
	}
	// A 1-minute point: average CPU% (59×50 + 110)/60 = 51, highest memory
	// and pids of its minute, counters as at its end.
	var m Sample
	for i := 1; i < len(all); i++ {
		if all[i].Time.Sub(all[i-1].Time) == time.Minute {
			m = all[i]
			break
		}
	}
	if math.Abs(m.CPUPercent-51) > 0.01 {
		t.Errorf("minute point CPU%% = %v, want 51", m.CPUPercent)
	}
	if m.MemoryBytes != 159<<20 || m.Pids != 6 {
		t.Errorf("minute point memory, pids = %d, %d; want the maxima %d, 6", m.MemoryBytes, m.Pids, 159<<20)
	}
	if sec := m.Time.Sub(time.Unix(0, base)).Seconds(); math.Abs(m.CPUSeconds-sec*0.5) > 1e-6 {
		t.Errorf("minute point CPU seconds = %v, want %v (cumulative at its end)", m.CPUSeconds, sec*0.5)
	}

	// Ranges.
	tests := []struct {
		name     string
		from, to time.Duration // after base
		want     int
	}{
		{"last minute", 3*time.Hour - time.Minute, 3 * time.Hour, 60},
		{"one second", 2*time.Hour + 59*time.Minute, 2*time.Hour + 59*time.Minute, 1},
		{"nothing before the first sample", -time.Hour, -time.Second, 0},
		{"nothing after the last", 4 * time.Hour, 5 * time.Hour, 0},
		// Minute points stand at each minute's last second.
		{"an hour back, at 1 min", 2*time.Hour - time.Second, 2*time.Hour + 30*time.Minute, 31},
		{"2 hours back, at 15 min", 0, time.Hour, 4},
	}
	for _, tt := range tests {
		got := h.query(nil, base+int64(tt.from), base+int64(tt.to))
		if len(got) != tt.want {
			t.Errorf("%s: %d samples, want %d", tt.name, len(got), tt.want)
		}
		for _, s := range got {
			if s.Time.Before(time.Unix(0, base+int64(tt.from))) || s.Time.After(time.Unix(0, base+int64(tt.to))) {
				t.Errorf("%s: sample at %v is out of range", tt.name, s.Time)
			}
		}
	}
}

func TestPointRoundTrip(t *testing.T) {
	now := time.Unix(1700000000, 123)
	r := Reading{
		CPUNanos: 2_500_000_000, CPUThrottledNanos: 1e9,
		MemoryBytes: 300 << 20, MemoryPeakBytes: 310 << 20, MemoryLimitBytes: 1 << 30,
		Pids: 12, PidsLimit: 100, DiskUsedBytes: 12345678, DiskBytes: 10 << 30,
		NetRxBytes: 1 << 40, NetTxBytes: 7, EgressAllowed: 5, EgressDenied: 2, OOMKills: 1,
	}
	p := toPoint(now, &r, 42.5)
	s := p.sample()
	want := Sample{Sample: api.Sample{
		Time: time.Unix(0, now.UnixNano()), CPUSeconds: 2.5, CPUPercent: 42.5, CPUThrottledSeconds: 1,
		MemoryBytes: 300 << 20, MemoryPeakBytes: 310 << 20, MemoryLimitBytes: 1 << 30,
		Pids: 12, PidsLimit: 100, DiskUsedBytes: 12345678, DiskBytes: 10 << 30,
		NetRxBytes: 1 << 40, NetTxBytes: 7, EgressAllowed: 5, EgressDenied: 2, OOMKills: 1,
	}}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", s, want)
	}
	huge := Reading{MemoryBytes: 1 << 50, EgressAllowed: 1 << 40, Pids: -1}
	hp := toPoint(now, &huge, 0)
	if hp.memKiB != math.MaxUint32 || hp.allowed != math.MaxUint32 || hp.pids != 0 {
		t.Errorf("saturation: mem %d, allowed %d, pids %d", hp.memKiB, hp.allowed, hp.pids)
	}
}

// TestHistoryMemoryBound: 8 days of 1 s samples leave each ring at its
// tier's size, give or take a chunk, so a sandbox's history stops growing.
func TestHistoryMemoryBound(t *testing.T) {
	h := newHistory(DefaultTiers)
	r := Reading{MemoryBytes: 1 << 20}
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := int64(0); i < 8*24*3600; i++ {
		r.CPUNanos = uint64(i) * 1e6
		h.add(toPoint(time.Unix(0, base+i*1e9), &r, 0.1), 1)
	}
	for i := range h.rings {
		rg := &h.rings[i]
		if rg.len() != DefaultTiers[i].points() || rg.n >= rg.max+chunkPoints {
			t.Errorf("tier %d: %d points kept of %d held, want %d", i, rg.len(), rg.n, DefaultTiers[i].points())
		}
	}
	all := h.query(nil, 0, math.MaxInt64)
	if span := all[len(all)-1].Time.Sub(all[0].Time); span < 7*24*time.Hour-15*time.Minute {
		t.Errorf("history spans %v, want about 7 days", span)
	}
}
