package guestapi

import (
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/wire"
)

// Handover is what the fast guest (internal/guestc: PID 1 in C, which
// serves attached starts of plain commands) leaves the Go guest when a
// connection asks for anything else: it writes this into a memfd
// (ReadHandover reads it) and execs the Go guest (the sealed binary it
// holds at HandoverExeFD) with the verb guestfork.AdoptVerb and the
// memfd's number. PID 1 stays
// PID 1 through the exec, so its children, its namespaces, its seccomp
// filter and the descriptors named here go on; the Go guest takes over
// the processes and connections and serves from then on. The sandbox was
// prepared by the fast guest: the root entered, the hostname set, the
// process in the sandbox's cgroups (but its v1 pids group, as the Go
// guest's) and a cgroup namespace, no_new_privs and the filter loaded.
type Handover struct {
	Serve ServeConfig `json:"serve"`
	// Caps is the sandbox's capability set, for the processes the Go
	// guest starts (Prepare.Caps).
	Caps []string `json:"caps"`
	// OOMFD is the cgroup's OOM event counter (-1: none), and OOMSeen the
	// count when the fast guest last read it.
	OOMFD   int    `json:"oom_fd"`
	OOMSeen uint64 `json:"oom_seen"`
	// PidsTasks is the sandbox's v1 pids tasks file (Prepare.PidsTasks),
	// -1 where the guest's process is in the sandbox's pids group.
	PidsTasks int            `json:"pids_tasks"`
	Procs     []HandoverProc `json:"procs"`
	Conns     []HandoverConn `json:"conns"`
}

// HelperIdle is how long the fast guest's helper (guest.Helper), which
// serves the file ops and port connections the fast guest passes on,
// stays without one to serve.
const HelperIdle = 10 * time.Second

// HandoverExeFD is the descriptor of the Go guest's sealed binary in a
// fast guest (close-on-exec: no process of the sandbox inherits it).
const HandoverExeFD = 5

// HandoverProc is a process the fast guest started, running or finished
// and retained.
type HandoverProc struct {
	PID       int      `json:"pid"`
	Cmd       []string `json:"cmd"`
	Cwd       string   `json:"cwd"`
	StartedNS int64    `json:"started_ns"` // Unix time
	// Stdout and Stderr are the read ends of its output pipes, -1 once
	// closed.
	Stdout int `json:"stdout"`
	Stderr int `json:"stderr"`
	// Dropped is output lost to the retention cap before Output.
	Dropped int64           `json:"dropped"`
	Output  []HandoverChunk `json:"output"`
	// Exit is set once the fast guest reaped it.
	Exit *api.ExitStatus `json:"exit,omitempty"`
}

// HandoverChunk is retained output, in the order it was read. Its Len
// bytes are not in the JSON but in the memfd's output region (Data once
// ReadHandover read them).
type HandoverChunk struct {
	Type wire.Type `json:"type"`
	Len  int64     `json:"len"`
	Data []byte    `json:"-"`
}

// HandoverConn is an open control connection, in the state the fast
// guest left it: with Request, a request frame's payload it read and did
// not serve (the one that made it hand over); with PID, streaming that
// process's output from Offset, Answer (an encoded Response frame) still
// to go before the next frame; with Release, waiting for the client's
// Release after an exit frame; with none of them, between requests.
//
// With Lane, the connection is an exec lane bound to the sandbox (OpLane)
// whose requests the fast guest served: Request is a lane request it did
// not serve, PID an exec it streams to the lane (Answer: its wire.Started
// frame), and Release is never set.
type HandoverConn struct {
	FD      int           `json:"fd"`
	Request []byte        `json:"request,omitempty"`
	PID     int           `json:"pid,omitempty"`
	Offset  int64         `json:"offset,omitempty"`
	Answer  []byte        `json:"answer,omitempty"`
	Release bool          `json:"release,omitempty"`
	Lane    *HandoverLane `json:"lane,omitempty"`
}

// HandoverLane is where an exec lane's reports stand (LaneStart,
// LanePassed; internal/guest/lane_linux.go).
type HandoverLane struct {
	// Report is the connection the lane's reports go on (OpLane's).
	Report  int    `json:"report"`
	Sandbox string `json:"sandbox"`
	// Reports are report frames not sent yet; Budget is what is left of
	// the exec in flight's output budget, Passed output passed on and not
	// reported yet, and Begun says the exec's start went.
	Reports []byte `json:"reports,omitempty"`
	Budget  int    `json:"budget"`
	Passed  int64  `json:"passed"`
	Begun   bool   `json:"begun"`
	// Failed: the reports broke off or the daemon is gone; the lane ends
	// after its exec in flight.
	Failed bool `json:"failed"`
	// Read is the start of a frame read from the lane.
	Read []byte `json:"read,omitempty"`
}
