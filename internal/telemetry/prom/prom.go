// Package prom owns paddock's Prometheus exposition: a Collector for the
// daemon (sandboxes by state, creates and deletes, warm pools, admission,
// budgets, autoscaling, the sampler's own cost) and for the sandboxes,
// with bounded label cardinality.
//
// Cardinality: the only label that comes from outside the daemon is
// sandbox, and it is only ever a validated sandbox id
// ([a-z0-9][a-z0-9-]{0,63}) of a running sandbox. At most TopN sandboxes
// (default 20) get per-sandbox series, 15 each: those using the most CPU
// in the latest sample (then memory, then id, for a stable order).
// Every running sandbox, ranked or not, is counted in the paddock_sandboxes_*
// aggregates, and paddock_sandbox_series_omitted says how many were left
// out. A ranked sandbox of several containers also gets 5 series per
// container (paddock_container_*, labelled sandbox and container, a
// validated container name: [a-z][a-z0-9-]{0,31}, at most 16 of them).
// The other labels (state, budget, direction, decision) take values
// from fixed sets; pool names a warm pool ("image:NAME", "template:NAME").
// A name the daemon hands in that does not look like one (state: [a-z_],
// 32 bytes; pool: poolPattern) is dropped, and at most 16 of each are kept. So a scrape carries at most TopN×(15 + 16×5) +
// a fixed ~60 series, whatever runs.
//
// The fleet counters (paddock_sandboxes_*_total) are the sampler's
// Totals: what sandboxes used between samples, summed since the daemon
// started, so they only grow as sandboxes come and go.
package prom

import (
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/autoscale"
	"github.com/paddock-dev/paddock/internal/telemetry/budget"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

// Config configures a Collector. Only Sampler is required.
type Config struct {
	Sampler *metrics.Sampler
	// States counts sandboxes by lifecycle state ("running", ...).
	States func() map[string]int
	// WarmPools gives the ready sandboxes of each warm pool
	// ("image:host", "template:web"), WarmTargets the size each is kept at.
	WarmPools   func() map[string]int
	WarmTargets func() map[string]int
	Admission   *admission.Controller
	Budgets     *budget.Tracker
	Autoscaler  *autoscale.Autoscaler
	// Storage reports the space left for sandboxes' disks; may be nil.
	Storage func() (api.StorageSpace, error)
	// TopN is how many sandboxes get series of their own. Default 20, at
	// most 200; -1 for none.
	TopN int
}

// Collector is a prometheus.Collector. Register it with a registry and
// serve that with promhttp.
type Collector struct {
	cfg Config

	creates, createFailures, deletes prometheus.Counter
	createSeconds                    prometheus.Histogram

	mu  sync.Mutex // guards buf
	buf []metrics.Latest
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector.
func New(cfg Config) (*Collector, error) {
	if cfg.Sampler == nil {
		return nil, errdefs.Invalid("sampler", "must be set")
	}
	switch {
	case cfg.TopN == 0:
		cfg.TopN = 20
	case cfg.TopN < 0:
		cfg.TopN = 0
	case cfg.TopN > 200:
		return nil, errdefs.Invalid("top_n", "at most 200, got %d", cfg.TopN)
	}
	return &Collector{
		cfg: cfg,
		creates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_sandbox_creates_total", Help: "Sandboxes created.",
		}),
		createFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_sandbox_create_failures_total", Help: "Sandbox creates that failed (admission refusals included).",
		}),
		deletes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_sandbox_deletes_total", Help: "Sandboxes deleted.",
		}),
		createSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "paddock_sandbox_create_duration_seconds",
			Help:    "Time to create a sandbox, from request to running.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}, nil
}

// Created counts a create that took d.
func (c *Collector) Created(d time.Duration) {
	c.creates.Inc()
	c.createSeconds.Observe(d.Seconds())
}

