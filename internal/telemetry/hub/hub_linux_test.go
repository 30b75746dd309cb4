package hub

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/cgrouptest"
)

// TestHubLifecycle drives a Hub as the manager does, over a real cgroup
// with a busy process in it: admission, sampling, a budget action, a
// resize, events and the self view, and removal.
func TestHubLifecycle(t *testing.T) {
	cgrouptest.RequireRoot(t)
	cgm := cgrouptest.NewManager(t)
	h, err := New(Config{Dir: t.TempDir(), Cgroups: cgm, Capacity: admission.Resources{CPUs: 4, MemoryBytes: 2 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	killed := make(chan string, 1)
	h.SetActions(Actions{Kill: func(_ context.Context, id string) error { killed <- id; return nil }})

	// 2 GiB less 512 MiB kept back: one 1 GiB sandbox fits, two do not.
	res := api.Resources{CPUs: 1, MemoryBytes: 1 << 30, Pids: 64}
	if err := h.Admit("creating-a", res); err != nil {
		t.Fatal(err)
	}
	if err := h.Admit("creating-b", res); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("second admission: %v", err)
	}
	const id = "hubtest1"
	g, err := cgm.Create(id, cgroup.Limits{CPUs: res.CPUs, MemoryBytes: res.MemoryBytes, Pids: res.Pids})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Delete(context.Background()) })
	cgrouptest.Start(t, g, "sh", "-c", "while :; do :; done")
	h.Running("creating-a", api.Sandbox{ID: id, State: api.StateRunning, Resources: res, CreatedAt: time.Now(),
		Budget: &api.Budget{CPUSeconds: 0.2, Action: "kill"}})

	smp := h.Sampler()
	now := time.Now()
	for i := 0; i < 3; i++ {
		time.Sleep(300 * time.Millisecond)
		now = now.Add(time.Second)
		smp.Tick(now)
	}
	m, err := h.Metrics(id, now.Add(-time.Hour), now)
	if err != nil || m.Current == nil {
		t.Fatalf("metrics: %v %+v", err, m)
	}
	if m.Current.MemoryLimitBytes != 1<<30 || m.Current.PidsLimit != 64 || m.Current.CPUSeconds <= 0 || len(m.History) != 3 {
		t.Errorf("metrics: %+v, %d history", m.Current, len(m.History))
	}
	// The busy loop may not have had its 0.2 s of CPU yet on a loaded
	// host: keep sampling, as the daemon would, until the action runs.
	for wait := 0; ; wait++ {
		select {
		case got := <-killed:
			if got != id {
				t.Errorf("kill action for %q", got)
			}
		case <-time.After(300 * time.Millisecond):
			if wait == 50 {
				t.Fatalf("the cpu budget's kill action did not run; budgets %+v", m.Budgets)
			}
			now = now.Add(time.Second)
			smp.Tick(now)
			continue
		}
		break
	}

	if err := h.Resize(id, api.Resources{CPUs: 1, MemoryBytes: 2 << 30}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a growth past capacity: %v", err)
	}
	grown := api.Resources{CPUs: 2, MemoryBytes: 1 << 30, Pids: 128}
	if err := h.Resize(id, grown); err != nil {
		t.Fatal(err)
	}
	h.Changed(api.Sandbox{ID: id, State: api.StateRunning, Resources: grown})
	// The budget's events (a warning first if a tick saw it nearly
	// spent: the busy loop's pace depends on the host), then the limits.
	evs, err := h.Events(id, EventQuery{Types: []string{"limits", "budget"}})
	n := len(evs)
	if err != nil || n < 2 || n > 3 || evs[n-2].Type != "budget" || !strings.Contains(evs[n-2].Message, "reached") ||
		evs[n-1].Type != "limits" || !strings.Contains(string(evs[n-1].Data), `"from_pids":64`) || (n == 3 && evs[0].Type != "budget") {
		t.Errorf("events: %v %+v", err, evs)
	}
	self, err := h.Self(id)
	if err != nil || self.Limits == nil || self.Limits.Pids != 128 || self.Usage == nil {
		t.Errorf("self view: %v %+v", err, self)
	}

	h.Stopped(api.Sandbox{ID: id, State: api.StateStopped, Resources: grown})
	if len(h.Latest()) != 0 {
		t.Errorf("a stopped sandbox is still sampled")
	}
	// Its reservation is back: the other one fits now.
	if err := h.Admit("creating-b", res); err != nil {
		t.Errorf("admission after a stop: %v", err)
	}
	h.Removed(id)
	if evs, err := h.Events(id, EventQuery{}); err != nil || len(evs) != 0 {
		t.Errorf("events after removal: %v %+v", err, evs)
	}
	if _, err := h.Self(id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("self view after removal: %v", err)
	}
}
