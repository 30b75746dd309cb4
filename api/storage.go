package api

import "time"

// VolumeMount mounts a named volume, or a directory snapshot, into a
// sandbox.
type VolumeMount struct {
	// Name is the volume's name.
	Name string `json:"name,omitempty"`
	// Snapshot, instead of Name, mounts a directory snapshot read-only.
	Snapshot string `json:"snapshot,omitempty"`
	// Path is where it appears in the sandbox: absolute and clean.
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// VolumeRequest is the body of POST /v1/volumes.
type VolumeRequest struct {
	// Name is 1 to 64 characters of [a-z0-9-], starting with a letter or
	// digit.
	Name string `json:"name"`
	// SizeBytes caps the volume; 0 means the daemon's default disk size.
	SizeBytes int64             `json:"size_bytes,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// FromSnapshot fills the volume with a directory snapshot's files.
	FromSnapshot string `json:"from_snapshot,omitempty"`
}

// Volume describes a named volume.
type Volume struct {
	Name      string            `json:"name"`
	SizeBytes int64             `json:"size_bytes"`
	UsedBytes int64             `json:"used_bytes"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// UsedBy lists the sandboxes that mount it.
	UsedBy []string `json:"used_by,omitempty"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	// Path, when set, captures only this directory of the sandbox (a
	// directory snapshot), which can be mounted into other sandboxes.
	Path   string            `json:"path,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Memory also checkpoints the sandbox's processes (a runtime that
	// keeps memory: gvisor): a sandbox made from the snapshot starts with
	// copies of them running. The sandbox runs on.
	Memory bool `json:"memory,omitempty"`
}

// Snapshot describes a captured sandbox filesystem (or one directory of
// it).
type Snapshot struct {
	ID string `json:"id"`
	// Sandbox is the sandbox it was taken from.
	Sandbox string `json:"sandbox"`
	// Path is set for a directory snapshot.
	Path string `json:"path,omitempty"`
	// Container, for a directory snapshot of a sandbox of several
	// containers, is the one whose directory it holds (the request's
	// ?container=, by default the first); Image, Env and Workdir are
	// that container's.
	Container string `json:"container,omitempty"`
	Image     string `json:"image"`
	// Env, Workdir and Resources are the sandbox's when it was taken; a
	// sandbox created from the snapshot starts with them.
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	Resources Resources         `json:"resources"`
	// Policy is the sandbox's network policy when it was taken.
	Policy    *Policy           `json:"policy,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// SizeBytes is the captured filesystem's size (its cap);
	// AllocatedBytes what its data takes, before sharing with others.
	SizeBytes      int64 `json:"size_bytes"`
	AllocatedBytes int64 `json:"allocated_bytes"`
	// FrozenMS is how long the sandbox's processes were frozen for the
	// capture; TotalMS the whole capture.
	FrozenMS float64 `json:"frozen_ms"`
	TotalMS  float64 `json:"total_ms"`
	// Shared says the capture shares blocks with its source (reflink)
	// rather than copying them.
	Shared bool `json:"shared"`
	// UsedBy lists what holds the snapshot: templates, and sandboxes that
	// mount a directory snapshot.
	UsedBy []string `json:"used_by,omitempty"`
	// Containers, for a sandbox of several, are its containers as made
	// (the first's disk is the snapshot's image, each other's captured in
	// the same freeze); a sandbox created from it has them all.
	// SharedVolumes are captured in the same freeze (each shared-NAME.img
	// beside the disks) and made again from it, new volumes of the new
	// sandbox's. (Named volumes that are not shared are not captured.)
	Containers    []Container    `json:"containers,omitempty"`
	SharedVolumes []SharedVolume `json:"shared_volumes,omitempty"`
	// Memory is set for a memory snapshot: its processes were
	// checkpointed with its files.
	Memory *SnapshotMemory `json:"memory,omitempty"`
}

// SnapshotMemory describes the checkpoint of a memory snapshot.
type SnapshotMemory struct {
	// Runtime is the one that restores it: sandboxes made from the
	// snapshot run on it.
	Runtime string `json:"runtime"`
	// CheckpointBytes is its size on disk (compressed); MemoryBytes the
	// memory the sandbox's processes used.
	CheckpointBytes int64 `json:"checkpoint_bytes"`
	MemoryBytes     int64 `json:"memory_bytes,omitempty"`
	// StoppedMS is how long the sandbox's processes were stopped: the
	// checkpoint, the capture of its files and, on gvisor, their restore
	// from the checkpoint, from which they run on.
	StoppedMS float64 `json:"stopped_ms"`
	// Volumes are the mounts its processes saw: a sandbox made from the
	// snapshot mounts the same (by default) or volumes at the same paths.
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many copies to make, 1 to 64; 0 means 1.
	Count  int               `json:"count,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// CopyVolumes gives each fork its own copy of the volumes the
	// sandbox mounts; by default forks share them.
	CopyVolumes bool `json:"copy_volumes,omitempty"`
	// Memory says whether the forks keep the sandbox's processes (copies
	// of them run in each fork). Unset: they do where the sandbox's
	// runtime keeps memory (gvisor), and start afresh from its files
	// elsewhere; true on a runtime that keeps no memory is refused.
	Memory *bool `json:"memory,omitempty"`
}

// ForkResult is the answer to a fork.
type ForkResult struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	// FrozenMS is how long the source's processes were frozen for the
	// capture the forks were made from; TotalMS the whole fork.
	FrozenMS float64 `json:"frozen_ms"`
	TotalMS  float64 `json:"total_ms"`
	// Shared says the forks share blocks with the source (reflink).
	Shared bool `json:"shared"`
	// Memory says the forks kept the source's processes: the memory
	// checkpoint they started from (FrozenMS then covers it too).
	Memory *SnapshotMemory `json:"memory,omitempty"`
}
