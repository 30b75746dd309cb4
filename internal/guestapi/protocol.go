// Package guestapi is the protocol between the daemon and a sandbox's
// guest (PID 1, internal/guest) and the daemon's typed client of it.
//
// The protocol: the boot messages on the sync socket (Config, Ready), the
// control connection's request and response frames (Request, Response:
// process, file, port and lane ops) and the streams that follow some of
// them (wire frames; file streams' End; a lane's reports). Both sides
// import this package; it imports nothing of the guest's.
//
// The client: Client has a method for each op (Start, Attach, List,
// Signal, file ops, DialPort, HandLane, ...). Daemon code reaches a guest
// only through it, so a change of the protocol touches this package and
// the guest's server, nothing else.
package guestapi

import (
	"sort"
	"syscall"
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
	// (internal/guest/lane_linux.go; the fast guest's in internal/guestc
	// too): after the answer, one byte with the lane's socket
	// (SCM_RIGHTS) follows, and the connection then carries the guest's
	// reports of the lane's execs to the daemon.
	OpLane = "lane"
	// OpQuiesce readies a guest under gVisor for a checkpoint: it closes
	// its control socket's listener and every connection but this one,
	// answers, and closes this one too (a bound host socket cannot be
	// saved). RelistenSignal, sent once the sandbox runs again (restored,
	// or its checkpoint failed), has it bind the socket again.
	OpQuiesce = "quiesce"
	// OpSetEnv replaces variables of the environment the guest gives new
	// processes (Request.Env, KEY=VALUE): a restored sandbox's network
	// variables, whose network slot is new.
	OpSetEnv = "set_env"
)

// RelistenSignal is the signal that has a quiesced guest bind its control
// socket again: SIGPWR, which runsc kill can send and the guest forwards
// to no process. From inside the sandbox it does nothing to a guest that
// listens.
const RelistenSignal = syscall.SIGPWR

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
	// Env are the variables OpSetEnv sets.
	Env []string `json:"env,omitempty"`
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

// LaneStart is the payload of a lane report's wire.Started frame: an exec
// the guest started on a lane it serves.
type LaneStart struct {
	PID int      `json:"pid"`
	Cmd []string `json:"cmd"`
}

// LanePassed is the payload of a lane report's wire.Release frame: output
// the guest passed to the lane's client without carrying it in the
// reports (past the report budget); the daemon's copy fetches it from the
// process's output ring.
type LanePassed struct {
	Bytes int64 `json:"bytes"`
}

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
