// Package api holds paddock's wire types: the JSON bodies of the /v1 HTTP
// API and the frame types of its streams. It has no logic beyond a file
// mode's octal form and its os.FileMode bits; the OpenAPI document beside
// it (openapi.yaml) describes the same shapes.
package api

import "time"

// Version is the API version prefix.
const Version = "v1"

// State is a sandbox's lifecycle state.
type State string

const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	// StateFrozen: processes frozen in place (cgroup freezer); memory kept.
	StateFrozen State = "frozen"
	// StatePaused: hibernated: no processes, no memory or CPU; files,
	// environment, limits and policy kept; resumes with the same id.
	StatePaused  State = "paused"
	StateStopped State = "stopped"
	StateFailed  State = "failed"
)

// TimeoutAction is what a sandbox's timeout does when it is up.
type TimeoutAction string

const (
	// TimeoutRemove ends and removes the sandbox (the default).
	TimeoutRemove TimeoutAction = "remove"
	// TimeoutPause pauses the sandbox and clears its timeout: it is kept
	// until it is resumed or removed.
	TimeoutPause TimeoutAction = "pause"
)

// Resources are a sandbox's limits. Zero means "the daemon's default".
type Resources struct {
	// CPUs is a CPU quota in cores (0.5 = half a core).
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryBytes is a hard memory cap; swap is not allowed.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pids caps the number of tasks.
	Pids int64 `json:"pids,omitempty"`
	// DiskBytes caps the sandbox's writable layer.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// CreateRequest is the body of POST /v1/sandboxes.
type CreateRequest struct {
	Image     string            `json:"image,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	Resources Resources         `json:"resources,omitempty"`
	// Timeout is the sandbox's lifetime in seconds; when it is up the
	// sandbox is ended and removed (or paused: OnTimeout). 0 means no
	// timeout.
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
	// OnTimeout is what the timeout does; default TimeoutRemove.
	OnTimeout TimeoutAction     `json:"on_timeout,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// AutoPauseSeconds pauses the sandbox after this long without an API
	// call, an open stream or network traffic. 0: never.
	AutoPauseSeconds int64 `json:"auto_pause_seconds,omitempty"`
	// AutoResume resumes a paused (or thaws a frozen) sandbox on the next
	// API call that needs it running. Default true.
	AutoResume *bool `json:"auto_resume,omitempty"`
	// Volumes are named volumes to mount.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// From starts the sandbox from a snapshot (by id) or a template (by
	// name) instead of a bare image: its files, and the environment,
	// workdir and limits it was captured with unless the request sets
	// them. An image name is accepted too.
	From string `json:"from,omitempty"`
	// Budget and Autoscale are optional.
	Budget    *Budget    `json:"budget,omitempty"`
	Autoscale *Autoscale `json:"autoscale,omitempty"`
	// Policy is what the sandbox may reach on the network; absent means
	// nothing.
	Policy *Policy `json:"policy,omitempty"`
	// Runtime is the isolation tier: "native" (namespaces, seccomp) or
	// "gvisor" (a kernel in user space, runsc); "" is the daemon's
	// default (--default-runtime).
	Runtime string `json:"runtime,omitempty"`
	// NodeSelector, through a cluster's gateway, places the sandbox on a
	// node whose labels include all of these (api.Node.Labels). A single
	// daemon ignores it.
	NodeSelector map[string]string `json:"node_selector,omitempty"`
	// Containers, when set, make the sandbox a group of named containers
	// sharing its network namespace, limits and lifecycle (the first is
	// the sandbox's own guest, the default of every call). Image, Env,
	// Workdir and Volumes are then set per container and left empty here.
	// Absent: a sandbox of one container, as before. Native runtime only
	// (on gvisor the create is refused: docs/containers.md).
	Containers []Container `json:"containers,omitempty"`
	// SharedVolumes are volumes made with the sandbox and removed with it,
	// which its containers mount by name (Container.Mounts).
	SharedVolumes []SharedVolume `json:"shared_volumes,omitempty"`
}

// Container is one container of a sandbox (CreateRequest.Containers): its
// own root filesystem and disk, mount, pid, ipc and user namespaces and
// uid range, in the sandbox's network namespace and within its limits.
type Container struct {
	// Name is 1 to 32 of a-z, 0-9 and single '-', starting with a letter;
	// unique in the sandbox.
	Name string `json:"name"`
	// Image is the container's image; default the daemon's ("host").
	Image string `json:"image,omitempty"`
	// Command, when set, is started in the background once the container
	// is up (a service); its output is the process's (ps, attach, logs).
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	// User runs Command as this user of the container; default root.
	User string `json:"user,omitempty"`
	// Resources cap this container within the sandbox's (each at most the
	// sandbox's); zero fields leave only the sandbox's cap. The first
	// container runs under the sandbox's own limits and sets none.
	// DiskBytes sizes its disk (default the daemon's).
	Resources Resources `json:"resources,omitempty"`
	// Mounts are shared volumes of the sandbox (SharedVolumes) or named
	// volumes, by name, each read-write or read-only.
	Mounts []VolumeMount `json:"mounts,omitempty"`
	// Role, when RoleEgress, makes the container the sandbox's egress
	// sidecar: every other container's outbound TCP connection is sent
	// to its EgressPort (transparently, as paddock's proxy gets them: the
	// original destination is the socket's SO_ORIGINAL_DST), and its own
	// connections go out through the sandbox's policy, which stays the
	// outer boundary. At most one container has it.
	Role string `json:"role,omitempty"`
	// EgressPort is where the egress container listens, on loopback or
	// any address; required with RoleEgress.
	EgressPort int `json:"egress_port,omitempty"`
	// Controls names other containers of the sandbox that this one
	// drives: it gets a control socket at ControlSocket (and PADDOCK_HOST
	// and PADDOCK_SANDBOX in its environment) on which the API serves
	// exec, files and processes of those containers, and nothing else.
	Controls []string `json:"controls,omitempty"`
	// Readiness, when set, gates the create's answer (and a resume's) on
	// the container passing its check: until Timeout the create fails,
	// naming the container and the check's last result, and nothing of
	// the sandbox is left.
	Readiness *Readiness `json:"readiness,omitempty"`
	// DependsOn names containers listed before this one whose readiness
	// checks must pass before its Command starts, at the create and at
	// every start again (a resume); without it, commands start at once
	// and the checks are awaited after.
	DependsOn []string `json:"depends_on,omitempty"`
	// Restart is what is done when Command exits: RestartNo (the
	// default), RestartOnFailure (a non-zero exit or a signal) or
	// RestartAlways, with a backoff from 1 s doubling to 30 s.
	Restart string `json:"restart,omitempty"`
}

// Restart policies of a container's command (Container.Restart).
const (
	RestartNo        = "no"
	RestartOnFailure = "on-failure"
	RestartAlways    = "always"
)

// Readiness is a container's readiness check: Exec (a command that
// exits 0) or HTTP (a GET of "PORT/PATH" on the sandbox's loopback that
// answers 2xx or 3xx), tried every 10 ms to 200 ms until TimeoutSeconds
// (default 60).
type Readiness struct {
	Exec           []string `json:"exec,omitempty"`
	HTTP           string   `json:"http,omitempty"`
	TimeoutSeconds int      `json:"timeout_seconds,omitempty"`
}

// RoleEgress is Container.Role of an egress sidecar.
const RoleEgress = "egress"

// ControlSocket is where a container that controls others
// (Container.Controls) finds its control socket; ControlDir holds it.
const (
	ControlDir    = "/run/paddock-control"
	ControlSocket = ControlDir + "/api.sock"
)

// SharedVolume is a volume a sandbox's containers share.
type SharedVolume struct {
	// Name is how containers' mounts name it: 1 to 32 of a-z, 0-9 and
	// single '-', starting with a letter.
	Name string `json:"name"`
	// SizeBytes caps it; 0 means the daemon's default disk size.
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// Volume is the named volume that holds it (ID-NAME), set by the
	// daemon.
	Volume string `json:"volume,omitempty"`
}

// ContainerStatus is a container of a sandbox as Get and List show it.
type ContainerStatus struct {
	Container
	ImageID string `json:"image_id,omitempty"`
	// State is the container's: running, or stopped (its init process
	// ended while the sandbox ran; Error says why), or the sandbox's own
	// when it is not running.
	State State  `json:"state"`
	Error string `json:"error,omitempty"`
	// PID is Command's process id in the container (0: none).
	PID int `json:"pid,omitempty"`
	// Restarts counts Command's restarts (Container.Restart); Exit is
	// how it last ended and LastLines the last lines it wrote then.
	Restarts  int          `json:"restarts,omitempty"`
	Exit      *ExitStatus  `json:"exit,omitempty"`
	LastLines []string     `json:"last_lines,omitempty"`
	Runtime   *RuntimeInfo `json:"runtime,omitempty"`
}

// Sandbox describes one sandbox.
type Sandbox struct {
	ID        string            `json:"id"`
	State     State             `json:"state"`
	Image     string            `json:"image"`
	ImageID   string            `json:"image_id,omitempty"` // the exact image (an OCI image's config digest); its name may move
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir"`
	Resources Resources         `json:"resources"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// ExpiresAt is when the timeout ends the sandbox, if it has one.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// OnTimeout is what happens at ExpiresAt; "" is TimeoutRemove.
	OnTimeout        TimeoutAction `json:"on_timeout,omitempty"`
	AutoPauseSeconds int64         `json:"auto_pause_seconds,omitempty"`
	AutoResume       bool          `json:"auto_resume"`
	// LastActiveAt is the last API call, stream or network traffic.
	LastActiveAt *time.Time    `json:"last_active_at,omitempty"`
	Volumes      []VolumeMount `json:"volumes,omitempty"`
	// From is the snapshot or template the sandbox started from.
	From string `json:"from,omitempty"`
	// Pooled says the create was a hand-out of a group its template's
	// warm pool made ahead (services started, checks passed); false for
	// one made on the spot (the pool was empty).
	Pooled    bool       `json:"pooled,omitempty"`
	Budget    *Budget    `json:"budget,omitempty"`
	Autoscale *Autoscale `json:"autoscale,omitempty"`
	Policy    *Policy    `json:"policy,omitempty"`
	// Archived: the paused sandbox's disk is in the cluster's object
	// store, not on a node; resuming it restores it (on any node).
	Archived bool `json:"archived,omitempty"`
	// Paused says what the pause of a paused sandbox kept.
	Paused *PauseInfo `json:"paused,omitempty"`
	// Error says why a sandbox failed.
	Error string `json:"error,omitempty"`
	// RuntimeName is the isolation tier it runs on (CreateRequest.Runtime);
	// "" in records older than the tiers is native.
	RuntimeName string `json:"runtime_name,omitempty"`
	// Runtime details useful to operators.
	Runtime *RuntimeInfo `json:"runtime,omitempty"`
	// Node is the cluster node that holds the sandbox (its name, as
	// `paddock nodes` lists it); empty on a daemon that is no node.
	Node string `json:"node,omitempty"`
	// Containers are the sandbox's containers, first the one every call
	// addresses by default; absent for a sandbox made without any.
	Containers    []ContainerStatus `json:"containers,omitempty"`
	SharedVolumes []SharedVolume    `json:"shared_volumes,omitempty"`
}

// ContainerParam is the query parameter that addresses a container of a
// sandbox on its exec, files, processes and ports routes; absent, the
// first.
const ContainerParam = "container"

// MaxContainerName bounds a container's (and a shared volume's) name.
const MaxContainerName = 32

// IsContainerName reports whether name can name a container or a shared
// volume: 1 to MaxContainerName of a-z, 0-9 and '-', starting with a
// letter, not ending with '-', and no "--" (which separates a sandbox's id
// from a container's name in the ids of its parts).
func IsContainerName(name string) bool {
	if len(name) == 0 || len(name) > MaxContainerName || name[0] < 'a' || name[0] > 'z' || name[len(name)-1] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') || c == '-' && name[i-1] == '-' {
			return false
		}
	}
	return true
}

// PauseInfo is what a pause kept of a sandbox.
type PauseInfo struct {
	// Memory: its processes were checkpointed with their memory (the
	// gvisor runtime), and a resume continues them (same pids, open
	// files, listening sockets). Without it (native) only the files,
	// environment, limits and policy were kept: a resume starts the
	// sandbox afresh.
	Memory bool `json:"memory"`
	// CheckpointBytes is the checkpoint's size on the sandbox's disk;
	// MemoryBytes the memory its processes used. Compressing: the
	// checkpoint was written uncompressed (the pause answers then) and is
	// being compressed; CheckpointBytes is the compressed size once it
	// is false.
	CheckpointBytes int64 `json:"checkpoint_bytes,omitempty"`
	MemoryBytes     int64 `json:"memory_bytes,omitempty"`
	Compressing     bool  `json:"compressing,omitempty"`
	// TookMillis is how long the pause took.
	TookMillis int64     `json:"took_ms"`
	At         time.Time `json:"at"`
	// Lost says why the memory checkpoint of this pause can no longer be
	// restored (a resume failed on it); the next resume starts the
	// sandbox from its files.
	Lost string `json:"lost,omitempty"`
}

// RuntimeInfo is what the host knows about a running sandbox.
type RuntimeInfo struct {
	Name string `json:"name"`
	// Version is the tier's own (gvisor: runsc's), where it has one.
	Version  string `json:"version,omitempty"`
	HostPID  int    `json:"host_pid,omitempty"`
	UIDBase  uint32 `json:"uid_base"`
	Cgroup   string `json:"cgroup,omitempty"`
	Idmapped bool   `json:"idmapped"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	// Cmd is the argv; Cmd[0] is looked up in PATH.
	Cmd []string          `json:"cmd"`
	Env map[string]string `json:"env,omitempty"`
	// Cwd defaults to the sandbox's workdir.
	Cwd string `json:"cwd,omitempty"`
	// User runs the command as a user of the sandbox; default root.
	User string `json:"user,omitempty"`
	// TTY runs the command on a pseudo-terminal of this size.
	TTY *TTY `json:"tty,omitempty"`
	// TimeoutSeconds kills the command when its lifetime is up.
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
	// Stdin, when set, is written to the process and then closed. For a
	// streamed stdin, upgrade the connection instead (see openapi.yaml).
	Stdin *string `json:"stdin,omitempty"`
}

// ExitStatus ends every exec stream.
type ExitStatus struct {
	ExitCode int `json:"exit_code"`
	// Signal is the signal that killed the process, if one did.
	Signal    string `json:"signal,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	// TimedOut is set when the process was killed for outliving its
	// timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// Error is set when the process could not be run or the stream was
	// cut (for example "sandbox ended").
	Error string `json:"error,omitempty"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Status is the HTTP status the error would have answered with; set
	// only in an exec lane's error frame, which has no status line.
	Status int `json:"status,omitempty"`
}

// VersionInfo is the body of GET /v1/version.
type VersionInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	// Runtime is the default runtime (the tier of creates naming none).
	Runtime string `json:"runtime"`
	// Runtimes are the runtimes this daemon runs, with their versions
	// (gvisor: runsc's).
	Runtimes  map[string]string `json:"runtimes,omitempty"`
	CgroupV2  bool              `json:"cgroup_v2"`
	Idmapped  bool              `json:"idmapped_mounts"`
	GoVersion string            `json:"go_version"`
}

