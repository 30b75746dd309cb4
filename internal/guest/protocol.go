package guest

import (
	"sort"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// Ops of the control protocol. Each connection carries one request frame,
// one response frame and, for start with attach and for attach, a stream
// of output frames ending in an exit frame.
const (
	OpStart      = "start"
	OpAttach     = "attach"
	OpList       = "list"
	OpSignal     = "signal"
	OpInput      = "input"
	OpCloseStdin = "close_stdin"
	OpResize     = "resize"
	OpPing       = "ping"
	// OpLane hands the guest a client's exec lane bound to this sandbox
	// (lane_linux.go): after the answer, one byte with the lane's socket
	// (SCM_RIGHTS) follows, and the connection then carries the guest's
	// reports of the lane's execs to the daemon.
	OpLane = "lane"
)

// Request is the first frame a client sends on a guest connection.
type Request struct {
	Op    string        `json:"op"`
	Start *StartRequest `json:"start,omitempty"`
	// PID names the process for attach, signal, input and close_stdin.
	PID int `json:"pid,omitempty"`
	// Offset is where attach replays output from (bytes of stdout and
	// stderr together since the process started).
	Offset int64  `json:"offset,omitempty"`
	Signal string `json:"signal,omitempty"`
	Data   []byte `json:"data,omitempty"`
	// TTY is the new size for resize.
	TTY *api.TTY `json:"tty,omitempty"`
	// File carries the arguments of the file ops (files_protocol.go).
	File *FileRequest `json:"file,omitempty"`
	// Port carries the arguments of the port ops (ports_protocol.go).
	Port *PortRequest `json:"port,omitempty"`
	// Sandbox is the sandbox a lane is bound to (OpLane).
	Sandbox string `json:"sandbox,omitempty"`
}

// StartRequest starts a process.
type StartRequest struct {
	Cmd []string `json:"cmd"`
	// Env is added to the sandbox's environment (KEY=VALUE).
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	User string   `json:"user,omitempty"`
	// Stdin keeps the process's stdin open for input frames; otherwise it
	// reads /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// TTY runs the process on a pseudo-terminal of this size.
	TTY *api.TTY `json:"tty,omitempty"`
	// TimeoutSeconds kills the process group when the lifetime is up.
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
	// Attach streams the output on this connection after the response.
	Attach bool `json:"attach,omitempty"`
}

// ExecStart is the attached start of an exec request: stdin is kept open
// when the request brings input or a terminal.
func ExecStart(req *api.ExecRequest) *StartRequest {
	return &StartRequest{Cmd: req.Cmd, Env: EnvList(req.Env), Cwd: req.Cwd, User: req.User, TTY: req.TTY,
		TimeoutSeconds: req.TimeoutSeconds, Stdin: req.Stdin != nil || req.TTY != nil, Attach: true}
}

// Response answers a Request.
type Response struct {
	Error     *api.Error    `json:"error,omitempty"`
	PID       int           `json:"pid,omitempty"`
	Processes []ProcessInfo `json:"processes,omitempty"`
	// File carries the answers of the file ops (files_protocol.go).
	File *FileResponse `json:"file,omitempty"`
}

// ProcessInfo describes a process the guest started.
type ProcessInfo struct {
	PID       int             `json:"pid"`
	Cmd       []string        `json:"cmd"`
	User      string          `json:"user,omitempty"`
	Cwd       string          `json:"cwd"`
	TTY       bool            `json:"tty,omitempty"`
	StartedAt time.Time       `json:"started_at"`
	Running   bool            `json:"running"`
	Exit      *api.ExitStatus `json:"exit,omitempty"`
	// OutputBytes is the offset after the last byte of output.
	OutputBytes int64 `json:"output_bytes"`
	// DroppedBytes is output lost to the retention cap.
	DroppedBytes int64 `json:"dropped_bytes"`
}

// Config is a message from the daemon on the sync socket. A guest is
// usually started ahead of time: it is sent Prepare (become this sandbox,
// minus its environment) while nobody waits, and Activate (the
// environment; start serving) when a create asks for a sandbox. A cold
// start sends both in one message.
type Config struct {
	Prepare  *Prepare  `json:"prepare,omitempty"`
	Activate *Activate `json:"activate,omitempty"`
}

// Prepare builds the sandbox. Every host directory arrives as a
// descriptor (Mount.FD indexes those sent with the message): the guest runs
// as an unprivileged host uid and may not be able to walk the daemon's
// directories by path.
type Prepare struct {
	// Layers are the read-only lower layers, top-most first.
	Layers []Mount `json:"layers"`
	// Disk is the sandbox's writable volume (a detached mount); the
	// overlay's upper and work dirs are Disk's upper/ and work/.
	Disk Mount `json:"disk"`
	// Binds are host directories mounted read-only into the rootfs.
	Binds []Mount `json:"binds"`
	// OOMFD indexes the fd of the cgroup's OOM event counter file.
	OOMFD    int    `json:"oom_fd"`
	Hostname string `json:"hostname"`
	// CgroupV2 mounts the sandbox's own cgroup2 tree at /sys/fs/cgroup.
	CgroupV2 bool `json:"cgroup_v2"`
	// Seccomp is a compiled BPF program the guest and its processes run
	// under.
	Seccomp []byte `json:"seccomp"`
	// Caps is the capability set the sandbox keeps ("CAP_CHOWN", ...).
	Caps []string `json:"caps"`
	// AllowSetuid leaves no_new_privs unset, so that setuid programs
	// (sudo) raise a process to the sandbox's root, within Caps.
	AllowSetuid bool `json:"allow_setuid,omitempty"`
	// SkipWarmUp leaves out the warm-up command: the daemon waits for
	// this guest (a resume, a create with no warm guest), and the
	// command would only delay the sandbox's first one.
	SkipWarmUp bool `json:"skip_warm_up,omitempty"`
}

// Activate starts a prepared guest serving with the sandbox's environment.
type Activate struct {
	Serve ServeConfig `json:"serve"`
}

// Mount is a directory for the root filesystem, sent as a detached mount
// the daemon made (open_tree: read-only, idmapped where the kernel
// allows). A mount of the daemon's namespace could not be bound from or
// mounted on inside the guest's; a detached one can be attached.
type Mount struct {
	// Source is the host path, for messages only.
	Source string `json:"source,omitempty"`
	// FD indexes the descriptors sent with the message.
	FD   int    `json:"fd"`
	Dest string `json:"dest,omitempty"`
	// File: the mount is of a file, not a directory.
	File bool `json:"file,omitempty"`
}

// ServeConfig is what the guest needs once the sandbox is built.
type ServeConfig struct {
	Env     []string `json:"env"`
	Workdir string   `json:"workdir"`
	// OutputLimit caps the output retained per process, in bytes.
	OutputLimit int64 `json:"output_limit"`
	// Retain is how many finished processes are kept for reattach.
	Retain int `json:"retain"`
}

// Ready answers each Config: an error, or the phase reached ("prepared",
// or "ready" with the guest's pid in its namespace, which must be 1).
type Ready struct {
	Error string `json:"error,omitempty"`
	Phase string `json:"phase,omitempty"`
	PID   int    `json:"pid,omitempty"`
}

// File descriptors the daemon passes to the guest.
const (
	fdSync   = 3 // SOCK_SEQPACKET to the daemon for config and ready
	fdListen = 4 // the control socket listener
)

// EnvList turns an environment map into the KEY=VALUE list a StartRequest
// carries, sorted so that the same map always gives the same list.
func EnvList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
