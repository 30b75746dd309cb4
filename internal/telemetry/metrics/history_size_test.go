package metrics

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// series generators for the history size and round-trip tests: each
// returns the reading and the time of sample i, as the sampler would see
// them (a ticker's jitter on the time, counters that only grow).
type seriesGen func(i int64, r *Reading) time.Duration

var historyBase = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// idleSeries: a sandbox doing nothing. Its agent wakes now and then for a
// few microseconds of CPU; memory, pids and disk stay put.
func idleSeries(seed uint64) seriesGen {
	rng := rand.New(rand.NewPCG(seed, 1))
	return func(i int64, r *Reading) time.Duration {
		if i == 0 {
			*r = Reading{MemoryBytes: 3 << 20, MemoryPeakBytes: 9 << 20, MemoryLimitBytes: 512 << 20,
				Pids: 2, PidsLimit: 256, DiskUsedBytes: 40 << 20, DiskBytes: 1 << 30}
		}
		if i%10 == 0 {
			r.CPUNanos += 20_000 + rng.Uint64N(10_000)
		}
		return time.Duration(rng.Int64N(200_000)) // ticker jitter
	}
}

// busySeries: every field moves every second.
func busySeries(seed uint64) seriesGen {
	rng := rand.New(rand.NewPCG(seed, 2))
	return func(i int64, r *Reading) time.Duration {
		if i == 0 {
			*r = Reading{MemoryLimitBytes: 4 << 30, PidsLimit: 1024, DiskBytes: 10 << 30}
		}
		r.CPUNanos += rng.Uint64N(2e9)
		r.CPUThrottledNanos += rng.Uint64N(1e8)
		r.MemoryBytes = 100<<20 + rng.Int64N(3<<30)
		r.MemoryPeakBytes = max(r.MemoryPeakBytes, r.MemoryBytes)
		r.Pids = 1 + rng.Int64N(500)
		r.DiskUsedBytes = rng.Int64N(10 << 30)
		r.NetRxBytes += rng.Uint64N(1e8)
		r.NetTxBytes += rng.Uint64N(1e7)
		r.EgressAllowed += rng.Uint64N(50)
		r.EgressDenied += rng.Uint64N(3)
		if rng.IntN(1000) == 0 {
			r.OOMKills++
		}
		return time.Duration(rng.Int64N(5_000_000))
	}
}

// feed adds n samples of gen to h the way series.record does.
func feed(h *history, gen seriesGen, n int64) {
	var r, prev Reading
	var prevT int64
	for i := int64(0); i < n; i++ {
		t := historyBase + i*1e9 + int64(gen(i, &r))
		pct, dt := 0.0, 0.0
		if i > 0 {
			dt = float64(t-prevT) / 1e9
			pct = float64(delta(prev.CPUNanos, r.CPUNanos)) / 1e9 / dt * 100
		}
		h.add(toPoint(time.Unix(0, t), &r, pct), dt)
		prev, prevT = r, t
	}
}

// TestHistoryFullBytes fills the default tiers (8 days of 1 s samples) and
// reports the memory one sandbox's history then holds: its slices'
// capacities and structs.
func TestHistoryFullBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 8 days of samples")
	}
	for _, tt := range []struct {
		name string
		gen  func(uint64) seriesGen
		max  int
	}{
		{"idle", idleSeries, 32 << 10},
		// Every field jumps at random every second: past what a real
		// sandbox does, still under the 265 KiB of 88-byte points.
		{"busy", busySeries, 200 << 10},
	} {
		h := newHistory(DefaultTiers)
		feed(h, tt.gen(1), 8*24*3600)
		// 3012 points of 88 bytes (265 KiB) before the history was coded.
		t.Logf("%s sandbox, all tiers full: %d bytes (%.1f KiB)", tt.name, h.bytes(), float64(h.bytes())/1024)
		if h.bytes() > tt.max {
			t.Errorf("%s sandbox: history of %d bytes, want at most %d", tt.name, h.bytes(), tt.max)
		}
	}
}

// historyDigest hashes what query returns for a few ranges of a history
// fed gen for n seconds.
func historyDigest(gen seriesGen, n int64) string {
	h := newHistory(DefaultTiers)
	feed(h, gen, n)
	sum := sha256.New()
	end := historyBase + n*1e9
	for _, r := range [][2]int64{
		{math.MinInt64, math.MaxInt64},
		{end - 10*60e9, end},                       // 1 s tier
		{end - 3*3600e9, end - 3600e9},             // 1 min tier
		{historyBase, end - 2*24*3600e9},           // 15 min tier
		{end - 16*60e9 + 500e6, end - 14*60e9 + 7}, // across tiers, off the grid
	} {
		for _, s := range h.query(nil, r[0], r[1]) {
			// As printed before samples had containers.
			line := strings.Replace(fmt.Sprintf("%+v", s.Sample), " Containers:[]}", "}", 1)
			fmt.Fprintf(sum, "%d %s\n", s.Time.UnixNano(), line)
		}
	}
	return hex.EncodeToString(sum.Sum(nil))[:16]
}