// StreamProtocol is the Upgrade token for a bidirectional exec stream; the
// stream's frames are described in openapi.yaml.
const StreamProtocol = "paddock-stream"

// LaneProtocol is the Upgrade token of an exec lane (GET /v1/lane): a
// kept connection that carries one exec after another as frames, without
// an HTTP request and answer for each (openapi.yaml).
const LaneProtocol = "paddock-lane"

// LaneRequest is the payload of a request frame on an exec lane.
type LaneRequest struct {
	Sandbox string      `json:"sandbox"`
	Exec    ExecRequest `json:"exec"`
}

// StreamContentType is the media type of a one-way frame stream.
const StreamContentType = "application/vnd.paddock.stream"

// TTY asks for a pseudo-terminal of the given size.
type TTY struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// StartRequest is the body of POST /v1/sandboxes/{id}/processes.
type StartRequest struct {
	Cmd []string          `json:"cmd"`
	Env map[string]string `json:"env,omitempty"`
	// Cwd defaults to the sandbox's workdir.
	Cwd string `json:"cwd,omitempty"`
	// User runs the process as a user of the sandbox (name or uid);
	// default root.
	User string `json:"user,omitempty"`
	// Stdin keeps the process's stdin open for input; otherwise it reads
	// /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// TTY runs the process on a pseudo-terminal (stdout and stderr merged).
	TTY *TTY `json:"tty,omitempty"`
	// TimeoutSeconds kills the process (SIGKILL to its group) when its
	// lifetime is up. 0: none.
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
}

// Process describes a process started in a sandbox.
type Process struct {
	PID       int       `json:"pid"`
	Cmd       []string  `json:"cmd"`
	User      string    `json:"user,omitempty"`
	Cwd       string    `json:"cwd"`
	TTY       bool      `json:"tty,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// State is "running" or "exited".
	State string      `json:"state"`
	Exit  *ExitStatus `json:"exit,omitempty"`
	// OutputBytes is the offset after the last byte of output (stdout and
	// stderr together); attach replays from any offset still retained.
	OutputBytes int64 `json:"output_bytes"`
	// DroppedBytes is output lost to the per-process retention cap.
	DroppedBytes int64 `json:"dropped_bytes"`
}

// SignalRequest is the body of POST .../processes/{pid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"`
}

// IsSandboxID reports whether id has the form of a sandbox id: 1 to 64 of
// a-z, 0-9 and '-', not starting with '-'. An id is checked before it
// names a file, a cgroup or a metric.
func IsSandboxID(id string) bool {
	if len(id) == 0 || len(id) > 64 || id[0] == '-' {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