// CreateFailed counts a create that failed.
func (c *Collector) CreateFailed() { c.createFailures.Inc() }

// Deleted counts a delete.
func (c *Collector) Deleted() { c.deletes.Inc() }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// The descriptions, grouped as the package comment describes them.
var (
	dSandboxes     = desc("paddock_sandboxes", "Sandboxes by lifecycle state.", "state")
	dWarmPool      = desc("paddock_warm_pool_size", "Ready sandboxes in each warm pool.", "pool")
	dWarmTarget    = desc("paddock_warm_pool_target", "The size each warm pool is kept at.", "pool")
	dTickSeconds   = desc("paddock_telemetry_tick_seconds", "Wall time of the sampler's last tick.")
	dTickSandboxes = desc("paddock_telemetry_sampled_sandboxes", "Sandboxes the sampler's last tick read.")
	dOmitted       = desc("paddock_sandbox_series_omitted", "Running sandboxes without series of their own (beyond the top N by CPU).")
	dAdmCPULimit   = desc("paddock_admission_cpus_limit", "CPUs that can be reserved: (capacity - reserved) × overcommit.")
	dAdmCPUUsed    = desc("paddock_admission_cpus_reserved", "CPUs reserved by sandboxes.")
	dAdmMemLimit   = desc("paddock_admission_memory_limit_bytes", "Memory that can be reserved: (capacity - reserved) × overcommit.")
	dAdmMemUsed    = desc("paddock_admission_memory_reserved_bytes", "Memory reserved by sandboxes.")
	dStorageSize   = desc("paddock_storage_size_bytes", "Size of the filesystem that holds sandboxes' disks.")
	dStorageFree   = desc("paddock_storage_free_bytes", "Space a new disk may take now: free less a margin, no more than the host's filesystem below can back.")
	dStorageHost   = desc("paddock_storage_host_free_bytes", "Free space of the host's filesystem below the storage.")
	dStorageProm   = desc("paddock_storage_promised_bytes", "Disks' capacity not backed by allocated blocks (overcommit above 1).")
	dStorageShort  = desc("paddock_storage_short_bytes", "Promised disk capacity the free space cannot hold: writes past it fail with I/O errors. Alert above 0.")
	dStorageRatio  = desc("paddock_storage_overcommit_ratio", "The configured disk overcommit (1: every disk backed).")
	dBudgetWarn    = desc("paddock_budget_warnings_total", "Budget warnings fired.", "budget")
	dBudgetExceed  = desc("paddock_budget_exceeded_total", "Budgets reached (and their action run).", "budget")
	dAutoscale     = desc("paddock_autoscale_changes_total", "Autoscale limit changes, by direction; failed ones were refused or could not be applied.", "direction")

	// All running sandboxes.
	dAllCPU       = desc("paddock_sandboxes_cpu_seconds_total", "CPU time used by sandboxes while sampled.")
	dAllThrottled = desc("paddock_sandboxes_cpu_throttled_seconds_total", "Time sandboxes were throttled by their CPU quota, while sampled.")
	dAllRx        = desc("paddock_sandboxes_network_receive_bytes_total", "Bytes received by sandboxes through the egress proxy.")
	dAllTx        = desc("paddock_sandboxes_network_transmit_bytes_total", "Bytes sent by sandboxes through the egress proxy.")
	dAllEgress    = desc("paddock_sandboxes_egress_requests_total", "Egress requests by policy decision.", "decision")
	dAllOOM       = desc("paddock_sandboxes_oom_kills_total", "Processes killed by the OOM killer in sandboxes.")
	dAllCores     = desc("paddock_sandboxes_cpu_usage_cores", "CPU in use by all running sandboxes, in cores, over the last sample.")
	dAllMem       = desc("paddock_sandboxes_memory_bytes", "Memory used by all running sandboxes.")
	dAllMemLimit  = desc("paddock_sandboxes_memory_limit_bytes", "Memory limits of all running sandboxes.")
	dAllPids      = desc("paddock_sandboxes_pids", "Tasks in all running sandboxes.")
	dAllDisk      = desc("paddock_sandboxes_disk_used_bytes", "Disk used by all running sandboxes.")

	// Per sandbox, for the top N.
	dCPU       = desc("paddock_sandbox_cpu_seconds_total", "CPU time used by the sandbox.", "sandbox")
	dCores     = desc("paddock_sandbox_cpu_usage_cores", "CPU in use by the sandbox, in cores, over the last sample.", "sandbox")
	dThrottled = desc("paddock_sandbox_cpu_throttled_seconds_total", "Time the sandbox was throttled by its CPU quota.", "sandbox")
	dMem       = desc("paddock_sandbox_memory_bytes", "Memory used by the sandbox.", "sandbox")
	dMemPeak   = desc("paddock_sandbox_memory_peak_bytes", "Most memory the sandbox has used.", "sandbox")
	dMemLimit  = desc("paddock_sandbox_memory_limit_bytes", "The sandbox's memory limit (0: none).", "sandbox")
	dPids      = desc("paddock_sandbox_pids", "Tasks in the sandbox.", "sandbox")
	dPidsLimit = desc("paddock_sandbox_pids_limit", "The sandbox's task limit (0: none).", "sandbox")
	dDisk      = desc("paddock_sandbox_disk_used_bytes", "Disk used by the sandbox's writable layer.", "sandbox")
	dDiskLimit = desc("paddock_sandbox_disk_limit_bytes", "Size of the sandbox's writable layer.", "sandbox")
	dRx        = desc("paddock_sandbox_network_receive_bytes_total", "Bytes received by the sandbox through the egress proxy.", "sandbox")
	dTx        = desc("paddock_sandbox_network_transmit_bytes_total", "Bytes sent by the sandbox through the egress proxy.", "sandbox")
	dEgress    = desc("paddock_sandbox_egress_requests_total", "Egress requests of the sandbox by policy decision.", "sandbox", "decision")
	dOOM       = desc("paddock_sandbox_oom_kills_total", "Processes of the sandbox killed by the OOM killer.", "sandbox")

	// Per container of a ranked sandbox of several.
	dCtrCPU   = desc("paddock_container_cpu_seconds_total", "CPU time used by the container (a share of its sandbox's).", "sandbox", "container")
	dCtrCores = desc("paddock_container_cpu_usage_cores", "CPU in use by the container, in cores, over the last sample.", "sandbox", "container")
	dCtrMem   = desc("paddock_container_memory_bytes", "Memory used by the container (0 on cgroup v2 for all but the first: no counter of its own).", "sandbox", "container")
	dCtrPids  = desc("paddock_container_pids", "Tasks in the container (0 on cgroup v2 for all but the first).", "sandbox", "container")
	dCtrDisk  = desc("paddock_container_disk_used_bytes", "Disk used by the container's own writable layer.", "sandbox", "container")
)