// TestHistorySameAsPoints: the coded history answers exactly what the
// history of 88-byte points before it did (the digests were taken from
// that one), for idle, busy and mixed series, young and full.
func TestHistorySameAsPoints(t *testing.T) {
	mixed := func(seed uint64) seriesGen {
		idle, busy := idleSeries(seed), busySeries(seed)
		return func(i int64, r *Reading) time.Duration {
			if i == 0 {
				busy(0, r)
			}
			if (i/3600)%5 == 1 { // a busy hour in five
				return busy(i, r)
			}
			return idle(i, r)
		}
	}
	for _, tt := range []struct {
		name string
		gen  func(uint64) seriesGen
		n    int64
		want string
	}{
		{"idle 20 min", idleSeries, 1200, "d3306dae6c38df6b"},
		{"idle 8 days", idleSeries, 8 * 24 * 3600, "36367e3429053564"},
		{"busy 3 hours", busySeries, 3 * 3600, "a0598e2ee3e93eb4"},
		{"busy 8 days", busySeries, 8 * 24 * 3600, "254635f9df76aebf"},
		{"mixed 8 days", mixed, 8 * 24 * 3600, "734c6ae215b571de"},
	} {
		if got := historyDigest(tt.gen(7), tt.n); got != tt.want {
			t.Errorf("%s: digest %s, want %s", tt.name, got, tt.want)
		}
	}
}

// FuzzRingCoding: whatever points are pushed, in whatever order, a ring
// decodes exactly the last of them it holds.
func FuzzRingCoding(f *testing.F) {
	f.Add(uint64(1), uint16(10), uint8(0))
	f.Add(uint64(2), uint16(300), uint8(1))
	f.Add(uint64(3), uint16(1000), uint8(2))
	f.Fuzz(func(t *testing.T, seed uint64, n uint16, mode uint8) {
		rng := rand.New(rand.NewPCG(seed, uint64(mode)))
		r := ring{max: 1 + int(seed%200)}
		var pushed []point
		var p point
		for range n {
			switch mode % 3 {
			case 0: // anything at all
				f := [pointFields]uint64{}
				for i := range f {
					f[i] = rng.Uint64()
				}
				p.setFields(&f)
				p.t = int64(rng.Uint64())
			case 1: // small steps either way
				f := p.fields()
				for i := range f {
					f[i] += uint64(rng.Int64N(2001) - 1000)
				}
				p.setFields(&f)
				p.t += rng.Int64N(3e9) - 1e9
			default: // a counter that wraps, a float that is NaN
				p.cpu -= rng.Uint64N(1 << 40)
				p.t += 1e9
				p.cpuPct = float32(math.NaN())
				if rng.IntN(2) == 0 {
					p.cpuPct = float32(math.Inf(-1))
				}
			}
			r.push(p)
			pushed = append(pushed, p)
		}
		var got []point
		for i := range r.chunks {
			c := r.chunks[i].cursor()
			for range r.chunks[i].n {
				c.next()
				got = append(got, c.p)
			}
		}
		want := pushed[len(pushed)-r.n:]
		if len(got) != len(want) || r.len() != min(len(pushed), r.max) {
			t.Fatalf("%d points decoded, %d held, want %d", len(got), r.n, len(want))
		}
		for i := range got {
			// Compare bits: NaN != NaN.
			if got[i].t != want[i].t || got[i].fields() != want[i].fields() {
				t.Fatalf("point %d: got %+v, want %+v", i, got[i], want[i])
			}
		}
	})
}

// BenchmarkHistoryAdd is the cost of storing one busy sample into the
// default tiers, most of what the history adds to a tick's work.
func BenchmarkHistoryAdd(b *testing.B) {
	gen := busySeries(1)
	h := newHistory(DefaultTiers)
	feed(h, gen, 8*24*3600) // full: rings drop as they add
	var r Reading
	b.ReportAllocs()
	b.ResetTimer()
	for i := range int64(b.N) {
		gen(i, &r)
		h.add(toPoint(time.Unix(0, historyBase+(8*24*3600+i)*1e9), &r, 50), 1)
	}
}
