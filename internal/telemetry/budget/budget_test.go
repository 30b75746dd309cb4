package budget

import (
	"encoding/json"
	"errors"
	"github.com/paddock-dev/paddock/api"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/events"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

type call struct {
	id string
	n  Notice
}

type calls struct {
	mu               sync.Mutex
	warns, exceededs []call
}

func (c *calls) config(cfg Config) Config {
	cfg.OnWarn = func(id string, n Notice) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.warns = append(c.warns, call{id, n})
	}
	cfg.OnExceeded = func(id string, n Notice) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.exceededs = append(c.exceededs, call{id, n})
	}
	return cfg
}

func (c *calls) counts() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.warns), len(c.exceededs)
}

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// TestEachBudgetAtItsThreshold drives every budget with synthetic samples
// one step at a time and checks that the warning fires once at 80% and the
// action once at 100%, not a step earlier.
func TestEachBudgetAtItsThreshold(t *testing.T) {
	// Each step adds 10% of the budget.
	tests := []struct {
		kind   Kind
		spec   Spec
		prices Prices
		step   func(i int) metrics.Sample // the sample after i steps
		action Action
	}{
		{
			kind: CPUSeconds, spec: Spec{CPUSeconds: 100}, action: Pause,
			step: func(i int) metrics.Sample { return metrics.Sample{Sample: api.Sample{CPUSeconds: float64(10 * i)}} },
		},
		{
			kind: WallSeconds, spec: Spec{WallSeconds: 100, Action: Kill}, action: Kill,
			step: func(i int) metrics.Sample { return metrics.Sample{} },
		},
		{
			kind: EgressBytes, spec: Spec{EgressBytes: 1e6, Action: Pause, Actions: map[Kind]Action{EgressBytes: CutNetwork}}, action: CutNetwork,
			step: func(i int) metrics.Sample {
				return metrics.Sample{Sample: api.Sample{NetRxBytes: uint64(6e4 * i), NetTxBytes: uint64(4e4 * i)}}
			},
		},
		{
			kind: EgressRequests, spec: Spec{EgressRequests: 50, Action: CutNetwork}, action: CutNetwork,
			step: func(i int) metrics.Sample {
				return metrics.Sample{Sample: api.Sample{EgressAllowed: uint64(4 * i), EgressDenied: uint64(i)}}
			},
		},
		{
			// 1 GB limit for 10 s steps at 0.36 per GB-hour: 0.001 a step;
			// 0.5 per CPU-second at 0.004 CPU-s a step: 0.002; 1000 per GB
			// at 7000 bytes a step: 0.007. 0.01 a step in all.
			kind: Cost, spec: Spec{Cost: 0.1}, action: Pause,
			prices: Prices{CPUSecond: 0.5, MemoryGBHour: 0.36, EgressGB: 1000},
			step: func(i int) metrics.Sample {
				return metrics.Sample{Sample: api.Sample{MemoryLimitBytes: 1e9, CPUSeconds: 0.004 * float64(i), NetTxBytes: uint64(7000 * i)}}
			},
		},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind), func(t *testing.T) {
			var c calls
			dir := t.TempDir()
			log, err := events.Open(events.Config{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			now := t0
			tr := New(c.config(Config{Prices: tt.prices, Events: log, Now: func() time.Time { return now }}))
			if err := tr.Set("sbx", tt.spec, t0, nil); err != nil {
				t.Fatal(err)
			}
			for i := 0; i <= 12; i++ {
				now = t0.Add(time.Duration(i) * 10 * time.Second)
				s := tt.step(i)
				s.Time = now
				tr.Observe("sbx", s)
				w, x := c.counts()
				wantW, wantX := 0, 0
				if i >= 8 {
					wantW = 1
				}
				if i >= 10 {
					wantX = 1
				}
				if w != wantW || x != wantX {
					t.Fatalf("after step %d (%d%%): %d warnings, %d exceeded; want %d, %d", i, 10*i, w, x, wantW, wantX)
				}
			}
			n := c.exceededs[0].n
			if n.Budget != tt.kind || n.Action != tt.action || !n.Exceeded || math.Abs(n.Used/n.Limit-1) > 1e-6 {
				t.Errorf("exceeded notice = %+v, want %s at 100%% with %s", n, tt.kind, tt.action)
			}
			if w := c.warns[0].n; w.Budget != tt.kind || math.Abs(w.Used/w.Limit-0.8) > 1e-6 || w.Exceeded {
				t.Errorf("warning = %+v, want %s at 80%%", w, tt.kind)
			}
			evs, err := log.List("sbx", events.Query{Types: []events.Type{events.Budget}})
			if err != nil || len(evs) != 2 {
				t.Fatalf("budget events = %d, %v; want 2", len(evs), err)
			}
			var got Notice
			if err := json.Unmarshal(evs[1].Data, &got); err != nil || got.Action != tt.action {
				t.Errorf("event data %s: %v", evs[1].Data, err)
			}
			t.Logf("%s", evs[1].Message)

			st, err := tr.Status("sbx")
			if err != nil || len(st.Budgets) != 1 || st.Budgets[0].Remaining != 0 || !st.Budgets[0].Exceeded {
				t.Errorf("Status = %+v, %v", st, err)
			}
		})
	}
}

