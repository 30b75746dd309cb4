package prom

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/autoscale"
	"github.com/paddock-dev/paddock/internal/telemetry/budget"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

// scrape serves reg through promhttp and parses the answer with the
// official text parser.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("scrape: %s, %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing the scrape: %v", err)
	}
	return fams
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no family %s", name)
	}
outer:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue outer
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

func TestScrape(t *testing.T) {
	s, err := metrics.NewSampler(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// 30 running sandboxes; sandbox i uses i% of a core. One has an id
	// that is not a sandbox id (it must never become a label value).
	cpu := map[string]uint64{}
	for i := 0; i < 30; i++ {
		id := fmt.Sprintf("sbx-%02d", i)
		s.Register(id, metrics.SourceFunc(func() (metrics.Reading, error) {
			cpu[id] += uint64(i) * 1e7 // i% of a second per tick
			return metrics.Reading{
				CPUNanos: cpu[id], MemoryBytes: 64 << 20, MemoryLimitBytes: 256 << 20, Pids: 3, PidsLimit: 64,
				NetRxBytes: 1000, NetTxBytes: 10, EgressAllowed: 4, EgressDenied: 1, DiskUsedBytes: 1 << 20, DiskBytes: 1 << 30,
			}, nil
		}))
	}
	s.Register(`evil"} 1\n#`, metrics.SourceFunc(func() (metrics.Reading, error) {
		return metrics.Reading{CPUNanos: 1e12, MemoryBytes: 1 << 20}, nil
	}))
	now := time.Now()
	s.Tick(now)
	s.Tick(now.Add(time.Second))

	adm, _ := admission.New(admission.Config{Capacity: admission.Resources{CPUs: 2, MemoryBytes: 4 << 30}})
	adm.Reserve("sbx-01", admission.Resources{CPUs: 1, MemoryBytes: 1 << 30})
	bt := budget.New(budget.Config{})
	as := autoscale.New(autoscale.Config{Apply: func(string, cgroup.Limits) error { return nil }})
	c, err := New(Config{
		Sampler:     s,
		States:      func() map[string]int { return map[string]int{"running": 31, "stopped": 2, "Bad Label": 9} },
		WarmPools:   func() map[string]int { return map[string]int{"image:host": 2, "template:web": 1, "image:a\"b": 9} },
		WarmTargets: func() map[string]int { return map[string]int{"image:host": 2, "template:web": 3} },
		Admission:   adm,
		Budgets:     bt,
		Autoscaler:  as,
		Storage: func() (api.StorageSpace, error) {
			return api.StorageSpace{SizeBytes: 100 << 30, FreeBytes: 20 << 30, HostFreeBytes: 21 << 30,
				PromisedBytes: 30 << 30, ShortBytes: 9 << 30, Overcommit: 2}, nil
		},
		TopN: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Created(3 * time.Millisecond)
	c.Created(40 * time.Millisecond)
	c.CreateFailed()
	c.Deleted()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, reg)

	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"paddock_sandbox_creates_total", nil, 2},
		{"paddock_sandbox_create_failures_total", nil, 1},
		{"paddock_sandbox_deletes_total", nil, 1},
		{"paddock_sandboxes", []string{"state", "running"}, 31},
		{"paddock_warm_pool_size", []string{"pool", "image:host"}, 2},
		{"paddock_warm_pool_size", []string{"pool", "template:web"}, 1},
		{"paddock_warm_pool_target", []string{"pool", "template:web"}, 3},
		{"paddock_admission_cpus_limit", nil, 8},
		{"paddock_admission_memory_reserved_bytes", nil, 1 << 30},
		{"paddock_storage_free_bytes", nil, 20 << 30},
		{"paddock_storage_host_free_bytes", nil, 21 << 30},
		{"paddock_storage_short_bytes", nil, 9 << 30},
		{"paddock_storage_overcommit_ratio", nil, 2},
		{"paddock_autoscale_changes_total", []string{"direction", "grow"}, 0},
		{"paddock_budget_exceeded_total", []string{"budget", "cost"}, 0},
		{"paddock_telemetry_sampled_sandboxes", nil, 31},
		{"paddock_sandbox_series_omitted", nil, 21},
		// The busiest sandbox is shown, with its rate and counters.
		{"paddock_sandbox_cpu_usage_cores", []string{"sandbox", "sbx-29"}, 0.29},
		{"paddock_sandbox_memory_limit_bytes", []string{"sandbox", "sbx-29"}, 256 << 20},
		{"paddock_sandbox_egress_requests_total", []string{"sandbox", "sbx-20", "decision", "denied"}, 1},
		// The fleet: everything that ran.
		{"paddock_sandboxes_memory_bytes", nil, 30*64<<20 + 1<<20},
		{"paddock_sandboxes_egress_requests_total", []string{"decision", "allowed"}, 0}, // counters grow between samples only
	}
	for _, ck := range checks {
		if got := value(t, fams, ck.name, ck.labels...); fmt.Sprintf("%.6g", got) != fmt.Sprintf("%.6g", ck.want) {
			t.Errorf("%s%v = %v, want %v", ck.name, ck.labels, got, ck.want)
		}
	}
	// sum(i%, i<30) in cores, plus 1000 s of the evil one... which used
	// 0 between its two samples.
	if got := value(t, fams, "paddock_sandboxes_cpu_seconds_total"); got < 4.34 || got > 4.36 {
		t.Errorf("fleet CPU seconds = %v, want 4.35", got)
	}

	// Bounded cardinality: top 10 by CPU, valid ids only, no stray states.
	perSandbox := 0
	for name, f := range fams {
		for _, m := range f.Metric {
			for _, lp := range m.Label {
				switch lp.GetName() {
				case "sandbox":
					perSandbox++
					var n int
					if _, err := fmt.Sscanf(lp.GetValue(), "sbx-%d", &n); err != nil || n < 20 {
						t.Errorf("%s has series for %q, not one of the 10 busiest", name, lp.GetValue())
					}
				case "state":
					if lp.GetValue() == "Bad Label" {
						t.Errorf("a malformed state became a label")
					}
				}
			}
		}
	}
	if perSandbox != 10*15 {
		t.Errorf("%d per-sandbox series, want %d", perSandbox, 10*15)
	}
	if h := fams["paddock_sandbox_create_duration_seconds"]; h == nil || h.Metric[0].Histogram.GetSampleCount() != 2 {
		t.Errorf("create duration histogram: %v", h)
	}
}

