// Package admission owns host-level admission control: it keeps the CPU
// and memory every sandbox has reserved and refuses a create (or an
// autoscale grow) that would take the host past its capacity times a
// configurable overcommit ratio, with a reason a person can act on.
package admission

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	goruntime "runtime"
	"strconv"
	"sync"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/shrink"
)

// Resources are what a sandbox reserves: its limits. A zero field
// reserves nothing of that resource (the manager fills every limit with a
// default before it asks).
type Resources struct {
	CPUs        float64
	MemoryBytes int64
}

// Config configures a Controller.
type Config struct {
	// Capacity is what the host offers sandboxes; HostCapacity reads it.
	Capacity Resources
	// Reserved is kept back for the daemon and the host itself.
	Reserved Resources
	// CPUOvercommit and MemoryOvercommit multiply the capacity left after
	// Reserved. Defaults: 4 for CPU (quotas are ceilings, rarely all
	// used at once), 1 for memory (an overcommitted host OOM-kills).
	CPUOvercommit    float64
	MemoryOvercommit float64
}

// Controller tracks reservations. It is safe for concurrent use.
type Controller struct {
	cfg Config

	mu           sync.Mutex
	reserved     map[string]Resources
	reservedPeak int // for shrink.Map
	total        Resources
}

// New returns a Controller.
func New(cfg Config) (*Controller, error) {
	if cfg.CPUOvercommit == 0 {
		cfg.CPUOvercommit = 4
	}
	if cfg.MemoryOvercommit == 0 {
		cfg.MemoryOvercommit = 1
	}
	switch {
	case !(cfg.CPUOvercommit >= 1 && cfg.CPUOvercommit <= 1000):
		return nil, errdefs.Invalid("cpu_overcommit", "must be between 1 and 1000, got %v", cfg.CPUOvercommit)
	case !(cfg.MemoryOvercommit >= 1 && cfg.MemoryOvercommit <= 100):
		return nil, errdefs.Invalid("memory_overcommit", "must be between 1 and 100, got %v", cfg.MemoryOvercommit)
	case cfg.Capacity.CPUs <= 0 || cfg.Capacity.MemoryBytes <= 0:
		return nil, errdefs.Invalid("capacity", "must be positive, got %v CPUs and %d bytes", cfg.Capacity.CPUs, cfg.Capacity.MemoryBytes)
	case cfg.Reserved.CPUs < 0 || cfg.Reserved.MemoryBytes < 0 ||
		cfg.Reserved.CPUs >= cfg.Capacity.CPUs || cfg.Reserved.MemoryBytes >= cfg.Capacity.MemoryBytes:
		return nil, errdefs.Invalid("reserved", "must be non-negative and below the capacity")
	}
	return &Controller{cfg: cfg, reserved: map[string]Resources{}}, nil
}

// HostCapacity reads this host's CPUs and memory (MemTotal).
func HostCapacity() (Resources, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return Resources{}, fmt.Errorf("reading host capacity: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemTotal:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				break
			}
			return Resources{CPUs: float64(goruntime.NumCPU()), MemoryBytes: kb << 10}, nil
		}
	}
	return Resources{}, fmt.Errorf("reading host capacity: no MemTotal in /proc/meminfo")
}

// Limits are the most that can be reserved: (capacity − reserved) ×
// overcommit.
func (c *Controller) Limits() Resources {
	return Resources{
		CPUs:        (c.cfg.Capacity.CPUs - c.cfg.Reserved.CPUs) * c.cfg.CPUOvercommit,
		MemoryBytes: int64(float64(c.cfg.Capacity.MemoryBytes-c.cfg.Reserved.MemoryBytes) * c.cfg.MemoryOvercommit),
	}
}

// InUse is the sum of every reservation.
func (c *Controller) InUse() Resources {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// Admit reports whether r fits next to the current reservations, without
// reserving it: an error wrapping errdefs.ErrUnavailable says which
// resource is short and by how much.
func (c *Controller) Admit(r Resources) error {
	if err := check(r); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fits(r, Resources{}, c.total)
}

// Reserve admits r for sandbox id and records it. Reserving for an id
// that holds a reservation replaces it (Resize).
func (c *Controller) Reserve(id string, r Resources) error {
	if err := check(r); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.reserved[id]
	others := sub(c.total, old)
	if err := c.fits(r, old, others); err != nil {
		return err
	}
	c.reserved[id] = r
	c.total = add(others, r)
	return nil
}

// Resize changes id's reservation to r: growing is admitted like a create
// (and may fail), shrinking always succeeds. An id without a reservation
// is reserved.
func (c *Controller) Resize(id string, r Resources) error { return c.Reserve(id, r) }

// Restore records r for id without admitting it: for the sandboxes a
// restarted daemon finds running, which hold their resources whatever the
// capacity now says.
func (c *Controller) Restore(id string, r Resources) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total = add(sub(c.total, c.reserved[id]), r)
	c.reserved[id] = r
}

// Rename moves a reservation made under a provisional key (before the
// runtime picks the sandbox's id) to the sandbox's id.
func (c *Controller) Rename(from, to string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.reserved[from]
	if !ok {
		return
	}
	delete(c.reserved, from)
	c.reserved = shrink.Map(c.reserved, &c.reservedPeak)
	c.total = sub(c.total, c.reserved[to]) // r is counted already; an old one under to goes
	c.reserved[to] = r
}

// Release drops id's reservation (the sandbox stopped or was deleted).
func (c *Controller) Release(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.reserved[id]; ok {
		c.total = sub(c.total, old)
		delete(c.reserved, id)
		c.reserved = shrink.Map(c.reserved, &c.reservedPeak)
	}
}

func check(r Resources) error {
	if r.CPUs < 0 || math.IsNaN(r.CPUs) || math.IsInf(r.CPUs, 0) || r.MemoryBytes < 0 {
		return errdefs.Invalid("resources", "must be non-negative, got %v CPUs and %d bytes", r.CPUs, r.MemoryBytes)
	}
	return nil
}

// fits checks r, replacing old, against the limits with others already
// in use; the caller holds c.mu. Only a resource that grows is checked:
// shrinking is never refused, even on a host that is over its limits
// (after a restart with a smaller capacity, say).
func (c *Controller) fits(r, old, others Resources) error {
	lim := c.Limits()
	capy := sub(c.cfg.Capacity, c.cfg.Reserved)
	if r.MemoryBytes > old.MemoryBytes && others.MemoryBytes+r.MemoryBytes > lim.MemoryBytes {
		return errdefs.New(errdefs.ErrUnavailable, "memory: %s requested of %s × %s overcommit, %s in use",
			gib(r.MemoryBytes), gib(capy.MemoryBytes), ratio(c.cfg.MemoryOvercommit), gib(others.MemoryBytes))
	}
	// A hair of slack: sums of fractional CPUs.
	if r.CPUs > old.CPUs && others.CPUs+r.CPUs > lim.CPUs+1e-9 {
		return errdefs.New(errdefs.ErrUnavailable, "cpu: %s CPUs requested of %s × %s overcommit, %s in use",
			num(r.CPUs), num(capy.CPUs), ratio(c.cfg.CPUOvercommit), num(others.CPUs))
	}
	return nil
}

func add(a, b Resources) Resources {
	return Resources{CPUs: a.CPUs + b.CPUs, MemoryBytes: a.MemoryBytes + b.MemoryBytes}
}

func sub(a, b Resources) Resources {
	return Resources{CPUs: a.CPUs - b.CPUs, MemoryBytes: a.MemoryBytes - b.MemoryBytes}
}

func gib(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func ratio(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
