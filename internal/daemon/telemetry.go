package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/gateway"
	"github.com/paddock-dev/paddock/internal/sandbox"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/budget"
	"github.com/paddock-dev/paddock/internal/telemetry/hub"
)

// Admission control's default overcommit ratios. A sandbox's limits are
// ceilings that idle agents rarely reach, so the defaults admit a dense
// fleet (256 two-CPU sandboxes on two cores, 16 GiB of limits per GiB of
// memory) and refuse only what cannot fit at all; 1 reserves strictly.
const (
	DefaultCPUOvercommit    = 256
	DefaultMemoryOvercommit = 16
)

// TelemetryConfig configures metrics, budgets and host admission.
type TelemetryConfig struct {
	// CPUOvercommit and MemoryOvercommit multiply the host's capacity for
	// admission control (zero: the hub's strict defaults, 4 and 1).
	CPUOvercommit    float64
	MemoryOvercommit float64
	// MemoryCapacity, if set, replaces the host's memory as the capacity
	// admission control hands out (for tests and shared hosts).
	MemoryCapacity int64
	// Prices turn usage into a cost for cost budgets.
	Prices budget.Prices
}

// startTelemetry makes the hub; the manager observes through it.
func startTelemetry(cfg Config, cgroups *cgroup.Manager, mgr *sandbox.Manager, disks *disk.Pool, log *slog.Logger) (*hub.Hub, error) {
	tc := cfg.Telemetry
	hc := hub.Config{
		Dir:     filepath.Join(cfg.StateDir, "telemetry"),
		Cgroups: cgroups,
		Disk: func(id string) (used, size int64, err error) {
			return mgr.DiskUsage(context.Background(), id)
		},
		Storage: func() (api.StorageSpace, error) {
			sp, err := disks.Space()
			return api.StorageSpace{SizeBytes: sp.Size, FreeBytes: sp.Free, HostFreeBytes: sp.HostFree,
				PromisedBytes: sp.Promised, ShortBytes: sp.Short, Overcommit: sp.Overcommit}, err
		},
		Prices:           tc.Prices,
		CPUOvercommit:    tc.CPUOvercommit,
		MemoryOvercommit: tc.MemoryOvercommit,
		States: func() map[string]int {
			out := map[string]int{}
			for _, s := range mgr.List(context.Background(), sandbox.Filter{}) {
				out[string(s.State)]++
			}
			return out
		},
		WarmPools:   func() map[string]int { return mgr.Pools().List(context.Background()).Ready },
		WarmTargets: func() map[string]int { return mgr.Pools().List(context.Background()).Target },
		Logger:      log,
	}
	if tc.MemoryCapacity > 0 {
		c, err := admission.HostCapacity()
		if err != nil {
			return nil, err
		}
		c.MemoryBytes = tc.MemoryCapacity
		hc.Capacity = c
	}
	h, err := hub.New(hc)
	if err != nil {
		return nil, fmt.Errorf("starting telemetry: %w", err)
	}
	h.SetActions(hub.Actions{
		Pause: func(ctx context.Context, id string) error {
			_, err := mgr.Freeze(ctx, id)
			return err
		},
		Kill: func(ctx context.Context, id string) error {
			_, err := mgr.Stop(ctx, id)
			return err
		},
		// Cutting the network replaces the policy with one that allows
		// nothing; setting a policy again restores it.
		CutNetwork: func(ctx context.Context, id string) error {
			_, err := mgr.SetPolicy(ctx, id, api.Policy{})
			return err
		},
	})
	h.SetGuests(mgr.ContainerGuest)
	mgr.SetObserver(h)
	return h, nil
}

// gatewayTelemetry sends the gateway's decisions to the hub and the hub's
// view of each sandbox to the gateway's self view.
func gatewayTelemetry(gw *gateway.Gateway, h *hub.Hub, mgr *sandbox.Manager, log *slog.Logger) {
	gw.SetSelf(h.Self)
	gw.SetEvents(func(id string, e gateway.Event) {
		// Network traffic is activity: it keeps auto-pause away.
		mgr.Touch(id)
		switch {
		case e.Egress != nil:
			x := e.Egress
			log.Debug("egress", "sandbox", id, "kind", x.Kind, "action", x.Action, "host", x.Host, "ip", x.IP, "port", x.Port, "path", x.Path, "rule", x.Rule, "reason", x.Reason, "error", x.Error)
			dest := x.Host
			if dest == "" {
				dest = x.IP
			}
			h.Egress(id, x.Action == "allow", x.BytesIn, x.BytesOut, fmt.Sprintf("%s %s %s: %s", x.Action, x.Kind, dest, x.Reason), x)
		case e.DNS != nil:
			q := e.DNS
			log.Debug("dns", "sandbox", id, "name", q.Name, "type", q.Type, "rcode", q.Rcode, "allowed", q.Allowed)
			if !q.Allowed {
				h.Event(id, "policy", fmt.Sprintf("deny dns %s: %s", q.Name, q.Reason), q)
			}
		}
	})
}
