package native

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// TestMadeAheadYields: guests made ahead of time wait with their cgroup's
// CPU weight lowered (a blank guest), so that the refill yields to
// running sandboxes across cgroups, and every guest a sandbox runs on has
// the default weight: a warm guest once it is ready, a blank one once a
// start adopts it.
func TestMadeAheadYields(t *testing.T) {
	d := nativeDeps(t, "paddock-yield")
	cfg := d.config(t)
	cfg.WarmGuests, cfg.BlankGuests = 1, 1
	cfg.WarmImage = func() (*image.Image, error) { return d.img, nil }
	cfg.WarmDiskBytes = 256 << 20
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })

	var blank *guestProc
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		rt.mu.Lock()
		if b := rt.blank[forNew]; len(b) > 0 {
			blank = b[0]
		}
		rt.mu.Unlock()
		if blank != nil && rt.PoolSizes()["image:"+d.img.Name] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no warm and blank guest ready after a minute")
		}
	}
	bg, ok := cpuWeight(t, blank.sb.cg)
	if !ok {
		t.Skip("the CPU controller is not enabled for sandboxes' cgroups")
	}
	ctx := context.Background()
	weights := map[string]int{}
	for _, tc := range []struct {
		name string
		spec runtime.Spec
	}{
		{"warm", runtime.Spec{Image: d.img}},
		{"blank", runtime.Spec{Image: d.img, Resources: api.Resources{DiskBytes: 128 << 20}}},
	} {
		inst, err := rt.Start(ctx, tc.spec)
		if err != nil {
			t.Fatalf("%s start: %v", tc.name, err)
		}
		weights[tc.name], _ = cpuWeight(t, inst.(*Sandbox).cg)
		if err := rt.Remove(ctx, inst.ID()); err != nil {
			t.Errorf("removing %s: %v", inst.ID(), err)
		}
	}
	if weights["warm"] != weights["blank"] || bg >= weights["warm"] {
		t.Errorf("CPU weights: a waiting blank guest's %d, a sandbox's on a warm guest %d, on a blank one %d; "+
			"want the waiting guest's lower and both sandboxes' the same", bg, weights["warm"], weights["blank"])
	}
}

// cpuWeight reads group g's CPU weight (v1 cpu.shares, v2 cpu.weight);
// false where the CPU controller has no such file.
func cpuWeight(t *testing.T, g *cgroup.Group) (int, bool) {
	t.Helper()
	for _, d := range g.Dirs() {
		for _, f := range []string{"cpu.shares", "cpu.weight"} {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			return n, true
		}
	}
	return 0, false
}