var allDescs = []*prometheus.Desc{
	dSandboxes, dWarmPool, dWarmTarget, dTickSeconds, dTickSandboxes, dOmitted,
	dAdmCPULimit, dAdmCPUUsed, dAdmMemLimit, dAdmMemUsed, dStorageSize, dStorageFree, dStorageHost,
	dStorageProm, dStorageShort, dStorageRatio, dBudgetWarn, dBudgetExceed, dAutoscale,
	dAllCPU, dAllThrottled, dAllRx, dAllTx, dAllEgress, dAllOOM, dAllCores, dAllMem, dAllMemLimit, dAllPids, dAllDisk,
	dCPU, dCores, dThrottled, dMem, dMemPeak, dMemLimit, dPids, dPidsLimit, dDisk, dDiskLimit, dRx, dTx, dEgress, dOOM,
	dCtrCPU, dCtrCores, dCtrMem, dCtrPids, dCtrDisk,
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
	c.creates.Describe(ch)
	c.createFailures.Describe(ch)
	c.deletes.Describe(ch)
	c.createSeconds.Describe(ch)
}

var (
	namePattern = regexp.MustCompile(`^[a-z_]{1,32}$`)
	// poolPattern: "image:NAME" or "template:NAME", NAME as images and
	// templates spell theirs.
	poolPattern = regexp.MustCompile(`^(image|template):[a-zA-Z0-9][a-zA-Z0-9._/:@-]{0,127}$`)
)

