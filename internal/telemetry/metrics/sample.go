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

	// Containers are the shares of a sandbox of several containers, first
	// first (see CgroupSource.Containers); nil for any other sandbox.
	Containers []ContainerReading
}

// ContainerReading is one container's share of a sandbox's Reading: its
// cgroup fields and its disk's.
type ContainerReading struct {
	Name string
	Reading
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
	// Containers, set for a sandbox of several containers, are read into
	// Reading.Containers, and the sandbox's disk fields become the sum of
	// theirs.
	Containers []ContainerPart
}

// ContainerPart is one container of a sandbox of several: its cgroup,
// inside the sandbox's (nil: it does not run, and reads zero), and its
// disk. The first (Containers[0]) runs in the sandbox's cgroup itself: its
// share of the CPU, memory and pids is the sandbox's less the others'
// (cgroup counters are hierarchical), its disk is CgroupSource.Disk, and
// its Cgroup and Disk are not read.
type ContainerPart struct {
	Name   string
	Cgroup CgroupReader
	Disk   interface {
		Usage() (used, size int64, err error)
	}
}

// partial is a CgroupReader that may lack some controllers' files (a v2
// group whose parent enables no controllers for it has only cpu.stat), or
// whose OOM kills are its own alone (v1's are not counted in the parents).
type partial interface {
	Has() (memory, pids bool)
	LocalOOM() bool
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
	if len(c.Containers) > 0 {
		c.readContainers(&r)
	}
	return r, nil
}

// readContainers fills r.Containers from the sandbox's reading r. A
// container that does not run reads zero but for its disk. The first's
// share is what the others leave of the sandbox's counters, where every
// other container has them; the sandbox's disk becomes all of theirs.
func (c *CgroupSource) readContainers(r *Reading) {
	// A new slice each time: the sampler hands the samples out.
	parts := make([]ContainerReading, len(c.Containers))
	var rest Reading
	memKnown, pidsKnown := true, true
	for i, p := range c.Containers[1:] {
		cr := &parts[i+1]
		cr.Name = p.Name
		if p.Disk != nil {
			if used, size, err := p.Disk.Usage(); err == nil {
				cr.DiskUsedBytes, cr.DiskBytes = used, size
			}
		}
		rest.DiskUsedBytes += cr.DiskUsedBytes
		rest.DiskBytes += cr.DiskBytes
		if p.Cgroup == nil || p.Cgroup.ReadCgroup(&cr.Reading) != nil {
			cr.CPUNanos, cr.CPUThrottledNanos, cr.MemoryBytes, cr.MemoryPeakBytes, cr.Pids, cr.OOMKills = 0, 0, 0, 0, 0, 0
			continue
		}
		if h, ok := p.Cgroup.(partial); ok {
			mem, pids := h.Has()
			memKnown, pidsKnown = memKnown && mem, pidsKnown && pids
		}
		if cr.MemoryLimitBytes == 0 {
			cr.MemoryLimitBytes = r.MemoryLimitBytes
		}
		if cr.PidsLimit == 0 {
			cr.PidsLimit = r.PidsLimit
		}
		rest.CPUNanos += cr.CPUNanos
		rest.MemoryBytes += cr.MemoryBytes
		rest.Pids += cr.Pids
		rest.OOMKills += cr.OOMKills
	}
	localOOM := false
	if h, ok := c.Cgroup.(partial); ok {
		localOOM = h.LocalOOM()
	}
	f := &parts[0]
	f.Name = c.Containers[0].Name
	f.CPUNanos = less(r.CPUNanos, rest.CPUNanos)
	// Throttling is by a group's own quota: the first's is the sandbox's.
	f.CPUThrottledNanos = r.CPUThrottledNanos
	f.OOMKills = r.OOMKills
	if !localOOM {
		f.OOMKills = less(r.OOMKills, rest.OOMKills)
	}
	if memKnown {
		f.MemoryBytes = int64(less(uint64(max(r.MemoryBytes, 0)), uint64(rest.MemoryBytes)))
	}
	if pidsKnown {
		f.Pids = int64(less(uint64(max(r.Pids, 0)), uint64(rest.Pids)))
	}
	f.MemoryLimitBytes, f.PidsLimit = r.MemoryLimitBytes, r.PidsLimit
	f.DiskUsedBytes, f.DiskBytes = r.DiskUsedBytes, r.DiskBytes
	if localOOM {
		r.OOMKills += rest.OOMKills
	}
	r.DiskUsedBytes += rest.DiskUsedBytes
	r.DiskBytes += rest.DiskBytes
	r.Containers = parts
}

// less is a-b, or 0 where the counters, read one after the other, crossed.
func less(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// Close closes the cgroup readers that hold anything.
func (c *CgroupSource) Close() error {
	if cl, ok := c.Cgroup.(io.Closer); ok {
		cl.Close()
	}
	for _, p := range c.Containers {
		if cl, ok := p.Cgroup.(io.Closer); ok {
			cl.Close()
		}
	}
	return nil
}
