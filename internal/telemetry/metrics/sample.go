// Package metrics owns per-sandbox resource samples: a Sampler that reads
// every registered sandbox once a tick on a single goroutine, works out
// CPU% from the deltas, keeps a bounded history at falling resolutions,
// and hands each tick's samples to observers (budgets, the autoscaler).
package metrics

import (
	"io"
	"sync"
	"sync/atomic"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
)

// Reading is what a Source reports: raw counters and gauges, as the kernel
// and the egress proxy keep them. Counters are cumulative; a counter that
// goes down is taken as reset (a restarted sandbox gets a new cgroup).
// Fields a Source cannot read stay zero.
type Reading struct {
	CPUNanos          uint64
	CPUThrottledNanos uint64
	MemoryBytes       int64
	MemoryPeakBytes   int64
	MemoryLimitBytes  int64 // 0: unlimited
	Pids              int64
	PidsLimit         int64 // 0: unlimited
	DiskUsedBytes     int64
	DiskBytes         int64
	NetRxBytes        uint64 // received by the sandbox
	NetTxBytes        uint64 // sent by the sandbox
	EgressAllowed     uint64
	EgressDenied      uint64
	OOMKills          uint64

	// Memory pressure, for the autoscaler. MemoryFailcnt is v1
	// memory.failcnt (or v2 memory.events "max"); MemoryStallNanos is PSI
	// "some" total from v2 memory.pressure; MemoryReclaimableBytes is the
	// inactive page cache (memory.stat inactive_file), which usage counts
	// but the kernel can drop.
	MemoryFailcnt          uint64
	MemoryStallNanos       uint64
	MemoryReclaimableBytes int64
}

// Source reads one sandbox. Read is called from the sampler's goroutine
// only, once a tick, so it may reuse buffers without locking. An error
// wrapping errdefs.ErrNotFound (the cgroup is gone) skips the sandbox
// quietly for that tick.
type Source interface {
	Read() (Reading, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func() (Reading, error)

// Read calls f.
func (f SourceFunc) Read() (Reading, error) { return f() }

// Sample is one point of a sandbox's metrics: the API's (see api.Sample
// for what its fields mean in a history) and, on the latest sample only,
// the autoscaler's inputs (see Reading), which the API does not show.
type Sample struct {
	api.Sample

	MemoryFailcnt          uint64  `json:"-"`
	MemoryStallSeconds     float64 `json:"-"`
	MemoryReclaimableBytes int64   `json:"-"`
}

// NetCounters are one sandbox's network counters, fed by the egress proxy
// from any goroutine and read by its Source.
type NetCounters struct {
	rx, tx, allowed, denied atomic.Uint64
}

// AddBytes counts bytes received by (rx) and sent from (tx) the sandbox.
func (n *NetCounters) AddBytes(rx, tx uint64) {
	if rx != 0 {
		n.rx.Add(rx)
	}
	if tx != 0 {
		n.tx.Add(tx)
	}
}

// AddRequest counts one egress policy decision.
func (n *NetCounters) AddRequest(allowed bool) {
	if allowed {
		n.allowed.Add(1)
	} else {
		n.denied.Add(1)
	}
}

// Load returns the counters.
func (n *NetCounters) Load() (rx, tx, allowed, denied uint64) {
	return n.rx.Load(), n.tx.Load(), n.allowed.Load(), n.denied.Load()
}

// NetTable holds the NetCounters of every sandbox, so that the egress
// proxy's callback can find them by sandbox id.
type NetTable struct{ m sync.Map }

// Get returns id's counters, making them on first use.
func (t *NetTable) Get(id string) *NetCounters {
	if n, ok := t.m.Load(id); ok {
		return n.(*NetCounters)
	}
	n, _ := t.m.LoadOrStore(id, new(NetCounters))
	return n.(*NetCounters)
}

// Remove forgets id's counters.
func (t *NetTable) Remove(id string) { t.m.Delete(id) }

// CgroupReader fills in the cgroup part of a Reading: *CgroupFiles, or
// GroupStats over a cgroup.Group.
type CgroupReader interface {
	ReadCgroup(r *Reading) error
}

// GroupStats reads a cgroup through cgroup.Group.Stats, which opens and
// closes eight control files per read: simpler than CgroupFiles, about
// five times dearer, and without the memory pressure fields.
type GroupStats struct {
	Group interface{ Stats() (cgroup.Stats, error) }
}

// ReadCgroup implements CgroupReader.
func (g GroupStats) ReadCgroup(r *Reading) error {
	st, err := g.Group.Stats()
	if err != nil {
		return err
	}
	r.CPUNanos, r.CPUThrottledNanos = st.CPUUsageNanos, st.CPUThrottledNanos
	r.MemoryBytes, r.MemoryPeakBytes, r.MemoryLimitBytes = st.MemoryCurrent, st.MemoryPeak, st.MemoryLimit
	r.Pids, r.PidsLimit, r.OOMKills = st.PidsCurrent, st.PidsLimit, st.OOMKills
	return nil
}

// CgroupSource reads a sandbox from its cgroup, its disk volume and its
// network counters. Disk and Net may be nil. A disk that cannot be read
// (not mounted yet) leaves the disk fields zero rather than failing the
// sample. The Sampler closes it (and so its CgroupFiles) once the sandbox
// is unregistered.
type CgroupSource struct {
	Cgroup CgroupReader
	Disk   interface {
		Usage() (used, size int64, err error)
	}
	Net *NetCounters
}

var _ Source = (*CgroupSource)(nil)

// Read implements Source.
func (c *CgroupSource) Read() (Reading, error) {
	var r Reading
	if err := c.Cgroup.ReadCgroup(&r); err != nil {
		return Reading{}, err
	}
	if c.Disk != nil {
		if used, size, err := c.Disk.Usage(); err == nil {
			r.DiskUsedBytes, r.DiskBytes = used, size
		}
	}
	if c.Net != nil {
		r.NetRxBytes, r.NetTxBytes, r.EgressAllowed, r.EgressDenied = c.Net.Load()
	}
	return r, nil
}

// Close closes the cgroup reader if it holds anything.
func (c *CgroupSource) Close() error {
	if cl, ok := c.Cgroup.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}