const maxNames = 16

// maxContainers bounds the containers of one sandbox that get series (a
// sandbox has at most 16).
const maxContainers = 16

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

// named emits one gauge per entry of m whose name is fit for a label.
func named(ch chan<- prometheus.Metric, d *prometheus.Desc, m map[string]int) {
	namedLike(ch, d, m, namePattern)
}

// namedLike emits one gauge per entry of m whose name matches pattern, at
// most maxNames, in name order.
func namedLike(ch chan<- prometheus.Metric, d *prometheus.Desc, m map[string]int, pattern *regexp.Regexp) {
	names := make([]string, 0, len(m))
	for k := range m {
		if pattern.MatchString(k) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names[:min(len(names), maxNames)] {
		gauge(ch, d, float64(m[k]), k)
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.creates.Collect(ch)
	c.createFailures.Collect(ch)
	c.deletes.Collect(ch)
	c.createSeconds.Collect(ch)
	if c.cfg.States != nil {
		named(ch, dSandboxes, c.cfg.States())
	}
	if c.cfg.WarmPools != nil {
		namedLike(ch, dWarmPool, c.cfg.WarmPools(), poolPattern)
	}
	if c.cfg.WarmTargets != nil {
		namedLike(ch, dWarmTarget, c.cfg.WarmTargets(), poolPattern)
	}
	if a := c.cfg.Admission; a != nil {
		lim, use := a.Limits(), a.InUse()
		gauge(ch, dAdmCPULimit, lim.CPUs)
		gauge(ch, dAdmCPUUsed, use.CPUs)
		gauge(ch, dAdmMemLimit, float64(lim.MemoryBytes))
		gauge(ch, dAdmMemUsed, float64(use.MemoryBytes))
	}
	if c.cfg.Storage != nil {
		if sp, err := c.cfg.Storage(); err == nil {
			gauge(ch, dStorageSize, float64(sp.SizeBytes))
			gauge(ch, dStorageFree, float64(sp.FreeBytes))
			gauge(ch, dStorageHost, float64(sp.HostFreeBytes))
			gauge(ch, dStorageProm, float64(sp.PromisedBytes))
			gauge(ch, dStorageShort, float64(sp.ShortBytes))
			gauge(ch, dStorageRatio, sp.Overcommit)
		}
	}
	if b := c.cfg.Budgets; b != nil {
		warns, exceeded := b.Counts()
		for _, k := range budget.Kinds {
			counter(ch, dBudgetWarn, float64(warns[k]), string(k))
			counter(ch, dBudgetExceed, float64(exceeded[k]), string(k))
		}
	}
	if a := c.cfg.Autoscaler; a != nil {
		g, s, f := a.Counts()
		counter(ch, dAutoscale, float64(g), "grow")
		counter(ch, dAutoscale, float64(s), "shrink")
		counter(ch, dAutoscale, float64(f), "failed")
	}

	s := c.cfg.Sampler
	tick, sampled := s.LastTick()
	gauge(ch, dTickSeconds, tick.Seconds())
	gauge(ch, dTickSandboxes, float64(sampled))

	t := s.Totals()
	counter(ch, dAllCPU, t.CPUSeconds)
	counter(ch, dAllThrottled, t.CPUThrottledSeconds)
	counter(ch, dAllRx, float64(t.NetRxBytes))
	counter(ch, dAllTx, float64(t.NetTxBytes))
	counter(ch, dAllEgress, float64(t.EgressAllowed), "allowed")
	counter(ch, dAllEgress, float64(t.EgressDenied), "denied")
	counter(ch, dAllOOM, float64(t.OOMKills))

	c.mu.Lock()
	defer c.mu.Unlock()
	running := s.Running(c.buf[:0])
	// The buffer is kept for the next scrape, but not at the size of a
	// peak long gone: after a thousand sandboxes it held 270 KiB and
	// every removed sandbox's id (issue 21).
	defer func() {
		if cap(running) > 2*len(running)+64 {
			clear(running[:cap(running)])
			running = nil
		}
		c.buf = running
	}()
	var cores, mem, memLimit, pids, disk float64
	for i := range running {
		x := &running[i].Sample
		cores += x.CPUPercent / 100
		mem += float64(x.MemoryBytes)
		memLimit += float64(x.MemoryLimitBytes)
		pids += float64(x.Pids)
		disk += float64(x.DiskUsedBytes)
	}
	gauge(ch, dAllCores, cores)
	gauge(ch, dAllMem, mem)
	gauge(ch, dAllMemLimit, memLimit)
	gauge(ch, dAllPids, pids)
	gauge(ch, dAllDisk, disk)

	slices.SortFunc(running, func(a, b metrics.Latest) int {
		switch {
		case a.Sample.CPUPercent != b.Sample.CPUPercent:
			if a.Sample.CPUPercent > b.Sample.CPUPercent {
				return -1
			}
			return 1
		case a.Sample.MemoryBytes != b.Sample.MemoryBytes:
			if a.Sample.MemoryBytes > b.Sample.MemoryBytes {
				return -1
			}
			return 1
		}
		if a.ID < b.ID {
			return -1
		}
		return 1
	})
	shown := 0
	for i := range running {
		if shown == c.cfg.TopN {
			break
		}
		id, x := running[i].ID, &running[i].Sample
		if !api.IsSandboxID(id) {
			continue
		}
		shown++
		counter(ch, dCPU, x.CPUSeconds, id)
		gauge(ch, dCores, x.CPUPercent/100, id)
		counter(ch, dThrottled, x.CPUThrottledSeconds, id)
		gauge(ch, dMem, float64(x.MemoryBytes), id)
		gauge(ch, dMemPeak, float64(x.MemoryPeakBytes), id)
		gauge(ch, dMemLimit, float64(x.MemoryLimitBytes), id)
		gauge(ch, dPids, float64(x.Pids), id)
		gauge(ch, dPidsLimit, float64(x.PidsLimit), id)
		gauge(ch, dDisk, float64(x.DiskUsedBytes), id)
		gauge(ch, dDiskLimit, float64(x.DiskBytes), id)
		counter(ch, dRx, float64(x.NetRxBytes), id)
		counter(ch, dTx, float64(x.NetTxBytes), id)
		counter(ch, dEgress, float64(x.EgressAllowed), id, "allowed")
		counter(ch, dEgress, float64(x.EgressDenied), id, "denied")
		counter(ch, dOOM, float64(x.OOMKills), id)
		for _, c := range x.Containers[:min(len(x.Containers), maxContainers)] {
			if !api.IsContainerName(c.Name) {
				continue
			}
			counter(ch, dCtrCPU, c.CPUSeconds, id, c.Name)
			gauge(ch, dCtrCores, c.CPUPercent/100, id, c.Name)
			gauge(ch, dCtrMem, float64(c.MemoryBytes), id, c.Name)
			gauge(ch, dCtrPids, float64(c.Pids), id, c.Name)
			gauge(ch, dCtrDisk, float64(c.DiskUsedBytes), id, c.Name)
		}
	}
	gauge(ch, dOmitted, float64(len(running)-shown))
	clear(c.buf) // drop the samples' references until the next scrape
}
