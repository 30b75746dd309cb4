package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestContainerStats: a sandbox's metrics are broken down per container
// from their real cgroups: a container burning CPU shows it and the
// others do not, one holding memory shows it, the sandbox's totals hold
// them all; the CLI, a container's own history and Prometheus show the
// same.
func TestContainerStats(t *testing.T) {
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{
		Resources: api.Resources{MemoryBytes: 1 << 30},
		Containers: []api.Container{
			{Name: "harness"},
			{Name: "burner", Command: []string{"sh", "-c", "while :; do :; done"}},
			{Name: "holder", Command: []string{"python3", "-c", "import time\nb = b'x' * (96 << 20)\nprint('holding', flush=True)\ntime.sleep(600)"}},
		},
	})
	share := func(s *api.Sample, name string) api.ContainerSample {
		t.Helper()
		for _, c := range s.Containers {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no share of container %s in %+v", name, s.Containers)
		return api.ContainerSample{}
	}
	var s *api.Sample
	if !waitFor(30*time.Second, 200*time.Millisecond, func() bool {
		s = d.metrics(id).Current
		return s != nil && len(s.Containers) == 3 && share(s, "burner").CPUSeconds > 1.5 && share(s, "holder").MemoryBytes >= 96<<20
	}) {
		t.Fatalf("no sample with burner busy and holder holding: %+v", s)
	}
	harness, burner, holder := share(s, "harness"), share(s, "burner"), share(s, "holder")
	// The host is shared: the burner gets what it gets, the others
	// nearly nothing.
	if harness.CPUSeconds > 0.5 || holder.CPUSeconds > 1 || burner.CPUPercent < 5 || harness.CPUPercent > burner.CPUPercent/4 || holder.CPUPercent > burner.CPUPercent/4 {
		t.Errorf("CPU: harness %.2f s %.1f%%, holder %.2f s %.1f%%, burner %.2f s %.1f%%", harness.CPUSeconds, harness.CPUPercent,
			holder.CPUSeconds, holder.CPUPercent, burner.CPUSeconds, burner.CPUPercent)
	}
	if burner.MemoryBytes > 48<<20 || harness.MemoryBytes > 48<<20 {
		t.Errorf("containers holding nothing use memory: burner %d, harness %d (holder %d)", burner.MemoryBytes, harness.MemoryBytes, holder.MemoryBytes)
	}
	if s.CPUPercent < burner.CPUPercent-1 || s.CPUSeconds < burner.CPUSeconds+harness.CPUSeconds+holder.CPUSeconds-0.5 {
		t.Errorf("the sandbox's CPU (%.1f%%, %.2f s) is less than its containers' (burner %.1f%%, %.2f s)", s.CPUPercent, s.CPUSeconds, burner.CPUPercent, burner.CPUSeconds)
	}
	if s.MemoryBytes < holder.MemoryBytes || s.Pids < harness.Pids+burner.Pids+holder.Pids || burner.Pids < 2 || holder.Pids < 2 {
		t.Errorf("totals: memory %d, pids %d; containers %+v", s.MemoryBytes, s.Pids, s.Containers)
	}
	if holder.MemoryLimitBytes != 1<<30 || harness.DiskBytes == 0 || burner.DiskBytes == 0 || s.DiskBytes < harness.DiskBytes+burner.DiskBytes+holder.DiskBytes {
		t.Errorf("limits and disks: sandbox disk %d; containers %+v", s.DiskBytes, s.Containers)
	}

	t.Run("cli", func(t *testing.T) {
		out := d.MustCLI("stats", id)
		for _, want := range []string{"CONTAINER", "harness", "burner", "holder"} {
			if !strings.Contains(out, want) {
				t.Errorf("paddock stats lacks %q:\n%s", want, out)
			}
		}
		var m api.Metrics
		if err := json.Unmarshal([]byte(d.MustCLI("stats", "-c", "burner", "--json", id)), &m); err != nil {
			t.Fatal(err)
		}
		if m.Container != "burner" || m.Current == nil || m.Current.CPUPercent < 5 || len(m.History) < 2 || m.History[len(m.History)-1].CPUSeconds <= m.History[0].CPUSeconds {
			t.Errorf("burner's metrics and history: %+v", m)
		}
		if r := d.CLI("stats", "-c", "nope", id); r.Code == 0 || !strings.Contains(r.Stderr, "nope") {
			t.Errorf("stats of an unknown container: %+v", r)
		}
	})

	t.Run("sdk", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m, err := d.Client().Metrics(client.WithContainer(ctx, "holder"), id, client.MetricsOptions{})
		if err != nil || m.Current == nil || m.Current.MemoryBytes < 96<<20 || len(m.Current.Containers) != 0 {
			t.Fatalf("holder's metrics: %+v %v", m, err)
		}
	})

	t.Run("prometheus", func(t *testing.T) {
		a := d.do("GET", "/metrics", "")
		for _, c := range []string{"harness", "burner", "holder"} {
			want := fmt.Sprintf(`paddock_container_cpu_usage_cores{container=%q,sandbox=%q}`, c, id)
			if !strings.Contains(string(a.Body), want) {
				t.Errorf("scrape lacks %s", want)
			}
		}
	})
}