// TestRaiseRearms: raising a reached budget re-arms its warning and action;
// usage carried over a restart keeps the once-only notices quiet.
func TestRaiseRearms(t *testing.T) {
	var c calls
	now := t0
	tr := New(c.config(Config{Now: func() time.Time { return now }}))
	spec := Spec{CPUSeconds: 10}
	tr.Set("a", spec, t0, nil)
	tr.Observe("a", metrics.Sample{Sample: api.Sample{Time: t0, CPUSeconds: 11}})
	if w, x := c.counts(); w != 0 || x != 1 {
		t.Fatalf("crossing both at once: %d warnings, %d exceeded; want only the exceeded", w, x)
	}
	tr.Observe("a", metrics.Sample{Sample: api.Sample{Time: t0.Add(time.Second), CPUSeconds: 12}})
	if _, x := c.counts(); x != 1 {
		t.Fatalf("exceeded fired again")
	}
	spec.CPUSeconds = 20
	tr.Set("a", spec, t0, nil)
	tr.Observe("a", metrics.Sample{Sample: api.Sample{Time: t0.Add(2 * time.Second), CPUSeconds: 17}})
	tr.Observe("a", metrics.Sample{Sample: api.Sample{Time: t0.Add(3 * time.Second), CPUSeconds: 21}})
	if w, x := c.counts(); w != 1 || x != 2 {
		t.Fatalf("after raising to 20: %d warnings, %d exceeded; want 1, 2", w, x)
	}

	// A daemon restart: usage persisted, the cgroup's counter went on
	// from 21 to 25 while the daemon was down.
	u, err := tr.Usage("a")
	if err != nil || u.CPUSeconds != 21 || len(u.Exceeded) != 1 {
		t.Fatalf("Usage = %+v, %v", u, err)
	}
	b, _ := json.Marshal(u)
	var back Usage
	json.Unmarshal(b, &back)
	var c2 calls
	tr2 := New(c2.config(Config{Now: func() time.Time { return now }}))
	tr2.Set("a", spec, t0, &back)
	tr2.Observe("a", metrics.Sample{Sample: api.Sample{Time: t0.Add(time.Minute), CPUSeconds: 25}})
	st, _ := tr2.Status("a")
	if w, x := c2.counts(); w != 0 || x != 0 || st.Budgets[0].Used != 25 {
		t.Errorf("after restart: %d warnings, %d exceeded, used %v; want none again, 25", w, x, st.Budgets[0].Used)
	}
	// A counter reset (the sandbox started again: a new cgroup) adds from 0.
	tr2.Observe("a", metrics.Sample{Sample: api.Sample{Time: t0.Add(2 * time.Minute), CPUSeconds: 2}})
	if st, _ := tr2.Status("a"); st.Budgets[0].Used != 27 {
		t.Errorf("after a counter reset: used %v, want 27", st.Budgets[0].Used)
	}
	tr2.Remove("a")
	if _, err := tr2.Status("a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Remove = %v", err)
	}
	// Unbudgeted sandboxes are ignored.
	tr2.Observe("other", metrics.Sample{Sample: api.Sample{CPUSeconds: 1e9}})
}

func TestSpecValidate(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		ok   bool
	}{
		{"empty", Spec{}, true},
		{"all", Spec{CPUSeconds: 1, WallSeconds: 2, EgressBytes: 3, EgressRequests: 4, Cost: 5, WarnAt: 0.5, Action: Kill}, true},
		{"negative", Spec{CPUSeconds: -1}, false},
		{"NaN", Spec{Cost: math.NaN()}, false},
		{"warn above 1", Spec{WarnAt: 1.5}, false},
		{"bad action", Spec{Action: "explode"}, false},
		{"bad override", Spec{Actions: map[Kind]Action{CPUSeconds: "explode"}}, false},
		{"unknown budget", Spec{Actions: map[Kind]Action{"gpu": Pause}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.spec
			err := s.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%v is not ErrInvalid", err)
			}
			if err == nil && (s.WarnAt == 0 || s.Action == "") {
				t.Errorf("defaults not filled: %+v", s)
			}
		})
	}
}
