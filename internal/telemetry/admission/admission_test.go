package admission

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

const gb = 1 << 30

func newController(t *testing.T, cfg Config) *Controller {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAdmit(t *testing.T) {
	// 24 GiB × 1.5 = 36 GiB of memory; 2 CPUs × 4 = 8 CPUs.
	c := newController(t, Config{Capacity: Resources{CPUs: 2, MemoryBytes: 24 * gb}, MemoryOvercommit: 1.5})
	if err := c.Reserve("a", Resources{CPUs: 1, MemoryBytes: 29*gb + gb/2}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		r    Resources
		want string // "" admits
	}{
		{"fits", Resources{CPUs: 1, MemoryBytes: 6 * gb}, ""},
		{"exactly full", Resources{CPUs: 7, MemoryBytes: 6*gb + gb/2}, ""},
		{"memory short", Resources{CPUs: 1, MemoryBytes: 30 * gb},
			"memory: 30.0 GiB requested of 24.0 GiB × 1.5 overcommit, 29.5 GiB in use"},
		{"cpu short", Resources{CPUs: 7.5, MemoryBytes: gb},
			"cpu: 7.5 CPUs requested of 2 × 4.0 overcommit, 1 in use"},
		{"nothing", Resources{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Admit(tt.r)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Admit = %v, want admitted", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrUnavailable) || err.Error() != tt.want {
				t.Fatalf("Admit = %v\nwant %q (ErrUnavailable)", err, tt.want)
			}
		})
	}
	if _, err := New(Config{Capacity: Resources{CPUs: 2, MemoryBytes: gb}, CPUOvercommit: 0.5}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("overcommit below 1 = %v, want ErrInvalid", err)
	}
	if err := c.Admit(Resources{CPUs: -1}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("negative request = %v, want ErrInvalid", err)
	}
}

func TestReserveResizeRelease(t *testing.T) {
	c := newController(t, Config{
		Capacity: Resources{CPUs: 4, MemoryBytes: 10 * gb},
		Reserved: Resources{CPUs: 0, MemoryBytes: 2 * gb}, // 8 GiB for sandboxes
	})
	steps := []struct {
		op     string
		id     string
		r      Resources
		ok     bool
		inUse  int64 // GiB after the step
		inCPUs float64
	}{
		{"reserve", "a", Resources{1, 4 * gb}, true, 4, 1},
		{"reserve", "b", Resources{1, 4 * gb}, true, 8, 2},
		{"reserve", "c", Resources{1, gb}, false, 8, 2},
		{"resize", "a", Resources{1, 5 * gb}, false, 8, 2}, // grow past the limit
		{"resize", "a", Resources{1, 2 * gb}, true, 6, 2},  // shrink
		{"resize", "b", Resources{2, 6 * gb}, true, 8, 3},  // grow into the room
		{"release", "a", Resources{}, true, 6, 2},
		{"release", "a", Resources{}, true, 6, 2}, // twice is fine
		{"reserve", "c", Resources{1, 2 * gb}, true, 8, 3},
	}
	for i, st := range steps {
		var err error
		switch st.op {
		case "reserve":
			err = c.Reserve(st.id, st.r)
		case "resize":
			err = c.Resize(st.id, st.r)
		case "release":
			c.Release(st.id)
		}
		if (err == nil) != st.ok {
			t.Fatalf("step %d %s %s %+v = %v, want ok=%v", i, st.op, st.id, st.r, err, st.ok)
		}
		if u := c.InUse(); u.MemoryBytes != st.inUse*gb || u.CPUs != st.inCPUs {
			t.Fatalf("step %d: in use %+v, want %d GiB and %v CPUs", i, u, st.inUse, st.inCPUs)
		}
	}
}

// TestShrinkOverLimit: a host over its limits (capacity lowered across a
// restart) still lets a sandbox shrink.
func TestShrinkOverLimit(t *testing.T) {
	c := newController(t, Config{Capacity: Resources{CPUs: 1, MemoryBytes: 4 * gb}})
	c.reserved["a"] = Resources{CPUs: 8, MemoryBytes: 8 * gb}
	c.total = c.reserved["a"]
	if err := c.Resize("a", Resources{CPUs: 4, MemoryBytes: 6 * gb}); err != nil {
		t.Errorf("shrinking on an overfull host = %v", err)
	}
	if err := c.Resize("a", Resources{CPUs: 5, MemoryBytes: 6 * gb}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("growing on an overfull host = %v, want ErrUnavailable", err)
	}
}

func TestRestoreRename(t *testing.T) {
	c := newController(t, Config{Capacity: Resources{CPUs: 1, MemoryBytes: 4 * gb}})
	c.Restore("old", Resources{CPUs: 2, MemoryBytes: 6 * gb}) // over the limits: kept
	if u := c.InUse(); u.MemoryBytes != 6*gb {
		t.Fatalf("in use after Restore: %+v", u)
	}
	if err := c.Reserve("creating-1", Resources{MemoryBytes: gb}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Reserve on a full host = %v", err)
	}
	c.Release("old")
	if err := c.Reserve("creating-1", Resources{CPUs: 1, MemoryBytes: gb}); err != nil {
		t.Fatal(err)
	}
	c.Rename("creating-1", "sbx-9")
	c.Rename("missing", "x")
	if u := c.InUse(); u.MemoryBytes != gb || len(c.reserved) != 1 {
		t.Errorf("after Rename: %+v, %v", u, c.reserved)
	}
	c.Release("sbx-9")
	if u := c.InUse(); u.MemoryBytes != 0 || u.CPUs != 0 {
		t.Errorf("after Release: %+v", u)
	}
}

func TestConcurrentReserve(t *testing.T) {
	c := newController(t, Config{Capacity: Resources{CPUs: 100, MemoryBytes: 100 * gb}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.Reserve(fmt.Sprint(i), Resources{CPUs: 1, MemoryBytes: gb}) == nil {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted != 100 || c.InUse().MemoryBytes != 100*gb {
		t.Errorf("admitted %d (in use %+v), want exactly 100", admitted, c.InUse())
	}
}

func TestHostCapacity(t *testing.T) {
	r, err := HostCapacity()
	if err != nil || r.CPUs < 1 || r.MemoryBytes < 64<<20 {
		t.Fatalf("HostCapacity = %+v, %v", r, err)
	}
	t.Logf("this host: %v CPUs, %.1f GiB", r.CPUs, float64(r.MemoryBytes)/gb)
}