// TestScrapeContainers: a sandbox of several containers gets each
// container's share as series of its own, valid names only.
func TestScrapeContainers(t *testing.T) {
	s, err := metrics.NewSampler(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var cpu uint64
	s.Register("sbx-group", metrics.SourceFunc(func() (metrics.Reading, error) {
		cpu += 5e8
		return metrics.Reading{CPUNanos: cpu, MemoryBytes: 96 << 20, Containers: []metrics.ContainerReading{
			{Name: "web", Reading: metrics.Reading{CPUNanos: cpu / 5, MemoryBytes: 32 << 20}},
			{Name: "db", Reading: metrics.Reading{CPUNanos: cpu * 4 / 5, MemoryBytes: 64 << 20, Pids: 7, DiskUsedBytes: 5 << 20}},
			{Name: `Bad"Name`, Reading: metrics.Reading{}},
		}}, nil
	}))
	now := time.Now()
	s.Tick(now)
	s.Tick(now.Add(time.Second))
	c, err := New(Config{Sampler: s})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, reg)
	for _, ck := range []struct {
		name, container string
		want            float64
	}{
		{"paddock_container_cpu_usage_cores", "web", 0.1},
		{"paddock_container_cpu_usage_cores", "db", 0.4},
		{"paddock_container_cpu_seconds_total", "db", 0.8},
		{"paddock_container_memory_bytes", "db", 64 << 20},
		{"paddock_container_pids", "db", 7},
		{"paddock_container_disk_used_bytes", "db", 5 << 20},
	} {
		if got := value(t, fams, ck.name, "sandbox", "sbx-group", "container", ck.container); fmt.Sprintf("%.6g", got) != fmt.Sprintf("%.6g", ck.want) {
			t.Errorf("%s{%s} = %v, want %v", ck.name, ck.container, got, ck.want)
		}
	}
	if got := value(t, fams, "paddock_sandbox_cpu_usage_cores", "sandbox", "sbx-group"); fmt.Sprintf("%.3g", got) != "0.5" {
		t.Errorf("the sandbox's cores = %v, want 0.5 (its total)", got)
	}
	for _, f := range fams {
		for _, m := range f.Metric {
			for _, lp := range m.Label {
				if lp.GetName() == "container" && lp.GetValue() != "web" && lp.GetValue() != "db" {
					t.Errorf("%s has a series for container %q", f.GetName(), lp.GetValue())
				}
			}
		}
	}
}
