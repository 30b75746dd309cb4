package api

import (
	"encoding/json"
	"time"
)

// Sample is one point of a sandbox's metrics. In a history, points older
// than 15 minutes stand for a whole interval: counters and limits are
// their values at its end, CPUPercent its average, MemoryBytes and Pids
// the highest values seen in it.
type Sample struct {
	Time time.Time `json:"time"`
	// CPUSeconds is the CPU time used since the sandbox last started.
	CPUSeconds float64 `json:"cpu_seconds"`
	// CPUPercent is in percent of one core (200 is two cores busy).
	CPUPercent          float64 `json:"cpu_percent"`
	CPUThrottledSeconds float64 `json:"cpu_throttled_seconds"`
	MemoryBytes         int64   `json:"memory_bytes"`
	MemoryPeakBytes     int64   `json:"memory_peak_bytes"`
	MemoryLimitBytes    int64   `json:"memory_limit_bytes"`
	Pids                int64   `json:"pids"`
	PidsLimit           int64   `json:"pids_limit"`
	DiskUsedBytes       int64   `json:"disk_used_bytes"`
	DiskBytes           int64   `json:"disk_bytes"`
	NetRxBytes          uint64  `json:"net_rx_bytes"`
	NetTxBytes          uint64  `json:"net_tx_bytes"`
	EgressAllowed       uint64  `json:"egress_requests_allowed"`
	EgressDenied        uint64  `json:"egress_requests_denied"`
	OOMKills            uint64  `json:"oom_kills"`
	// Containers are the shares of a sandbox of several containers, first
	// first, in the latest sample only (a container's history: ask with
	// ?container=NAME). The sandbox's CPU, memory, pids and disk use above
	// are their sum; network and egress are the sandbox's alone.
	Containers []ContainerSample `json:"containers,omitempty"`
}

// ContainerSample is one container's share of a sandbox's sample: its
// cgroup's CPU, memory and pids (the first container's is the sandbox's
// cgroup less the others'; on cgroup v2 the others have no memory and
// pids counters of their own, and read zero) and its own disk. Its limits
// are its own, or the sandbox's where it has none.
type ContainerSample struct {
	Name string `json:"name"`
	Sample
}

// Metrics is the answer of GET /v1/sandboxes/{id}/metrics.
type Metrics struct {
	Sandbox string `json:"sandbox"`
	// Container is set when the call named one (?container=NAME): Current
	// and History are then that container's share.
	Container       string  `json:"container,omitempty"`
	IntervalSeconds float64 `json:"interval_seconds"`
	// Current is the latest sample; nil if the sandbox was never sampled.
	Current *Sample `json:"current,omitempty"`
	// History is oldest first: 1 s apart for the last 15 minutes, then 1
	// minute for a day, then 15 minutes for a week.
	History []Sample `json:"history"`
	// Budgets is set for a running sandbox with a budget.
	Budgets *BudgetStatus `json:"budgets,omitempty"`
	// Autoscale is set for a running autoscaled sandbox: the limits the
	// autoscaler has it at.
	Autoscale *Resources `json:"autoscale,omitempty"`
	// Storage is the space left on the filesystem that holds every
	// sandbox's disk, shared by all sandboxes.
	Storage *StorageSpace `json:"storage,omitempty"`
}

// StorageSpace is the space of the filesystem that holds sandboxes' disks
// (the host's, or the XFS image paddock made on it).
type StorageSpace struct {
	SizeBytes int64 `json:"size_bytes"`
	// FreeBytes is what a new disk may take now: the free space less a
	// margin, no more than the host's filesystem below can back.
	FreeBytes int64 `json:"free_bytes"`
	// HostFreeBytes is the free space of the host's filesystem below.
	HostFreeBytes int64 `json:"host_free_bytes"`
	// PromisedBytes is disks' capacity not backed by allocated blocks
	// (only with an overcommit above 1).
	PromisedBytes int64 `json:"promised_bytes"`
	// ShortBytes is how much of PromisedBytes the free space cannot hold:
	// writes past it fail with I/O errors. Above zero is an alarm.
	ShortBytes int64   `json:"short_bytes"`
	Overcommit float64 `json:"overcommit"`
}

// SandboxSample is one running sandbox's latest sample, in GET /v1/metrics.
type SandboxSample struct {
	ID     string `json:"id"`
	Sample Sample `json:"sample"`
}

// BudgetStatus is a sandbox's budgets, what it used and what remains.
type BudgetStatus struct {
	Budgets []BudgetLine    `json:"budgets"`
	Usage   json.RawMessage `json:"usage,omitempty"`
}

// BudgetLine is one budget's state.
type BudgetLine struct {
	Budget    string  `json:"budget"`
	Used      float64 `json:"used"`
	Limit     float64 `json:"limit"`
	Remaining float64 `json:"remaining"`
	Warned    bool    `json:"warned"`
	Exceeded  bool    `json:"exceeded"`
	Action    string  `json:"action"`
}

// Event is one entry of a sandbox's event log (GET
// /v1/sandboxes/{id}/events). Types: lifecycle, exec, oom, limits,
// snapshot, fork, pause, policy, budget, autoscale.
type Event struct {
	// Seq numbers a sandbox's events from 1; resume after the last seen
	// with ?after=. A jump means the retention cap dropped events.
	Seq     uint64          `json:"seq"`
	Time    time.Time       `json:"time"`
	Sandbox string          `json:"sandbox"`
	Type    string          `json:"type"`
	Message string          `json:"message,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Events is the answer of GET /v1/sandboxes/{id}/events.
type Events struct {
	Events []Event `json:"events"`
}

// ExecLog describes one process's kept output (GET
// /v1/sandboxes/{id}/logs).
type ExecLog struct {
	// Seq numbers a sandbox's processes in the order they started.
	Seq uint64 `json:"seq"`
	// Container is the container the process ran in, "" for the
	// sandbox's first (each container has its own pids).
	Container string      `json:"container,omitempty"`
	PID       int         `json:"pid"`
	Cmd       []string    `json:"cmd"`
	StartedAt time.Time   `json:"started_at"`
	EndedAt   *time.Time  `json:"ended_at,omitempty"`
	Exit      *ExitStatus `json:"exit,omitempty"`
	// Start is the offset of the first byte kept, End the offset after
	// the last.
	Start int64 `json:"start"`
	End   int64 `json:"end"`
}
