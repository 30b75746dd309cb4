//go:build cgo

package guestfork

// Links forker_linux.c, the forker itself, into every binary that starts
// guests (the daemon's, and the tests').

// #include "forker.h"
import "C"

import (
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/sysmon"
)

// The protocol is written twice, once for each language: unless the two
// agree, the key below repeats the map's first (false) and the build
// fails. In a function never called, it costs the program nothing.
func _() {
	_ = map[bool]int{false: 0, C.FORKER_VERB == ForkerVerb &&
		C.GUEST_VERB == GuestVerb &&
		C.NICE == Nice &&
		C.FD_EXE == FDExe &&
		C.FD_FAST == FDFast && FDFast == guestapi.HandoverExeFD &&
		C.FD_SECCOMP == FDSeccomp &&
		C.GUEST_SLACK_NS == int64(sysmon.Slack) &&
		C.REQ_LEN == requestLen &&
		C.REQ_CGROUP == reqCgroup &&
		C.REQ_URGENT == reqUrgent &&
		C.REQ_NETNS == reqNetNS: 1}
}
