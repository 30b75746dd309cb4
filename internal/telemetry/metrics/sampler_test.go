package metrics

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// fakeSource reports whatever the test sets.
type fakeSource struct {
	mu  sync.Mutex
	r   Reading
	err error
}

func (f *fakeSource) Read() (Reading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r, f.err
}

func (f *fakeSource) set(fn func(r *Reading)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.r)
}

type recorder struct {
	mu  sync.Mutex
	got map[string][]Sample
}

func (r *recorder) Observe(id string, s Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = map[string][]Sample{}
	}
	r.got[id] = append(r.got[id], s)
}

func newTestSampler(t *testing.T, obs ...Observer) *Sampler {
	t.Helper()
	s, err := NewSampler(Config{Observers: obs})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSamplerCPUPercent(t *testing.T) {
	rec := &recorder{}
	s := newTestSampler(t, rec)
	src := &fakeSource{}
	s.Register("a", src)
	t0 := time.Unix(1000, 0)

	steps := []struct {
		after   time.Duration
		cpu     uint64 // cumulative ns
		wantPct float64
	}{
		{0, 1e9, 0}, // first sample: no delta yet
		{time.Second, 1.5e9, 50},
		{2 * time.Second, 3.5e9, 200},
		{3 * time.Second, 3.5e9, 0},
		{4 * time.Second, 0.25e9, 25}, // reset: a new cgroup counts from zero
		{6 * time.Second, 1.25e9, 50}, // a missed tick: averaged over 2 s
	}
	for _, st := range steps {
		src.set(func(r *Reading) { r.CPUNanos = st.cpu; r.MemoryBytes = 64 << 20 })
		s.Tick(t0.Add(st.after))
		cur, ok, err := s.Current("a")
		if err != nil || !ok {
			t.Fatalf("Current: %v, %v", ok, err)
		}
		if math.Abs(cur.CPUPercent-st.wantPct) > 1e-9 {
			t.Errorf("at +%v: CPU%% = %v, want %v", st.after, cur.CPUPercent, st.wantPct)
		}
		if cur.CPUSeconds != float64(st.cpu)/1e9 || cur.MemoryBytes != 64<<20 {
			t.Errorf("at +%v: CPU seconds %v, memory %d", st.after, cur.CPUSeconds, cur.MemoryBytes)
		}
	}
	if n := len(rec.got["a"]); n != len(steps) {
		t.Errorf("observer saw %d samples, want %d", n, len(steps))
	}
	// CPU used while sampled: 0.5 + 2 + 0 + 0.25 + 1 seconds.
	if got := s.Totals().CPUSeconds; math.Abs(got-3.75) > 1e-9 {
		t.Errorf("Totals().CPUSeconds = %v, want 3.75", got)
	}
	hist, err := s.History("a", t0, t0.Add(time.Hour))
	if err != nil || len(hist) != len(steps) {
		t.Fatalf("History = %d samples, %v; want %d", len(hist), err, len(steps))
	}
	if hist[2].CPUPercent != 200 {
		t.Errorf("history CPU%% = %v, want 200", hist[2].CPUPercent)
	}
}

func TestSamplerLifecycle(t *testing.T) {
	s := newTestSampler(t)
	a, b := &fakeSource{}, &fakeSource{}
	s.Register("a", a)
	s.Register("b", b)
	t0 := time.Unix(1000, 0)
	s.Tick(t0)
	if got := s.Running(nil); len(got) != 2 {
		t.Fatalf("Running = %v, want 2 sandboxes", got)
	}

	// A source whose cgroup is gone is skipped quietly; another error is
	// skipped too (and logged).
	b.set(func(*Reading) {})
	b.mu.Lock()
	b.err = fmt.Errorf("reading stats: %w", errdefs.NotFound("cgroup", "b"))
	b.mu.Unlock()
	a.mu.Lock()
	a.err = errors.New("boom")
	a.mu.Unlock()
	s.Tick(t0.Add(time.Second))
	if _, n := s.LastTick(); n != 0 {
		t.Errorf("LastTick sampled %d, want 0", n)
	}
	a.mu.Lock()
	a.err = nil
	a.mu.Unlock()

	s.Unregister("b")
	s.Tick(t0.Add(2 * time.Second))
	if got := s.Running(nil); len(got) != 1 || got[0].ID != "a" {
		t.Errorf("Running after Unregister(b) = %v, want [a]", got)
	}
	if h, err := s.History("b", t0, t0.Add(time.Hour)); err != nil || len(h) != 1 {
		t.Errorf("History of an unregistered sandbox = %d samples, %v; want it kept", len(h), err)
	}
	s.Forget("b")
	if _, err := s.History("b", t0, t0.Add(time.Hour)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("History after Forget = %v, want ErrNotFound", err)
	}
	if _, _, err := s.Current("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Current(nope) = %v, want ErrNotFound", err)
	}
	// Registered but never read: no current sample yet.
	s.Register("c", &fakeSource{err: errors.New("not yet")})
	if _, ok, err := s.Current("c"); ok || err != nil {
		t.Errorf("Current of an unsampled sandbox = %v, %v; want not ok", ok, err)
	}
}

func TestSamplerRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Interval: time.Microsecond},
		{Interval: time.Second, Tiers: []Tier{{time.Minute, time.Hour}}},
	} {
		if _, err := NewSampler(cfg); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("NewSampler(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
	s, err := NewSampler(Config{Interval: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("a 100ms interval with default tiers: %v", err)
	}
	if s.cfg.Tiers[0].Resolution != 100*time.Millisecond || s.cfg.Tiers[0].Span != 15*time.Minute {
		t.Errorf("first tier = %+v", s.cfg.Tiers[0])
	}
}

// TestSamplerConcurrent runs ticks against registrations and queries, for
// the race detector.
func TestSamplerConcurrent(t *testing.T) {
	s := newTestSampler(t, &recorder{})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("s%d-%d", w, i%5)
				s.Register(id, &fakeSource{r: Reading{CPUNanos: uint64(i)}})
				_, _, _ = s.Current(id)
				_, _ = s.History(id, time.Time{}, time.Now())
				_ = s.Running(nil)
				if i%3 == 0 {
					s.Unregister(id)
				}
				if i%7 == 0 {
					s.Forget(id)
				}
			}
		}()
	}
	t0 := time.Now()
	for i := 0; i < 200; i++ {
		s.Tick(t0.Add(time.Duration(i) * time.Second))
	}
	close(stop)
	wg.Wait()
}

func TestNetTable(t *testing.T) {
	var tab NetTable
	n := tab.Get("a")
	if tab.Get("a") != n {
		t.Fatal("Get returned different counters for one id")
	}
	n.AddBytes(10, 20)
	n.AddRequest(true)
	n.AddRequest(false)
	n.AddRequest(false)
	if rx, tx, al, de := n.Load(); rx != 10 || tx != 20 || al != 1 || de != 2 {
		t.Errorf("Load = %d %d %d %d", rx, tx, al, de)
	}
	tab.Remove("a")
	if tab.Get("a") == n {
		t.Error("Remove kept the counters")
	}
}

type closingSource struct {
	fakeSource
	closed chan struct{}
}

func (c *closingSource) Close() error { close(c.closed); return nil }

// TestSamplerClosesSources: a source is closed once unregistered or
// replaced, by the next tick (never under a tick that reads it), and by
// Close.
func TestSamplerClosesSources(t *testing.T) {
	s := newTestSampler(t)
	a := &closingSource{closed: make(chan struct{})}
	b := &closingSource{closed: make(chan struct{})}
	c := &closingSource{closed: make(chan struct{})}
	s.Register("a", a)
	s.Register("b", b)
	s.Tick(time.Unix(1, 0))
	s.Unregister("a")
	s.Register("b", c) // replaced
	isClosed := func(x *closingSource) bool {
		select {
		case <-x.closed:
			return true
		default:
			return false
		}
	}
	if isClosed(a) || isClosed(b) {
		t.Fatal("closed before the next tick")
	}
	s.Tick(time.Unix(2, 0))
	if !isClosed(a) || !isClosed(b) || isClosed(c) {
		t.Fatalf("after a tick: a %v, b %v, c %v; want a and b closed", isClosed(a), isClosed(b), isClosed(c))
	}
	s.Close()
	if !isClosed(c) {
		t.Error("Close left a source open")
	}
}
