package guestfork

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// Nice is the forker's (and fresh guests') scheduling priority.
const Nice = 10

// The forker's own descriptors beside its socket (fd 3): the sealed guest
// binary, the sealed fast guest (internal/guestc) if the daemon has one,
// and the sandboxes' base seccomp filter (a split filter's, loaded by
// the forker once and inherited by every guest: seccomp.Split) if the
// daemon gives one. With the fast guest, every guest is exec'd from it
// and finds the guest binary at the same number, FDFast
// (guestapi.HandoverExeFD), to hand over to. An optional descriptor the
// daemon does not give is closed in the forker.
const (
	FDExe     = 4
	FDFast    = 5
	FDSeccomp = 6
)

// Descriptors of a fork request, in order.
const (
	FDStdin = iota
	FDLog
	FDSync
	FDListen
	FDCgroup // v2 only: the cgroup to clone into
)

// The hidden verbs: GuestVerb runs the guest binary as PID 1 of a sandbox
// (internal/guestmain); ForkerVerb runs the daemon's own binary as the
// forker (forker_linux.c takes the process before the Go runtime starts;
// its arguments after the verb are the devices guests bind). AdoptVerb
// runs the Go guest in a fast guest's place (guest.Adopt; its argument
// is the handover's descriptor); HelperVerb runs it as the fast guest's
// helper (guest.Helper; its argument is the sandbox's workdir).
const (
	GuestVerb  = "guest"
	ForkerVerb = "guest-forker"
	AdoptVerb  = "guest-adopt"
	HelperVerb = "guest-helper"
)

// Request asks the forker for a guest.
type Request struct {
	// UIDBase is the host uid (and gid) that root in the guest's user
	// namespace maps to; IDs is how many ids are mapped from there.
	UIDBase uint32
	IDs     uint32
	// UseCgroup: the request carries a cgroup v2 directory (FDCgroup)
	// that the guest is cloned into.
	UseCgroup bool
	// Urgent forks the guest at the normal priority: a sandbox waits for
	// it (a resume, a create that found no warm guest).
	Urgent bool
	// NetNS: the request's last descriptor is a network namespace the
	// daemon made (a network slot, owned by the host's user namespace),
	// which the guest is forked into instead of a new one of its own.
	NetNS bool
}

// requestLen is the length of an encoded Request.
const requestLen = 12

// The request's flags.
const (
	reqCgroup = 1 << iota
	reqUrgent
	reqNetNS
)

// Encode is the request as the forker reads it: the uid base, the number
// of ids and the flags, 32 bits each in the host's byte order.
func (r Request) Encode() []byte {
	var flags uint32
	if r.UseCgroup {
		flags |= reqCgroup
	}
	if r.Urgent {
		flags |= reqUrgent
	}
	if r.NetNS {
		flags |= reqNetNS
	}
	b := binary.NativeEndian.AppendUint32(make([]byte, 0, requestLen), r.UIDBase)
	b = binary.NativeEndian.AppendUint32(b, r.IDs)
	return binary.NativeEndian.AppendUint32(b, flags)
}

// DecodeReply reads the forker's answer: the guest's pid, or the error
// that kept it from starting (wrapping the errno it failed with, so that
// a lack of memory or of pids reads as such).
func DecodeReply(b []byte) (int, error) {
	if len(b) < 8 {
		return 0, fmt.Errorf("the forker's answer is %d bytes, want at least 8", len(b))
	}
	pid := int32(binary.NativeEndian.Uint32(b))
	errno := syscall.Errno(binary.NativeEndian.Uint32(b[4:]))
	if pid > 0 {
		return int(pid), nil
	}
	msg := string(b[8:])
	if errno == 0 {
		return 0, errors.New(msg)
	}
	// The message ends with the errno's text already.
	return 0, &forkError{msg: msg, errno: errno}
}

type forkError struct {
	msg   string
	errno syscall.Errno
}

func (e *forkError) Error() string { return e.msg }
func (e *forkError) Unwrap() error { return e.errno }
